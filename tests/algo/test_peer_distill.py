"""Peer distillation (``hacrl_fed.algo.peer_distill``) on hand-worked rows.

Three rows, three positions::

    row 0  foreign, A = +0.5   log π = [ln ½, ln ¼, ·]   response [1, 1, 0]   NLL = (ln 2 + 2 ln 2)/2 = 1.5 ln 2
    row 1  foreign, A = −0.5   log π = [ln ½, ·, ·]      response [1, 0, 0]   NLL = ln 2        (below baseline)
    row 2  own,     A = +1.0   log π = [−1, −2, −3]      response [1, 1, 1]   NLL = 2           (own: never in D)

D = {row 0}; with N = 3 rows: indicator L_PD = 1.5 ln 2 / 3 = 0.5 ln 2; advantage-weighted 0.5 · 1.5 ln 2 / 3.
"""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_fed.algo.peer_distill import distill_coef, distill_rows, distill_weights, peer_distill_loss

LN2 = math.log(2.0)


def _rows():
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0], [math.log(0.5), 0.0, 0.0], [-1.0, -2.0, -3.0]],
                        requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5, 1.0])
    own = torch.tensor([False, False, True])
    return logp, mask, adv, own


def test_only_foreign_rows_above_their_baseline_are_distilled():
    _, _, adv, own = _rows()
    assert distill_rows(adv, own).tolist() == [True, False, False]
    assert distill_rows(adv, own, loss_mask=torch.tensor([False, True, True])).tolist() == [False, False, False]
    # a row the screens leave out arrives with A · g = 0: not above the baseline, not distilled
    assert distill_rows(torch.tensor([0.0, 0.2, 0.0]), own).tolist() == [False, True, False]


def test_the_term_on_hand_worked_rows():
    logp, mask, adv, own = _rows()
    rows = distill_rows(adv, own)
    loss, nll = peer_distill_loss(logp, mask, distill_weights(adv, rows, "indicator"))
    assert nll.tolist() == pytest.approx([1.5 * LN2, LN2, 2.0])
    assert float(loss) == pytest.approx(0.5 * LN2)
    loss.backward()
    # dL/dlog π = −ω_i / (L_i · N) on D's response tokens, 0 elsewhere
    expected = torch.tensor([[-1 / 6, -1 / 6, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected)
    loss_a, _ = peer_distill_loss(logp, mask, distill_weights(adv, rows, "advantage"))
    assert float(loss_a) == pytest.approx(0.5 * 1.5 * LN2 / 3)


def test_micro_batch_shares_add_up_to_the_mini_batch_term():
    logp, mask, adv, own = _rows()
    w = distill_weights(adv, distill_rows(adv, own))
    whole, _ = peer_distill_loss(logp, mask, w)
    first, _ = peer_distill_loss(logp[:1], mask[:1], w[:1], num_sequences=3)
    rest, _ = peer_distill_loss(logp[1:], mask[1:], w[1:], num_sequences=3)
    assert float(first + rest) == pytest.approx(float(whole))


def test_a_row_without_response_tokens_gives_nothing():
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, nll = peer_distill_loss(logp, torch.zeros(1, 2, dtype=torch.bool), torch.ones(1))
    assert float(loss) == 0.0 and nll.tolist() == [0.0]


def test_schedules():
    assert distill_coef(0.2, "constant", 7, None) == 0.2
    assert distill_coef(0.2, "linear", 1, 10) == pytest.approx(0.2)
    assert distill_coef(0.2, "linear", 6, 10) == pytest.approx(0.1)
    assert distill_coef(0.2, "linear", 11, 10) == 0.0
    assert distill_coef(0.2, "linear", 40, 10) == 0.0
    with pytest.raises(ValueError, match="peer_distill_steps"):
        distill_coef(0.2, "linear", 1, None)
    with pytest.raises(ValueError, match="unknown"):
        distill_coef(0.2, "cosine", 1, 10)
    with pytest.raises(ValueError, match="unknown"):
        distill_weights(torch.ones(1), torch.ones(1, dtype=torch.bool), "softmax")


# ----------------------------------------------------------------------------- in the update loop, real tiny models


def _update(load_tiny, algo, *, step=1):
    from algo_testkit import GEMMA, LLAMA, as_foreign, make_agent_rows

    from hacrl_fed.config import OptimConfig
    from hacrl_fed.update.loop import hacpo_update, make_optimizer

    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    own = [r for r, _ in make_agent_rows("a", model_a, tok_a, n_prompts=2, g=2)]
    foreign = as_foreign(make_agent_rows("b", model_b, tok_b, n_prompts=2, g=2, seed=1), tok_a, "b")
    adv = [1.0, -1.0, 1.0, -1.0] + [1.0, -1.0, 0.5, -0.5]
    optim = OptimConfig(lr=1e-3, mini_batch_rows=64)
    metrics = hacpo_update(model_a, make_optimizer(model_a, optim), own + foreign, adv, {"b": 1.0}, algo, optim,
                           learner="a", step=step)
    return model_a, metrics


def test_off_by_default_and_at_zero_the_update_is_the_recipes(load_tiny):
    from hacrl_fed.algo.config import AlgoConfig

    assert AlgoConfig.preset("hacpo").peer_distill_coef == 0.0
    plain, m_plain = _update(load_tiny, AlgoConfig.preset("hacpo", kl_coef=0.0))
    zero, m_zero = _update(load_tiny, AlgoConfig.preset("hacpo", kl_coef=0.0, peer_distill_coef=0.0))
    assert all(torch.equal(p, q) for p, q in zip(plain.parameters(), zero.parameters(), strict=True))
    assert "distill_rows" not in m_plain and m_plain["loss"] == m_zero["loss"]


def test_the_term_trains_the_peer_successes_above_baseline(load_tiny):
    from hacrl_fed.algo.config import AlgoConfig

    plain, _ = _update(load_tiny, AlgoConfig.preset("hacpo", kl_coef=0.0))
    on, m = _update(load_tiny, AlgoConfig.preset("hacpo", kl_coef=0.0, peer_distill_coef=0.5))
    # two of b's four rows are above their baseline (A = 1.0 and 0.5); a's own rows never enter the term
    assert m["src/b/distill_rows"] == 2.0 and m["src/a/distill_rows"] == 0.0 and m["distill_rows"] == 2.0
    assert m["distill_coef"] == 0.5 and m["distill_nll"] > 0
    assert any(not torch.equal(p, q) for p, q in zip(plain.parameters(), on.parameters(), strict=True))
    # the linear schedule has reached 0 at step T + 1: the update is the recipe's again
    done, m_done = _update(load_tiny, AlgoConfig.preset("hacpo", kl_coef=0.0, peer_distill_coef=0.5,
                                                       peer_distill_schedule="linear", peer_distill_steps=4), step=5)
    assert m_done["distill_coef"] == 0.0
    assert all(torch.allclose(p, q, atol=0, rtol=0) for p, q in zip(plain.parameters(), done.parameters(), strict=True))


def test_a_linear_schedule_needs_its_length():
    from pydantic import ValidationError

    from hacrl_fed.algo.config import AlgoConfig

    with pytest.raises(ValidationError, match="peer_distill_steps"):
        AlgoConfig.preset("hacpo", peer_distill_coef=0.1, peer_distill_schedule="linear")
