"""Multi-turn episodes in the update (docs/multi-turn.md, "The cross ratio of a trajectory"), on real tiny models:

* the glue between agent turns (template markers, the environment's observations) is context only: no loss,
  no gradient, not in any sum or count;
* the cross ratio of a trajectory compares the agent turns' content tokens (every stopped turn's EOS left out on
  both sides), the own ratio every agent token on both sides;
* the row gate sees the content log-likelihood, and shared-prompt packing stays exact with masked rows.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from algo_testkit import GEMMA, LLAMA

import hacrl_fed.update.loop as update
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.logprobs import token_logprobs
from hacrl_fed.algo.losses import compute_loss
from hacrl_fed.update.loop import hacpo_update, make_optimizer
from hacrl_fed.config import OptimConfig
from hacrl_fed.data.prompts import conversation_template, response_separator
from hacrl_fed.tokenization.episodes import EpisodeTemplate, foreign_episode_row, own_episode_row
from hacrl_fed.tokenization.views import collate, encode_response_text
from hacrl_fed.v1 import rollout_pb2 as pb

OBS = ["Guess a number from 1 to 9.", "Too low.", "Too high.", "Correct."]
PLAYS = [(["I guess 3.", "Then 7.", "So 5."], [True, False, True]),
         (["5", "the answer is 8"], [True, True]),
         (["We add 2 and 3", "first 4 then 6", "so the result equals 5"], [True, True, False])]


def template(tok) -> EpisodeTemplate:
    return EpisodeTemplate(tok, system_prompt="Solve.", chat_template=conversation_template(tok),
                           separator=response_separator(tok))


@torch.no_grad()
def logprobs(model, row) -> list[float]:
    """Per-token log π of the row's response ids (the behaviour forward of the project's log-prob function)."""
    ids = torch.tensor([list(row.prompt_ids + row.response_ids)])
    return token_logprobs(model, ids, torch.ones_like(ids))[0, len(row.prompt_ids):].tolist()


def play(agent: str, model, tok, msgs, stops, index: int, reward: float):
    """An own episode row: the agent's turns as ids, the template's glue, behaviour log-probs from ``model``."""
    t = template(tok)
    turns = [encode_response_text(tok, t.separator + m) + ([tok.eos_token_id] if s else [])
             for m, s in zip(msgs, stops, strict=True)]
    glues = [t.glue_ids(OBS[:k + 1], OBS[k + 1], turn_stopped=stops[k]) for k in range(len(msgs) - 1)]
    kwargs = dict(prompt_id="e1", sample_index=index, agent=agent, prompt_ids=t.prompt_ids(OBS[0]), turn_ids=turns,
                  glue_ids=glues, finish_reasons=["stop" if s else "length" for s in stops], reward=reward,
                  max_episode_tokens=1024)
    draft = own_episode_row(**kwargs, turn_logprobs=[[0.0] * len(x) for x in turns])
    lp = logprobs(model, draft)
    per_turn, at = [], 0
    for k, turn in enumerate(turns):
        per_turn.append(lp[at:at + len(turn)])
        at += len(turn) + (len(glues[k]) if k < len(glues) else 0)
    return own_episode_row(**kwargs, turn_logprobs=per_turn), lp


def on_the_wire(row, lp, msgs, stops) -> pb.Rollout:
    """The source's episode as it travels: texts, finish reasons, per-turn EOS log-probs, the behaviour sums."""
    turns = [pb.Turn(role=pb.ENV, text=OBS[0])]
    eos = iter(row.turn_eos)
    for k, (m, s) in enumerate(zip(msgs, stops, strict=True)):
        turn = pb.Turn(role=pb.AGENT, text=m, finish_reason=pb.STOP if s else pb.LENGTH)
        if s:
            turn.behaviour_eos_logprob = lp[next(eos)]
        turns += [turn, pb.Turn(role=pb.ENV, text=OBS[k + 1])]
    return pb.Rollout(prompt_id=row.prompt_id, sample_index=row.sample_index, reward=row.reward,
                      behaviour_logprob_sum=row.behaviour_logprob_sum, behaviour_token_count=row.behaviour_token_count,
                      finish_reason=turns[-2].finish_reason, turns=turns)


