"""The GRPOTrainer-style options of the update: loss aggregation, truncation masking, reward scaling,
the entropy metric and train-mode dropout — against TRL's formulas and on real tiny models."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from algo_testkit import LLAMA, make_agent_rows, sequence_logprob_sum

from hacrl_fed.algo.advantages import group_advantages, row_advantages
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.logprobs import token_logprobs
from hacrl_fed.algo.losses import LossInputs, compute_loss
from hacrl_fed.update.loop import hacpo_update, make_optimizer
from hacrl_fed.config import OptimConfig

L_MAX = 6


def _token_batch(seed: int = 0):
    """Three own rows with 1, 3 and 5 response tokens (T = 6), GRPO token ratios ρ ≠ 1 (some clipped)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [1, 3, 5]
    mask = torch.zeros(3, 6, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, 1:1 + n] = True
    logp = (torch.randn(3, 6, generator=g) * 0.5 - 2.0).masked_fill(~mask, 0.0).requires_grad_(True)
    old = (logp.detach() + torch.randn(3, 6, generator=g) * 0.3).masked_fill(~mask, 0.0)
    adv = torch.tensor([1.5, -0.5, 0.75])
    return logp, old, mask, adv


def _inputs(logp, old, mask, adv, **kw) -> LossInputs:
    b = logp.shape[0]
    return LossInputs(token_logprobs=logp, response_mask=mask, advantages=adv,
                      old_logprob_sum=(old * mask).sum(-1).double(), old_token_count=mask.sum(-1).float(),
                      is_own=torch.ones(b, dtype=torch.bool), capability_ratio=torch.ones(b),
                      old_token_logprobs=old, max_response_tokens=L_MAX, **kw)


def _trl_loss(logp, old, mask, adv, loss_type: str, eps_low=0.2, eps_high=0.28):
    """TRL GRPOTrainer._compute_loss (beta = 0, token-level importance sampling), written out."""
    coef_1 = torch.exp(logp - old)
    coef_2 = coef_1.clamp(1 - eps_low, 1 + eps_high)
    per_token = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None])
    m = mask.float()
    if loss_type == "grpo":
        return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "dapo":
        return (per_token * m).sum() / m.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * m).sum() / (per_token.size(0) * L_MAX)
    raise AssertionError(loss_type)


@pytest.mark.parametrize(("mode", "trl"), [("sequence_mean", "grpo"), ("token_mean", "dapo"), ("constant", "dr_grpo")])
def test_aggregation_modes_equal_trl_loss_types(mode, trl):
    logp, old, mask, adv = _token_batch()
    cfg = AlgoConfig.preset("grpo", loss_aggregation=mode, kl_coef=0.0)
    ours = compute_loss(_inputs(logp, old, mask, adv), cfg).loss
    (grad_ours,) = torch.autograd.grad(ours, logp)
    theirs = _trl_loss(logp, old, mask, adv, trl)
    (grad_theirs,) = torch.autograd.grad(theirs, logp)
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6)
    assert torch.allclose(grad_ours, grad_theirs, atol=1e-7)


def test_aggregation_of_sequence_ratios_weights_rows_by_length():
    """GSPO's row objective is constant over the row's tokens: token_mean weighs rows by L_i (TRL's (B, 1) ratio)."""
    logp, old, mask, adv = _token_batch(1)
    base = AlgoConfig.preset("gspo", kl_coef=0.0)
    rows = -compute_loss(_inputs(logp, old, mask, adv), base).rows.objective.detach()
    lengths = mask.sum(-1).float()
    for mode, want in (("sequence_mean", rows.mean()), ("token_mean", (lengths * rows).sum() / lengths.sum()),
                       ("constant", (lengths * rows).sum() / (3 * L_MAX))):
        cfg = base.model_copy(update={"loss_aggregation": mode})
        assert float(compute_loss(_inputs(logp, old, mask, adv), cfg).loss) == pytest.approx(float(want), rel=1e-6)


@pytest.mark.parametrize("mode", ["sequence_mean", "token_mean", "constant"])
def test_micro_batches_add_up_to_the_mini_batch(mode):
    logp, old, mask, adv = _token_batch(2)
    cfg = AlgoConfig.preset("grpo", loss_aggregation=mode, kl_coef=0.0)
    whole = compute_loss(_inputs(logp, old, mask, adv), cfg).loss
    n_tok = int(mask.sum())
    parts = [compute_loss(_inputs(logp[s], old[s], mask[s], adv[s], num_sequences=3, num_tokens=n_tok), cfg).loss
             for s in (slice(0, 1), slice(1, 3))]
    assert float(sum(parts)) == pytest.approx(float(whole), rel=1e-6)


