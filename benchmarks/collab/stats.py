"""The collaboration benchmark's comparisons of two recipes, through :mod:`hacrl_fed.report.stats` (the one
statistics module: paired differences by seed and problem, the two-way variance model, t intervals on the seeds'
degrees of freedom, minimum detectable effects). Inputs are cell records (``{"seed": …, "after": {agent: {eval
set: {problem id: entry}}}}``); outputs are fractions (0.05 = 5 points)."""

from __future__ import annotations

import math

from hacrl_fed.report import stats

from collab.scoring import accuracy, is_correct

TARGET = 0.05
"""The effect the power columns ask about: 5 points."""


def paired(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str, *, only: set[str] | None = None,
           value=is_correct) -> stats.PairedResult | None:
    """Recipe a − recipe b for ``agent`` on ``eval_set``, paired by seed and problem (the seeds both have, the
    problems every one of them has, within ``only`` when given): :func:`hacrl_fed.report.stats.paired_analysis`
    of the difference table; ``value=reward_of`` compares the mean episode reward. None when nothing pairs."""
    _, items, a, b = stats.align({c["seed"]: c["after"][agent][eval_set] for c in cells_a},
                                 {c["seed"]: c["after"][agent][eval_set] for c in cells_b},
                                 value=lambda v: float(value(v)), only=only)
    if not items:
        return None
    return stats.paired_analysis(stats.paired_differences(a, b))


def paired_interval(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str, *,
                    only: set[str] | None = None, value=is_correct) -> tuple[float, float, float]:
    """Mean difference a − b and its 95 % t interval on the seeds' degrees of freedom (:func:`paired`):
    ``(mean, low, high)``; the bounds are None with one paired seed (no interval), all three nan when nothing
    pairs."""
    r = paired(cells_a, cells_b, agent, eval_set, only=only, value=value)
    if r is None:
        return (float("nan"),) * 3
    return (r.mean, None, None) if r.n < 2 else (r.mean, r.low, r.high)


def paired_mde(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str) -> dict:
    """The power of the comparison a − b as run: ``seeds`` n, ``problems`` m, the standard deviations of the
    seed, problem and residual components, the minimum detectable effect at n and m (80 % power, two-sided 5 %),
    ``seeds_for_5_points`` at the same m (None when no number of seeds reaches it) and ``floor``, the MDE that
    the m problems alone leave with unlimited seeds. ``None`` values below 2 paired seeds."""
    r = paired(cells_a, cells_b, agent, eval_set)
    n, m = (r.n, r.m) if r else (0, 0)
    out = {"seeds": n, "problems": m, "sd_seed": None, "sd_problem": None, "sd_resid": None, "mde": None,
           "seeds_for_5_points": None, "floor": None}
    if r is None or r.components is None:
        return out
    c = r.components
    return out | {"sd_seed": math.sqrt(c.seed), "sd_problem": math.sqrt(c.problem), "sd_resid": math.sqrt(c.resid),
                  "mde": r.mde, "seeds_for_5_points": stats.seeds_for(c, m, TARGET),
                  "floor": stats.mde_multiplier(math.inf) * math.sqrt(c.problem / m)}


def task_table(cells: list[dict], agent: str, eval_set: str, tasks: dict[str, set[str]], seeds: list) -> list[list[float]]:
    """Accuracy per (seed, task): rows the ``seeds`` (in order), columns the ``tasks`` (name → problem ids)."""
    by = {c["seed"]: c["after"][agent][eval_set] for c in cells}
    return [[accuracy(by[s], ids) for ids in tasks.values()] for s in seeds]


def iqm_vs(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str, tasks: dict[str, set[str]], *,
           reps: int = 2000) -> dict | None:
    """The second view of a − b on a task suite: the interquartile mean of the (seed × task) accuracies of each
    recipe (:func:`hacrl_fed.report.stats.iqm`) and the difference of the two with a 95 % percentile interval
    of the stratified bootstrap (runs resampled within each task, the same draws for both recipes: paired by
    seed; Agarwal et al. 2021). None below 2 paired seeds or without tasks."""
    seeds = sorted({c["seed"] for c in cells_a} & {c["seed"] for c in cells_b})
    if len(seeds) < 2 or not tasks:
        return None
    a, b = task_table(cells_a, agent, eval_set, tasks, seeds), task_table(cells_b, agent, eval_set, tasks, seeds)
    point, lo, hi = stats.bootstrap_interval(a, other=b, reps=reps, seed=0)
    return {"seeds": len(seeds), "tasks": len(tasks), "iqm": stats.iqm(a), "iqm_base": stats.iqm(b),
            "diff": (point, lo, hi)}
