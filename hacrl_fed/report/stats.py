"""The statistics of a paired benchmark comparison, once: two recipes run at the same seeds and evaluated on
the same items, compared item by item.

Data. One recipe's outcomes form a table ``(n seeds, m items)`` of 0/1 (greedy answer right) or rewards; two
recipes at the same seeds and items give the paired differences ``D = A − B`` (:func:`align`,
:func:`paired_differences`). All quantities are in the units of the outcomes (a fraction for 0/1: 0.05 = 5
points).

Model (two-way crossed random effects, one observation per cell)::

    D_ij = μ + s_i + p_j + e_ij,   s_i ~ (0, σ²_seed), p_j ~ (0, σ²_problem), e_ij ~ (0, σ²_resid)

``s_i`` is what seed i's training run adds to the difference (both recipes share the seed), ``p_j`` how much
item j favours one recipe, ``e_ij`` the rest (the seed × item interaction cannot be told apart from error
without replication). μ is the difference in the population of seeds and items the benchmark samples.

Estimation (:func:`variance_components`): the ANOVA method of moments. With row (seed) means D̄_i., column
(item) means D̄_.j and grand mean D̄.., the mean squares and their expectations are ::

    MS_seed    = m Σ_i (D̄_i. − D̄..)² / (n − 1)                       E = σ²_resid + m σ²_seed
    MS_problem = n Σ_j (D̄_.j − D̄..)² / (m − 1)                       E = σ²_resid + n σ²_problem
    MS_resid   = Σ_ij (D_ij − D̄_i. − D̄_.j + D̄..)² / ((n − 1)(m − 1))  E = σ²_resid

so σ̂²_resid = MS_resid, σ̂²_seed = (MS_seed − MS_resid)/m, σ̂²_problem = (MS_problem − MS_resid)/n, each
truncated at 0 (Searle, Casella & McCulloch, *Variance Components*, Wiley 1992, the two-way crossed
classification without interaction; the same estimators are the variance components of generalizability
theory's crossed two-facet design, Brennan, *Generalizability Theory*, Springer 2001).

Variance of the mean difference over n seeds and m items (every seed evaluates every item; Brennan 2001, the
error variance of a mean over a crossed design's two random facets)::

    Var(D̄..) = σ²_seed / n + σ²_problem / m + σ²_resid / (n · m)          (:func:`var_of_mean`)

Intervals and power (:func:`paired_analysis`, :func:`mde`): D̄.. ± t_{1−α/2, n−1} · SE with SE = √Var(D̄..)
on the seeds' n − 1 degrees of freedom: exact when the seed term dominates, conservative otherwise (the
problem and residual terms have m − 1 and (n − 1)(m − 1) degrees of freedom), and never resting on a seed
variance that two agreeing seeds happen to put near 0 (tests/report/test_stats.py simulates the coverage);
the minimum detectable effect at power 1 − β, two-sided α, is
MDE = (t_{1−α/2, ν} + t_{1−β, ν}) · SE (Bloom, "Minimum detectable effects", *Evaluation Review* 19(5), 1995).
:func:`plan` finds, from a pilot's components, the cheapest (n, m) whose MDE meets a target.

A second view (:func:`iqm`, :func:`stratified_bootstrap`, :func:`bootstrap_interval`): the interquartile mean
of a ``(runs, tasks)`` score table with a percentile interval from the stratified bootstrap, which resamples
runs with replacement independently within each task (Agarwal et al., "Deep RL at the Edge of the
Statistical Precipice", NeurIPS 2021, arXiv 2108.13264; the ``rliable`` library's ``StratifiedBootstrap`` and
``aggregate_iqm``).

Pure functions over numpy arrays; no I/O. Bad input raises ``ValueError`` with a one-line reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Hashable, Mapping

import numpy as np
from scipy import stats as _sps

__all__ = ["Components", "PairedResult", "Plan", "align", "paired_differences", "variance_components",
           "var_of_mean", "t_quantile", "mde_multiplier", "mde", "paired_analysis", "items_analysis", "seeds_for", "plan",
           "iqm", "stratified_bootstrap", "bootstrap_interval"]

MAX_CELLS = 10_000_000
"""Largest table (seeds × items) accepted: bounds memory and time of every function here."""


@dataclass(frozen=True)
class Components:
    """Variance components of the paired differences (outcome units squared) and the mean squares they
    come from; ``n`` seeds and ``m`` items of the table they were estimated on."""

    seed: float
    problem: float
    resid: float
    n: int
    m: int
    ms_seed: float
    ms_problem: float
    ms_resid: float


@dataclass(frozen=True)
class PairedResult:
    """One paired comparison: ``mean`` difference, its t-based interval ``[low, high]`` at ``level``, ``se``,
    degrees of freedom ``df`` (n − 1), ``mde`` at the n and m run, the per-seed mean differences and the
    components (None below 2 seeds or 2 items, where the interval and MDE are nan)."""

    mean: float
    low: float
    high: float
    se: float
    df: int
    mde: float
    n: int
    m: int
    per_seed: tuple[float, ...]
    components: Components | None


@dataclass(frozen=True)
class Plan:
    """The cheapest design found by :func:`plan`: ``n`` seeds, ``m`` items, its ``cost`` and ``mde``."""

    n: int
    m: int
    cost: float
    mde: float


def _table(x, name: str = "table") -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D (seeds, items), got shape {a.shape}")
    if a.size > MAX_CELLS:
        raise ValueError(f"{name} has {a.size} cells, more than {MAX_CELLS}")
    if a.size and not np.isfinite(a).all():
        raise ValueError(f"{name} holds a non-finite value")
    return a


def align(a_by_seed: Mapping[Hashable, Mapping[Hashable, object]],
          b_by_seed: Mapping[Hashable, Mapping[Hashable, object]], *,
          value: Callable[[object], float] = float, only=None) -> tuple[list, list, np.ndarray, np.ndarray]:
    """Two recipes' outcomes, seed → item → outcome, as two ``(n, m)`` tables over the seeds both have and the
    items every one of those seeds has in both (restricted to ``only`` when given); ``value`` maps an outcome
    to a number (e.g. an outcome string to 0/1). Returns ``(seeds, items, A, B)``, seeds and items sorted."""
    seeds = sorted(set(a_by_seed) & set(b_by_seed), key=repr)
    if not seeds:
        return [], [], np.zeros((0, 0)), np.zeros((0, 0))
    common = set.intersection(*(set(a_by_seed[s]) & set(b_by_seed[s]) for s in seeds))
    if only is not None:
        common &= set(only)
    items = sorted(common, key=repr)
    if len(seeds) * len(items) > MAX_CELLS:
        raise ValueError(f"{len(seeds)} seeds × {len(items)} items is more than {MAX_CELLS} cells")
    a = np.array([[float(value(a_by_seed[s][i])) for i in items] for s in seeds], dtype=float).reshape(
        len(seeds), len(items))
    b = np.array([[float(value(b_by_seed[s][i])) for i in items] for s in seeds], dtype=float).reshape(
        len(seeds), len(items))
    return seeds, items, a, b


def paired_differences(a, b) -> np.ndarray:
    """``A − B`` for two ``(n seeds, m items)`` tables of the same shape (same seeds, same items in order)."""
    a, b = _table(a, "A"), _table(b, "B")
    if a.shape != b.shape:
        raise ValueError(f"tables differ in shape: {a.shape} vs {b.shape}")
    return a - b


def variance_components(d) -> Components:
    """ANOVA (method-of-moments) estimates of σ²_seed, σ²_problem, σ²_resid from a ``(n, m)`` table of paired
    differences, n ≥ 2 and m ≥ 2 (module docstring gives the mean squares and their expectations)."""
    d = _table(d, "differences")
    n, m = d.shape
    if n < 2 or m < 2:
        raise ValueError(f"variance components need at least 2 seeds and 2 items, got {n} × {m}")
    grand = d.mean()
    rows, cols = d.mean(axis=1), d.mean(axis=0)
    ms_seed = m * float(((rows - grand) ** 2).sum()) / (n - 1)
    ms_problem = n * float(((cols - grand) ** 2).sum()) / (m - 1)
    resid = d - rows[:, None] - cols[None, :] + grand
    ms_resid = float((resid ** 2).sum()) / ((n - 1) * (m - 1))
    return Components(seed=max(0.0, (ms_seed - ms_resid) / m), problem=max(0.0, (ms_problem - ms_resid) / n),
                      resid=ms_resid, n=n, m=m, ms_seed=ms_seed, ms_problem=ms_problem, ms_resid=ms_resid)


def var_of_mean(c: Components, n: int, m: int) -> float:
    """σ²_seed/n + σ²_problem/m + σ²_resid/(n·m): the variance of a mean difference over n seeds and m items."""
    if n < 1 or m < 1:
        raise ValueError(f"n and m must be ≥ 1, got n={n}, m={m}")
    return c.seed / n + c.problem / m + c.resid / (n * m)


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (``df = inf``: the normal)."""
    if not 0 < p < 1:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    return float(_sps.norm.ppf(p)) if math.isinf(df) else float(_sps.t.ppf(p, df))


