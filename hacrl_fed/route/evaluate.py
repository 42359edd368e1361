"""``hacrl-fed route eval``: routing policies compared on held-out queries, accuracy against cost.

Given every model's measured outcomes (:mod:`hacrl_fed.route.measure`) on a calibration split and on the
queries to route, :func:`compare` applies each policy of :mod:`hacrl_fed.route.policies` (fitted on the
calibration split only) and reports per policy:

* accuracy on the routed queries, with a 95 % bootstrap interval over queries, and the paired difference to
  ``best_single`` with its interval (the same resampled queries for both);
* cost per query, three ways: measured generation seconds, response tokens, parameters × tokens (the
  machine-independent one; a policy's cost is that of the model it chose, measured on that query);
* the share of queries sent to each model.

``cost_aware@τ`` is swept over τ; the report gives the cheapest τ whose accuracy reaches ``best_single``'s on the
routed queries (*the cost at which the router matches the best single model*), and the τ the calibration split
alone would choose (leave-one-out kNN on calibration: cheapest τ reaching ``best_single``'s calibration
accuracy) with its held-out result, the honest figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hacrl_fed.route import policies as P

__all__ = ["COST_KINDS", "RouteData", "compare", "format_table", "plot"]

COST_KINDS = ("param_tokens", "tokens", "seconds")
TARGETS = tuple(round(x, 2) for x in np.arange(0.0, 1.0001, 0.05))
"""The τ grid of ``cost_aware@τ``."""
BOOTSTRAP = 2000


@dataclass
class RouteData:
    """Outcomes of M models on C calibration and Q routed queries (arrays model-major).

    ``correct_*``: (M, ·) in [0, 1]; ``tokens_*``, ``seconds_*``: (M, ·); ``params``: (M,) or None (unknown for
    some model); ``tasks_*``: task of each query ('' when unknown); ``sim_*``: cosine similarities of the
    routed (Q, C) and calibration (C, C) queries to the calibration queries."""

    models: list[str]
    correct_cal: np.ndarray
    correct: np.ndarray
    tokens_cal: np.ndarray
    tokens: np.ndarray
    seconds_cal: np.ndarray
    seconds: np.ndarray
    params: np.ndarray | None
    tasks_cal: list[str]
    tasks: list[str]
    sim: np.ndarray
    sim_cal: np.ndarray

    def cost_of(self, kind: str, calibration: bool = False) -> np.ndarray:
        """Measured per-query cost (M, ·) of ``kind`` (:data:`COST_KINDS`)."""
        tokens = self.tokens_cal if calibration else self.tokens
        if kind == "tokens":
            return tokens
        if kind == "seconds":
            return self.seconds_cal if calibration else self.seconds
        if self.params is None:
            raise ValueError("param_tokens needs every model's parameter count (--params NAME=135M for endpoints)")
        return tokens * self.params[:, None]


def _interval(values: np.ndarray, idx: np.ndarray) -> list[float]:
    boot = values[idx].mean(axis=1)
    return [float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))]


def _score(d: RouteData, choice: np.ndarray | None, idx: np.ndarray, base: np.ndarray | None) -> dict[str, Any]:
    """One policy's row. ``choice``: (Q,) model per query, or None for ``random`` (the mean over models)."""
    q = np.arange(d.correct.shape[1])
    if choice is None:
        acc, costs = d.correct.mean(axis=0), {k: d.cost_of(k).mean(axis=0) for k in COST_KINDS if _has(d, k)}
        share = {m: 1.0 / len(d.models) for m in d.models}
    else:
        acc, costs = d.correct[choice, q], {k: d.cost_of(k)[choice, q] for k in COST_KINDS if _has(d, k)}
        share = {m: float(np.mean(choice == i)) for i, m in enumerate(d.models)}
    row: dict[str, Any] = {"accuracy": float(acc.mean()), "accuracy_ci": _interval(acc, idx),
                           "cost": {k: float(v.mean()) for k, v in costs.items()}, "share": share}
    if base is not None:
        diff = acc - base
        row["vs_best_single"] = float(diff.mean())
        row["vs_best_single_ci"] = _interval(diff, idx)
    row["per_query_accuracy"] = acc
    return row


def _has(d: RouteData, kind: str) -> bool:
    return kind != "param_tokens" or d.params is not None


