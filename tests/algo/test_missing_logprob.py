"""Foreign rows whose source sent no behaviour log-prob (the wire's presence flag unset; docs/cross-vendor.md).

Hand-computed values for one cross row of L_k = 4 response tokens after one prompt token, capability ratio
r = 2, default window δ = 0.2 (l_0 = 0.8), α = 1:

* ``success_only``: A = 0.5 ⇒ J = l·l^α·r·A = 0.8·0.8·2·0.5 = 0.64, ∂J/∂log π_t = 0.64 / 4 per response token;
  A = −0.5 ⇒ J = 0, no gradient (dropped).
* ``luffy_shaping`` (LUFFY arXiv 2504.14945, γ = 0.1): token probabilities 0.5, 0.25, 0.1, 0.05 ⇒
  f = π/(π+γ) = 5/6, 5/7, 1/2, 1/3, mean 0.595238; J = r·A·mean f = 0.595238 at A = 0.5;
  ∂J/∂log π_t = r·A·γπ/(π+γ)²/L_k.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from algo_testkit import GEMMA, LLAMA, as_foreign, make_agent_rows

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.algo.extensions import missing_logprob_objective
from hacrl_fed.algo.losses import LossInputs, compute_loss
from hacrl_fed.update.loop import hacpo_update, make_optimizer
from hacrl_fed.config import OptimConfig

PROBS = [0.5, 0.25, 0.1, 0.05]
TOL = 1e-9


def one_row(adv: float, *, has: bool = False, r: float = 2.0, m: int = 0) -> tuple[torch.Tensor, LossInputs]:
    t = torch.zeros(1, 5, dtype=torch.float64)
    t[0, 1:] = torch.log(torch.tensor(PROBS, dtype=torch.float64))
    t.requires_grad_(True)
    mask = torch.zeros(1, 5, dtype=torch.bool)
    mask[0, 1:] = True
    return t, LossInputs(token_logprobs=t, response_mask=mask, advantages=torch.tensor([adv], dtype=torch.float64),
                         old_logprob_sum=torch.tensor([math.nan], dtype=torch.float64),   # meaningless here
                         old_token_count=torch.tensor([0.0], dtype=torch.float64), is_own=torch.tensor([False]),
                         capability_ratio=torch.tensor([r], dtype=torch.float64), update_index=m,
                         has_behaviour_logprob=torch.tensor([has]))


def grad_of(t, objective) -> torch.Tensor:
    (g,) = torch.autograd.grad(objective.sum(), t)
    return g[0]


def test_success_only_keeps_a_success_at_the_edge_weight():
    t, x = one_row(0.5)
    terms = missing_logprob_objective(x, AlgoConfig())
    assert float(terms.objective.detach()) == pytest.approx(0.64, abs=TOL)
    g = grad_of(t, terms.objective)
    assert float(g[0]) == 0.0 and torch.allclose(g[1:], torch.full((4,), 0.64 / 4, dtype=torch.float64))
    assert float(terms.has_grad) == 1.0 and float(terms.ratio) == pytest.approx(0.8)
    # the edge follows the stepwise window: l_2 = 0.85
    _, x2 = one_row(0.5, m=2)
    assert float(missing_logprob_objective(x2, AlgoConfig()).objective.detach()) == pytest.approx(0.85 ** 2, abs=TOL)


@pytest.mark.parametrize("adv", [-0.5, 0.0])
def test_success_only_drops_a_non_success(adv):
    t, x = one_row(adv)
    terms = missing_logprob_objective(x, AlgoConfig())
    assert float(terms.objective.detach()) == 0.0 and float(terms.has_grad) == 0.0 and float(terms.clip_low) == 1.0
    assert torch.count_nonzero(grad_of(t, terms.objective)) == 0


@pytest.mark.parametrize("adv", [0.5, -0.5])
def test_luffy_shaping_value_and_gradient(adv):
    t, x = one_row(adv)
    cfg = AlgoConfig(missing_behaviour_logprob="luffy_shaping")
    terms = missing_logprob_objective(x, cfg)
    f = [p / (p + 0.1) for p in PROBS]
    assert sum(f) / 4 == pytest.approx(0.595238, abs=1e-6)
    assert float(terms.objective.detach()) == pytest.approx(2.0 * adv * sum(f) / 4, abs=TOL)
    expected = [2.0 * adv * 0.1 * p / (p + 0.1) ** 2 / 4 for p in PROBS]
    assert grad_of(t, terms.objective)[1:].tolist() == pytest.approx(expected, abs=TOL)
    assert float(terms.has_grad) == 1.0


def test_compute_loss_mixes_the_rule_with_the_paper_path_row_by_row():
    """A batch of a row with a log-prob and one without: the first keeps exactly the paper's terms."""
    t, x = one_row(0.5)
    two = torch.cat([t.detach(), t.detach()]).requires_grad_(True)
    mixed = LossInputs(token_logprobs=two, response_mask=x.response_mask.repeat(2, 1),
                       advantages=torch.tensor([0.5, 0.5], dtype=torch.float64),
                       old_logprob_sum=torch.tensor([float(t.detach()[0, 1:].sum()) + 0.2, math.nan],
                                                    dtype=torch.float64),
                       old_token_count=torch.tensor([4.0, 0.0], dtype=torch.float64),
                       is_own=torch.tensor([False, False]),
                       capability_ratio=torch.tensor([2.0, 2.0], dtype=torch.float64),
                       has_behaviour_logprob=torch.tensor([True, False]), num_sequences=2)
    cfg = AlgoConfig(kl_coef=0.0)
    out = compute_loss(mixed, cfg)
    assert math.isfinite(float(out.loss.detach()))
    paper = compute_loss(LossInputs(**{**mixed.__dict__, "has_behaviour_logprob": None,
                                       "old_logprob_sum": mixed.old_logprob_sum.nan_to_num(0.0)}), cfg)
    # row 0: s = exp(−0.05) inside [0.8, 1] ⇒ J = s²·r·A, same as without the flag column
    s = math.exp(-0.2 / 4)
    assert float(out.rows.objective[0]) == pytest.approx(s * s * 2 * 0.5, abs=TOL)
    assert float(out.rows.objective[0]) == pytest.approx(float(paper.rows.objective[0]), abs=TOL)
    assert float(out.rows.objective[1]) == pytest.approx(0.64, abs=TOL)
    (g,) = torch.autograd.grad(out.loss, two)
    assert torch.isfinite(g).all()


