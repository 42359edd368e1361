"""Scoring of the per-problem entries a cell keeps: ``True``/``False`` (arithmetic), an outcome string (task
suites, :data:`OUTCOMES`) or an episode's reward in [0, 1] (multi-turn games)."""

from __future__ import annotations

import statistics


def is_correct(value) -> bool:
    """A per-problem entry of a cell: ``True``/``False`` (arithmetic cells), an outcome string (task cells) or an
    episode's reward in [0, 1] (episode cells: won at 1)."""
    return value is True or value == "correct" or (isinstance(value, float) and value >= 1.0)


def reward_of(value) -> float:
    """An episode cell's entry, its reward in [0, 1] (a partial reward counts how close a lost episode came)."""
    return float(value)


def has_rewards(entries: dict) -> bool:
    """Whether a ``{problem id: entry}`` map holds episode rewards (floats), so a mean reward can be reported."""
    return bool(entries) and all(isinstance(v, float) for v in entries.values())


def mean_reward(entries: dict) -> float:
    """Mean episode reward of a ``{problem id: reward}`` map (nan when empty)."""
    return statistics.fmean(entries.values()) if entries else float("nan")


def accuracy(correct: dict, only: set[str] | None = None) -> float:
    """Share of problems answered correctly in a ``{problem id: correct or outcome}`` map, over ``only`` when
    given (nan when empty)."""
    vals = [is_correct(v) for p, v in correct.items() if only is None or p in only]
    return sum(vals) / len(vals) if vals else float("nan")


OUTCOMES = ("correct", "wrong_answer", "truncated", "no_answer", "verifier_error")
"""What an evaluated response can be (``Federation.evaluate_outcomes``): right; a stated wrong answer; cut at the
token limit; no stated answer; the verifier failed."""


def outcome_mix(outcomes: dict, only: set[str] | None = None) -> dict[str, float] | None:
    """Share of the problems (those in ``only`` when given) of each :data:`OUTCOMES` value, in [0, 1]; None for
    cells without outcome strings (arithmetic cells hold booleans) or without a problem."""
    xs = [v for p, v in outcomes.items() if only is None or p in only]
    if not xs or not all(isinstance(v, str) for v in xs):
        return None
    return {k: sum(v == k for v in xs) / len(xs) for k in OUTCOMES}


def gain_kinds(before: dict, after: dict) -> dict:
    """Problems wrong before and right after, by what was wrong before: ``format`` (truncated or no stated
    answer) or ``content`` (a stated wrong answer, or a verifier error); and problems right before, wrong after,
    by what went wrong after. Needs outcome strings (task cells); ``{}`` for arithmetic cells (booleans)."""
    if not all(isinstance(v, str) for v in [*before.values(), *after.values()]):
        return {}
    out = {"format_fixed": 0, "content_fixed": 0, "format_broken": 0, "content_broken": 0}
    for pid, b in before.items():
        a = after.get(pid)
        if a is None or is_correct(a) == is_correct(b):
            continue
        kind = "format" if (a if is_correct(b) else b) in ("truncated", "no_answer") else "content"
        out[f"{kind}_{'fixed' if is_correct(a) else 'broken'}"] += 1
    return out