def compare(d: RouteData, *, k: int = 10, cost_kind: str = "param_tokens", seed: int = 0,
            capability: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Any]:
    """Every policy on the routed queries (module docstring). ``capability``: optional per-task accuracy per model
    (``{task: {model: accuracy}}``, from a run's ``report.json``) for ``best_per_task (report)``.

    Returns ``{"policies": {name: row}, "cost_aware": [...sweep...], "match": {...}, ...}``; JSON-ready."""
    if cost_kind not in COST_KINDS:
        raise ValueError(f"cost must be one of {COST_KINDS}, got {cost_kind!r}")
    if cost_kind == "param_tokens" and d.params is None:
        cost_kind = "seconds"
    n_q = d.correct.shape[1]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n_q, size=(BOOTSTRAP, n_q))
    cost = P.predicted_cost(d.cost_of(cost_kind, calibration=True))          # (M,) per query, from calibration
    pred = P.knn_predict(d.sim, d.correct_cal, k)                            # (Q, M)
    single = P.best_single(d.correct_cal, cost, n_q)
    base = d.correct[single, np.arange(n_q)]
    choices: dict[str, np.ndarray | None] = {
        "best_single": single,
        "knn": P.rank_models(pred, cost)[:, 0],
        "random": None,
        "oracle": P.oracle(d.correct, d.cost_of(cost_kind)),
    }
    if any(d.tasks_cal) and any(d.tasks):
        choices["best_per_task"] = P.best_per_task(d.correct_cal, cost, d.tasks_cal, d.tasks)
    if capability:
        choices["best_per_task (report)"] = _from_capability(d, capability, cost, single)
    policies = {name: _score(d, c, idx, base) for name, c in choices.items()}
    sweep, match = _cost_aware(d, pred, cost, cost_kind, idx, base, k)
    for row in sweep:
        policies.setdefault(f"cost_aware@{row['target']:.2f}", row["row"])
    return {"models": d.models, "queries": n_q, "calibration_queries": int(d.correct_cal.shape[1]), "k": k,
            "cost_kind": cost_kind, "predicted_cost": dict(zip(d.models, map(float, cost))),
            "calibration_accuracy": dict(zip(d.models, map(float, d.correct_cal.mean(axis=1)))),
            "model_accuracy": dict(zip(d.models, map(float, d.correct.mean(axis=1)))),
            "policies": policies, "cost_aware": [{"target": r["target"], "accuracy": r["row"]["accuracy"],
                                                  "cost": r["row"]["cost"]} for r in sweep], "match": match}


def _from_capability(d: RouteData, capability: Mapping[str, Mapping[str, float]], cost: np.ndarray,
                     single: np.ndarray) -> np.ndarray:
    fallback = int(single[0]) if len(single) else 0
    best: dict[str, int] = {}
    for task, per in capability.items():        # a model the report does not score for a task ranks last
        scores = np.array([-1.0 if per.get(m) is None else float(per[m]) for m in d.models])
        if (scores >= 0).any():
            best[task] = int(P.argbest(scores, cost))
    return np.array([best.get(t, fallback) for t in d.tasks], dtype=int)


def _cost_aware(d: RouteData, pred: np.ndarray, cost: np.ndarray, cost_kind: str, idx: np.ndarray,
                base: np.ndarray, k: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    n_c = d.correct_cal.shape[1]
    sweep = [{"target": t, "row": _score(d, P.cost_aware(pred, cost, t), idx, base)} for t in TARGETS]
    single_acc = float(base.mean())
    reaching = [r for r in sweep if r["row"]["accuracy"] >= single_acc - 1e-12]
    cheapest = min(reaching, key=lambda r: r["row"]["cost"][cost_kind]) if reaching else None
    chosen = None
    if n_c > 1:                                 # the honest choice of τ: leave-one-out kNN on the calibration split
        loo = np.array(d.sim_cal, dtype=float, copy=True)
        np.fill_diagonal(loo, -np.inf)
        pred_cal = P.knn_predict(loo, d.correct_cal, k)
        cal_single = float(d.correct_cal.mean(axis=1).max())
        cal_cost = d.cost_of(cost_kind, calibration=True)
        ok = []
        for t in TARGETS:
            c = P.cost_aware(pred_cal, cost, t)
            acc = float(d.correct_cal[c, np.arange(n_c)].mean())
            if acc >= cal_single - 1e-12:
                ok.append((float(cal_cost[c, np.arange(n_c)].mean()), t))
        if ok:
            chosen = next(r for r in sweep if r["target"] == min(ok)[1])
    return sweep, {
        "best_single_accuracy": single_acc,
        "cheapest_matching_target": None if cheapest is None else cheapest["target"],
        "cheapest_matching_cost": None if cheapest is None else cheapest["row"]["cost"][cost_kind],
        "calibration_target": None if chosen is None else chosen["target"],
        "calibration_target_accuracy": None if chosen is None else chosen["row"]["accuracy"],
        "calibration_target_cost": None if chosen is None else chosen["row"]["cost"][cost_kind],
    }