def test_loss_mask_removes_rows_from_loss_and_token_counts():
    logp, old, mask, adv = _token_batch(3)
    keep = torch.tensor([True, False, True])
    for mode, trl in (("sequence_mean", "grpo"), ("token_mean", "dapo")):
        cfg = AlgoConfig.preset("grpo", loss_aggregation=mode, kl_coef=0.0)
        out = compute_loss(_inputs(logp, old, mask, adv, loss_mask=keep), cfg)
        (grad,) = torch.autograd.grad(out.loss, logp)
        assert torch.all(grad[1] == 0) and torch.any(grad[0] != 0)
        assert float(out.rows.reached_gradient()[1]) == 0.0
        # TRL: the masked row's completion mask is zeroed; grpo still averages over all B rows
        theirs = _trl_loss(logp, old, mask & keep[:, None], adv, trl)
        assert float(out.loss) == pytest.approx(float(theirs), rel=1e-6)


def test_reward_scaling_modes_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    ones, own = torch.ones(8, dtype=torch.float64), torch.ones(8, dtype=torch.bool)
    group = group_advantages(rewards, groups, ones, own)
    assert group[0] == pytest.approx(0.75 / (0.5 + 1e-6)) and group[4] == pytest.approx(0.25 / (0.5 + 1e-6))
    sigma_b = math.sqrt(8 * 0.25 / 7)                       # unbiased std of the 8 rewards
    batch = group_advantages(rewards, groups, ones, own, scaling="batch")
    assert batch[0] == pytest.approx(0.75 / (sigma_b + 1e-6)) and batch[6] == pytest.approx(-0.75 / (sigma_b + 1e-6))
    none = group_advantages(rewards, groups, ones, own, scaling="none")
    assert none.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.25, 0.25, -0.75, 0.25])
    # the capability-weighted baseline of HACPO stays: μ̂ = mean(ω R), only the denominator changes
    weight = torch.tensor([0.5] * 4 + [1.0] * 4, dtype=torch.float64)
    own = torch.tensor([False, True, True, True, True, True, True, True])
    hacpo = group_advantages(rewards, groups, weight, own, scaling="none")
    assert float(hacpo[0]) == pytest.approx(1.0 - 0.5 / 4)
    with pytest.raises(ValueError, match="unknown reward scaling"):
        group_advantages(rewards, groups, ones, own, scaling="max")


def test_reward_scaling_reaches_row_advantages(load_tiny):
    model, tok = load_tiny(LLAMA)
    rows = [r for r, _ in make_agent_rows("a", model, tok, n_prompts=2, g=3)]
    paper = row_advantages(rows, {}, AlgoConfig(), learner="a")
    none = row_advantages(rows, {}, AlgoConfig(reward_scaling="none"), learner="a")
    assert AlgoConfig().reward_scaling == "group" and AlgoConfig.preset("hacpo").reward_scaling == "group"
    assert paper != none and all(abs(a) <= 1.0 for a in none)   # R − μ with R in {0, 1}


@pytest.mark.parametrize("fused", [True, False])
def test_entropy_equals_full_softmax(load_tiny, fused):
    model, tok = load_tiny(LLAMA)
    ids = torch.tensor([tok.encode("the cat sat on the mat and then the dog", add_special_tokens=False)[:10]] * 2)
    mask = torch.ones_like(ids)
    score = torch.zeros_like(ids, dtype=torch.bool)
    score[:, 4:] = True
    with torch.no_grad():
        logp, ent = token_logprobs(model, ids, mask, temperature=0.7, chunk_tokens=3, fused=fused,
                                   score_mask=score, return_entropy=True)
        logits = model(input_ids=ids).logits.float() / 0.7
        logq = torch.log_softmax(logits[:, :-1], dim=-1)
        full = -(logq.exp() * logq).sum(-1)                 # H at positions 1..T−1
    assert torch.allclose(ent[:, 4:], full[:, 3:], atol=1e-5)
    assert torch.all(ent[:, :4] == 0)
    plain = token_logprobs(model, ids, mask, temperature=0.7, chunk_tokens=3, fused=fused, score_mask=score)
    assert torch.allclose(plain, logp)


