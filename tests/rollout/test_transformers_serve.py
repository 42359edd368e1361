"""The endpoint rollout source against a real ``transformers serve`` on a tiny local model: no ``n``, no
log-probs — the contributor still delivers G samples per prompt, without a behaviour log-prob."""

from __future__ import annotations

import pytest
from tf_serve import transformers_serve

from hacrl_fed.rollout.endpoint import EndpointRolloutSource, EndpointSettings
from hacrl_fed.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfserve")
    model = build_tiny_model("tiny-llama-bpe", root / "model")
    with transformers_serve(model, root / "serve.log") as url:
        yield url, str(model)


def test_a_contributor_gets_g_samples_per_prompt_without_n_and_logprobs(served):
    url, model = served
    src = EndpointRolloutSource(EndpointSettings(base_url=url, model=model, max_concurrency=2, timeout_s=120.0,
                                                 max_retries=1))
    msgs = [[{"role": "system", "content": "Solve."}, {"role": "user", "content": f"What is {a} + 1?"}]
            for a in range(2)]
    samples = src.generate(msgs, 3, temperature=1.0, top_p=1.0, max_tokens=6, stop=["\n\n"], seed=1)
    assert [(s.prompt_index, s.sample_index) for s in samples] == [(i, j) for i in range(2) for j in range(3)]
    for s in samples:
        assert isinstance(s.text, str) and s.finish_reason in ("stop", "length")
        assert s.logprob_sum is None and s.eos_logprob is None      # the server returns no log-probs
        assert 0 <= s.token_count <= 6
    assert src._use_n is False          # it answered n = 3 with one choice: single requests from then on
