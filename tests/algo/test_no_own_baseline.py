"""Groups without own rows (asynchronous rounds, docs/async.md): the named ``no_own_baseline`` rule of
:func:`hacrl_fed.algo.advantages.group_advantages`. ``raise`` (the paper) refuses a group whose μ̂ guard fires
while it holds no own row; ``plain_mean`` uses μ̂ := the plain mean of the group's raw rewards there."""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_fed.algo.advantages import ADV_EPS, group_advantages, group_advantages_reference, row_advantages
from hacrl_fed.algo.config import AlgoConfig

# group 0: own rows 1, 0 and one foreign row (ω = 3); group 1: foreign rows only, ω = 3, rewards 1, 1, 0
REWARDS = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
GROUPS = [0, 0, 0, 1, 1, 1]
WEIGHT = [1.0, 1.0, 3.0, 3.0, 3.0, 3.0]
OWN = [True, True, False, False, False, False]


def _fast(rule: str, rewards=REWARDS, groups=GROUPS, weight=WEIGHT, own=OWN) -> list[float]:
    return group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups),
                            torch.tensor(weight, dtype=torch.float64), torch.tensor(own),
                            no_own_baseline=rule).tolist()


def test_plain_mean_baseline_of_a_foreign_only_group_by_hand():
    adv = _fast("plain_mean")
    slow = group_advantages_reference(REWARDS, GROUPS, WEIGHT, OWN, no_own_baseline="plain_mean")
    # group 0: μ̂ = (1 + 0 + 3·1)/3 = 4/3 > 1 ⇒ own mean 1/2 (the paper's guard); σ = stdev(1, 0, 1)
    sigma0 = statistics.stdev([1.0, 0.0, 1.0])
    # group 1: μ̂ = 3·(1 + 1 + 0)/3 = 2 > 1, no own row ⇒ plain mean 2/3; σ = stdev(1, 1, 0)
    sigma1 = statistics.stdev([1.0, 1.0, 0.0])
    by_hand = [0.5 / (sigma0 + ADV_EPS), -0.5 / (sigma0 + ADV_EPS), 0.5 / (sigma0 + ADV_EPS),
               (1 / 3) / (sigma1 + ADV_EPS), (1 / 3) / (sigma1 + ADV_EPS), (-2 / 3) / (sigma1 + ADV_EPS)]
    assert adv == pytest.approx(by_hand, abs=1e-12)
    assert slow == pytest.approx(by_hand, abs=1e-12)
    assert adv[3] == pytest.approx(1 / 3 / math.sqrt(1 / 3), abs=1e-5)     # 0.577…: a positive signal kept
    assert sum(adv[3:]) == pytest.approx(0.0, abs=1e-9)                     # plain mean: the group sums to 0


def test_raise_is_the_default_and_still_raises_in_both_implementations():
    with pytest.raises(ValueError, match="no own row"):
        _fast("raise")
    with pytest.raises(ValueError, match="no own row"):
        group_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), torch.tensor(WEIGHT), torch.tensor(OWN))
    with pytest.raises(ValueError, match="without own rows"):
        group_advantages_reference(REWARDS, GROUPS, WEIGHT, OWN)
    with pytest.raises(ValueError, match="unknown no_own_baseline"):
        _fast("own_mean")
    with pytest.raises(ValueError, match="unknown no_own_baseline"):
        group_advantages_reference(REWARDS, GROUPS, WEIGHT, OWN, no_own_baseline="own_mean")


def test_a_foreign_only_group_whose_guard_does_not_fire_keeps_the_weighted_baseline():
    # ω = 0.5: μ̂ = 0.5·(1 + 1 + 0)/3 = 1/3 ≤ 1 ⇒ Eq. 7 as it is, under either rule
    rewards, groups, weight, own = [1.0, 1.0, 0.0], [0, 0, 0], [0.5] * 3, [False] * 3
    sigma = statistics.stdev(rewards)
    expected = [(r - 1 / 3) / (sigma + ADV_EPS) for r in rewards]
    assert _fast("raise", rewards, groups, weight, own) == pytest.approx(expected, abs=1e-12)
    assert _fast("plain_mean", rewards, groups, weight, own) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.sampled_from([0.0, 1.0]), st.sampled_from([0.5, 1, 3])),
                min_size=1, max_size=14), st.sampled_from(["group", "batch", "none"]))
def test_plain_mean_vectorized_equals_loop_reference(rows, scaling):
    """Random layouts where some groups hold no own row (their guard may fire): both implementations agree."""
    rewards = [r for _, _, r, _ in rows]
    groups = [g for g, _, _, _ in rows]
    own = [o for _, o, _, _ in rows]
    weight = [1.0 if o else float(w) for _, o, _, w in rows]
    fast = group_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups),
                            torch.tensor(weight, dtype=torch.float64), torch.tensor(own), scaling=scaling,
                            no_own_baseline="plain_mean").tolist()
    slow = group_advantages_reference(rewards, groups, weight, own, scaling=scaling, no_own_baseline="plain_mean")
    assert fast == pytest.approx(slow, abs=1e-9)


def test_row_advantages_passes_the_rule_to_the_estimator():
    rows = [SimpleNamespace(prompt_id=f"p{g}", sample_index=i, source_agent="a" if o else "b", is_own=o, reward=r)
            for i, (r, g, o) in enumerate(zip(REWARDS, GROUPS, OWN, strict=True))]
    ratios = {"b": 1 / 3}                          # ω = 1 / r = 3
    with pytest.raises(ValueError, match="no own row"):
        row_advantages(rows, ratios, AlgoConfig(), learner="a")
    adv = row_advantages(rows, ratios, AlgoConfig(), learner="a", no_own_baseline="plain_mean")
    assert adv == pytest.approx(_fast("plain_mean"), abs=1e-9)
