"""Shared-prompt packing: one prompt forward per group gives the unpacked log-probs, entropies, gradients, updates."""

from __future__ import annotations

import copy

import pytest
import torch
from algo_testkit import GEMMA, LLAMA, as_foreign, make_agent_rows

from hacrl_fed.algo.advantages import row_advantages
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.logprobs import packing_unsupported, token_logprobs
from hacrl_fed.update.loop import hacpo_update
from hacrl_fed.config import OptimConfig
from hacrl_fed.tokenization.packing import pack_rows, plan_packed_microbatches
from hacrl_fed.tokenization.views import collate

transformers = pytest.importorskip("transformers")


class Row:
    def __init__(self, prompt_ids, response_ids):
        self.prompt_ids, self.response_ids = list(prompt_ids), list(response_ids)


def _rows(vocab: int, seed: int = 0) -> list[Row]:
    """Two groups of unequal response lengths, a singleton, and a row whose prompt is a prefix of another's
    (must not share). Rows reach 90 tokens: past tiny Gemma's sliding window of 64."""
    g = torch.Generator().manual_seed(seed)

    def ids(n):
        return torch.randint(0, vocab, (n,), generator=g).tolist()

    p1, p2, p3 = ids(30), ids(11), ids(25)
    return ([Row(p1, ids(n)) for n in (60, 7, 33)] + [Row(p2, ids(n)) for n in (40, 1)] + [Row(p3, ids(20))]
            + [Row(p1[:29], ids(5))])


def _packs(rows, budget=10**6):
    plan = plan_packed_microbatches([r.prompt_ids for r in rows], [len(r.response_ids) for r in rows], budget)
    return [pack for micro in plan for pack in micro]


def _run(model, rows, packed: bool, *, temperature=0.7, chunk=16):
    """Log-probs, entropies and parameter gradients of a fixed weighted sum, packed or not."""
    batch = collate(rows, 0)
    layout = pack_rows(batch["input_ids"], batch["prompt_lens"], batch["response_lens"], _packs(rows), 0) if packed else None
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=temperature,
                             chunk_tokens=chunk, score_mask=batch["response_mask"], return_entropy=True, packed=layout)
    weights = torch.linspace(-1.0, 1.0, lp.numel()).view_as(lp)
    (lp * weights).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent, grads


def _assert_same(a, b, lp_tol=5e-6):
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = a, b
    assert (lp_a - lp_b).abs().max() <= lp_tol and (ent_a - ent_b).abs().max() <= lp_tol
    assert lp_a.abs().sum() > 0 and g_a.keys() == g_b.keys() and g_a
    for name in g_a:  # float32 sums in another order: |Δ| within 1e-5 of the tensor's largest entry
        assert (g_a[name] - g_b[name]).abs().max() <= 1e-5 * g_a[name].abs().max() + 1e-9, name


def test_plan_groups_shared_prompts_within_budget():
    prompts = [[1, 2, 3]] * 3 + [[4, 5]] * 2 + [[9]] + [[1, 2]]
    lens = [10, 3, 5, 4, 4, 8, 2]
    plan = plan_packed_microbatches(prompts, lens, 40)
    packs = [sorted(p) for m in plan for p in m]
    assert sorted(i for p in packs for i in p) == list(range(7))
    assert [0, 1, 2] in packs and [3, 4] in packs and [5] in packs and [6] in packs
    assert plan_packed_microbatches(prompts, lens, 12) and all(
        len(p) == 1 or len(prompts[p[0]]) + sum(lens[i] for i in p) <= 12
        for m in plan_packed_microbatches(prompts, lens, 12) for p in m)
    for micro in plan:  # packs × longest packed length within the budget (a lone pack may exceed it)
        widths = [len(prompts[p[0]]) + sum(lens[i] for i in p) for p in micro]
        assert len(micro) == 1 or len(micro) * max(widths) <= 40


def test_pack_size_follows_the_models_attention_cost():
    from types import SimpleNamespace

    from hacrl_fed.tokenization.packing import pair_cost

    smollm2 = SimpleNamespace(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                              intermediate_size=1536)
    assert pair_cost(smollm2) == 3072 and pair_cost(None) == float("inf")
    # P = 45, R = 90: the cheapest pack is (P/R)·sqrt(1 + 3072/P) ≈ 4.2 responses
    plan = plan_packed_microbatches([[1] * 45] * 8, [90] * 8, 10**6, pair_cost(smollm2))
    assert sorted(len(p) for m in plan for p in m) == [4, 4]
    assert [len(p) for m in plan_packed_microbatches([[1] * 45] * 8, [90] * 8, 10**6) for p in m] == [8]


def test_pack_rows_rejects_a_pack_without_one_prompt():
    rows = [Row([1, 2], [3]), Row([1, 7], [4])]
    batch = collate(rows, 0)
    with pytest.raises(ValueError, match="share the prompt"):
        pack_rows(batch["input_ids"], batch["prompt_lens"], batch["response_lens"], [[0, 1]], 0)
    with pytest.raises(ValueError, match="exactly once"):
        pack_rows(batch["input_ids"], batch["prompt_lens"], batch["response_lens"], [[0]], 0)


