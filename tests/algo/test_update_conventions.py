"""The update loop's ratio conventions and optimizer rules on real tiny models.

* a foreign STOP row whose source EOS log-prob is known: the cross ratio's value leaves the EOS out on both
  sides (content tokens), the gradient still reaches the learner's EOS;
* a mini-batch whose gradient is exactly zero takes no optimizer step (AdamW momentum would move the
  weights without any signal), unless ``optim.skip_zero_grad_updates = false``;
* the LM head runs only over the positions whose log-prob is needed, with the same values.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from algo_testkit import GEMMA, LLAMA, as_foreign, make_agent_rows, sequence_logprob_sum

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.logprobs import token_logprobs
from hacrl_fed.update.loop import hacpo_update, make_optimizer
from hacrl_fed.config import OptimConfig


def flat(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


@pytest.fixture
def pair(load_tiny):
    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    pairs = make_agent_rows("b", model_b, tok_b, n_prompts=2, g=2, seed=1)
    return model_a, tok_a, model_b, tok_b, pairs


def _with_source_eos(rows, pairs, model_b):
    """Attach the source's EOS log-prob (as the wire carries it) to re-encoded rows."""
    out = []
    for row, (src_row, _) in zip(rows, pairs, strict=True):
        ids = src_row.response_ids
        eos_lp = (sequence_logprob_sum(model_b, src_row.prompt_ids, ids)
                  - sequence_logprob_sum(model_b, src_row.prompt_ids, ids[:-1]))
        out.append(replace(row, behaviour_eos_logprob=eos_lp))
    return out


def test_cross_ratio_leaves_the_eos_out_on_both_sides(pair):
    model_a, tok_a, model_b, _, pairs = pair
    rows = _with_source_eos(as_foreign(pairs, tok_a, "b"), pairs, model_b)
    assert all(r.ratio_excludes_eos and r.ends_with_eos for r in rows)
    expected = []
    for r in rows:
        learner_content = sequence_logprob_sum(model_a, r.prompt_ids, r.response_ids[:-1])
        src_sum, src_count = r.ratio_source
        assert src_count == r.behaviour_token_count - 1
        assert src_sum == pytest.approx(r.behaviour_logprob_sum - r.behaviour_eos_logprob)
        expected.append(math.exp(learner_content / (len(r.response_ids) - 1) - src_sum / src_count))
    algo, optim = AlgoConfig(kl_coef=0.0), OptimConfig(mini_batch_rows=64)
    metrics = hacpo_update(model_a, make_optimizer(model_a, optim), rows, [0.5] * len(rows), {"b": 1.0}, algo,
                           optim, learner="a")
    assert metrics["src/b/s_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    # without the source's EOS log-prob (an older peer) both sides keep the EOS, as before
    old = as_foreign(pairs, tok_a, "b")
    assert not any(r.ratio_excludes_eos for r in old)
    assert all(r.ratio_source == (r.behaviour_logprob_sum, r.behaviour_token_count) for r in old)


def test_learner_gradient_still_reaches_its_eos(pair):
    """Only the EOS logit of the learner changes the loss's gradient on the head's EOS row: it is non-zero."""
    model_a, tok_a, model_b, _, pairs = pair
    rows = _with_source_eos(as_foreign(pairs, tok_a, "b"), pairs, model_b)
    algo = AlgoConfig(kl_coef=0.0, cross_clip=False)     # every row inside: a gradient on every row
    optim = OptimConfig(lr=1e-2, mini_batch_rows=64)
    head = model_a.get_output_embeddings().weight
    eos = tok_a.eos_token_id
    before = head[eos].detach().clone()
    hacpo_update(model_a, make_optimizer(model_a, optim), rows, [1.0] * len(rows), {"b": 1.0}, algo, optim,
                 learner="a")
    assert not torch.equal(before, head[eos].detach())


def test_zero_gradient_minibatch_takes_no_optimizer_step(pair):
    model_a, tok_a, *_ = pair
    own = [row for row, _ in make_agent_rows("a", model_a, tok_a, n_prompts=2, g=2)]
    algo = AlgoConfig(kl_coef=0.0)

    def two_steps(skip: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
        model = type(model_a)(model_a.config)
        model.load_state_dict(model_a.state_dict())
        optim = OptimConfig(lr=1e-3, mini_batch_rows=64, skip_zero_grad_updates=skip)
        opt = make_optimizer(model, optim)
        hacpo_update(model, opt, own, [1.0, -1.0, 0.5, -0.5], {}, algo, optim, learner="a")   # momentum
        mid = flat(model)
        m = hacpo_update(model, opt, own, [0.0] * 4, {}, algo, optim, learner="a")             # zero gradient
        return mid, flat(model), m

    mid, after, metrics = two_steps(skip=True)
    assert torch.equal(mid, after) and metrics["zero_grad_updates"] == 1 and metrics["grad_norm"] == 0.0
    mid, after, metrics = two_steps(skip=False)
    assert not torch.equal(mid, after) and metrics["zero_grad_updates"] == 0   # AdamW momentum moved it


def test_score_mask_runs_the_head_only_where_needed(load_tiny):
    model, tok = load_tiny(GEMMA)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]])
    attn = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    score = torch.zeros_like(attn, dtype=torch.bool)
    score[0, 3:] = True
    score[1, 2:4] = True
    full = token_logprobs(model, ids, attn)
    part = token_logprobs(model, ids, attn, score_mask=score)
    assert torch.allclose(part[score], full[score], atol=1e-6)
    assert torch.count_nonzero(part[~score]) == 0
    with pytest.raises(ValueError, match="score_mask"):
        token_logprobs(model, ids, attn, score_mask=score[:, :3])


def test_frozen_embeddings_have_no_gradient_and_the_head_is_not_stepped(load_tiny):
    from hacrl_fed.worker.models import freeze_embeddings

    model, tok = load_tiny(LLAMA)
    freeze_embeddings(model)
    frozen = [p for m in (model.get_input_embeddings(), model.get_output_embeddings()) for p in m.parameters()]
    assert frozen and not any(p.requires_grad for p in frozen)
    assert any(p.requires_grad for p in model.parameters())
    own = [row for row, _ in make_agent_rows("a", model, tok, n_prompts=2, g=2)]
    optim = OptimConfig(lr=1e-2, mini_batch_rows=64)
    emb = model.get_input_embeddings().weight.detach().clone()
    body = flat(model)
    hacpo_update(model, make_optimizer(model, optim), own, [1.0, -1.0, 0.5, -0.5], {}, AlgoConfig(kl_coef=0.0),
                 optim, learner="a")
    assert torch.equal(emb, model.get_input_embeddings().weight.detach())
    assert not torch.equal(body, flat(model))
