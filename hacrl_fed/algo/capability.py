"""Agent capability P̂ and the capability ratio r_{j→k} (paper Eqs. 8–9; hacpo-spec §2, T7, T8).

For N agents. Each agent keeps a window of its last K per-step mean rewards, current step
included; its capability is the window mean, floored. The ratio the algorithm uses is

    r_{j→k} = clip(P̂_j / P̂_k, 0.1, 10)      (source j, learner k)

It multiplies the cross-agent gradient (ω^(j,k), Eq. 10) and its reciprocal weights the
source's rewards in the learner's baseline (ω^(k,j), Eq. 7). Pure Python; no I/O.

Extension (``AlgoConfig.capability_scope = "task"``, not in the paper): the tracker also keeps, per agent
and task, a window of the agent's per-step mean rewards over that task's prompts (steps where the task
appeared), P̂_j(t), and the ratio of a row on a prompt of task t is

    r_{j→k}(t) = clip(P̂_j(t) / P̂_k(t), 0.1, 10)   when both agents have a value for t, else r_{j→k}

(:func:`task_ratios`). Rationale: a peer stronger on one task and weaker on another is weighted per task, in
the baseline (Eq. 7) and the gradient (Eq. 10) alike. With ``"global"`` (the ``hacpo`` preset) only Eq. 8–9.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

CAPABILITY_FLOOR = 1e-8
"""P̂ is floored here so a ratio never divides by zero (both reference codes; spec §12)."""


def capability_ratio(p_source: float, p_learner: float, *, ratio_clip: tuple[float, float] = (0.1, 10.0),
                     floor: float = CAPABILITY_FLOOR) -> float:
    """r_{j→k} = clip(max(P̂_j, floor) / max(P̂_k, floor), lo, hi) (Eq. 8 as the codes store it; T8).

    Args:
        p_source: P̂_j of the agent that generated the rows.
        p_learner: P̂_k of the agent being updated.
        ratio_clip: (lo, hi), 0 < lo <= hi.
        floor: lower bound applied to both capabilities.

    Raises:
        ValueError: non-finite capability or invalid clip bounds.
    """
    lo, hi = ratio_clip
    if not (0 < lo <= hi):
        raise ValueError(f"ratio_clip must satisfy 0 < low <= high, got {ratio_clip}")
    if not (math.isfinite(p_source) and math.isfinite(p_learner)):
        raise ValueError(f"capabilities must be finite, got source {p_source} and learner {p_learner}")
    # P̂ ← max(P̂, 1e-8): both zero ⇒ ratio 1 (T8)
    p_j, p_k = max(p_source, floor), max(p_learner, floor)
    # r_{j→k} = clip(P̂_j / P̂_k, 0.1, 10)
    return min(hi, max(lo, p_j / p_k))


class CapabilityTracker:
    """Per-agent moving-window capability P̂ (Eq. 9) and pairwise ratios r_{j→k} (Eq. 8).

    Args:
        window: K, per-step means averaged (current step included; K = 5 in the paper).
        floor: lower bound of P̂ (1e-8).
        warmup_steps: during the first ``warmup_steps`` calls of :meth:`update` every ratio is 1.
        ratio_clip: bounds of r_{j→k} ((0.1, 10) in both reference codes).

    An agent absent from a step keeps its window unchanged. Before its first value an agent is
    unknown: :meth:`capability` and :meth:`ratio` raise ``KeyError``.
    """

    def __init__(self, window: int = 5, *, floor: float = CAPABILITY_FLOOR, warmup_steps: int = 0,
                 ratio_clip: tuple[float, float] = (0.1, 10.0)) -> None:
        if int(window) != window or window < 1:
            raise ValueError(f"capability window must be an integer >= 1, got {window}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if not (0 < ratio_clip[0] <= ratio_clip[1]):
            raise ValueError(f"ratio_clip must satisfy 0 < low <= high, got {ratio_clip}")
        if not floor > 0:
            raise ValueError(f"floor must be > 0, got {floor}")
        self.window = int(window)
        self.floor = float(floor)
        self.warmup_steps = int(warmup_steps)
        self.ratio_clip = (float(ratio_clip[0]), float(ratio_clip[1]))
        self.steps = 0
        self._history: dict[str, deque[float]] = {}
        self._tasks: dict[str, dict[str, deque[float]]] = {}

    def update(self, step_means: Mapping[str, float],
               task_means: Mapping[str, Mapping[str, float]] | None = None) -> None:
        """Append each agent's mean reward of this step, P_t^(j), over all its B·G responses, and (optional)
        ``task_means`` (agent → task → mean reward over its responses to that task's prompts this step) to the
        per-task windows.

        Raises ``ValueError`` (and changes nothing) if a value is not finite.
        """
        bad = {a: v for a, v in step_means.items() if not math.isfinite(float(v))}
        bad |= {f"{a}/{t}": v for a, per in (task_means or {}).items() for t, v in per.items()
                if not math.isfinite(float(v))}
        if bad:
            raise ValueError(f"step mean rewards must be finite, got {bad}")
        for agent, value in step_means.items():
            self._history.setdefault(agent, deque(maxlen=self.window)).append(float(value))
        for agent, per in (task_means or {}).items():
            for task, value in per.items():
                self._tasks.setdefault(agent, {}).setdefault(task, deque(maxlen=self.window)).append(float(value))
        self.steps += 1

    def task_capabilities(self, agent: str) -> dict[str, float]:
        """P̂^(agent)(t) for every task t with a value: the floored mean of its per-task window (the extension in
        the module docstring). Empty for an agent without task values."""
        return {t: max(self.floor, sum(v) / len(v)) for t, v in sorted(self._tasks.get(agent, {}).items()) if v}

    @property
    def agents(self) -> list[str]:
        """Sorted agents with at least one value."""
        return sorted(self._history)

    def capability(self, agent: str) -> float:
        """P̂^(agent) = max(floor, mean of the last K step means) (Eq. 9; T7). ``KeyError`` if unknown."""
        values = self._values(agent)
        # P̂_t = (1/K) Σ_{τ=t−K+1..t} P_τ, over the values that exist so far, floored
        return max(self.floor, sum(values) / len(values))

    def ratio(self, source: str, learner: str) -> float:
        """r_{source→learner} = clip(P̂_source / P̂_learner, lo, hi); 1 during warm-up or for source == learner.

        Raises ``KeyError`` for an agent without values.
        """
        p_j, p_k = self.capability(source), self.capability(learner)
        if source == learner or self.steps <= self.warmup_steps:
            return 1.0
        return capability_ratio(p_j, p_k, ratio_clip=self.ratio_clip, floor=self.floor)

    def ratios(self, learner: str) -> dict[str, float]:
        """r_{j→learner} for every known agent j (the learner itself maps to 1.0)."""
        return {source: self.ratio(source, learner) for source in self.agents}

    def state_dict(self) -> dict[str, Any]:
        """Plain-Python state for checkpoints (JSON/TOML serializable)."""
        state = {
            "window": self.window, "floor": self.floor, "warmup_steps": self.warmup_steps,
            "ratio_clip": list(self.ratio_clip), "steps": self.steps,
            "history": {agent: list(values) for agent, values in sorted(self._history.items())},
        }
        if self._tasks:
            state["tasks"] = {a: {t: list(v) for t, v in sorted(per.items())} for a, per in sorted(self._tasks.items())}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output. Raises ``ValueError`` on malformed state or a window mismatch."""
        try:
            window, steps, history = int(state["window"]), int(state["steps"]), state["history"]
            parsed = {str(a): [float(v) for v in vs] for a, vs in dict(history).items()}
            tasks = {str(a): {str(t): [float(v) for v in vs] for t, vs in dict(per).items()}
                     for a, per in dict(state.get("tasks") or {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed capability state: {exc!r}") from exc
        if window != self.window:
            raise ValueError(f"capability state has window {window}, this tracker has {self.window}")
        windows = [*parsed.values(), *(v for per in tasks.values() for v in per.values())]
        if steps < 0 or any(len(v) > window or not all(map(math.isfinite, v)) for v in windows):
            raise ValueError("malformed capability state: negative steps, over-long or non-finite history")
        self.steps = steps
        self._history = {a: deque(vs, maxlen=self.window) for a, vs in parsed.items()}
        self._tasks = {a: {t: deque(vs, maxlen=self.window) for t, vs in per.items()} for a, per in tasks.items()}

    def _values(self, agent: str) -> deque[float]:
        values = self._history.get(agent)
        if not values:
            known = ", ".join(self.agents) or "(none)"
            raise KeyError(f"no capability values for agent {agent!r}; known agents: {known}")
        return values


RatioKey = str | tuple[str, str]
"""A key of a learner's ratio map: a source agent j (r_{j→k}) or ``(j, prompt id)`` (that prompt's r_{j→k}(t))."""


def row_ratio(ratios: Mapping[RatioKey, float], source: str, prompt_id: str) -> float:
    """The ratio of a row of ``source`` on ``prompt_id``: ``ratios[(source, prompt_id)]`` when present (capability
    per task), else ``ratios[source]``, else nan (the caller rejects it)."""
    value = ratios.get((source, prompt_id))
    return ratios.get(source, math.nan) if value is None else value


def task_ratios(global_ratios: Mapping[str, float], task_caps: Mapping[str, Mapping[str, float]], learner: str,
                prompt_tasks: Mapping[str, str], *, ratio_clip: tuple[float, float] = (0.1, 10.0),
                floor: float = CAPABILITY_FLOOR) -> dict[RatioKey, float]:
    """``global_ratios`` plus ``(j, prompt id) → r_{j→k}(t)`` for every source j of ``global_ratios`` and every
    prompt whose task t (``prompt_tasks``: prompt id → task, empty = none) has a P̂(t) for both j and the learner k
    in ``task_caps`` (agent → task → P̂(t)); other prompts keep r_{j→k} (the extension in the module docstring).

    Raises ``ValueError`` for a non-finite capability or bad clip bounds (:func:`capability_ratio`).
    """
    out: dict[RatioKey, float] = dict(global_ratios)
    mine = task_caps.get(learner, {})
    for j in global_ratios:
        theirs = task_caps.get(j, {})
        for pid, task in prompt_tasks.items():
            if task and task in mine and task in theirs:
                # r_{j→k}(t) = clip(P̂_j(t) / P̂_k(t), lo, hi)
                out[(j, pid)] = capability_ratio(theirs[task], mine[task], ratio_clip=ratio_clip, floor=floor)
    return out