def test_pack_layout_positions_restart_per_response():
    rows = [Row([5, 6], [7, 8, 9]), Row([5, 6], [10])]
    batch = collate(rows, 0)
    packed = pack_rows(batch["input_ids"], batch["prompt_lens"], batch["response_lens"], [[0, 1]], 0)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9, 10]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 2]]
    assert packed.segments.tolist() == [[0, 0, 1, 1, 1, 2]]
    assert packed.index.tolist() == [[0, 1, 2, 3, 4], [0, 1, 5, 0, 0]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", [LLAMA, GEMMA])
def test_packed_logprobs_entropy_and_grads_equal_unpacked(tiny_dirs, kind, attn):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs[kind], dtype=torch.float32,
                                                              attn_implementation=attn)
    assert packing_unsupported(model) is None
    rows = _rows(model.config.vocab_size)
    if kind == GEMMA:
        assert max(len(r.prompt_ids) + len(r.response_ids) for r in rows) > model.config.sliding_window
    _assert_same(_run(model, rows, False), _run(model, rows, True))


@pytest.mark.parametrize("kind", [LLAMA, GEMMA])
def test_packed_equal_with_gradient_checkpointing_in_train_mode(tiny_dirs, kind):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs[kind], dtype=torch.float32)
    model.gradient_checkpointing_enable()
    model.train()
    rows = _rows(model.config.vocab_size, seed=3)
    _assert_same(_run(model, rows, False, temperature=1.0), _run(model, rows, True, temperature=1.0))


def test_packed_equal_through_lora(tiny_dirs):
    peft = pytest.importorskip("peft")
    base = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs[LLAMA], dtype=torch.float32)
    model = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj", "lm_head"],
                                                      init_lora_weights=False))
    assert packing_unsupported(model) is None
    rows = _rows(model.config.vocab_size, seed=5)
    unpacked, packed = _run(model, rows, False), _run(model, rows, True)
    _assert_same(unpacked, packed)
    assert all("lora_" in n for n in packed[2])


def test_packing_is_refused_where_a_mask_would_be_ignored(tiny_dirs):
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dirs[LLAMA], dtype=torch.float32)
    model.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in packing_unsupported(model)
    rows = _rows(model.config.vocab_size)
    batch = collate(rows, 0)
    layout = pack_rows(batch["input_ids"], batch["prompt_lens"], batch["response_lens"], _packs(rows), 0)
    with pytest.raises(ValueError, match="not exact"):
        token_logprobs(model, batch["input_ids"], batch["attention_mask"], packed=layout)


@pytest.fixture
def agents(load_tiny):
    model_a, tok_a = load_tiny(LLAMA)
    model_b, tok_b = load_tiny(GEMMA)
    own = [row for row, _ in make_agent_rows("a", model_a, tok_a, n_prompts=2, g=3)]
    from_b = as_foreign(make_agent_rows("b", model_b, tok_b, n_prompts=2, g=3, seed=1), tok_a, "b")
    from_c = as_foreign(make_agent_rows("c", model_a, tok_a, n_prompts=3, g=1, seed=2), tok_a, "c")  # 1 singleton
    return model_a, from_c + own + from_b, {"b": 1.6, "c": 0.5}


def _flat(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


@pytest.mark.parametrize("recipe", ["hacpo", "grpo"])
def test_update_with_and_without_packing_is_the_same(agents, monkeypatch, recipe):
    """The whole step (own + foreign rows, groups and singletons, KL to the reference, GRPO's old per-token
    pass) moves the parameters the same with the option on and off; on, every forward is packed."""
    import hacrl_fed.update.loop as update

    model, rows, ratios = agents
    if recipe == "grpo":
        rows = [r for r in rows if r.is_own]
    algo = AlgoConfig(kl_coef=0.01, cross_clip=False) if recipe == "hacpo" else AlgoConfig.preset("grpo", kl_coef=0.01)
    adv = row_advantages(rows, ratios, algo, learner="a")
    ref = copy.deepcopy(model)
    seen = []

    def spy(model, input_ids, attention_mask, **kw):
        seen.append(kw.get("packed") is not None)
        return token_logprobs(model, input_ids, attention_mask, **kw)

    monkeypatch.setattr(update, "token_logprobs", spy)
    out = {}
    for mode in ("off", "on"):
        seen.clear()
        m = copy.deepcopy(model)
        optim = OptimConfig(mini_batch_rows=64, micro_batch_tokens=300, grad_clip=1e6, shared_prompt_forward=mode)
        metrics = hacpo_update(m, torch.optim.SGD(m.parameters(), lr=0.5), rows, adv, ratios, algo, optim,
                               learner="a", ref_model=ref)
        assert seen and all(s == (mode == "on") for s in seen)
        out[mode] = (_flat(m), metrics)
    torch.testing.assert_close(out["on"][0], out["off"][0], rtol=1e-4, atol=1e-6)
    assert not torch.equal(out["on"][0], _flat(model))
    for key in ("loss", "kl", "entropy", "tokens", "src/a/s_mean"):
        assert out["on"][1][key] == pytest.approx(out["off"][1][key], rel=1e-5, abs=1e-7), key


def test_auto_packs_only_supported_models_and_on_refuses_the_rest(agents, monkeypatch):
    import hacrl_fed.update.loop as update

    model, rows, ratios = agents
    algo = AlgoConfig(kl_coef=0.0)
    adv = row_advantages(rows, ratios, algo, learner="a")
    assert OptimConfig().shared_prompt_forward == "auto"
    assert update._use_packing(model, OptimConfig()) and not update._use_packing(
        model, OptimConfig(shared_prompt_forward="off"))
    monkeypatch.setattr(update, "packing_unsupported", lambda m: "attention implementation 'x'")
    assert not update._use_packing(model, OptimConfig())
    before = _flat(model)
    with pytest.raises(ValueError, match="shared_prompt_forward"):
        hacpo_update(model, make_sgd(model), rows, adv, ratios, algo, OptimConfig(shared_prompt_forward="on"),
                     learner="a")
    assert torch.equal(before, _flat(model))


def make_sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)
