"""Cross-ratio conventions (content tokens, both sides) and the named cross-family extensions.

Hand-computed values, in the style of the spec vectors (tests/algo/test_spec_vectors.py):

* T9c — content-only two-length ratio. Learner: Σ = −30 over L_k = 100 tokens, of which the terminal EOS
  is −5 ⇒ content −25 over 99. Source: Σ = −26 over L_j = 104, its EOS −4 ⇒ content −22 over 103.
  log s = −25/99 − (−22/103) = −0.038932 ⇒ s = 0.961816 (with the EOS on both sides: 0.951229, T9).
* Byte unit: the same content sums over B = 300 bytes ⇒ log s = (−25 + 22)/300 = −0.01 ⇒ s = 0.990050.
"""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.algo.extensions import naive_cross_objective
from hacrl_fed.algo.losses import LossInputs, compute_loss, cross_log_ratio, hacpo_cross_objective

TOL = 1e-6


def content_inputs(*, adv: float = 0.5, r: float = 2.0, bytes_: float = 300.0, m: int = 0,
                   source_sum: float = -22.0, source_count: float = 103.0) -> tuple[torch.Tensor, LossInputs]:
    """One cross row: 100 learner response tokens after one prompt token; the last is the EOS (−5)."""
    t = torch.zeros(1, 101, dtype=torch.float64)
    t[0, 1:100] = -25.0 / 99
    t[0, 100] = -5.0
    t.requires_grad_(True)
    mask = torch.zeros(1, 101, dtype=torch.bool)
    mask[0, 1:] = True
    content = mask.clone()
    content[0, 100] = False
    return t, LossInputs(token_logprobs=t, response_mask=mask, advantages=torch.tensor([adv], dtype=torch.float64),
                         old_logprob_sum=torch.tensor([source_sum], dtype=torch.float64),
                         old_token_count=torch.tensor([source_count], dtype=torch.float64),
                         is_own=torch.tensor([False]), capability_ratio=torch.tensor([r], dtype=torch.float64),
                         update_index=m, ratio_mask=content,
                         content_bytes=torch.tensor([bytes_], dtype=torch.float64))


def test_t9c_content_only_ratio_value_and_gradient_over_every_token():
    t, inputs = content_inputs()
    log_s = cross_log_ratio(inputs)
    assert float(log_s.detach()) == pytest.approx(-25 / 99 + 22 / 103, abs=TOL)
    assert math.exp(float(log_s)) == pytest.approx(0.961816, abs=TOL)
    (g,) = torch.autograd.grad(log_s.sum(), t)
    # the gradient is that of the mean log-prob over all 100 response tokens, the EOS included
    assert torch.allclose(g[0, 1:], torch.full((100,), 1 / 100, dtype=torch.float64))
    assert float(g[0, 0]) == 0.0


def test_byte_unit_ratio():
    _, inputs = content_inputs()
    log_s = cross_log_ratio(inputs, unit="byte")
    assert float(log_s) == pytest.approx(-0.01, abs=TOL)
    assert math.exp(float(log_s)) == pytest.approx(0.990050, abs=TOL)
    with pytest.raises(ValueError, match="content_bytes"):
        cross_log_ratio(LossInputs(**{**inputs.__dict__, "content_bytes": None}), unit="byte")
    with pytest.raises(ValueError, match="unknown cross ratio unit"):
        cross_log_ratio(inputs, unit="char")


def test_without_ratio_mask_the_paper_form_is_unchanged():
    """No content mask: the value is T9's two-length ratio over every response token."""
    t, inputs = content_inputs(source_sum=-26.0, source_count=104.0)
    log_s = cross_log_ratio(LossInputs(**{**inputs.__dict__, "ratio_mask": None}))
    assert math.exp(float(log_s)) == pytest.approx(0.951229, abs=TOL)


def _objective_and_grad(cfg: AlgoConfig, **kw) -> tuple[float, float]:
    t, inputs = content_inputs(**kw)
    terms = hacpo_cross_objective(inputs, cfg)
    (g,) = torch.autograd.grad(terms.objective.sum(), t)
    return float(terms.objective.detach()), float(g[0, 1:].sum()), float(terms.has_grad)


def test_success_gated_rule_keeps_a_positive_row_below_the_window_at_the_edge_weight():
    # s ≈ 0.56 < 0.8: the paper drops it; success-gated keeps the edge weight l = 0.8 (α = 1 ⇒ 0.64)
    below = dict(source_sum=-22.0 + 60.0, source_count=103.0)      # log s = −25/99 − 38/103 ≈ −0.621
    value, grad, has = _objective_and_grad(AlgoConfig(), adv=0.5, r=2.0, **below)
    assert grad == 0.0 and has == 0.0 and value == pytest.approx(0.64 * 2.0 * 0.5, abs=TOL)
    gated = AlgoConfig(cross_below_window="success_gated")
    value, grad, has = _objective_and_grad(gated, adv=0.5, r=2.0, **below)
    assert value == pytest.approx(0.64 * 2.0 * 0.5, abs=TOL)
    assert grad == pytest.approx(0.64 * 2.0 * 0.5, abs=TOL) and has == 1.0   # r·A·l^(1+α) · ∇ mean log π
    # a failure (A < 0) below the window stays dropped
    value, grad, has = _objective_and_grad(gated, adv=-0.5, r=2.0, **below)
    assert grad == 0.0 and has == 0.0


def test_on_policy_rule_keeps_rows_above_one_at_weight_one():
    above = dict(source_sum=-22.0 - 10.0, source_count=103.0)      # s = exp(−25/99 + 32/103) > 1
    value, grad, has = _objective_and_grad(AlgoConfig(), adv=0.5, r=2.0, **above)
    assert grad == 0.0 and has == 0.0 and value == pytest.approx(1.0, abs=TOL)
    for adv in (0.5, -0.5):
        value, grad, has = _objective_and_grad(AlgoConfig(cross_above_window="on_policy"), adv=adv, r=2.0, **above)
        assert value == pytest.approx(2.0 * adv, abs=TOL) and grad == pytest.approx(2.0 * adv, abs=TOL)
        assert has == 1.0


def test_inside_the_window_the_extensions_change_nothing():
    paper = _objective_and_grad(AlgoConfig(), adv=0.5, r=2.0)
    ext = _objective_and_grad(AlgoConfig.preset("hacpo_cross_family", cross_ratio_unit="token"), adv=0.5, r=2.0)
    assert paper == pytest.approx(ext, abs=1e-12)
    s = math.exp(-25 / 99 + 22 / 103)
    assert paper[0] == pytest.approx(s * s * 2.0 * 0.5, abs=TOL) and paper[2] == 1.0


def test_naive_sharing_uses_the_content_ratio():
    t, inputs = content_inputs(adv=1.0)
    terms = naive_cross_objective(inputs, AlgoConfig.preset("naive"))
    assert float(terms.ratio) == pytest.approx(0.961816, abs=TOL)


def test_grad_frac_metric_counts_rows_that_reach_the_gradient():
    t, inputs = content_inputs()
    out = compute_loss(inputs, AlgoConfig(kl_coef=0.0))
    assert out.metrics["hacpo/cross_grad_frac"] == 1.0
    _, zero_adv = content_inputs(adv=0.0)
    assert compute_loss(zero_adv, AlgoConfig(kl_coef=0.0)).metrics["hacpo/cross_grad_frac"] == 0.0