def test_update_reports_entropy_and_masks_truncated_rows(load_tiny):
    from hacrl_fed.tokenization.views import own_row

    model, tok = load_tiny(LLAMA)
    stop = [r for r, _ in make_agent_rows("a", model, tok, n_prompts=2, g=2)]
    cut = []
    for r in stop[:2]:
        resp = r.response_ids[:-1]                           # no EOS: cut at max_new_tokens
        cut.append(own_row(prompt_id=r.prompt_id, sample_index=r.sample_index + 10, agent="a",
                           prompt_ids=r.prompt_ids, response_ids=resp, reward=1.0 - r.reward,
                           behaviour_logprob_sum=sequence_logprob_sum(model, r.prompt_ids, resp),
                           finish_reason="length", max_response_tokens=256))
    rows = stop + cut
    adv = row_advantages(rows, {}, AlgoConfig(), learner="a")
    optim = OptimConfig(lr=1e-3, mini_batch_rows=64, update_mode="eval")

    def run(algo, rows, adv):
        m = copy.deepcopy(model)
        metrics = hacpo_update(m, make_optimizer(m, optim), rows, adv, {}, algo, optim, learner="a")
        return m, metrics

    algo = AlgoConfig.preset("gspo", kl_coef=0.0, loss_aggregation="token_mean", mask_truncated_completions=True)
    masked, metrics = run(algo, rows, adv)
    dropped, _ = run(algo, stop, adv[:len(stop)])
    assert metrics["masked_truncated_rows"] == 2
    # with the token mean, masking the truncated rows is training on the others alone
    for p, q in zip(masked.parameters(), dropped.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)
    unmasked, _ = run(algo.model_copy(update={"mask_truncated_completions": False}), rows, adv)
    assert any(not torch.allclose(p, q) for p, q in zip(masked.parameters(), unmasked.parameters(), strict=True))
    # entropy: the pre-update policy's mean token entropy over the trained (stop) rows' responses
    want, n = 0.0, 0
    with torch.no_grad():
        for r in stop:
            ids = torch.tensor([list(r.prompt_ids) + list(r.response_ids)])
            logq = torch.log_softmax(model(input_ids=ids).logits.float()[0, len(r.prompt_ids) - 1:-1], -1)
            want += float(-(logq.exp() * logq).sum())
            n += len(r.response_ids)
    assert metrics["entropy"] == pytest.approx(want / n, rel=1e-4)


def test_constant_aggregation_needs_the_response_cap(load_tiny):
    model, tok = load_tiny(LLAMA)
    rows = [r for r, _ in make_agent_rows("a", model, tok, n_prompts=1, g=2)]
    algo = AlgoConfig.preset("gspo", kl_coef=0.0, loss_aggregation="constant")
    with pytest.raises(ValueError, match="max_response_tokens"):
        hacpo_update(model, make_optimizer(model, OptimConfig()), rows, [1.0, -1.0], {}, algo, OptimConfig(),
                     learner="a")


def _with_dropout(model, p: float):
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = p
    return model


def test_train_mode_update_uses_dropout_and_eval_mode_old_logprobs(load_tiny):
    model, tok = load_tiny(LLAMA)
    rows = [r for r, _ in make_agent_rows("a", model, tok, n_prompts=2, g=3)]
    adv = row_advantages(rows, {}, AlgoConfig(), learner="a")
    _with_dropout(model, 0.5)
    modes: list[tuple[bool, bool]] = []                   # (training, grad enabled) of every decoder forward
    model.model.register_forward_pre_hook(lambda m, _: modes.append((m.training, torch.is_grad_enabled())))
    optim = OptimConfig(lr=1e-3)
    grpo = AlgoConfig.preset("grpo", kl_coef=0.0)
    model.train()
    hacpo_update(model, make_optimizer(model, optim), rows, adv, {}, grpo, optim, learner="a")
    assert modes[0] == (False, False)                     # the GRPO old log-probs: eval mode, no grad
    assert all(mode == (True, True) for mode in modes[1:]) and len(modes) > 1
    assert model.training                                 # the caller's mode is left as it was

    # with dropout active the first mini-batch's own ratios move off 1; in eval mode they are 1
    gspo = AlgoConfig.preset("gspo", kl_coef=0.0)
    fresh, _ = load_tiny(LLAMA)
    on = _with_dropout(copy.deepcopy(fresh), 0.5).train()
    off = _with_dropout(copy.deepcopy(fresh), 0.5).eval()
    s_on = hacpo_update(on, make_optimizer(on, optim), rows, adv, {}, gspo, optim, learner="a")["src/a/s_mean"]
    s_off = hacpo_update(off, make_optimizer(off, optim), rows, adv, {}, gspo, optim, learner="a")["src/a/s_mean"]
    assert s_off == pytest.approx(1.0, abs=1e-5) and abs(s_on - 1.0) > 1e-3
