"""hacpo_update on real tiny models with incompatible tokenizers (spec §8.3 step 6d)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from algo_testkit import GEMMA, LLAMA, as_foreign, make_agent_rows, sequence_logprob_sum

from hacrl_fed.algo.advantages import row_advantages
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.loop import (
    hacpo_update,
    make_optimizer,
    order_rows,
    plan_microbatches,
    plan_minibatches,
    source_order,
)
from hacrl_fed.config import OptimConfig


class R:
    def __init__(self, source):
        self.source_agent = source


def test_order_rows_own_first_then_sorted_sources():
    rows = [R(s) for s in ["c", "k", "b", "c", "k", "b"]]
    assert order_rows(rows, "k") == [1, 4, 2, 5, 0, 3]


def test_order_rows_rotates_sources_by_step():
    rows = [R(s) for s in ["c", "k", "b", "d", "c", "b"]]
    assert source_order(["c", "b", "d", "b"], 0) == ["b", "c", "d"]
    assert source_order(["c", "b", "d"], 1) == ["c", "d", "b"]
    assert source_order(["c", "b", "d"], 5) == ["d", "b", "c"]
    assert source_order([], 3) == []
    assert order_rows(rows, "k", rotation=1) == [1, 0, 4, 3, 2, 5]
    # every source is last (tightest stepwise bounds) equally often over N − 1 consecutive steps
    lasts = [source_order(["b", "c", "d"], step)[-1] for step in range(6)]
    assert sorted(lasts) == ["b", "b", "c", "c", "d", "d"]


def test_plan_minibatches_counts_m_over_epochs():
    own = [True] * 5 + [False] * 6
    plan = plan_minibatches(own, 4, epochs=2, stepwise_index="update")
    assert [len(mb.rows) for mb in plan] == [4, 4, 3] * 2
    assert [mb.m for mb in plan] == [0, 1, 2, 3, 4, 5] and [mb.epoch for mb in plan] == [0, 0, 0, 1, 1, 1]
    plan = plan_minibatches(own, 4, epochs=2, stepwise_index="cross_update")
    assert [mb.m for mb in plan] == [0, 0, 1, 2, 2, 3]           # own-only updates do not tighten
    with pytest.raises(ValueError):
        plan_minibatches(own, 0)


def test_plan_microbatches_fits_budget_and_covers_rows():
    lengths = [5, 40, 12, 12, 7, 100, 3]
    micro = plan_microbatches(lengths, 30)
    assert sorted(i for m in micro for i in m) == list(range(len(lengths)))
    for m in micro:
        assert len(m) * max(lengths[i] for i in m) <= 30 or len(m) == 1


@pytest.fixture
def agents(load_tiny):
    """Learner "a" (tiny Llama) with its own rows, and the rows it receives from "b" (tiny Gemma,
    another tokenizer) and "c" (a second Llama-tokenizer agent)."""
    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    own = [row for row, _ in make_agent_rows("a", model_a, tok_a, n_prompts=2, g=3)]
    from_b = as_foreign(make_agent_rows("b", model_b, tok_b, n_prompts=2, g=3, seed=1), tok_a, "b")
    from_c = as_foreign(make_agent_rows("c", model_a, tok_a, n_prompts=2, g=3, seed=2), tok_a, "c")
    rows = from_c + own + from_b                      # any order; the update orders them
    ratios = {"b": 1.6, "c": 0.5}
    return model_a, rows, ratios


def flat(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def test_smoke_three_agents(agents):
    model, rows, ratios = agents
    algo = AlgoConfig(kl_coef=0.001)
    optim = OptimConfig(lr=1e-3, mini_batch_rows=6, micro_batch_tokens=256)
    adv = row_advantages(rows, ratios, algo, learner="a")
    before = flat(model)
    metrics = hacpo_update(model, make_optimizer(model, optim), rows, adv, ratios, algo, optim, learner="a",
                           ref_model=copy.deepcopy(model))
    assert not torch.equal(before, flat(model))
    assert metrics["updates"] == 3 and metrics["rows"] == 18 and metrics["skipped_updates"] == 0
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["tokens"] == sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    for src in ("a", "b", "c"):
        assert metrics[f"src/{src}/rows"] == 6
        for key in ("s_mean", "s_min", "s_max", "clip_low", "clip_high", "adv_abs_mean", "loss"):
            assert f"src/{src}/{key}" in metrics
    # own rows: the behaviour sum came from this model's own forward ⇒ s = 1 in the first update
    assert metrics["src/a/s_mean"] == pytest.approx(1.0, abs=1e-5)
    # cross rows in updates 1 and 2 (cross_update index 0, 1)
    assert metrics["cross_lower_bound_first"] == pytest.approx(0.8)
    assert metrics["cross_lower_bound_last"] == pytest.approx(0.825)
    assert metrics["kl"] >= 0.0 and metrics["grad_norm"] > 0


def test_cross_ratio_is_never_the_on_policy_shortcut(agents):
    """One mini-batch, one epoch: the cross ratio still uses the source's behaviour log-prob."""
    model, rows, ratios = agents
    b_rows = [r for r in rows if r.source_agent == "b"]
    expected = [math.exp(sequence_logprob_sum(model, r.prompt_ids, r.response_ids) / len(r.response_ids)
                         - r.behaviour_logprob_sum / r.behaviour_token_count) for r in b_rows]
    algo, optim = AlgoConfig(kl_coef=0.0), OptimConfig(mini_batch_rows=64)
    metrics = hacpo_update(model, make_optimizer(model, optim), b_rows, [0.5] * len(b_rows), ratios, algo, optim,
                           learner="a")
    assert metrics["updates"] == 1
    assert metrics["src/b/s_mean"] == pytest.approx(sum(expected) / len(expected), rel=1e-5)
    assert metrics["src/b/s_min"] == pytest.approx(min(expected), rel=1e-5)
    assert abs(metrics["src/b/s_mean"] - 1.0) > 1e-3