def mde_multiplier(df: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """t_{1−α/2, df} + t_{power, df}: the MDE in standard errors (2.80 on the normal at 5 % and 80 %)."""
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    return t_quantile(1 - alpha / 2, df) + t_quantile(power, df)


def mde(c: Components, n: int, m: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Minimum detectable effect of a paired difference over n ≥ 2 seeds and m items, two-sided ``alpha``,
    ``power``: (t_{1−α/2, n−1} + t_{power, n−1}) · √Var(D̄..) (Bloom 1995), outcome units."""
    if n < 2:
        raise ValueError(f"an MDE needs at least 2 seeds (n − 1 degrees of freedom), got {n}")
    return mde_multiplier(n - 1, alpha, power) * math.sqrt(var_of_mean(c, n, m))


def paired_analysis(d, level: float = 0.95, power: float = 0.8) -> PairedResult:
    """Mean paired difference of a ``(n, m)`` table, its t interval on n − 1 degrees of freedom and the MDE
    (two-sided 1 − ``level``, ``power``) at the n and m of the table. Below 2 seeds or 2 items the interval,
    se and MDE are nan (one seed says nothing about the next)."""
    d = _table(d, "differences")
    n, m = d.shape
    if not d.size:
        raise ValueError("no paired seeds and items")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    mean = float(d.mean())
    per_seed = tuple(float(x) for x in d.mean(axis=1))
    if n < 2 or m < 2:
        nan = float("nan")
        return PairedResult(mean, nan, nan, nan, n - 1, nan, n, m, per_seed, None)
    c = variance_components(d)
    se = math.sqrt(var_of_mean(c, n, m))
    half = t_quantile(1 - (1 - level) / 2, n - 1) * se
    return PairedResult(mean, mean - half, mean + half, se, n - 1, mde(c, n, m, 1 - level, power), n, m,
                        per_seed, c)


def items_analysis(d, level: float = 0.95, power: float = 0.8) -> PairedResult:
    """Mean paired difference of one run per side over ``m`` items (``d`` of shape ``(m,)`` or ``(1, m)``): for a
    comparison with no seed term, e.g. two engines evaluating the same fixed model greedily. The items are the
    only random facet, so SE = sd(D) / √m and the interval and MDE use t on m − 1 degrees of freedom (the
    one-sample paired t). ``components`` is None (σ²_problem and σ²_resid cannot be told apart with one run);
    ``per_seed`` is the one mean. nan below 2 items."""
    d = _table(np.asarray(d, dtype=float).reshape(1, -1), "differences")
    m = d.shape[1]
    if not d.size:
        raise ValueError("no paired items")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    mean = float(d.mean())
    if m < 2:
        nan = float("nan")
        return PairedResult(mean, nan, nan, nan, m - 1, nan, 1, m, (mean,), None)
    var = float(d.var(ddof=1))
    se = math.sqrt(var / m)
    half = t_quantile(1 - (1 - level) / 2, m - 1) * se
    return PairedResult(mean, mean - half, mean + half, se, m - 1, mde_multiplier(m - 1, 1 - level, power) * se,
                        1, m, (mean,), None)


def seeds_for(c: Components, m: int, target: float, *, alpha: float = 0.05, power: float = 0.8,
              n_max: int = 1000) -> int | None:
    """The fewest seeds n ≥ 2 whose MDE at m items is ≤ ``target``; None when none up to ``n_max`` reaches it
    (the problem term σ²_problem/m alone can keep the MDE above the target for every n)."""
    if target <= 0:
        raise ValueError(f"target must be > 0, got {target}")
    for n in range(2, n_max + 1):
        if mde(c, n, m, alpha, power) <= target:
            return n
    return None


def _items_for(c: Components, n: int, target: float, k: float, m_step: int, m_max: int) -> int | None:
    """Fewest items (a multiple of m_step, ≤ m_max) with k·√Var ≤ target at n seeds, or None."""
    room = (target / k) ** 2 - c.seed / n
    if room <= 0:
        return None
    need = (c.problem + c.resid / n) / room
    m = max(m_step, m_step * math.ceil(need / m_step - 1e-12))
    while m > m_step and k * math.sqrt(var_of_mean(c, n, m - m_step)) <= target:
        m -= m_step   # guard against rounding in the closed form
    while m <= m_max and k * math.sqrt(var_of_mean(c, n, m)) > target:
        m += m_step
    return m if m <= m_max else None


def plan(c: Components, target: float, cost_seed: float, cost_item: float, *, alpha: float = 0.05,
         power: float = 0.8, n_max: int = 200, m_max: int = 100_000, m_step: int = 1) -> Plan | None:
    """The cheapest (n, m) whose MDE (:func:`mde`, from pilot components ``c``) is ≤ ``target``.

    Cost model: cost(n, m) = n · (cost_seed + m · cost_item), where ``cost_seed`` is what one seed's training
    costs (every recipe compared) and ``cost_item`` what one item's evaluation costs in one seed's cells (every
    seed evaluates every item). For each n in 2..n_max the fewest items (a multiple of ``m_step``, ≤ ``m_max``)
    come from solving the variance formula for m; the cheapest pair wins (ties: fewer seeds). None when no
    design in range reaches the target."""
    if target <= 0 or cost_seed < 0 or cost_item < 0 or m_step < 1:
        raise ValueError("target must be > 0, costs ≥ 0 and m_step ≥ 1")
    best: Plan | None = None
    for n in range(2, n_max + 1):
        k = mde_multiplier(n - 1, alpha, power)
        m = _items_for(c, n, target, k, m_step, m_max)
        if m is None:
            continue
        cost = n * (cost_seed + m * cost_item)
        if best is None or cost < best.cost:
            best = Plan(n, m, cost, mde(c, n, m, alpha, power))
    return best


def iqm(scores) -> float:
    """Interquartile mean of all scores of a ``(runs, tasks)`` table: the mean of the middle half after
    cutting ⌊0.25·N⌋ of the N values from each end (rliable's ``aggregate_iqm``, ``scipy.stats.trim_mean``)."""
    s = _table(scores, "scores")
    if not s.size:
        raise ValueError("no scores")
    return float(_sps.trim_mean(s, proportiontocut=0.25, axis=None))


def _iqm_rows(x: np.ndarray) -> np.ndarray:
    """:func:`iqm` of every row of a ``(reps, N)`` array (cut ⌊0.25·N⌋ from each end of the sorted row)."""
    n = x.shape[1]
    k = int(0.25 * n)
    return np.sort(x, axis=1)[:, k:n - k].mean(axis=1)


def _resample_indices(rng: np.random.Generator, runs: int, tasks: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.integers(0, runs, size=(runs, tasks)), np.arange(tasks)[None, :]


def stratified_bootstrap(scores, statistic: Callable[[np.ndarray], float] = iqm, *, other=None,
                         reps: int = 2000, seed: int = 0) -> np.ndarray:
    """``reps`` bootstrap replicates of ``statistic`` over a ``(runs, tasks)`` table: each replicate draws, for
    every task independently, ``runs`` runs with replacement (stratified by task; Agarwal et al. 2021). With
    ``other`` (the same shape, the same runs, e.g. the baseline at the same seeds), each replicate is
    statistic(scores*) − statistic(other*) with the same draws for both (paired). Returns shape ``(reps,)``."""
    s = _table(scores, "scores")
    o = None if other is None else _table(other, "other")
    if o is not None and o.shape != s.shape:
        raise ValueError(f"tables differ in shape: {s.shape} vs {o.shape}")
    runs, tasks = s.shape
    if not s.size:
        raise ValueError("no scores")
    if not 1 <= reps <= 100_000 or reps * s.size > 50 * MAX_CELLS:
        raise ValueError(f"reps must be 1..100000 and reps × cells ≤ {50 * MAX_CELLS}, got {reps}")
    rng = np.random.default_rng(seed)
    if statistic is iqm:   # all replicates at once: the same draws and values as the loop below, faster
        rows = rng.integers(0, runs, size=(reps, runs, tasks))
        cols = np.arange(tasks)[None, None, :]
        out = _iqm_rows(s[rows, cols].reshape(reps, -1))
        return out - _iqm_rows(o[rows, cols].reshape(reps, -1)) if o is not None else out
    out = np.empty(reps)
    for r in range(reps):
        idx = _resample_indices(rng, runs, tasks)
        out[r] = statistic(s[idx]) - (statistic(o[idx]) if o is not None else 0.0)
    return out


def bootstrap_interval(scores, statistic: Callable[[np.ndarray], float] = iqm, *, other=None,
                       level: float = 0.95, reps: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Point estimate and percentile interval at ``level`` of ``statistic`` (or of its paired difference with
    ``other``) under :func:`stratified_bootstrap`: ``(point, low, high)``."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    s = _table(scores, "scores")
    point = statistic(s) - (statistic(_table(other, "other")) if other is not None else 0.0)
    boots = stratified_bootstrap(s, statistic, other=other, reps=reps, seed=seed)
    lo, hi = np.quantile(boots, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(point), float(lo), float(hi)
