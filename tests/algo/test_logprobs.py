"""Chunked selected-token log-probs == naive full log-softmax gather (values and gradients)."""

from __future__ import annotations

import pytest
import torch

from hacrl_fed.update.logprobs import position_ids_from_mask, token_logprobs, unwrap_causal_lm
from hacrl_fed.tiny_models import TINY_KINDS, build_tiny_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    return {kind: build_tiny_model(kind, tmp_path_factory.mktemp(kind)) for kind in TINY_KINDS}


@pytest.fixture(scope="module")
def models(model_dirs):
    return {kind: transformers.AutoModelForCausalLM.from_pretrained(path).float() for kind, path in model_dirs.items()}


def fresh_model(model_dirs, kind):
    """A private copy for tests that wrap or modify the model (peft)."""
    return transformers.AutoModelForCausalLM.from_pretrained(model_dirs[kind]).float()


def naive_logprobs(model, input_ids, attention_mask, temperature=1.0):
    """Reference: full log-softmax over model(...).logits, gathered, zero where t-1 or t is padding."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids_from_mask(attention_mask)).logits.float() / temperature
    lp = torch.log_softmax(logits, dim=-1)[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    valid = (attention_mask[:, 1:] * attention_mask[:, :-1]).bool()
    return torch.cat([torch.zeros(input_ids.shape[0], 1), torch.where(valid, lp, 0.0)], dim=1)


def batch(vocab, side, seed=0, B=3, T=13):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if side == "right":
        mask[1, 9:] = 0
        mask[2, 4:] = 0
    elif side == "left":
        mask[1, :2] = 0
        mask[2, :7] = 0
    return ids, mask


def grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def values_and_grads(fn, model, ids, mask, weights):
    model.zero_grad(set_to_none=True)
    lp = fn(model, ids, mask)
    (lp * weights).sum().backward()
    return lp.detach(), grads(model)


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "checkpoint"])
@pytest.mark.parametrize("kind", TINY_KINDS)
@pytest.mark.parametrize("side,chunk,temperature", [("right", 1, 1.0), ("right", 7, 0.6), ("left", 3, 1.3),
                                                    ("none", 1024, 1.0), ("left", 1024, 0.6)])
def test_chunked_matches_naive(models, kind, side, chunk, temperature, fused):
    model = models[kind]
    ids, mask = batch(model.config.vocab_size, side)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    got, g_got = values_and_grads(lambda m, i, a: token_logprobs(m, i, a, temperature=temperature, chunk_tokens=chunk,
                                                                     fused=fused),
                                  model, ids, mask, w)
    ref, g_ref = values_and_grads(lambda m, i, a: naive_logprobs(m, i, a, temperature), model, ids, mask, w)
    assert got.dtype == torch.float32 and got.shape == ids.shape
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert g_got.keys() == g_ref.keys() and len(g_got) == len(list(model.parameters()))
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=name)
    valid = torch.zeros_like(mask, dtype=torch.bool)
    valid[:, 1:] = (mask[:, 1:] * mask[:, :-1]).bool()
    assert (got[~valid] == 0).all() and (got[valid] < 0).all()


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "checkpoint"])
def test_softcapping_is_applied(models, fused):
    model = models["tiny-gemma-unigram"]
    ids, mask = batch(model.config.vocab_size, "right", seed=3)
    w = torch.randn(ids.shape)
    model.config.final_logit_softcapping = 0.5  # strong enough to change every log-prob
    try:
        capped, g_got = values_and_grads(lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=4, temperature=0.8,
                                                                        fused=fused), model, ids, mask, w)
        # Gemma3ForCausalLM softcaps in its own forward
        ref, g_ref = values_and_grads(lambda m, i, a: naive_logprobs(m, i, a, 0.8), model, ids, mask, w)
    finally:
        model.config.final_logit_softcapping = None
    uncapped = token_logprobs(model, ids, mask, chunk_tokens=4, temperature=0.8).detach()
    torch.testing.assert_close(capped, ref, atol=1e-5, rtol=1e-5)
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=name)
    assert (capped - uncapped).abs().max() > 1e-3


class HeadWithBias(torch.nn.Module):
    """Embedding + linear head with a bias, a logit scale and a softcap: exercises every fused-backward branch."""

    def __init__(self, vocab=50, hidden=8):
        super().__init__()
        self.model = torch.nn.Embedding(vocab, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=True)
        self.config = type("Cfg", (), {"final_logit_softcapping": 2.0, "logits_scaling": 0.5})()

    def get_decoder(self):
        class Out(torch.nn.Module):
            def __init__(self, emb):
                super().__init__()
                self.emb = emb

            def forward(self, input_ids, **_):
                return type("O", (), {"last_hidden_state": torch.tanh(self.emb(input_ids))})()
        return Out(self.model)

    def get_output_embeddings(self):
        return self.lm_head


def test_fused_backward_bias_scale_softcap():
    torch.manual_seed(0)
    model = HeadWithBias()
    ids, mask = batch(50, "right", seed=4)
    w = torch.randn(ids.shape)

    def naive(m, i, a):
        z = m.lm_head(m.get_decoder()(i).last_hidden_state) / 0.5
        z = torch.tanh(z / 2.0) * 2.0 / 0.9
        lp = torch.log_softmax(z, -1)[:, :-1].gather(-1, i[:, 1:, None]).squeeze(-1)
        return torch.cat([torch.zeros(i.shape[0], 1), lp * (a[:, 1:] * a[:, :-1])], 1)

    ref, g_ref = values_and_grads(naive, model, ids, mask, w)
    for fused in (True, False):
        got, g_got = values_and_grads(lambda m, i, a: token_logprobs(m, i, a, temperature=0.9, chunk_tokens=6,
                                                                     fused=fused), model, ids, mask, w)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert g_got.keys() == {"model.weight", "lm_head.weight", "lm_head.bias"}
        for name in g_ref:
            torch.testing.assert_close(g_got[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=name)


def test_left_padding_matches_unpadded_row(models):
    """A left-padded row scores its tokens exactly like the same row without padding (positions from the mask)."""
    model = models["tiny-llama-bpe"]
    ids, _ = batch(model.config.vocab_size, "none", B=1, T=9)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], dim=1)
    with torch.no_grad():
        alone = token_logprobs(model, ids, torch.ones_like(ids))
        left = token_logprobs(model, padded, mask, chunk_tokens=2)
    torch.testing.assert_close(left[:, 4:], alone, atol=1e-5, rtol=1e-5)
    assert not left.requires_grad


def test_peft_wrapped_model(model_dirs):
    peft = pytest.importorskip("peft")
    base = fresh_model(model_dirs, "tiny-llama-bpe")
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                        init_lora_weights=False))
    _, head, _ = unwrap_causal_lm(wrapped)
    assert head is base.get_output_embeddings()
    ids, mask = batch(base.config.vocab_size, "right", seed=5)
    w = torch.randn(ids.shape)
    got, g_got = values_and_grads(lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=5), wrapped, ids, mask, w)
    ref, g_ref = values_and_grads(naive_logprobs, wrapped, ids, mask, w)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert g_got.keys() == g_ref.keys() and g_got and all("lora_" in n for n in g_got)  # only adapters train
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=name)


def test_single_token_rows_keep_graph(models):
    model = models["tiny-llama-bpe"]
    ids = torch.tensor([[5], [7]])
    lp = token_logprobs(model, ids, torch.ones_like(ids))
    assert (lp == 0).all()
    lp.sum().backward()  # no error: the empty batch still has a graph


@pytest.mark.parametrize("kwargs,match", [({"temperature": 0.0}, "temperature"), ({"chunk_tokens": 0}, "chunk")])
def test_bad_arguments(models, kwargs, match):
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=match):
        token_logprobs(models["tiny-llama-bpe"], ids, torch.ones_like(ids), **kwargs)


def test_shape_mismatch(models):
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        token_logprobs(models["tiny-llama-bpe"], torch.tensor([[1, 2, 3]]), torch.ones(1, 2, dtype=torch.long))


def test_fused_needs_linear_head(model_dirs):
    """A LoRA-wrapped LM head is not an nn.Linear: auto mode takes the checkpoint path, fused=True refuses."""
    peft = pytest.importorskip("peft")
    base = fresh_model(model_dirs, "tiny-gemma-unigram")
    wrapped = peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["lm_head"], init_lora_weights=False))
    ids = torch.tensor([[1, 2, 3, 4]])
    mask = torch.ones_like(ids)
    with pytest.raises(TypeError, match="nn.Linear"):
        token_logprobs(wrapped, ids, mask, fused=True)
    w = torch.randn(ids.shape)
    got, g_got = values_and_grads(token_logprobs, wrapped, ids, mask, w)
    ref, g_ref = values_and_grads(naive_logprobs, wrapped, ids, mask, w)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert g_got.keys() == g_ref.keys() and any("lm_head" in n for n in g_got)
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=name)


def test_not_a_causal_lm():
    with pytest.raises(TypeError, match="causal LM"):
        unwrap_causal_lm(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kind", TINY_KINDS)
def test_bf16_autocast_fused_backward_matches_autograd(models, kind):
    """Under torch.autocast(bf16) the hand-written backward recomputes the logits under the same autocast state:
    values equal autograd's through the same bf16 forward and gradients agree to bf16 rounding (the head's weight
    gradient is accumulated in float32 here, in bf16 by autograd); both stay near float32."""
    model = models[kind]
    ids, mask = batch(model.config.vocab_size, "right", seed=5)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2))

    def under_autocast(fused):
        def fn(m, i, a):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return token_logprobs(m, i, a, chunk_tokens=4, fused=fused)
        return fn

    got, g_got = values_and_grads(under_autocast(None), model, ids, mask, w)
    ref, g_ref = values_and_grads(under_autocast(False), model, ids, mask, w)
    fp32, _ = values_and_grads(lambda m, i, a: token_logprobs(m, i, a, chunk_tokens=4), model, ids, mask, w)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    for name in g_ref:
        assert float((g_got[name] - g_ref[name]).norm() / g_ref[name].norm()) < 1e-2, name
    assert 0 < (got - fp32).abs().max() < 0.05         # bf16 rounding, nothing worse
