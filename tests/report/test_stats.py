"""hacrl_fed.report.stats: hand-worked tables, tabulated t quantiles, planning worked by hand, the stratified
bootstrap's strata, and simulated coverage of the t interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hacrl_fed.report import stats

# Table 1 (seeds × items), paired differences A − B:
#     [[1, 0, 1],
#      [0, 0, 1]]
# grand mean 3/6 = 0.5; seed means 2/3, 1/3; item means 0.5, 0, 1.
# SS_seed = 3·((1/6)² + (1/6)²) = 1/6, df 1 → MS_seed = 1/6
# SS_item = 2·(0² + 0.5² + 0.5²) = 1, df 2 → MS_problem = 1/2
# residuals d − row − col + grand: [[1/3, −1/6, −1/6], [−1/3, 1/6, 1/6]] → SS = 2·(1/9 + 1/36 + 1/36) = 1/3,
# df 2 → MS_resid = 1/6.  (Check: total SS Σ(d − 0.5)² = 6·0.25 = 1.5 = 1/6 + 1 + 1/3.)
# σ²_resid = 1/6, σ²_seed = max(0, (1/6 − 1/6)/3) = 0, σ²_problem = (1/2 − 1/6)/2 = 1/6.
# Var(mean) at n = 2, m = 3: 0/2 + (1/6)/3 + (1/6)/6 = 1/12 → SE = 0.288675.
# 95 % interval: 0.5 ± t_{0.975,1} · SE = 0.5 ± 12.7062 · 0.288675 = 0.5 ± 3.66797.
# MDE (80 %, 5 %): (12.7062 + 1.37638) · 0.288675 = 4.06531.
TABLE_1 = [[1, 0, 1], [0, 0, 1]]

# Table 2:
#     [[1, 1, 1],
#      [0, 0, 1]]
# grand 4/6 = 2/3; seed means 1, 1/3; item means 0.5, 0.5, 1.
# SS_seed = 3·((1/3)² + (1/3)²) = 2/3 → MS 2/3; SS_item = 2·(1/36 + 1/36 + 4/36) = 1/3 → MS 1/6;
# residuals [[1/6, 1/6, −1/3], [−1/6, −1/6, 1/3]] → SS 1/3 → MS_resid 1/6.
# σ²_resid = 1/6, σ²_seed = (2/3 − 1/6)/3 = 1/6, σ²_problem = max(0, (1/6 − 1/6)/2) = 0.
# Var(mean) at n = 2, m = 3: (1/6)/2 + 0 + (1/6)/6 = 1/9 → SE = 1/3.
TABLE_2 = [[1, 1, 1], [0, 0, 1]]


def test_components_of_table_1_by_hand():
    c = stats.variance_components(TABLE_1)
    assert (c.n, c.m) == (2, 3)
    assert c.ms_seed == pytest.approx(1 / 6)
    assert c.ms_problem == pytest.approx(1 / 2)
    assert c.ms_resid == pytest.approx(1 / 6)
    assert (c.seed, c.problem, c.resid) == pytest.approx((0.0, 1 / 6, 1 / 6))
    assert stats.var_of_mean(c, 2, 3) == pytest.approx(1 / 12)


def test_components_of_table_2_by_hand():
    c = stats.variance_components(TABLE_2)
    assert (c.seed, c.problem, c.resid) == pytest.approx((1 / 6, 0.0, 1 / 6))
    assert stats.var_of_mean(c, 2, 3) == pytest.approx(1 / 9)
    # the formula at another design: n = 4, m = 6 → (1/6)/4 + 0 + (1/6)/24 = 7/144
    assert stats.var_of_mean(c, 4, 6) == pytest.approx(7 / 144)


def test_paired_analysis_of_table_1_by_hand():
    r = stats.paired_analysis(TABLE_1)
    assert r.mean == pytest.approx(0.5)
    assert r.per_seed == pytest.approx((2 / 3, 1 / 3))
    assert r.df == 1
    assert r.se == pytest.approx(math.sqrt(1 / 12))
    assert (r.low, r.high) == pytest.approx((0.5 - 3.66797, 0.5 + 3.66797), abs=1e-4)
    assert r.mde == pytest.approx(4.06531, abs=1e-4)


def test_differences_from_two_recipes_and_alignment():
    # recipe a and b by seed → item; seed 2 only in a, item "z" missing at seed 1 of b: both left out
    a = {0: {"x": 1, "y": 0, "z": 1}, 1: {"x": 1, "y": 1, "z": 0}, 2: {"x": 0, "y": 0, "z": 0}}
    b = {0: {"x": 0, "y": 0, "z": 1}, 1: {"x": 1, "y": 0}}
    seeds, items, ta, tb = stats.align(a, b)
    assert seeds == [0, 1] and items == ["x", "y"]
    assert stats.paired_differences(ta, tb).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    _, items, ta, _ = stats.align(a, b, only={"y"}, value=lambda v: 10 * v)
    assert items == ["y"] and ta.tolist() == [[0.0], [10.0]]


def test_bad_input_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="shape"):
        stats.paired_differences([[1, 0]], [[1, 0, 1]])
    with pytest.raises(ValueError, match="2-D"):
        stats.variance_components([1, 0, 1])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        stats.variance_components([[1, 0, 1]])
    with pytest.raises(ValueError, match="non-finite"):
        stats.paired_analysis([[1, float("nan")], [0, 1]])
    with pytest.raises(ValueError, match="at least 2 seeds"):
        stats.mde(stats.variance_components(TABLE_1), 1, 10)


def test_one_seed_gives_a_mean_and_no_interval():
    r = stats.paired_analysis([[1, 0, 1, 1]])
    assert r.mean == pytest.approx(0.75)
    assert math.isnan(r.low) and math.isnan(r.high) and math.isnan(r.mde) and r.components is None


@pytest.mark.parametrize("p,df,expected", [
    # printed t tables (e.g. Abramowitz & Stegun table 26.10)
    (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 3, 3.1824), (0.975, 10, 2.2281), (0.975, 30, 2.0423),
    (0.8, 1, 1.3764), (0.8, 2, 1.0607), (0.8, 9, 0.8834), (0.975, math.inf, 1.95996), (0.8, math.inf, 0.84162),
])
def test_t_quantiles_match_the_tables(p, df, expected):
    assert stats.t_quantile(p, df) == pytest.approx(expected, abs=1e-4)


def test_mde_multiplier_is_2_80_on_the_normal_and_14_08_on_one_degree_of_freedom():
    assert stats.mde_multiplier(math.inf) == pytest.approx(2.8016, abs=1e-4)
    assert stats.mde_multiplier(1) == pytest.approx(12.7062 + 1.3764, abs=1e-3)


def test_seeds_for_and_the_floor_set_by_the_items():
    c = stats.Components(seed=0.01, problem=0.25, resid=0.0, n=2, m=128, ms_seed=0, ms_problem=0, ms_resid=0)
    # at m = 128 the problem term alone gives MDE ≥ 2.8016 · √(0.25/128) = 0.1238: 10 points is never reached
    assert stats.seeds_for(c, 128, 0.10) is None
    # at m = 10 000 the problem term is √(0.25/1e4) = 0.005; seed term 0.1/√n; n = 11:
    # (2.2281 + 0.8791) · √(0.01/11 + 0.25/1e4) = 3.1072 · 0.03056 = 0.0950 ≤ 0.1, while n = 10:
    # (2.2622 + 0.8834) · √(0.001 + 0.000025) = 3.1456 · 0.03202 = 0.1007 > 0.1
    assert stats.seeds_for(c, 10_000, 0.10) == 11


def test_plan_seed_term_only_by_hand():
    # σ²_seed = 0.01, nothing else: MDE(n) = k(n) · 0.1/√n, target 0.1.
    # n = 9: (2.3060 + 0.8889)/3 = 1.0650 → 0.1065 > 0.1; n = 10: (2.2622 + 0.8834)/√10 = 0.9947 → 0.0995 ≤ 0.1.
    # Items do not help, so m is the smallest step (4); cost = 10 · (50 + 4 · 1) = 540.
    c = stats.Components(seed=0.01, problem=0.0, resid=0.0, n=2, m=4, ms_seed=0, ms_problem=0, ms_resid=0)
    p = stats.plan(c, 0.1, cost_seed=50, cost_item=1, m_step=4)
    assert (p.n, p.m, p.cost) == (10, 4, 540)
    assert p.mde == pytest.approx(0.09947, abs=1e-4)


def test_plan_problem_term_only_by_hand():
    # σ²_problem = 0.25, nothing else: MDE = k(n) · 0.5/√m ≤ 0.1  ⇔  m ≥ (5 · k(n))²; cost = n · (100 + m).
    # n = 2: k = 14.0826 → m = 4958, cost 10 116;  n = 3: k = 5.3633 → m = 720, cost 2 460;
    # n = 4: k = 4.1609 → m = 433, cost 2 132;     n = 5: k = 3.7174 → m = 346, cost 2 230;
    # n = 6: k = 3.4901 → m = 305, cost 2 430; more seeds only cost more (m ≥ (5 · 2.80)² = 196 for every n).
    c = stats.Components(seed=0.0, problem=0.25, resid=0.0, n=2, m=4, ms_seed=0, ms_problem=0, ms_resid=0)
    p = stats.plan(c, 0.1, cost_seed=100, cost_item=1)
    assert (p.n, p.m, p.cost) == (4, 433, 2132)
    assert p.mde <= 0.1 < stats.mde(c, 4, 432)


def test_plan_none_when_out_of_range():
    c = stats.Components(seed=0.0, problem=0.25, resid=0.0, n=2, m=4, ms_seed=0, ms_problem=0, ms_resid=0)
    assert stats.plan(c, 0.1, cost_seed=100, cost_item=1, m_max=100) is None


def test_iqm_by_hand():
    # 6 scores sorted 0.1 0.2 0.3 0.4 0.5 100; ⌊0.25 · 6⌋ = 1 cut from each end → mean(0.2, 0.3, 0.4, 0.5) = 0.35
    assert stats.iqm([[0.1, 0.2], [0.3, 0.4], [0.5, 100.0]]) == pytest.approx(0.35)
    # 8 scores 1..8: cut 2 from each end → mean(3, 4, 5, 6) = 4.5
    assert stats.iqm(np.arange(1, 9).reshape(4, 2)) == pytest.approx(4.5)


def test_bootstrap_resamples_runs_within_each_task():
    # task 0 scores 0 at both runs, task 1 scores 10 and 20. Within-task resampling keeps task 0 at 0 and
    # task 1's two draws in {10, 20}: the mean of the 4 values is one of 5, 7.5, 10 (an unstratified bootstrap
    # could draw four zeros).
    scores = np.array([[0.0, 10.0], [0.0, 20.0]])
    boots = stats.stratified_bootstrap(scores, np.mean, reps=500, seed=1)
    assert set(np.round(boots, 6)) <= {5.0, 7.5, 10.0}
    assert {5.0, 7.5, 10.0} <= set(np.round(boots, 6))


def test_bootstrap_interval_collapses_when_runs_agree_and_pairing_cancels():
    # both runs alike: every resample is the table itself; sorted 0.2 0.2 0.4 0.4 0.9 0.9, one cut from each
    # end → mean(0.2, 0.4, 0.4, 0.9) = 0.475
    scores = np.array([[0.2, 0.4, 0.9], [0.2, 0.4, 0.9]])
    assert stats.bootstrap_interval(scores, reps=200) == pytest.approx((0.475, 0.475, 0.475))
    noisy = np.array([[0.1, 0.5, 0.7, 0.2], [0.3, 0.6, 0.2, 0.9], [0.8, 0.1, 0.4, 0.4]])
    assert stats.bootstrap_interval(noisy, other=noisy, reps=200) == pytest.approx((0.0, 0.0, 0.0))
    point, lo, hi = stats.bootstrap_interval(noisy, reps=500)
    assert point == pytest.approx(stats.iqm(noisy)) and lo < point < hi


def _simulate(rng, n, m, mu, sd_seed, sd_problem, sd_resid):
    return (mu + rng.normal(0, sd_seed, (n, 1)) + rng.normal(0, sd_problem, (1, m))
            + rng.normal(0, sd_resid, (n, m)))


@pytest.mark.parametrize("n,m,sd_seed,sd_problem,sd_resid", [
    (2, 30, 0.10, 0.0, 0.01),   # the seed term dominates: the t on n − 1 = 1 degree of freedom is exact
    (5, 40, 0.10, 0.08, 0.20),  # mixed: slightly conservative
    (10, 20, 0.02, 0.10, 0.10),  # the problem term dominates: conservative (its own df are m − 1)
])
def test_t_interval_covers_about_95_percent(n, m, sd_seed, sd_problem, sd_resid):
    # seeds, problems and residual drawn afresh each time; the true mean difference is 0.1
    rng = np.random.default_rng(20211)
    reps, hit, hit_z = 2000, 0, 0
    for _ in range(reps):
        r = stats.paired_analysis(_simulate(rng, n, m, 0.1, sd_seed, sd_problem, sd_resid))
        hit += r.low <= 0.1 <= r.high
        hit_z += abs(r.mean - 0.1) <= 1.96 * r.se
    assert 0.93 <= hit / reps <= 0.98
    if n == 2:
        # the normal quantile on two seeds (the method of the old power sentences) covers far less
        assert hit_z / reps < 0.85


def test_the_fast_iqm_bootstrap_equals_the_general_one():
    # the vectorised path for stats.iqm against the per-replicate loop over a statistic that computes the same IQM
    rng = np.random.default_rng(3)
    a, b = rng.random((3, 5)), rng.random((3, 5))
    slow = stats.stratified_bootstrap(a, lambda x: stats.iqm(x), other=b, reps=300, seed=7)
    fast = stats.stratified_bootstrap(a, other=b, reps=300, seed=7)
    assert fast.shape == (300,) and np.allclose(slow, fast)


def test_items_analysis_by_hand():
    """One run per side, 8 items: D = 1 on 3 items, 0 on 5; mean 3/8, var (ddof 1) = 1.875/7, SE = √(var/8);
    t_{0.975, 7} = 2.364624, t_{0.80, 7} = 0.896030 (tables)."""
    r = stats.items_analysis([1, 0, 0, 1, 1, 0, 0, 0])
    se = math.sqrt(1.875 / 7 / 8)
    assert (r.mean, r.df, r.n, r.m) == (0.375, 7, 1, 8) and r.se == pytest.approx(se)
    assert (r.low, r.high) == pytest.approx((0.375 - 2.364624 * se, 0.375 + 2.364624 * se), abs=1e-5)
    assert r.mde == pytest.approx((2.364624 + 0.896030) * se, abs=1e-5)
    assert r.components is None and math.isnan(stats.items_analysis([1]).se)
    with pytest.raises(ValueError, match="level"):
        stats.items_analysis([1, 0], level=1.5)
