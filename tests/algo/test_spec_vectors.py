"""hacpo-spec §13: the hand-computed vectors T1–T16, to 1e-6."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_fed.algo.advantages import AdvantageInputs, group_advantages_reference
from hacrl_fed.algo.capability import CapabilityTracker, capability_ratio
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.algo.losses import (
    LossInputs,
    compute_loss,
    gspo_objective,
    hacpo_cross_objective,
    low_var_kl,
    sequence_log_ratio,
)
from hacrl_fed.algo.registry import ADVANTAGE_ESTIMATORS
from hacrl_fed.update.loop import plan_minibatches

TOL = 1e-6


def one_group(own, foreign, ratio):
    """AdvantageInputs of one prompt: own rows then foreign rows of one source with r_{j→k} = ratio."""
    n_own, n_f = len(own), len(foreign)
    return AdvantageInputs(
        rewards=torch.tensor(own + foreign, dtype=torch.float64),
        group_index=torch.zeros(n_own + n_f, dtype=torch.long),
        source_ratio=torch.tensor([1.0] * n_own + [ratio] * n_f, dtype=torch.float64),
        is_own=torch.tensor([True] * n_own + [False] * n_f))


def hacpo_adv(inputs, **cfg):
    return ADVANTAGE_ESTIMATORS.get("hacpo")(inputs, AlgoConfig(**cfg)).tolist()


def expect(values, rewards, a1, a0):
    for v, r in zip(values, rewards, strict=True):
        assert v == pytest.approx(a1 if r == 1 else a0, abs=TOL)


def test_t1_learner_weaker():
    own, foreign = [1, 0, 1, 0], [1, 1, 1, 0]
    # P̂_k = 0.4, P̂_j = 0.8 ⇒ r = 2
    r = capability_ratio(0.8, 0.4)
    assert r == pytest.approx(2.0)
    expect(hacpo_adv(one_group(own, foreign, r)), own + foreign, 1.086851, -0.845329)


def test_t2_learner_stronger():
    own, foreign = [1, 1, 1, 0], [1, 0, 1, 0]
    expect(hacpo_adv(one_group(own, foreign, 0.5)), own + foreign, 0.241522, -1.690657)


def test_t3_plain_joint_baseline_differs():
    own, foreign = [1, 0, 1, 0], [1, 1, 1, 0]
    plain = ADVANTAGE_ESTIMATORS.get("grpo")(one_group(own, foreign, 2.0), AlgoConfig()).tolist()
    expect(plain, own + foreign, 0.724567, -1.207612)
    # and the same numbers for the other learner: the plain baseline ignores ω
    plain2 = ADVANTAGE_ESTIMATORS.get("grpo")(one_group(foreign, own, 0.5), AlgoConfig()).tolist()
    expect(plain2, foreign + own, 0.724567, -1.207612)
    assert hacpo_adv(one_group(own, foreign, 2.0))[0] != pytest.approx(plain[0], abs=1e-3)


def test_t4_baseline_guard():
    own, foreign = [1, 1, 1, 0], [1, 1, 0, 1]
    inputs = one_group(own, foreign, 1 / 3)
    expect(hacpo_adv(inputs), own + foreign, 0.540061, -1.620182)
    unguarded = hacpo_adv(inputs, baseline_guard=None)
    expect(unguarded[:1], [1], -1.080121, None)


@pytest.mark.parametrize("value", [0.0, 1.0])
@pytest.mark.parametrize("ratio", [0.1, 0.5, 1.0, 3.0, 10.0])
def test_t5_uniform_group_is_exactly_zero(value, ratio):
    adv = hacpo_adv(one_group([value] * 4, [value] * 4, ratio))
    assert adv == [0.0] * 8


def test_t6_sparse_success():
    own, foreign = [0, 0, 0, 1], [0, 0, 0, 0]
    expect(hacpo_adv(one_group(own, foreign, 2.0)), own + foreign, 2.474867, -0.353552)


def test_t7_capability_window():
    tracker = CapabilityTracker(window=5)
    a = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    b = [0.5, 0.5, 0.6, 0.6, 0.7, 0.8]
    tracker.update({"A": a[0], "B": b[0]})
    assert tracker.capability("A") == pytest.approx(0.1, abs=TOL)
    assert tracker.capability("B") == pytest.approx(0.5, abs=TOL)
    assert tracker.ratio("B", "A") == pytest.approx(5.0, abs=TOL)
    for x, y in zip(a[1:], b[1:], strict=True):
        tracker.update({"A": x, "B": y})
    assert tracker.capability("A") == pytest.approx(0.40, abs=TOL)
    assert tracker.capability("B") == pytest.approx(0.64, abs=TOL)
    assert tracker.ratio("B", "A") == pytest.approx(1.6, abs=TOL)
    assert tracker.ratio("A", "B") == pytest.approx(0.625, abs=TOL)
    assert 1 / tracker.ratio("B", "A") == pytest.approx(0.625, abs=TOL)  # baseline weight


def test_t8_ratio_clipping_and_floor():
    assert capability_ratio(0.5, 0.02) == pytest.approx(10.0)
    assert capability_ratio(0.02, 0.5) == pytest.approx(0.1)
    assert capability_ratio(0.0, 0.0) == 1.0
    tracker = CapabilityTracker(window=5)
    tracker.update({"A": 0.0, "B": 0.0})
    assert tracker.capability("A") == 1e-8 and tracker.ratio("A", "B") == 1.0


def rows_with_ratio(s_target: float, *, l_k: int = 10, l_j: int = 12, logp: float = -1.0):
    """token log-probs [1, l_k+2] (leaf, grad) whose cross ratio against a source sum over l_j tokens is s."""
    t = torch.zeros(1, l_k + 2, dtype=torch.float64)
    t[0, 2:] = logp
    t.requires_grad_(True)
    mask = torch.zeros(1, l_k + 2, dtype=torch.bool)
    mask[0, 2:] = True
    old_sum = torch.tensor([(logp - math.log(s_target)) * l_j], dtype=torch.float64)
    return t, mask, old_sum, torch.tensor([float(l_j)], dtype=torch.float64)


def cross_inputs(s_target, adv, r, m=0):
    t, mask, old_sum, l_j = rows_with_ratio(s_target)
    return t, LossInputs(token_logprobs=t, response_mask=mask, advantages=torch.tensor([adv], dtype=torch.float64),
                         old_logprob_sum=old_sum, old_token_count=l_j, is_own=torch.tensor([False]),
                         capability_ratio=torch.tensor([r], dtype=torch.float64), update_index=m)


def grad_factor(t, objective):
    """d objective / d mean log π_k: every response token gets factor / L_k."""
    (g,) = torch.autograd.grad(objective.sum(), t)
    return float(g[0, 2:].sum())


def test_t9_two_length_ratio():
    t = torch.zeros(1, 101)
    t[0, 1:] = -0.30                                     # Σ = −30 over L_k = 100 tokens
    mask = torch.zeros(1, 101, dtype=torch.bool)
    mask[0, 1:] = True
    log_s = sequence_log_ratio(t, mask, torch.tensor([-26.0]), torch.tensor([104]))
    assert math.exp(float(log_s)) == pytest.approx(0.951229, abs=TOL)
    assert math.exp((-30 + 26) / 100) == pytest.approx(0.960789, abs=TOL)  # the single-length mistake


@pytest.mark.parametrize("alpha,expected", [(1.0, 0.904837), (0.0, 0.951229), (3.0, 0.818731)])
def test_t10_cross_loss_inside_window(alpha, expected):
    s = math.exp(-0.05)                                   # T9's ratio, 0.951229
    t, inputs = cross_inputs(s, adv=0.5, r=2.0)
    terms = hacpo_cross_objective(inputs, AlgoConfig(alpha=alpha))
    assert float(terms.objective.detach()) == pytest.approx(expected, abs=TOL)
    # d objective / d mean log π_k = r·A·s^(1+α)
    assert grad_factor(t, terms.objective) == pytest.approx(expected, abs=TOL)
    out = compute_loss(inputs, AlgoConfig(alpha=alpha, kl_coef=0.0))
    assert float(out.loss.detach()) == pytest.approx(-expected, abs=TOL)


def test_t11_stepwise_schedule():
    cfg = AlgoConfig(cross_clip_delta=0.2, cross_clip_step=0.025)
    assert [cfg.cross_lower_bound(m) for m in range(4)] == pytest.approx([0.8, 0.825, 0.85, 0.875], abs=TOL)
    cfg2 = cfg.model_copy(update={"cross_clip_step": 0.01})
    assert [cfg2.cross_lower_bound(m) for m in range(4)] == pytest.approx([0.80, 0.81, 0.82, 0.83], abs=TOL)
    llama = AlgoConfig(cross_clip_delta=0.1, cross_clip_step=0.01)
    assert [llama.cross_lower_bound(m) for m in range(4)] == pytest.approx([0.90, 0.91, 0.92, 0.93], abs=TOL)
    assert cfg.cross_lower_bound(9) == 1.0
    # m = 9: window [1, 1], every cross row constant r·A, zero gradient
    for s in (0.85, 0.97, 1.2):
        t, inputs = cross_inputs(s, adv=0.7, r=1.5, m=9)
        terms = hacpo_cross_objective(inputs, cfg)
        assert float(terms.objective.detach()) == pytest.approx(1.05, abs=TOL)
        assert grad_factor(t, terms.objective) == 0.0


def test_t12_clamping_zero_gradient():
    cfg = AlgoConfig(alpha=1.0)
    t, inputs = cross_inputs(0.86, adv=1.0, r=1.0, m=3)
    terms = hacpo_cross_objective(inputs, cfg)
    assert float(terms.objective.detach()) == pytest.approx(0.765625, abs=TOL)
    assert grad_factor(t, terms.objective) == 0.0
    t, inputs = cross_inputs(1.03, adv=0.5, r=2.0, m=3)
    terms = hacpo_cross_objective(inputs, cfg)
    assert float(terms.objective.detach()) == pytest.approx(1.0, abs=TOL)
    assert grad_factor(t, terms.objective) == 0.0
    t, inputs = cross_inputs(0.7, adv=-1.0, r=1.0, m=3)   # A < 0 below l: still zero (two-sided clamp)
    terms = hacpo_cross_objective(inputs, cfg)
    assert grad_factor(t, terms.objective) == 0.0


def test_t13_alpha_three_weight():
    t, inputs = cross_inputs(0.9, adv=1.0, r=1.0)
    terms = hacpo_cross_objective(inputs, AlgoConfig(alpha=3.0))
    assert float(terms.objective.detach()) == pytest.approx(0.6561, abs=TOL)
    assert grad_factor(t, terms.objective) == pytest.approx(0.6561, abs=TOL)


@pytest.mark.parametrize("s,adv,value,flows", [
    (1.0005, 1.0, 1.0004, False), (1.0005, -1.0, -1.0005, True),
    (0.9990, 1.0, 0.999, True), (0.9990, -1.0, -0.9997, False)])
def test_t14_gspo_self_term(s, adv, value, flows):
    t, mask, old_sum, l_j = rows_with_ratio(s, l_j=10)
    inputs = LossInputs(token_logprobs=t, response_mask=mask, advantages=torch.tensor([adv]),
                        old_logprob_sum=old_sum, old_token_count=l_j, is_own=torch.tensor([True]),
                        capability_ratio=torch.ones(1))
    terms = gspo_objective(inputs, AlgoConfig())
    assert float(terms.objective.detach()) == pytest.approx(value, abs=TOL)
    assert (grad_factor(t, terms.objective) != 0.0) == flows


def t15_batch(is_own, ref_shift):
    """4 rows × 6 positions: response = positions 2..5; per-row constant token log-probs."""
    logp = torch.tensor([[0, 0, -1.0, -1.0, -1.0, -1.0], [0, 0, -2.0, -2.0, 0, 0],
                         [0, 0, -0.5, -0.5, -0.5, 0], [0, 0, -1.5, -1.5, -1.5, -1.5]], requires_grad=True)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]).bool()
    counts = mask.sum(-1).double()
    old_sum = torch.tensor([-4.0, -4.0, -1.2, -6.3], dtype=torch.float64)
    ref = torch.where(mask, logp.detach() + ref_shift, torch.zeros_like(logp))
    return LossInputs(token_logprobs=logp, response_mask=mask, advantages=torch.tensor([0.5, -1.0, 1.0, 0.3]),
                      old_logprob_sum=old_sum, old_token_count=counts, is_own=torch.tensor(is_own),
                      capability_ratio=torch.tensor([1.0, 1.0, 2.0, 0.5]), ref_token_logprobs=ref)


def test_t15_aggregation_and_kl_masking():
    cfg = AlgoConfig(kl_coef=0.001)
    inputs = t15_batch([True, True, False, False], ref_shift=0.3)
    out = compute_loss(inputs, cfg)
    # own rows: s = 1 ⇒ J = A (0.5, −1.0); cross row 2: s = e^−0.1 ∈ [0.8, 1] ⇒ J = s²·r·A;
    # cross row 3: s = e^0.075 > 1 ⇒ c = 1 ⇒ J = r·A
    a1, a2 = 0.5, -1.0
    b1, b2 = math.exp(-0.1) ** 2 * 2.0 * 1.0, 1.0 * 0.5 * 0.3
    pg = -(a1 + a2 + b1 + b2) / 4
    # k3 per own token with d = ref − logp = 0.3: exp(0.3) − 0.3 − 1
    k3 = math.exp(0.3) - 0.3 - 1.0
    assert float(out.kl) == pytest.approx(k3, abs=TOL)            # mean over own rows' 6 tokens only
    assert float(out.loss.detach()) == pytest.approx(pg + 0.001 * k3, abs=TOL)
    assert float(low_var_kl(torch.zeros(1), torch.tensor([0.3]))) == pytest.approx(k3, abs=TOL)


def test_t15_cross_only_minibatch_has_zero_kl_and_keeps_graph():
    inputs = t15_batch([False] * 4, ref_shift=0.3)
    out = compute_loss(inputs, AlgoConfig(kl_coef=0.001))
    assert float(out.kl) == 0.0
    out.loss.backward()
    assert inputs.token_logprobs.grad is not None


def test_t16_three_agents():
    gen = torch.Generator().manual_seed(16)
    n, b, g = 3, 128, 8
    rewards = torch.randint(0, 2, (b, n, g), generator=gen).double()
    ratios = torch.tensor([1.0, 1.6, 0.625], dtype=torch.float64)   # learner 0, sources 1 and 2
    flat = rewards.reshape(-1)
    group = torch.arange(b).repeat_interleave(n * g)
    src = torch.arange(n).repeat_interleave(g).repeat(b)
    inputs = AdvantageInputs(flat, group, ratios[src], src == 0)
    adv = ADVANTAGE_ESTIMATORS.get("hacpo")(inputs, AlgoConfig())
    assert adv.shape == (b * n * g,)
    ref = group_advantages_reference(flat.tolist(), group.tolist(), (1 / ratios[src]).tolist(), (src == 0).tolist())
    assert adv.tolist() == pytest.approx(ref, abs=TOL)
    # σ over all 24 rewards of the prompt, per-source baseline weights
    r0 = rewards[0].reshape(-1)
    if r0.max() != r0.min():
        mu = float((r0 * (1 / ratios[src[:24]])).sum() / 24)
        mu = mu if mu <= 1 else float(rewards[0, 0].mean())
        assert float(adv[0]) == pytest.approx((float(r0[0]) - mu) / (float(r0.std()) + 1e-6), abs=TOL)
    # mini-batch 64 prompts × 8 = 512 rows ⇒ M = 6 updates of 3072 rows
    is_own = [True] * (b * g) + [False] * (2 * b * g)          # ordered own first
    plan = plan_minibatches(is_own, 512, stepwise_index="update")
    cfg = AlgoConfig()
    assert len(plan) == 6
    assert [cfg.cross_lower_bound(mb.m) for mb in plan] == pytest.approx(
        [0.800, 0.825, 0.850, 0.875, 0.900, 0.925], abs=TOL)
    cross_plan = plan_minibatches(is_own, 512, stepwise_index="cross_update")
    assert [mb.m for mb in cross_plan] == [0, 0, 0, 1, 2, 3]
