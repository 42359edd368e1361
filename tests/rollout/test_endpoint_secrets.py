"""A server that echoes the API key it was sent never puts it into what a rollout-only site records (the step
error the coordinator keeps, a signed row) or what route eval logs: every form an endpoint can echo it in."""

from __future__ import annotations

import logging

import pytest
from fake_openai import FakeOpenAI

from hacrl_fed.rollout.endpoint import EndpointError, EndpointRolloutSource, EndpointSettings
from hacrl_fed.rollout.redact import REDACTED, Redactor

KEY = "sk-live-0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMN"   # longer than any cut of an error text
MSGS = [[{"role": "user", "content": "What is 2 + 3?"}]]


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("ECHO_TEST_KEY", KEY)


def source(server: FakeOpenAI, **kw) -> EndpointRolloutSource:
    settings = dict(base_url=server.base_url, model="m", max_retries=0, timeout_s=30.0, api_key_env="ECHO_TEST_KEY")
    return EndpointRolloutSource(EndpointSettings(**(settings | kw)))


def generate(src: EndpointRolloutSource, n: int = 2):
    return src.generate(MSGS, n, temperature=1.0, top_p=1.0, max_tokens=64)


@pytest.mark.parametrize("mode", ["echo401", "echo400", "echo500", "echo_finish"])
def test_a_key_echoed_in_an_error_never_reaches_the_step_error(keyed, mode, caplog):
    server = FakeOpenAI(mode)
    try:
        with pytest.raises(EndpointError) as info:
            generate(source(server))
    finally:
        server.close()
    assert server.headers and all({k.lower(): v for k, v in h.items()}["authorization"] == f"Bearer {KEY}"
                                  for h in server.headers)
    message = str(info.value)
    assert KEY[:12] not in message and KEY[-12:] not in message, message
    assert REDACTED in message                     # what was echoed is still visible, without the key
    assert KEY[:12] not in caplog.text


def test_a_key_echoed_in_the_content_is_not_signed_into_a_row(keyed):
    server = FakeOpenAI("echo_content")
    try:
        samples = generate(source(server))
    finally:
        server.close()
    assert len(samples) == 2
    for s in samples:
        assert KEY[:12] not in s.text and REDACTED in s.text
        assert s.logprob_sum is None               # the text is no longer what the server sampled


def test_without_a_key_nothing_is_redacted():
    server = FakeOpenAI("echo_content")
    try:
        samples = EndpointRolloutSource(EndpointSettings(base_url=server.base_url, model="m", max_retries=0)
                                        ).generate(MSGS, 1, temperature=1.0, top_p=1.0, max_tokens=64)
    finally:
        server.close()
    assert "Bearer EMPTY" in samples[0].text and REDACTED not in samples[0].text


def test_route_eval_does_not_log_a_key_echoed_in_an_error(keyed, caplog):
    from hacrl_fed.route.measure import ModelSpec, measure_endpoint

    class Verifier:
        def verify(self, responses, references, styles, problems=None):
            from hacrl_fed.reward.verdict import Verdict
            return [Verdict.incorrect("mismatch", "") for _ in responses]

    class Problem:
        id, problem, answer, answer_style = "p0", "What is 2 + 3?", "5", "boxed"

    server = FakeOpenAI("echo401")
    caplog.set_level(logging.WARNING, logger="hacrl_fed.route")
    try:
        measure_endpoint(ModelSpec("e", server.base_url), [Problem()], verifier=Verifier(), max_new_tokens=8,
                         system_prompt="", timeout_s=10.0, api_key=KEY)
    finally:
        server.close()
    assert "failed on p0" in caplog.text and REDACTED in caplog.text
    assert KEY[:12] not in caplog.text


def test_every_form_of_a_key_is_redacted_and_a_stream_split_inside_it_too():
    key = 'k3y/with"odd+chars'
    r = Redactor([key, None, "", "ab"])                        # short or empty values are no secrets
    for form in (key, 'k3y/with\\"odd+chars', "k3y%2Fwith%22odd%2Bchars"):
        assert r.text(f"x {form} y") == f"x {REDACTED} y"
    assert r.text("ab cd") == "ab cd"
    body = f'data: {{"content": "Bearer {key}"}}\n\n'.encode()
    for cut in range(1, len(body)):
        s = r.stream()
        out = s.feed(body[:cut]) + s.feed(body[cut:]) + s.flush()
        assert out == body.replace(key.encode(), REDACTED.encode()), cut
    s = r.stream()
    assert s.feed(b"data: {}\n\n") == b"data: {}\n\n"          # nothing that could begin a key is held back