def test_micro_batching_matches_one_big_batch(agents):
    """Gradient accumulation is scaled so the mini-batch loss is the mean over its rows: with SGD the
    parameters after one update are the same whatever the micro-batch token budget."""
    model, rows, ratios = agents
    algo = AlgoConfig(kl_coef=0.001, cross_clip=False)
    adv = row_advantages(rows, ratios, algo, learner="a")
    ref = copy.deepcopy(model)
    results = []
    for budget in (10_000, 64):
        m = copy.deepcopy(model)
        optim = OptimConfig(mini_batch_rows=64, micro_batch_tokens=budget, grad_clip=1e6)
        out = hacpo_update(m, torch.optim.SGD(m.parameters(), lr=0.5), rows, adv, ratios, algo, optim,
                           learner="a", ref_model=ref)
        results.append((flat(m), out["loss"]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-4, atol=1e-6)
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-5)
    assert not torch.equal(results[0][0], flat(model))


def test_optimizer_is_fused_adamw_with_the_for_loop_update(agents):
    """make_optimizer runs AdamW on torch's fused kernel where the parameters allow it (no parameter-sized
    temporaries), and one update equals torch's for-loop AdamW to float round-off; elsewhere torch's default."""
    model, rows, ratios = agents
    algo = AlgoConfig(kl_coef=0.0)
    optim = OptimConfig(lr=1e-3, weight_decay=0.01, mini_batch_rows=64)
    adv = row_advantages(rows, ratios, algo, learner="a")
    fused, loop = copy.deepcopy(model), copy.deepcopy(model)
    opt = make_optimizer(fused, optim)
    assert [g["fused"] for g in opt.param_groups] == [True]
    reference = torch.optim.AdamW([p for p in loop.parameters() if p.requires_grad], lr=optim.lr, betas=optim.betas,
                                  eps=optim.eps, weight_decay=optim.weight_decay, foreach=False)
    assert hacpo_update(fused, opt, rows, adv, ratios, algo, optim, learner="a")["updates"] == 1
    hacpo_update(loop, reference, rows, adv, ratios, algo, optim, learner="a")
    assert not torch.equal(flat(fused), flat(model))
    torch.testing.assert_close(flat(fused), flat(loop), rtol=0, atol=1e-6)
    assert make_optimizer(torch.nn.Linear(2, 2, device="meta"), optim).param_groups[0]["fused"] is None


def test_grpo_token_level_own_rows(agents):
    model, rows, _ = agents
    own = [r for r in rows if r.is_own]
    algo, optim = AlgoConfig.preset("grpo", kl_coef=0.0), OptimConfig(lr=1e-3, mini_batch_rows=3)
    adv = row_advantages(own, {}, algo, learner="a")
    metrics = hacpo_update(model, make_optimizer(model, optim), own, adv, {}, algo, optim, learner="a")
    assert metrics["updates"] == 2 and "src/b/rows" not in metrics
    assert metrics["src/a/s_min"] < metrics["src/a/s_max"]           # second update sees a moved policy
    assert math.isfinite(metrics["loss"])


