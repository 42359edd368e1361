"""The endpoint rollout source against a local HTTP server (tests/helpers/fake_openai.py): the vLLM reply
shape with log-probs, servers without ``n`` and ``logprobs``, and every way an endpoint can fail a step."""

from __future__ import annotations

import math
import threading

import pytest
from fake_openai import ANSWER, EOS_LOGPROB, LOGPROBS, FakeOpenAI

from hacrl_fed.rollout.endpoint import (EndpointError, EndpointRolloutSource, EndpointSettings, behaviour_logprob,
                                        parse_choices)

MSGS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 1 + 4?"}]]


@pytest.fixture
def server(request):
    s = FakeOpenAI(request.param)
    yield s
    s.close()


def source(server, **kw) -> EndpointRolloutSource:
    settings = dict(base_url=server.base_url, model="m", max_retries=0, timeout_s=30.0) | kw
    return EndpointRolloutSource(EndpointSettings(**settings))


def run(src, n=3, **kw):
    return src.generate(MSGS, n, temperature=0.7, top_p=0.9, max_tokens=16, stop=["\n\n"], seed=5, **kw)


@pytest.mark.parametrize("server", ["vllm"], indirect=True)
def test_vllm_shape_gives_the_behaviour_log_prob_with_the_eos_convention(server):
    samples = run(source(server))
    assert [(s.prompt_index, s.sample_index) for s in samples] == [(i, j) for i in range(2) for j in range(3)]
    for s in samples:
        assert s.text == ANSWER and s.finish_reason == "stop"
        assert s.logprob_sum == pytest.approx(sum(LOGPROBS) + EOS_LOGPROB)
        assert s.eos_logprob == EOS_LOGPROB and s.token_count == len(LOGPROBS) + 1
    assert len(server.requests) == 2 and all(r["n"] == 3 for r in server.requests)   # n honoured: one request each
    r = server.requests[0]
    assert (r["temperature"], r["top_p"], r["max_tokens"], r["stop"], r["logprobs"], r["model"]) == (
        0.7, 0.9, 16, ["\n\n"], True, "m")


def test_behaviour_log_prob_of_documented_entries():
    entries = [{"token": "4", "logprob": -0.5, "bytes": [52], "top_logprobs": []},
               {"token": "2", "logprob": -0.25, "bytes": [50], "top_logprobs": []}]
    assert behaviour_logprob(entries, "stop", "42") == (-0.75, 2, None)     # cut at a stop string: no EOS term
    assert behaviour_logprob(entries, "length", "42") == (-0.75, 2, None)
    eos = entries + [{"token": "", "logprob": -0.125, "bytes": [], "top_logprobs": []}]
    assert behaviour_logprob(eos, "stop", "42") == (-0.875, 3, -0.125)
    for bad in (math.nan, 0.5, "x", None):
        with pytest.raises(ValueError):
            behaviour_logprob([{"token": "a", "logprob": bad}], "stop", "a")


@pytest.mark.parametrize("body, why", [
    (b"\xff\xfe", "not JSON"), (b"[" * 100_000, "nested too deeply|not JSON"), (b"[]", "no 'choices'"),
    (b'{"choices": [{"message": {"content": "\\ud800"}, "finish_reason": "stop"}]}', "lone surrogate"),
    (b'{"choices": []}', "no 'choices'"),
    (b'{"choices": [{"message": {"content": 3}, "finish_reason": "stop"}]}', "string message.content"),
    (b'{"choices": [{"message": {"content": "a"}, "finish_reason": "tool_calls"}]}', "finish_reason"),
    (b'{"choices": [{"message": {"content": "' + b"a" * 200 + b'"}, "finish_reason": "stop"}]}', "characters"),
])
def test_parse_choices_rejects_bad_replies(body, why):
    with pytest.raises(ValueError, match=why):
        parse_choices(body, max_chars=100, max_tokens=4)


@pytest.mark.parametrize("server", ["plain"], indirect=True)
def test_a_server_without_n_and_logprobs_gets_single_requests(server):
    src = source(server)
    samples = run(src)
    assert len(samples) == 6 and all(s.logprob_sum is None and s.eos_logprob is None for s in samples)
    assert all(s.token_count == 6 for s in samples)        # usage.completion_tokens of single-choice replies
    asked_n = [r for r in server.requests if r.get("n", 1) > 1]
    assert asked_n and len(server.requests) == 2 + 2 * 2     # one n=3 try each, then the 2 missing one by one
    before = len(server.requests)
    run(src)
    assert len(server.requests) - before == 6 and all("n" not in r for r in server.requests[before:])


@pytest.mark.parametrize("server", ["refuse_n"], indirect=True)
def test_a_server_that_refuses_n_and_logprobs_is_asked_without(server):
    samples = run(source(server))
    assert len(samples) == 6 and all(s.logprob_sum is None for s in samples)
    assert all(s.text == ANSWER for s in samples)


