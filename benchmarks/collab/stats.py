"""The statistics of the collaboration benchmark: paired bootstrap intervals of a difference between two recipes,
the noise of one recipe over seeds and the minimum detectable effect of a paired comparison. Inputs are cell
records (``{"seed": …, "after": {agent: {eval set: {problem id: entry}}}}``); outputs are fractions (0.05 = 5
points)."""

from __future__ import annotations

import math
import random
import statistics

from collab.scoring import accuracy, is_correct


def paired_interval(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str, *,
                    reps: int = 2000, seed: int = 0, only: set[str] | None = None,
                    value=is_correct) -> tuple[float, float, float]:
    """Mean and 95 % bootstrap interval of accuracy(a) − accuracy(b), paired by seed and problem (over the
    problems in ``only`` when given); ``value=reward_of`` compares the mean episode reward instead.

    Seeds present in both and problems present in both are paired; the bootstrap resamples seeds, then
    problems (two-level), so both the training randomness and the problem sample count. Returns
    ``(mean, low, high)`` in accuracy units (nan when nothing pairs).
    """
    by_a = {c["seed"]: c["after"][agent][eval_set] for c in cells_a}
    by_b = {c["seed"]: c["after"][agent][eval_set] for c in cells_b}
    seeds = sorted(set(by_a) & set(by_b))
    if not seeds:
        return float("nan"), float("nan"), float("nan")
    common = set.intersection(*(set(by_a[s]) & set(by_b[s]) for s in seeds))
    problems = sorted(common & only if only else common)
    if not problems:
        return float("nan"), float("nan"), float("nan")
    diff = {s: [float(value(by_a[s][p])) - float(value(by_b[s][p])) for p in problems] for s in seeds}
    mean = statistics.fmean(x for s in seeds for x in diff[s])
    rng = random.Random(seed)
    boots = []
    for _ in range(reps):
        ss = [rng.choice(seeds) for _ in seeds]
        idx = [rng.randrange(len(problems)) for _ in problems]
        boots.append(statistics.fmean(diff[s][i] for s in ss for i in idx))
    boots.sort()
    return mean, boots[int(0.025 * reps)], boots[int(0.975 * reps) - 1]


def noise(cells: list[dict], agent: str, eval_set: str) -> dict:
    """Noise of one recipe's accuracy for one agent (``cells``: its seeds): ``sd_between``, the standard deviation
    of the accuracy over seeds as observed; ``sd_eval``, the evaluation (binomial) standard deviation of one cell
    with n problems; ``sd_seed``, the larger of the two (a seed's accuracy holds its evaluation noise, so two
    seeds that happen to agree do not make the design noiseless); and the minimum detectable effect (80 % power,
    two-sided 5 %) of a difference between two recipes with as many seeds, paired by seed and problem:
    MDE = (z_0.975 + z_0.8) · √2 · sd_seed / √S. ``seeds_for_5_points`` solves the same formula for S at
    MDE = 0.05. All are fractions (0.05 = 5 points)."""
    xs = [accuracy(c["after"][agent][eval_set]) for c in cells]
    n = len(cells[0]["after"][agent][eval_set]) if cells else 0
    if len(xs) < 2 or not n:
        return {"seeds": len(xs), "problems": n, "sd_between": None, "sd_seed": None, "sd_eval": None,
                "mde": None, "seeds_for_5_points": None}
    p = statistics.fmean(xs)
    sd_eval = math.sqrt(max(p * (1 - p), 1e-12) / n)
    sd_between = statistics.stdev(xs)
    sd_seed = max(sd_between, sd_eval)
    return {"seeds": len(xs), "problems": n, "sd_between": sd_between, "sd_seed": sd_seed, "sd_eval": sd_eval,
            "mde": (1.96 + 0.8416) * math.sqrt(2) * sd_seed / math.sqrt(len(xs)),
            "seeds_for_5_points": math.ceil(((1.96 + 0.8416) * math.sqrt(2) * sd_seed / 0.05) ** 2)}


def paired_mde(cells_a: list[dict], cells_b: list[dict], agent: str, eval_set: str) -> dict:
    """The minimum detectable effect of recipe a − recipe b as observed: the sd over seeds of the per-seed
    accuracy difference (same seed, same problems), sd_d, and MDE = (z_0.975 + z_0.8) · sd_d / √S (80 % power,
    two-sided 5 %), with the seeds that would detect 5 points. Unlike :func:`noise` this counts what pairing
    by seed removes (a hard seed is hard for both recipes). ``None`` values below 2 paired seeds."""
    by_a = {c["seed"]: accuracy(c["after"][agent][eval_set]) for c in cells_a}
    by_b = {c["seed"]: accuracy(c["after"][agent][eval_set]) for c in cells_b}
    diffs = [by_a[s] - by_b[s] for s in sorted(set(by_a) & set(by_b))]
    if len(diffs) < 2:
        return {"seeds": len(diffs), "sd_diff": None, "mde": None, "seeds_for_5_points": None}
    sd = statistics.stdev(diffs)
    return {"seeds": len(diffs), "sd_diff": sd, "mde": (1.96 + 0.8416) * sd / math.sqrt(len(diffs)),
            "seeds_for_5_points": max(2, math.ceil(((1.96 + 0.8416) * sd / 0.05) ** 2))}
