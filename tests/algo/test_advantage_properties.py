"""Hypothesis properties of the advantage estimator over random N-agent group layouts (spec §2, §12)."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hacrl_fed.algo.advantages import AdvantageInputs, group_advantages, group_advantages_reference, row_advantages
from hacrl_fed.algo.capability import capability_ratio
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.algo.registry import ADVANTAGE_ESTIMATORS

SETTINGS = settings(max_examples=80, deadline=None)


@st.composite
def layouts(draw, binary: bool | None = None):
    """N = 2…5 agents, P prompts, G (or a random count) responses per agent, rewards in [0, 1],
    capabilities in [0, 1] turned into ratios r_{j→k}; rows shuffled, group ids non-contiguous."""
    n = draw(st.integers(2, 5))
    p = draw(st.integers(1, 4))
    g = draw(st.integers(1, 4))
    equal = draw(st.booleans())
    caps = draw(st.lists(st.floats(0, 1), min_size=n, max_size=n))
    binary = draw(st.booleans()) if binary is None else binary
    reward = st.sampled_from([0.0, 1.0]) if binary else st.floats(0, 1)
    rows = []
    for q in range(p):
        for j in range(n):
            count = g if equal else draw(st.integers(1 if j == 0 else 0, 4))
            for _ in range(count):
                rows.append((3 * q + 7, j, draw(reward)))
    random.Random(draw(st.integers(0, 1000))).shuffle(rows)
    ratio = [capability_ratio(caps[j], caps[0]) for j in range(n)]
    return rows, ratio


def as_inputs(rows, ratio):
    return AdvantageInputs(
        rewards=torch.tensor([r for _, _, r in rows], dtype=torch.float64),
        group_index=torch.tensor([q for q, _, _ in rows]),
        source_ratio=torch.tensor([ratio[j] for _, j, _ in rows], dtype=torch.float64),
        is_own=torch.tensor([j == 0 for _, j, _ in rows]))


@SETTINGS
@given(layouts())
def test_finite_and_shaped(layout):
    rows, ratio = layout
    adv = ADVANTAGE_ESTIMATORS.get("hacpo")(as_inputs(rows, ratio), AlgoConfig())
    assert adv.shape == (len(rows),) and adv.dtype == torch.float64
    assert bool(torch.isfinite(adv).all())


@SETTINGS
@given(layouts(), st.booleans(), st.sampled_from(["group", "batch", "none"]))
def test_vectorized_equals_loop_reference(layout, capability_weighted, scaling):
    rows, ratio = layout
    inputs = as_inputs(rows, ratio)
    weight = (1 / inputs.source_ratio) if capability_weighted else torch.ones(len(rows), dtype=torch.float64)
    fast = group_advantages(inputs.rewards, inputs.group_index, weight, inputs.is_own, scaling=scaling).tolist()
    slow = group_advantages_reference(inputs.rewards.tolist(), inputs.group_index.tolist(), weight.tolist(),
                                      inputs.is_own.tolist(), scaling=scaling)
    assert fast == pytest.approx(slow, abs=1e-9)


@SETTINGS
@given(layouts(binary=True), st.sampled_from([0.0, 1.0]))
def test_uniform_groups_are_exactly_zero(layout, value):
    rows, ratio = layout
    rows = [(q, j, value) if q == 7 else (q, j, r) for q, j, r in rows]   # prompt 0 made uniform
    adv = ADVANTAGE_ESTIMATORS.get("hacpo")(as_inputs(rows, ratio), AlgoConfig()).tolist()
    group = [a for a, (q, _, _) in zip(adv, rows, strict=True) if q == 7]
    if len(group) > 1:
        assert all(a == 0.0 for a in group)
    else:                                          # a lone response: μ = 0, σ = 1 (spec §12)
        assert group == [value / (1 + 1e-6)]


@SETTINGS
@given(layouts(binary=True))
def test_equal_capabilities_reduce_to_joint_grpo(layout):
    rows, _ = layout
    inputs = as_inputs(rows, [1.0] * 5)
    hacpo = ADVANTAGE_ESTIMATORS.get("hacpo")(inputs, AlgoConfig())
    plain = ADVANTAGE_ESTIMATORS.get("grpo")(inputs, AlgoConfig())
    assert torch.equal(hacpo, plain)


def test_guard_without_own_rows_raises_in_both_implementations():
    rewards, groups, weight, own = [1.0, 1.0, 0.0], [0, 0, 0], [3.0, 3.0, 3.0], [False] * 3
    with pytest.raises(ValueError, match="no own row"):
        group_advantages(torch.tensor(rewards), torch.tensor(groups), torch.tensor(weight), torch.tensor(own))
    with pytest.raises(ValueError):
        group_advantages_reference(rewards, groups, weight, own)


def test_group_of_size_one():
    adv = group_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.ones(2), torch.ones(2, dtype=bool))
    assert adv.tolist() == pytest.approx([1 / (1 + 1e-6), 0.0], abs=1e-12)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([math.nan]), torch.tensor([0]), torch.ones(1), torch.ones(1, dtype=bool))
    with pytest.raises(ValueError, match="> 0"):
        group_advantages(torch.tensor([1.0]), torch.tensor([0]), torch.zeros(1), torch.ones(1, dtype=bool))
    with pytest.raises(ValueError, match="1-D"):
        group_advantages(torch.tensor([1.0]), torch.tensor([0, 0]), torch.ones(1), torch.ones(1, dtype=bool))


class Row:
    def __init__(self, prompt_id, source, reward, learner="k", sample_index=0):
        self.prompt_id, self.source_agent, self.reward = prompt_id, source, reward
        self.is_own, self.sample_index = source == learner, sample_index


def test_row_advantages_groups_by_prompt_and_applies_ratios():
    rows = [Row("p", "k", r) for r in (1, 0, 1, 0)] + [Row("p", "j", r) for r in (1, 1, 1, 0)]
    rows += [Row("q", "k", 1.0), Row("q", "j", 0.0)]
    adv = row_advantages(rows, {"j": 2.0}, AlgoConfig(), learner="k")
    assert adv[0] == pytest.approx(1.086851, abs=1e-6) and adv[1] == pytest.approx(-0.845329, abs=1e-6)  # T1
    no_adv = row_advantages(rows, {"j": 2.0}, AlgoConfig.preset("hacpo_no_adv"), learner="k")
    assert no_adv[0] == pytest.approx(0.724567, abs=1e-6)                                              # T3
    with pytest.raises(ValueError, match="capability ratio"):
        row_advantages(rows, {}, AlgoConfig(), learner="k")
    with pytest.raises(ValueError, match="isolated"):
        row_advantages(rows, {"j": 2.0}, AlgoConfig.preset("gspo"), learner="k")