@pytest.mark.parametrize("server, cause", [("error500", "HTTP 500"), ("garbage", "not JSON"),
                                           ("truncated", "could not be read")], indirect=["server"])
def test_a_failing_endpoint_fails_the_step_with_its_cause(server, cause):
    with pytest.raises(EndpointError, match=cause):
        run(source(server))


@pytest.mark.parametrize("server", ["error500"], indirect=True)
def test_5xx_is_retried_by_the_client(server):
    with pytest.raises(EndpointError, match="HTTP 500"):
        source(server, max_retries=2, max_concurrency=1).generate(MSGS[:1], 1, temperature=1.0, top_p=1.0,
                                                                  max_tokens=16)
    assert len(server.requests) == 3                        # 1 try + 2 retries (with the client's back-off)


def test_429_is_retried_then_succeeds():
    s = FakeOpenAI("flaky", fail_first=1)
    try:
        samples = run(source(s, max_retries=2, max_concurrency=1), n=1)
        assert len(samples) == 2 and len(s.requests) == 3
    finally:
        s.close()


@pytest.mark.parametrize("server", ["slow"], indirect=True)
def test_a_slow_endpoint_costs_the_step_not_the_process(server):
    """The step's budget ends the wait (the server holds every reply until released)."""
    src = source(server, step_budget_s=1.0, timeout_s=30.0)
    with pytest.raises(EndpointError, match="no reply within|budget"):
        run(src, n=1)
    server.release()
    assert len(run(source(server), n=1)) == 2                   # the next step works again


def test_the_api_key_is_read_from_the_named_variable_and_never_shown(monkeypatch, caplog):
    s = FakeOpenAI("error500")
    try:
        monkeypatch.setenv("TEST_ENDPOINT_KEY", "sk-very-secret")
        with pytest.raises(EndpointError) as info:
            run(source(s, api_key_env="TEST_ENDPOINT_KEY"), n=1)
        assert {k.lower(): v for k, v in s.headers[0].items()}["authorization"] == "Bearer sk-very-secret"
        assert "sk-very-secret" not in str(info.value) and "sk-very-secret" not in caplog.text
        monkeypatch.delenv("TEST_ENDPOINT_KEY")
        with pytest.raises(EndpointError, match="TEST_ENDPOINT_KEY"):
            source(s, api_key_env="TEST_ENDPOINT_KEY")
    finally:
        s.close()


def _entries(*tokens: str, lp: float = -0.5) -> list[dict]:
    return [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t in tokens]


@pytest.mark.parametrize("entries, finish, content", [
    (_entries("ok", lp=0.0), "stop", "The answer is \\boxed{5}."),          # one entry for a 24-character answer
    (_entries("The", " answer", " is", " 6."), "length", "The answer is 5."),  # tokens of another text
    (_entries("4"), "length", "42"),                                       # tokens of a prefix only
    (_entries("4", "2", "7"), "length", "42"),                             # the content and more
    (_entries("4", "2", "<junk>"), "length", "42"),                        # a stray token at a length stop
    (_entries("4", "2", "\n\n", "more"), "stop", "42"),                    # a stop string, then a whole token more
    (_entries("4", "2", "!", "!"), "stop", "42"),                          # two tokens after it, no stop string
    ([{"token": "4", "logprob": -0.1}, {"logprob": -0.1}], "length", "42"),  # an entry that spells nothing
])
def test_log_probs_that_do_not_spell_the_content_are_no_behaviour_log_prob(entries, finish, content):
    assert behaviour_logprob(entries, finish, content, ["\n\n"]) is None


def test_log_probs_that_spell_the_content_are_kept_with_the_eos_convention():
    assert behaviour_logprob(_entries("4", "2"), "length", "42") == (-1.0, 2, None)
    assert behaviour_logprob(_entries("4", "2", "\n\n"), "stop", "42", ["\n\n"]) == (-1.5, 3, None)   # cut at stop
    assert behaviour_logprob(_entries("4", "2.\n", "\nThe"), "stop", "42.", ["\n\n"]) == (-1.5, 3, None)
    assert behaviour_logprob(_entries("4", "2", "<|im_end|>"), "stop", "42") == (-1.5, 3, -0.5)   # special EOS
    assert behaviour_logprob([*_entries("é"), {"token": "", "logprob": -0.25, "bytes": []}], "stop", "é") == (
        -0.75, 2, -0.25)
    split = [{"token": "\ufffd", "logprob": -0.1, "bytes": [0xC3]}, {"token": "\ufffd", "logprob": -0.1, "bytes": [0xA9]}]
    assert behaviour_logprob(split, "length", "é") == (pytest.approx(-0.2), 2, None)   # a character in two tokens


@pytest.mark.parametrize("server", ["short_logprobs"], indirect=True)
def test_an_endpoint_whose_log_probs_do_not_spell_its_answer_gives_none(server):
    samples = run(source(server))
    assert len(samples) == 6 and all(s.text == ANSWER for s in samples)
    assert all(s.logprob_sum is None and s.eos_logprob is None for s in samples)
