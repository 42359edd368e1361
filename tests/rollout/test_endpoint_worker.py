"""The rollout-only site's worker over a local OpenAI-compatible server (tests/helpers/fake_openai.py): its
signed batch passes the coordinator's validation, carries the behaviour log-prob exactly when the endpoint
returned one, and a failing endpoint refuses that step only, with its cause."""

from __future__ import annotations

import pytest
from fake_openai import ANSWER, EOS_LOGPROB, LOGPROBS, FakeOpenAI

from fedutil import boxed_verify
from hacrl_fed.config import AgentConfig
from hacrl_fed.protocol.validation import has_behaviour_logprob, validate_envelope
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.contributor import EndpointWorker
from hacrl_fed.worker.errors import PreconditionError


class _Verifier:
    def verify(self, responses, references, styles, problems=None):
        return boxed_verify(responses, references, styles, problems)


def worker(federation, server: FakeOpenAI, **endpoint) -> EndpointWorker:
    cfg = AgentConfig.model_validate({
        "name": "carol", "private_key": str(federation.key_file("carol")), "roster": str(federation.roster_path),
        "model": {"name_or_path": "served-model", "stop": ["\n\n"]},
        "endpoint": {"url": server.base_url, "max_retries": 0, **endpoint}})
    return EndpointWorker(cfg, verifier=_Verifier())


@pytest.mark.parametrize("mode, with_logprob", [("vllm", True), ("plain", False), ("short_logprobs", False)])
def test_a_signed_batch_the_coordinator_accepts(federation, plan, mode, with_logprob):
    server = FakeOpenAI(mode)
    try:
        w = worker(federation, server)
        p = plan(step=1, b=2, g=3)
        p.sampling.max_new_tokens = 16
        reply = w.generate(p)
        item = validate_envelope(reply.envelope.SerializeToString(), federation.roster, p, expected_agent="carol",
                                 max_bytes=1 << 20)
        rows = item.batch.rollouts
        assert len(rows) == 6 and all(r.response_text == ANSWER for r in rows)
        assert all(has_behaviour_logprob(r) == with_logprob for r in rows)
        if with_logprob:
            assert rows[0].behaviour_logprob_sum == pytest.approx(sum(LOGPROBS) + EOS_LOGPROB)
            assert rows[0].behaviour_eos_logprob == EOS_LOGPROB and rows[0].behaviour_token_count == 6
        else:
            assert not any(r.HasField("behaviour_eos_logprob") for r in rows)
        assert reply.metrics["behaviour_logprob_rows"] == (6.0 if with_logprob else 0.0)
        assert item.batch.model_fingerprint.startswith("api:")
        r = server.requests[0]
        assert r["model"] == "served-model" and r["stop"] == ["\n\n"] and r["max_tokens"] == 16
        assert r["messages"][0]["role"] == "system" and r["messages"][-1]["role"] == "user"
        with pytest.raises(PreconditionError, match="does not train"):
            w.train(wpb.TrainRequest(run_id=p.run_id, step=1))
        assert w.health().engine == "endpoint"
    finally:
        server.close()


def test_a_failing_endpoint_refuses_that_step_only(federation, plan):
    server = FakeOpenAI("error500")
    try:
        w = worker(federation, server)
        with pytest.raises(PreconditionError, match="step 1: the endpoint failed: the endpoint answered HTTP 500"):
            w.generate(plan(step=1))
        server.mode = "plain"
        assert len(w.generate(plan(step=2)).envelope.payload) > 0        # the next step works
    finally:
        server.close()
