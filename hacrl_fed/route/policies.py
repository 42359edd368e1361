"""Routing policies: which deployed model answers a query, chosen before any model has seen it.

Pure functions over arrays (no I/O, no model): ``route eval`` (:mod:`hacrl_fed.route.evaluate`) fits them on a
calibration split and scores them on held-out queries; ``route serve`` ranks backends with the same code.

Notation: M models, C calibration queries, Q queries to route. ``correct[m, c]`` ∈ [0, 1] is model m's measured
accuracy on calibration query c (1/0 for one greedy response, the share correct for k samples); ``cost[m]`` is
model m's *predicted* cost of one query (its mean calibration cost: parameters × response tokens by default,
:func:`predicted_cost`). Every policy returns ``choice``: shape (Q,), int model indices. Ties go to the cheaper
model, then to the lower index.

Policies (the names ``route eval`` reports):

* ``best_single``: the model with the highest calibration accuracy, for every query.
* ``best_per_task``: per task, the model with the highest calibration accuracy on that task (needs the task of
  each query; a task without calibration queries gets ``best_single``'s model). With a run's ``report.json`` the
  per-task accuracies can come from the federation's own held-out evaluation instead (``route eval
  --capability``).
* ``knn``: the k nearest calibration queries by cosine similarity of query embeddings
  (:mod:`hacrl_fed.route.embed`) predict each model's accuracy (their mean ``correct``); the model with the
  highest prediction answers. The k-nearest-neighbour router that LLMRouterBench and the "routing plateau" study
  found hard to beat.
* ``cost_aware@τ``: the cheapest model whose kNN-predicted accuracy is at least τ; when none reaches τ, the one
  with the highest prediction.
* ``random``: a model drawn uniformly per query; reported as its expectation (the mean over models), not a draw.
* ``oracle``: with hindsight, the cheapest model that answered the query correctly (the cheapest model when
  none did): the ceiling any router can reach.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["argbest", "best_per_task", "best_single", "cost_aware", "knn_predict", "oracle", "predicted_cost",
           "rank_models"]


def _check(correct: np.ndarray, cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    correct, cost = np.asarray(correct, dtype=float), np.asarray(cost, dtype=float)
    if correct.ndim != 2 or correct.shape[0] == 0:
        raise ValueError(f"correct must have shape (models, queries) with at least one model, got {correct.shape}")
    if cost.shape != (correct.shape[0],):
        raise ValueError(f"cost must have shape ({correct.shape[0]},), got {cost.shape}")
    if not np.isfinite(cost).all() or (cost < 0).any():
        raise ValueError("cost must be finite and non-negative")
    return correct, cost


def argbest(scores: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Index of the highest score along the last axis; ties → cheaper model → lower index.

    ``scores``: (..., M). Scores within 1e-12 of the maximum count as tied."""
    top = scores.max(axis=-1, keepdims=True)
    tied = scores >= top - 1e-12
    # among the tied, the cheapest (then the first): rank by cost, pick the first tied in cost order
    order = np.argsort(cost, kind="stable")
    first = np.argmax(tied[..., order], axis=-1)
    return order[first]


def predicted_cost(tokens: np.ndarray, params: Sequence[float] | None = None) -> np.ndarray:
    """Predicted cost of one query per model: mean calibration response tokens × parameters (× 1 without).

    ``tokens``: (M, C) response tokens of each model on each calibration query. ``params``: M parameter counts.
    Returns (M,) in parameter-tokens (or tokens)."""
    tokens = np.asarray(tokens, dtype=float)
    mean = tokens.mean(axis=1) if tokens.shape[1] else np.zeros(tokens.shape[0])
    return mean * (np.asarray(params, dtype=float) if params is not None else 1.0)


def best_single(correct: np.ndarray, cost: np.ndarray, n_queries: int) -> np.ndarray:
    """``best_single``: (n_queries,) all the index of the model with the highest mean ``correct`` (M, C)."""
    correct, cost = _check(correct, cost)
    return np.full(n_queries, int(argbest(correct.mean(axis=1), cost)), dtype=int)