def test_the_paper_path_is_unchanged_when_every_row_has_a_log_prob():
    t, x = one_row(0.5, has=True)
    x = LossInputs(**{**x.__dict__, "old_logprob_sum": torch.tensor([-4.0], dtype=torch.float64),
                      "old_token_count": torch.tensor([4.0], dtype=torch.float64)})
    a = compute_loss(x, AlgoConfig(kl_coef=0.0))
    b = compute_loss(LossInputs(**{**x.__dict__, "has_behaviour_logprob": None}), AlgoConfig(kl_coef=0.0))
    assert float(a.loss) == float(b.loss)


def test_a_learner_trains_on_peer_rows_without_log_probs(load_tiny):
    """Real tiny models: foreign rows without a behaviour log-prob reach the update by the documented rule."""
    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    pairs = make_agent_rows("api", model_b, tok_b, n_prompts=2, g=2, seed=1)
    rows = [replace(r, has_behaviour_logprob=False, behaviour_logprob_sum=0.0, behaviour_token_count=0)
            for r in as_foreign(pairs, tok_a, "api")]
    adv = [1.0, -1.0, 1.0, -1.0]
    optim = OptimConfig(lr=1e-3, mini_batch_rows=64)
    before = [p.detach().clone() for p in model_a.parameters()]
    m = hacpo_update(model_a, make_optimizer(model_a, optim), rows, adv, {"api": 1.0}, AlgoConfig(kl_coef=0.0),
                     optim, learner="a")
    assert m["src/api/no_logprob_rows"] == 4.0
    assert m["src/api/grad_frac"] == 0.5 and m["src/api/pos_adv_grad_rows"] == 2.0   # successes only
    assert any(not torch.equal(b, p.detach()) for b, p in zip(before, model_a.parameters()))
    own_like = replace(rows[0], is_own=True, source_agent="a")
    with pytest.raises(ValueError, match="own row always has"):
        hacpo_update(model_a, make_optimizer(model_a, optim), [own_like], [1.0], {}, AlgoConfig(kl_coef=0.0), optim,
                     learner="a")
