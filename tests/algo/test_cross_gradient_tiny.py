"""Prop. D.6 on a real (tiny) model: a cross row's parameter gradient is r·A·s^(1+α)·∇ mean log π_k
inside the clip window (T10) and exactly zero outside it (T12)."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.logprobs import token_logprobs
from hacrl_fed.algo.losses import LossInputs, compute_loss

from algo_testkit import LLAMA


@pytest.fixture
def setup(load_tiny):
    model, _ = load_tiny(LLAMA)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (1, 20), generator=g)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 7:] = True                                   # 7 prompt tokens, 13 response tokens
    return model, ids, mask


def params_grad(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in model.parameters()])


def mean_logp_grad(model, ids, mask):
    model.zero_grad(set_to_none=True)
    logp = token_logprobs(model, ids, torch.ones_like(ids))
    mean = logp[mask].sum() / mask.sum()
    mean.backward()
    return float(mean.detach()), params_grad(model)


def cross_loss_grad(model, ids, mask, *, old_sum, l_j, adv, r, alpha, m=0):
    model.zero_grad(set_to_none=True)
    logp = token_logprobs(model, ids, torch.ones_like(ids))
    inputs = LossInputs(token_logprobs=logp, response_mask=mask, advantages=torch.tensor([adv]),
                        old_logprob_sum=torch.tensor([old_sum], dtype=torch.float64),
                        old_token_count=torch.tensor([float(l_j)]), is_own=torch.tensor([False]),
                        capability_ratio=torch.tensor([r]), update_index=m)
    out = compute_loss(inputs, AlgoConfig(alpha=alpha, kl_coef=0.0))
    out.loss.backward()
    return out, params_grad(model)


@pytest.mark.parametrize("alpha", [0.0, 1.0, 3.0])
def test_t10_gradient_inside_window(setup, alpha):
    model, ids, mask = setup
    mean, g_mean = mean_logp_grad(model, ids, mask)
    s, l_j, adv, r = 0.93, 16, 0.5, 2.0                 # L_j ≠ L_k = 13: two lengths
    old_sum = (mean - math.log(s)) * l_j
    out, g = cross_loss_grad(model, ids, mask, old_sum=old_sum, l_j=l_j, adv=adv, r=r, alpha=alpha)
    assert float(out.rows.ratio) == pytest.approx(s, rel=1e-5)
    # ∇ loss = −∇J = −r·A·s^(1+α)·∇ mean log π_k   (B = 1)
    expected = -r * adv * s ** (1 + alpha) * g_mean
    assert g.abs().max() > 0
    torch.testing.assert_close(g, expected, rtol=2e-4, atol=1e-7)


@pytest.mark.parametrize("s,adv,m", [(0.5, 1.0, 0), (0.86, 1.0, 3), (0.7, -1.0, 3), (1.2, 0.5, 0), (1.03, -2.0, 1)])
def test_t12_gradient_zero_outside_window(setup, s, adv, m):
    model, ids, mask = setup
    mean, _ = mean_logp_grad(model, ids, mask)
    l_j = 11
    out, g = cross_loss_grad(model, ids, mask, old_sum=(mean - math.log(s)) * l_j, l_j=l_j, adv=adv, r=1.5,
                             alpha=1.0, m=m)
    c = min(1.0, max(AlgoConfig().cross_lower_bound(m), s))
    assert float(out.loss.detach()) == pytest.approx(-(c * c * 1.5 * adv), rel=1e-5)
    assert torch.count_nonzero(g) == 0