def best_per_task(correct: np.ndarray, cost: np.ndarray, calibration_tasks: Sequence[str],
                  query_tasks: Sequence[str]) -> np.ndarray:
    """``best_per_task``: per query, the best model on the query's task in calibration.

    ``correct``: (M, C); ``calibration_tasks``: C task names; ``query_tasks``: Q task names. A task absent from
    calibration falls back to :func:`best_single`. Returns (Q,) ints."""
    correct, cost = _check(correct, cost)
    if len(calibration_tasks) != correct.shape[1]:
        raise ValueError(f"{len(calibration_tasks)} calibration tasks for {correct.shape[1]} calibration queries")
    overall = int(argbest(correct.mean(axis=1), cost))
    tasks = np.asarray(calibration_tasks, dtype=object)
    best = {t: int(argbest(correct[:, tasks == t].mean(axis=1), cost)) for t in set(calibration_tasks)}
    return np.array([best.get(t, overall) for t in query_tasks], dtype=int)


def knn_predict(similarity: np.ndarray, correct: np.ndarray, k: int) -> np.ndarray:
    """Predicted accuracy of every model on every query: the mean ``correct`` of its k most similar calibration
    queries.

    ``similarity``: (Q, C) cosine similarities (higher = nearer; ``-inf`` excludes a pair, as leave-one-out on
    the calibration set itself does); ``correct``: (M, C); ``k`` ≥ 1, at most the C − 1 … C usable neighbours
    (fewer when a row has fewer finite entries). Returns (Q, M) in [0, 1]. Raises ``ValueError`` for bad shapes
    or k < 1."""
    similarity, correct = np.asarray(similarity, dtype=float), np.asarray(correct, dtype=float)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if similarity.ndim != 2 or correct.ndim != 2 or similarity.shape[1] != correct.shape[1]:
        raise ValueError(f"similarity (Q, C) and correct (M, C) disagree: {similarity.shape} vs {correct.shape}")
    if similarity.shape[1] == 0:
        raise ValueError("knn needs at least one calibration query")
    k = min(k, similarity.shape[1])
    near = np.argsort(-similarity, axis=1, kind="stable")[:, :k]             # (Q, k)
    usable = np.isfinite(np.take_along_axis(similarity, near, axis=1))        # (Q, k)
    votes = correct.T[near]                                                   # (Q, k, M)
    counts = np.maximum(usable.sum(axis=1, keepdims=True), 1)                 # (Q, 1)
    return (votes * usable[..., None]).sum(axis=1) / counts


def rank_models(predicted: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Per query, every model from best to worst predicted accuracy (ties: cheaper first).

    ``predicted``: (Q, M); returns (Q, M) model indices; column 0 is the ``knn`` choice, the rest the fallback
    order ``route serve`` uses."""
    predicted, cost = np.asarray(predicted, dtype=float), np.asarray(cost, dtype=float)
    index = np.arange(predicted.shape[1])
    return np.stack([np.lexsort((index, cost, -np.round(row, 12))) for row in predicted]).astype(int)


def cost_aware(predicted: np.ndarray, cost: np.ndarray, target: float) -> np.ndarray:
    """``cost_aware@target``: per query the cheapest model whose predicted accuracy ≥ ``target``, else the model
    with the highest prediction. ``predicted``: (Q, M). Returns (Q,) ints."""
    predicted, cost = np.asarray(predicted, dtype=float), np.asarray(cost, dtype=float)
    ok = predicted >= target - 1e-12
    order = np.argsort(cost, kind="stable")
    cheapest_ok = order[np.argmax(ok[:, order], axis=1)]
    return np.where(ok.any(axis=1), cheapest_ok, argbest(predicted, cost))


def oracle(correct: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """``oracle``: per query the cheapest model that was correct (the cheapest when none was).

    ``correct``: (M, Q) measured on the queries being routed; ``cost``: (M,) or (M, Q) (the query's measured
    cost). Returns (Q,) ints."""
    correct = np.asarray(correct, dtype=float)
    cost = np.asarray(cost, dtype=float)
    per_query = np.broadcast_to(cost[:, None] if cost.ndim == 1 else cost, correct.shape)
    # correct first (higher correct wins), then cheaper: score = correct, ties on cost
    best = np.empty(correct.shape[1], dtype=int)
    for q in range(correct.shape[1]):
        best[q] = int(argbest(correct[:, q], per_query[:, q]))
    return best
