"""Redirects: a rollout-only site (and route eval's endpoint measurement) takes answers only from the URL it was
configured with — a 307 to another server (or to another path of the same one) is refused with the origin it
pointed to, and the other server never sees a request; ``route serve`` does not follow one either (the backend
counts as failed and the next one answers)."""

from __future__ import annotations

import logging

import pytest
from fake_openai import FakeOpenAI
from fastapi.testclient import TestClient

from hacrl_fed.rollout.endpoint import EndpointError, EndpointRolloutSource, EndpointSettings

MSGS = [[{"role": "user", "content": "What is 2 + 3?"}]]


@pytest.fixture
def pair():
    """A server that redirects every request to a second, working one."""
    redirecting, other = FakeOpenAI("redirect"), FakeOpenAI("vllm")
    yield redirecting, other
    redirecting.close()
    other.close()


@pytest.mark.parametrize("where", ["another origin", "same origin"])
def test_a_rollout_only_site_does_not_follow_a_redirect(pair, where):
    redirecting, other = pair
    target = other if where == "another origin" else redirecting
    redirecting.location = target.base_url + "/chat/completions?token=abc"
    src = EndpointRolloutSource(EndpointSettings(base_url=redirecting.base_url, model="m", max_retries=2))
    with pytest.raises(EndpointError, match="redirect") as info:
        src.generate(MSGS, 2, temperature=1.0, top_p=1.0, max_tokens=16)
    port = target.server.server_address[1]
    assert f"HTTP 307 to http://127.0.0.1:{port}" in str(info.value) and "token" not in str(info.value)
    assert other.requests == []
    assert len(redirecting.requests) == 1                     # not retried either


def test_route_eval_does_not_measure_a_server_it_was_redirected_to(pair, caplog):
    from hacrl_fed.route.measure import ModelSpec, measure_endpoint

    class Verifier:
        def verify(self, responses, references, styles, problems=None):
            from hacrl_fed.reward.verdict import Verdict
            return [Verdict.correct("match", r) if r else Verdict.incorrect("no_final_answer") for r in responses]

    class Problem:
        id, problem, answer, answer_style = "p0", "What is 2 + 3?", "5", "boxed"

    redirecting, other = pair
    redirecting.location = other.base_url + "/chat/completions"
    caplog.set_level(logging.WARNING, logger="hacrl_fed.route")
    out = measure_endpoint(ModelSpec("e", redirecting.base_url), [Problem()], verifier=Verifier(), max_new_tokens=8,
                           system_prompt="", timeout_s=10.0)
    assert out.correct == [0.0] and out.finish == ["error"] and other.requests == []
    assert "307" in caplog.text


def test_route_serve_does_not_follow_a_backend_s_redirect(pair):
    from hacrl_fed.route.serve import ROUTED_HEADER, Backend, build_app, fixed_order

    redirecting, other = pair
    redirecting.location = other.base_url + "/chat/completions"
    backends = [Backend("r", redirecting.base_url), Backend("o", other.base_url)]
    with TestClient(build_app(backends, fixed_order(["r", "o"]))) as client:
        resp = client.post("/v1/chat/completions", json={"model": "r", "messages": MSGS[0]})
        metrics = client.get("/metrics").json()
    assert resp.status_code == 200 and resp.headers[ROUTED_HEADER] == "o"      # the next backend, by the router
    assert metrics["backends"]["r"]["failures"] == {"bad_reply": 1}
    assert len(other.requests) == 1 and other.requests[0]["model"] == "o"      # asked once, as backend o