def test_invalid_calls_raise_before_any_change(agents):
    model, rows, ratios = agents
    optim = OptimConfig()
    before = flat(model)
    opt = make_optimizer(model, optim)
    adv = [0.1] * len(rows)
    with pytest.raises(ValueError, match="ref_model"):
        hacpo_update(model, opt, rows, adv, ratios, AlgoConfig(), optim, learner="a")
    with pytest.raises(ValueError, match="isolated"):
        hacpo_update(model, opt, rows, adv, ratios, AlgoConfig.preset("gspo", kl_coef=0.0), optim, learner="a")
    with pytest.raises(ValueError, match="capability ratio"):
        hacpo_update(model, opt, rows, adv, {"b": 1.0}, AlgoConfig(kl_coef=0.0), optim, learner="a")
    with pytest.raises(ValueError, match="not finite"):
        hacpo_update(model, opt, rows, [math.nan] * len(rows), ratios, AlgoConfig(kl_coef=0.0), optim, learner="a")
    with pytest.raises(ValueError, match="advantages"):
        hacpo_update(model, opt, rows, adv[:-1], ratios, AlgoConfig(kl_coef=0.0), optim, learner="a")
    assert torch.equal(before, flat(model))
    assert hacpo_update(model, opt, [], [], {}, AlgoConfig(), optim, learner="a")["updates"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_update_on_cuda_matches_cpu(agents):
    """Same update on the GPU: every tensor follows the model's device; results agree with the CPU."""
    model, rows, ratios = agents
    algo = AlgoConfig(kl_coef=0.001)
    optim = OptimConfig(mini_batch_rows=6, micro_batch_tokens=256, grad_clip=1e6)
    adv = row_advantages(rows, ratios, algo, learner="a")
    out = {}
    for device in ("cpu", "cuda"):
        m = copy.deepcopy(model).to(device)
        out[device] = hacpo_update(m, torch.optim.SGD(m.parameters(), lr=0.1), rows, adv, ratios, algo, optim,
                                   learner="a", ref_model=copy.deepcopy(model).to(device))
    for key in ("loss", "src/b/s_mean", "src/c/s_mean", "src/a/s_mean"):
        assert out["cuda"][key] == pytest.approx(out["cpu"][key], rel=1e-3, abs=1e-5)


@pytest.mark.parametrize("recipe", ["hacpo", "grpo"])
def test_lm_head_runs_only_over_response_tokens(agents, monkeypatch, recipe):
    """Every forward of the update (learner, reference, GRPO's old per-token pass) asks for response positions only."""
    import hacrl_fed.update.loop as update

    model, rows, ratios = agents
    masks = []

    def spy(model, input_ids, attention_mask, **kw):
        masks.append((kw.get("score_mask"), attention_mask))
        return token_logprobs(model, input_ids, attention_mask, **kw)

    from hacrl_fed.update.logprobs import token_logprobs
    monkeypatch.setattr(update, "token_logprobs", spy)
    algo = AlgoConfig.preset(recipe)
    use = rows if algo.share_rollouts else [r for r in rows if r.is_own]
    adv = row_advantages(use, ratios, algo, learner="a")
    hacpo_update(model, make_optimizer(model, OptimConfig()), use, adv, ratios, algo, OptimConfig(), learner="a",
                 ref_model=copy.deepcopy(model))
    assert len(masks) >= 2 + (recipe == "grpo")
    for score, attention in masks:
        assert score is not None and score.bool().sum() < attention.bool().sum()   # prompts are never scored


def test_bf16_autocast_update_stays_near_float32(agents):
    """The same update under bf16 autocast: float32 weights, bf16 forwards; loss and gradient (an SGD step, so the
    move is the gradient) close to float32. Clipping is off: the rows' behaviour sums are float32 values, and bf16
    rounding of a ratio would move rows across a clip edge (the worker scores its rows under the same autocast)."""
    model, rows, ratios = agents
    algo = AlgoConfig(kl_coef=0.0, self_clip_low=0.99, self_clip_high=100.0, cross_clip=False)
    optim = OptimConfig(lr=1e-3, mini_batch_rows=64, grad_clip=1e6)
    adv = row_advantages(rows, ratios, algo, learner="a")
    out = {}
    for dtype in (None, torch.bfloat16):
        m = copy.deepcopy(model)
        metrics = hacpo_update(m, torch.optim.SGD(m.parameters(), lr=0.5), rows, adv, ratios, algo, optim,
                               learner="a", autocast_dtype=dtype)
        assert all(p.dtype == torch.float32 for p in m.parameters())
        out[dtype] = (metrics, flat(m) - flat(model))
    (m32, d32), (m16, d16) = out[None], out[torch.bfloat16]
    assert m16["loss"] == pytest.approx(m32["loss"], rel=0.05, abs=1e-3)
    assert float(torch.nn.functional.cosine_similarity(d32, d16, dim=0)) > 0.99
    assert m16["grad_norm"] == pytest.approx(m32["grad_norm"], rel=0.05)
    with pytest.raises(ValueError, match="autocast_dtype"):
        hacpo_update(model, make_optimizer(model, optim), rows, adv, ratios, algo, optim, learner="a",
                     autocast_dtype=torch.float64)