@pytest.fixture
def episodes(load_tiny):
    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    own = [play("a", model_a, tok_a, *PLAYS[i], index=i, reward=float(i % 2))[0] for i in range(2)]
    src, src_lp = play("b", model_b, tok_b, *PLAYS[2], index=0, reward=1.0)
    foreign = foreign_episode_row(template(tok_a), on_the_wire(src, src_lp, *PLAYS[2]), "b", 1024)
    return model_a, own + [foreign], src, src_lp


def _capture(monkeypatch):
    seen = []

    def spy(inputs, cfg):
        seen.append(inputs)
        return compute_loss(inputs, cfg)

    monkeypatch.setattr(update, "compute_loss", spy)
    return seen


def _micro_order(rows) -> list[int]:
    """The rows of the update's single micro-batch, in its order (longest first)."""
    (micro,) = update.plan_microbatches([len(r.prompt_ids) + len(r.response_ids) for r in rows], 4096)
    return micro


def test_the_ratio_of_a_trajectory_compares_content_tokens(episodes, monkeypatch):
    model, rows, src, src_lp = episodes
    foreign = rows[2]
    assert foreign.ratio_excludes_eos and len(foreign.turn_eos) == 2 and foreign.finish_reason == "length"
    # the source's EOS terms, as they travelled per turn: model b's log-probs of its two stopped turns' EOS
    assert foreign.behaviour_eos_logprob == pytest.approx(sum(src_lp[i] for i in src.turn_eos))
    # by hand: the learner's mean over the agent turns without their EOS, the source's over its content tokens
    lp = logprobs(model, foreign)
    content = [i for i, m in enumerate(foreign.token_mask) if m and i not in foreign.turn_eos]
    assert len(content) == foreign.learner_token_count - 2 < len(foreign.response_ids) - 2
    learner = sum(lp[i] for i in content) / len(content)
    source = (src.behaviour_logprob_sum - foreign.behaviour_eos_logprob) / (src.behaviour_token_count - 2)
    seen = _capture(monkeypatch)
    algo = AlgoConfig(kl_coef=0.0, cross_clip=False)
    optim = OptimConfig(mini_batch_rows=64, shared_prompt_forward="off")   # rows in _micro_order
    metrics = hacpo_update(model, make_optimizer(model, optim), rows, [0.5, -0.5, 1.0], {"b": 1.0}, algo, optim,
                           learner="a")
    assert metrics["src/b/s_mean"] == pytest.approx(math.exp(learner - source), rel=1e-5)
    # own rows: the behaviour forward of the same policy over the same (agent) tokens: s = 1
    assert metrics["src/a/s_mean"] == pytest.approx(1.0, abs=1e-5)
    # the update's inputs: trained tokens only, counted as such; the ratio's content mask without the turns' EOS
    (inputs,) = seen
    order = _micro_order(rows)
    assert torch.equal(inputs.response_mask.cpu(), collate([rows[i] for i in order], 0)["response_mask"].bool())
    assert inputs.num_tokens == sum(r.trained_token_count for r in rows) < sum(len(r.response_ids) for r in rows)
    assert inputs.num_own_tokens == sum(r.trained_token_count for r in rows[:2])
    b = order.index(2)
    plen = len(foreign.prompt_ids)
    assert inputs.ratio_mask[b].nonzero().flatten().tolist() == [plen + i for i in content]
    assert inputs.old_logprob_sum[b].item() == pytest.approx(src.behaviour_logprob_sum - foreign.behaviour_eos_logprob)
    assert inputs.old_token_count[b].item() == src.behaviour_token_count - 2


