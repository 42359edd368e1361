"""A fitted kNN router: what ``route eval`` measured on its calibration split, in a file ``route serve`` loads.

``router.json`` holds the models, the calibration queries' text and task, every model's ``correct`` on each
(M × C), every model's predicted cost per query, k and the embedder (``tfidf`` or a model directory). It holds
no pickled object: loading re-fits the embedder on the stored texts, which gives the same vectors. The file is
validated when read (shape, types, bounds) and written atomically.

Bounds on a file ``route serve --router`` loads (what a router needs, so loading it costs seconds of CPU, not
minutes, and no memory beyond the file's size class): at most :data:`MAX_ROUTER_BYTES` bytes, JSON nested no
deeper than its own shape, :data:`MAX_MODELS` models, :data:`MAX_CALIBRATION` calibration texts holding at most
:data:`MAX_CALIBRATION_CHARS` characters in all (each counted up to the embedder's
:data:`~hacrl_fed.route.embed.MAX_QUERY_CHARS`, the head it reads), names and tasks of at most
:data:`MAX_NAME_CHARS`; the TF-IDF calibration embeddings stay sparse (their dense array is calibration texts ×
distinct n-grams). Anything else is a one-line ``ValueError`` naming the file and the bound (``route serve``
exits 2 with it).

:meth:`Router.rank` orders the models for one query: best kNN-predicted accuracy first, ties to the cheaper
(:func:`hacrl_fed.route.policies.rank_models`); ``target`` turns it into ``cost_aware@τ`` (the cheapest model
predicted to reach τ first, then the rest by predicted accuracy).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hacrl_fed.atomic import atomic_write_text, read_bounded
from hacrl_fed.route import policies as P

__all__ = ["ROUTER_FORMAT", "Router", "check_calibration_size", "request_text"]

ROUTER_FORMAT = "hacrl-fed-router/1"
MAX_ROUTER_BYTES = 32 * 2**20
MAX_CALIBRATION = 20_000
MAX_CALIBRATION_CHARS = 2_000_000
"""Calibration characters in all (TF-IDF fitting is linear in them: ≈ 3 CPU s per million characters of problem
text, ≈ 15 s of random text, whose every n-gram is new)."""
MAX_MODELS = 256
MAX_NAME_CHARS = 1000


@dataclass
class Router:
    """See the module docstring. ``correct``: M lists of C floats in [0, 1]; ``cost``: M non-negative floats."""

    models: list[str]
    texts: list[str]
    tasks: list[str]
    correct: list[list[float]]
    cost: list[float]
    k: int = 10
    embedder: str = "tfidf"
    _fitted: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_shape(self)
        m, c = len(self.models), len(self.texts)
        if m < 1 or len(set(self.models)) != m:
            raise ValueError("a router needs at least one model and unique model names")
        if not 1 <= c <= MAX_CALIBRATION or len(self.tasks) != c:
            raise ValueError(f"a router needs 1..{MAX_CALIBRATION} calibration texts, each with a task")
        arr = np.asarray(self.correct, dtype=float)
        if arr.shape != (m, c) or not np.isfinite(arr).all() or (arr < 0).any() or (arr > 1).any():
            raise ValueError(f"correct must be {m} × {c} values in [0, 1]")
        cost = np.asarray(self.cost, dtype=float)
        if cost.shape != (m,) or not np.isfinite(cost).all() or (cost < 0).any():
            raise ValueError(f"cost must be {m} non-negative numbers")
        if not isinstance(self.k, int) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"k must be a positive integer, got {self.k!r}")
        if not all(isinstance(t, str) for t in (*self.texts, *self.tasks, *self.models)):
            raise ValueError("models, texts and tasks must be strings")

    def _state(self) -> tuple[Any, np.ndarray]:
        if self._fitted is None:
            from hacrl_fed.route.embed import load_embedder

            emb = load_embedder(self.embedder).fit(self.texts)
            self._fitted = (emb, emb.matrix(self.texts))
        return self._fitted

    def predict(self, text: str) -> np.ndarray:
        """(M,) kNN-predicted accuracy of each model on ``text``."""
        from hacrl_fed.route.embed import cosine

        emb, cal = self._state()
        return P.knn_predict(cosine(emb.matrix([text]), cal), np.asarray(self.correct, dtype=float), self.k)[0]

    def rank(self, text: str, target: float | None = None) -> list[str]:
        """Model names for ``text``, first choice first (module docstring)."""
        pred = self.predict(text)[None, :]
        cost = np.asarray(self.cost, dtype=float)
        order = [int(i) for i in P.rank_models(pred, cost)[0]]
        if target is not None:
            first = int(P.cost_aware(pred, cost, target)[0])
            order = [first, *(i for i in order if i != first)]
        return [self.models[i] for i in order]

    def request_ranker(self, backends: list[str], target: float | None = None):
        """A ``route serve`` rank function: ``rank(request) → backend names`` by :meth:`rank` on the request's
        :func:`request_text`; backends the router does not know follow in their order. Raises ``ValueError``
        when a router model is not among ``backends``."""
        missing = [m for m in self.models if m not in backends]
        if missing:
            raise ValueError(f"the router file's models {missing} are not --model names ({', '.join(backends)})")
        rest = [b for b in backends if b not in self.models]
        self._state()                                   # fit the embedder now, not on the first request

        def rank(request: dict[str, Any]) -> list[str]:
            return [*self.rank(request_text(request), target), *rest]

        return rank

    def save(self, path: str | Path) -> Path:
        """Write ``path`` atomically; returns it."""
        rec = {"format": ROUTER_FORMAT, **{k: v for k, v in asdict(self).items() if not k.startswith("_")}}
        return atomic_write_text(Path(path), json.dumps(rec))

    @classmethod
    def load(cls, path: str | Path) -> Router:
        """Read and validate ``path``; raises ``ValueError`` (one line naming the file)."""
        try:
            rec = json.loads(read_bounded(path, MAX_ROUTER_BYTES))
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: not a readable router file: {' '.join(str(err).split())}") from None
        except RecursionError:
            raise ValueError(f"{path}: not a router file (JSON nested too deeply)") from None
        if not isinstance(rec, dict) or rec.get("format") != ROUTER_FORMAT:
            raise ValueError(f"{path}: not a {ROUTER_FORMAT} file (written by `hacrl-fed route eval`)")
        try:
            return cls(**{k: rec[k] for k in ("models", "texts", "tasks", "correct", "cost", "k", "embedder")})
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}: {' '.join(str(err).split())}") from None


def _check_shape(r: Router) -> None:
    """The fields' types and sizes, in Python and linear in the file, before anything is converted or fitted;
    ``ValueError`` naming the first that is off."""
    def strings(name: str, values: Any, most: int, chars: int) -> None:
        if not isinstance(values, list) or len(values) > most:
            raise ValueError(f"{name} must be a list of at most {most} strings")
        if not all(isinstance(v, str) and len(v) <= chars for v in values):
            raise ValueError(f"{name} must hold strings of at most {chars} characters")

    def numbers(name: str, values: Any, n: int) -> None:
        if not isinstance(values, list) or len(values) != n or not all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            raise ValueError(f"{name} must be a list of {n} numbers")

    strings("models", r.models, MAX_MODELS, MAX_NAME_CHARS)
    strings("texts", r.texts, MAX_CALIBRATION, 10**9)
    strings("tasks", r.tasks, MAX_CALIBRATION, MAX_NAME_CHARS)
    check_calibration_size(r.texts)
    if not isinstance(r.correct, list) or len(r.correct) != len(r.models):
        raise ValueError(f"correct must be {len(r.models)} lists, one per model")
    for row in r.correct:
        numbers("each row of correct", row, len(r.texts))
    numbers("cost", r.cost, len(r.models))
    if not isinstance(r.embedder, str) or not 0 < len(r.embedder) <= 4096:
        raise ValueError("embedder must be tfidf or a model directory")


def check_calibration_size(texts: list[str]) -> None:
    """``ValueError`` when ``texts`` are more calibration queries (:data:`MAX_CALIBRATION`) or characters
    (:data:`MAX_CALIBRATION_CHARS`, each text counted up to the embedder's head) than a router file may hold."""
    from hacrl_fed.route.embed import MAX_QUERY_CHARS

    if len(texts) > MAX_CALIBRATION:
        raise ValueError(f"{len(texts)} calibration texts, more than a router holds ({MAX_CALIBRATION})")
    total = sum(min(len(t), MAX_QUERY_CHARS) for t in texts)
    if total > MAX_CALIBRATION_CHARS:
        raise ValueError(f"the calibration texts hold {total} characters, more than a router needs "
                         f"({MAX_CALIBRATION_CHARS}; fitting costs CPU in proportion)")


def request_text(request: dict[str, Any]) -> str:
    """The text a router routes a chat-completions request by: its last ``user`` message (the text parts of a
    list content joined), or ``""`` when there is none."""
    for message in reversed(request.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict)
                                and isinstance(p.get("text"), str))
    return ""
