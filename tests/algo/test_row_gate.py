"""The update's row gate (the learner-side screens' hook): exact without effect, zero weight = no gradient."""

from __future__ import annotations

import copy

import pytest
import torch
from algo_testkit import GEMMA, LLAMA, as_foreign, make_agent_rows, sequence_logprob_sum

from hacrl_fed.algo.advantages import row_advantages
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.loop import hacpo_update, make_optimizer
from hacrl_fed.config import OptimConfig


@pytest.fixture
def setup(load_tiny):
    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    own = [row for row, _ in make_agent_rows("a", model_a, tok_a, n_prompts=2, g=3)]
    from_b = as_foreign(make_agent_rows("b", model_b, tok_b, n_prompts=2, g=3, seed=1), tok_a, "b")
    return model_a, own + from_b


def _run(model, rows, adv, gate=None, algo=None):
    m = copy.deepcopy(model)
    algo = algo or AlgoConfig.preset("hacpo_cross_family").model_copy(update={"kl_coef": 0.0})
    optim = OptimConfig(lr=1e-3, mini_batch_rows=4, micro_batch_tokens=128, epochs=2)
    metrics = hacpo_update(m, make_optimizer(m, optim), rows, adv, {"b": 1.3}, algo, optim, learner="a",
                           row_gate=gate)
    return torch.cat([p.detach().flatten() for p in m.parameters()]), metrics


@pytest.mark.parametrize("preset", ["hacpo", "hacpo_cross_family"])
def test_gate_of_ones_is_exactly_no_gate(setup, preset):
    model, rows = setup
    algo = AlgoConfig.preset(preset).model_copy(update={"kl_coef": 0.0})
    adv = row_advantages(rows, {"b": 1.3}, algo, learner="a")
    seen = []

    def ones(batch_rows, sums):
        seen.extend((r.source_agent, r.prompt_id, r.sample_index, s) for r, s in zip(batch_rows, sums))
        return [1.0] * len(batch_rows)

    plain, m_plain = _run(model, rows, adv, algo=algo)
    gated, m_gated = _run(model, rows, adv, ones, algo=algo)
    assert torch.equal(plain, gated) and m_plain == m_gated
    # every row was shown, once per epoch, with its content log-likelihood (no EOS), before its update
    assert len(seen) == 2 * len(rows)
    first: dict = {}
    for src, pid, idx, value in seen[:]:
        first.setdefault((src, pid, idx), value)
    for row in rows[:3]:   # own rows of the first mini-batch: the initial policy's log-likelihood
        full = sequence_logprob_sum(model, row.prompt_ids, row.response_ids)
        eos = sequence_logprob_sum(model, row.prompt_ids, row.response_ids) - sequence_logprob_sum(
            model, row.prompt_ids, row.response_ids[:-1])
        assert first[("a", row.prompt_id, row.sample_index)] == pytest.approx(full - eos, rel=1e-4, abs=1e-4)


def test_zero_weight_equals_zero_advantage_and_own_rows_stay(setup):
    model, rows = setup
    algo = AlgoConfig.preset("hacpo_cross_family").model_copy(update={"kl_coef": 0.0})
    adv = [1.0 if i % 2 else -0.5 for i in range(len(rows))]
    screened = {("b", "q0", 1), ("b", "q1", 0)}

    def gate(batch_rows, sums):
        # own rows asked for 0 too: the update keeps them at 1
        return [0.0 if (r.source_agent, r.prompt_id, r.sample_index) in screened or r.is_own else 1.0
                for r in batch_rows]

    zeroed = [0.0 if (r.source_agent, r.prompt_id, r.sample_index) in screened else a for r, a in zip(rows, adv)]
    gated, metrics = _run(model, rows, adv, gate)
    expected, _ = _run(model, rows, zeroed)
    torch.testing.assert_close(gated, expected, rtol=0, atol=0)
    assert metrics["src/b/grad_frac"] < 1.0


def test_gate_weights_are_checked(setup):
    model, rows = setup
    adv = [1.0] * len(rows)
    with pytest.raises(ValueError, match="not in"):
        _run(model, rows, adv, lambda rs, s: [2.0] * len(rs))
    with pytest.raises(ValueError, match="weights for"):
        _run(model, rows, adv, lambda rs, s: [1.0])