def test_glue_tokens_get_no_gradient(episodes, monkeypatch):
    model, rows, *_ = episodes
    seen = _capture(monkeypatch)
    algo = AlgoConfig(kl_coef=0.0, cross_clip=False, loss_aggregation="token_mean")
    optim = OptimConfig(mini_batch_rows=64, shared_prompt_forward="off")   # rows in _micro_order
    hacpo_update(model, make_optimizer(model, optim), rows, [0.5, -0.5, 1.0], {"b": 1.0}, algo, optim, learner="a")
    (inputs,) = seen
    resp = inputs.response_mask.bool()
    ordered = [rows[i] for i in _micro_order(rows)]
    glue = collate(ordered, 0)["attention_mask"].bool() & ~_prompt_mask(ordered) & ~resp
    assert int(glue.sum()) == sum(len(r.response_ids) - r.trained_token_count for r in rows) > 0

    def loss_and_grad(logp):
        leaf = logp.detach().clone().requires_grad_(True)
        loss = compute_loss(update.LossInputs(**{**inputs.__dict__, "token_logprobs": leaf}), algo).loss
        loss.backward()
        return loss.detach(), leaf.grad

    loss, grad = loss_and_grad(inputs.token_logprobs)
    assert torch.count_nonzero(grad[~resp]) == 0
    assert bool((grad[resp] != 0).all())                       # every agent token, each turn's EOS included
    # whatever the model says about the glue (an observation's tokens, a template marker), the loss is the same
    noisy = inputs.token_logprobs.detach().clone()
    noisy[glue] = torch.randn(int(glue.sum()), generator=torch.Generator().manual_seed(0)) * 5 - 3
    assert torch.equal(loss_and_grad(noisy)[0], loss)
    touched = inputs.token_logprobs.detach().clone()
    touched[resp] -= 0.1
    assert not torch.equal(loss_and_grad(touched)[0], loss)


def _prompt_mask(rows) -> torch.Tensor:
    batch = collate(rows, 0)
    pos = torch.arange(batch["input_ids"].shape[1]).unsqueeze(0)
    return pos < batch["prompt_lens"].unsqueeze(1)


def test_the_row_gate_sees_the_content_loglikelihood_of_the_agent_turns(episodes):
    model, rows, *_ = episodes
    expected = {}
    for r in rows:
        lp = logprobs(model, r)
        expected[(r.source_agent, r.sample_index)] = sum(
            lp[i] for i, m in enumerate(r.token_mask) if m and i not in r.turn_eos)
    shown = {}

    def gate(batch_rows, sums):
        for r, s in zip(batch_rows, sums, strict=True):
            shown.setdefault((r.source_agent, r.sample_index), s)
        return [1.0] * len(batch_rows)

    optim = OptimConfig(mini_batch_rows=64)
    hacpo_update(model, make_optimizer(model, optim), rows, [0.5, -0.5, 1.0], {"b": 1.0}, AlgoConfig(kl_coef=0.0),
                 optim, learner="a", row_gate=gate)
    assert shown.keys() == expected.keys()
    for key, value in expected.items():
        assert shown[key] == pytest.approx(value, rel=1e-5, abs=1e-5)


def test_packing_is_exact_with_episode_rows(episodes, monkeypatch):
    model, rows, *_ = episodes
    assert len({r.prompt_ids for r in rows}) == 1           # one first observation: one shared prompt
    algo = AlgoConfig(kl_coef=0.01, cross_clip=False)
    ref = copy.deepcopy(model)
    packed_calls = []

    def spy(model, input_ids, attention_mask, **kw):
        packed_calls.append(kw.get("packed") is not None)
        return token_logprobs(model, input_ids, attention_mask, **kw)

    monkeypatch.setattr(update, "token_logprobs", spy)
    out = {}
    for mode in ("off", "on"):
        packed_calls.clear()
        m = copy.deepcopy(model)
        optim = OptimConfig(mini_batch_rows=64, grad_clip=1e6, shared_prompt_forward=mode)
        metrics = hacpo_update(m, torch.optim.SGD(m.parameters(), lr=0.5), rows, [0.5, -0.5, 1.0], {"b": 1.0},
                               algo, optim, learner="a", ref_model=ref)
        assert packed_calls and all(p == (mode == "on") for p in packed_calls)
        out[mode] = (torch.cat([p.detach().flatten() for p in m.parameters()]), metrics)
    torch.testing.assert_close(out["on"][0], out["off"][0], rtol=1e-4, atol=1e-6)
    assert out["on"][1]["entropy"] == pytest.approx(out["off"][1]["entropy"], rel=1e-5)
    assert out["on"][1]["src/b/s_mean"] == pytest.approx(out["off"][1]["src/b/s_mean"], rel=1e-5)
