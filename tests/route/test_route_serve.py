"""``hacrl-fed route serve``: the OpenAI-compatible router in front of real HTTP backends.

The backends are small FastAPI apps served by uvicorn on 127.0.0.1 (they answer, stream SSE, fail with 500 or
400, sleep past the router's timeout, or break a stream), plus a closed port for a refused connection; one test
puts the router, as a real ``hacrl-fed route serve`` process, in front of a real ``transformers serve``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.testclient import TestClient
from tf_serve import free_port, transformers_serve
from typer.testing import CliRunner

from hacrl_fed.cli import app as cli_app
from hacrl_fed.route.serve import (FALLBACKS_HEADER, ROUTED_HEADER, Backend, backends_from_options,
                                   build_app, fixed_order)
from hacrl_fed.tiny_models import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
SECRET_CONTENT = "PURPLE-ELEPHANT-7"


@contextmanager
def running(app: FastAPI):
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yields ``http://127.0.0.1:PORT``."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical", lifespan="on",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    end = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < end, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


def events(tag: str) -> list[bytes]:
    """The SSE events a fake backend streams: three content deltas, then ``[DONE]``."""
    chunks = [{"id": f"s-{tag}", "object": "chat.completion.chunk", "created": 0, "model": tag,
               "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
              for word in (f"from {tag}", " five", ".")]
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


class FakeBackend:
    """A chat-completions server whose behaviour a test sets with :attr:`mode`: ``ok``, ``error500``, ``error400``,
    ``sleep`` (answers after 3 s), ``cut`` (a stream that breaks after two events), ``hold`` (a stream that
    waits after its first event until :attr:`gate` is set). :attr:`requests` and :attr:`headers` record what
    it received."""

    def __init__(self, tag: str) -> None:
        self.tag, self.mode = tag, "ok"
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.gate = threading.Event()
        self.app = FastAPI()
        self.app.post("/v1/chat/completions")(self.chat)

    def reset(self) -> None:
        self.mode = "ok"
        self.requests.clear()
        self.headers.clear()
        self.gate.clear()

    async def chat(self, request: Request):
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        if self.mode == "error500":
            return JSONResponse({"error": {"message": "internal"}}, status_code=500)
        if self.mode == "error400":
            return JSONResponse(self.refusal(), status_code=400)
        if self.mode == "sleep":
            await asyncio.sleep(3)
        if body.get("stream"):
            return StreamingResponse(self.stream(), media_type="text/event-stream")
        return {"id": f"c-{self.tag}", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"answer from {self.tag}"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}

    def refusal(self) -> dict:
        return {"error": {"message": f"{self.tag}: temperature must be <= 2", "type": "invalid_request_error",
                          "param": "temperature", "code": None}}

    async def stream(self):
        for i, event in enumerate(events(self.tag)):
            if self.mode == "cut" and i == 2:
                raise RuntimeError("the backend dies mid-stream")
            yield event
            if self.mode == "hold" and i == 0:
                while not self.gate.is_set():
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def fakes():
    """Three running fake backends a, b, c (their base URLs in ``urls``) and a closed port ``dead``."""
    made = {tag: FakeBackend(tag) for tag in "abc"}
    with running(made["a"].app) as a, running(made["b"].app) as b, running(made["c"].app) as c:
        urls = {"a": a + "/v1", "b": b + "/v1", "c": c + "/v1", "dead": f"http://127.0.0.1:{free_port()}/v1"}
        yield made, urls


@pytest.fixture
def backends(fakes):
    made, _ = fakes
    for fake in made.values():
        fake.reset()
    return made


def router(fakes, order: list[str], *, timeouts: dict[str, float] | None = None, rank=None, **limits):
    """A TestClient (enter it) of a router over the fakes named in ``order`` (fixed rank in that order)."""
    _, urls = fakes
    specs = [Backend(n, urls[n], model=f"model-{n}", timeout_s=(timeouts or {}).get(n, 20.0)) for n in order]
    return TestClient(build_app(specs, rank or fixed_order(order), **limits))


def chat(client: TestClient, **fields) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": "auto", "messages": MESSAGES} | fields)


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] is None
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if code is not None:
        assert error["code"] == code
    return error


def test_the_first_choice_of_rank_answers_with_the_request_s_own_fields(fakes, backends):
    seen = []

    def rank(request: dict) -> list[str]:
        seen.append(request)
        return ["b", "a"]

    with router(fakes, ["a", "b"], rank=rank) as client:
        resp = chat(client, temperature=0.3, max_tokens=7, user="u1")
        metrics = client.get("/metrics").json()
    assert resp.status_code == 200, resp.text
    assert resp.headers[ROUTED_HEADER] == "b" and resp.headers[FALLBACKS_HEADER] == "0"
    assert resp.json()["choices"][0]["message"]["content"] == "answer from b"
    assert seen == [{"model": "auto", "messages": MESSAGES, "temperature": 0.3, "max_tokens": 7, "user": "u1"}]
    assert backends["b"].requests == [{"model": "model-b", "messages": MESSAGES, "temperature": 0.3,
                                       "max_tokens": 7, "user": "u1"}]
    assert backends["a"].requests == []
    assert metrics["requests"] == 1 and metrics["answered"] == 1 and metrics["failed"] == 0
    b = metrics["backends"]["b"]
    assert (b["routed"], b["answered"], b["answered_after_fallback"], b["failures"]) == (1, 1, 0, {})
    assert b["latency_s_total"] > 0 and b["latency_s_mean"] == pytest.approx(b["latency_s_total"])
    assert metrics["backends"]["a"]["routed"] == 0


@pytest.mark.parametrize(("first", "kind"), [("error500", "http_5xx"), ("sleep", "timeout"), ("dead", "connect")])
def test_a_failing_backend_falls_back_to_the_next(fakes, backends, first, kind):
    order = ["dead", "b"] if first == "dead" else ["a", "b"]
    if first != "dead":
        backends["a"].mode = first
    with router(fakes, order, timeouts={"a": 0.5}) as client:
        resp = chat(client)
        metrics = client.get("/metrics").json()
    assert resp.status_code == 200, resp.text
    assert resp.headers[ROUTED_HEADER] == "b" and resp.headers[FALLBACKS_HEADER] == "1"
    assert resp.json()["choices"][0]["message"]["content"] == "answer from b"
    failed = metrics["backends"][order[0]]
    assert failed["failures"] == {kind: 1} and failed["fallbacks_from"] == 1 and failed["routed"] == 1
    assert failed["answered"] == 0
    b = metrics["backends"]["b"]
    assert (b["routed"], b["answered"], b["answered_after_fallback"]) == (0, 1, 1)
    assert metrics["answered"] == 1 and metrics["failed"] == 0


def test_a_client_error_of_the_backend_goes_back_as_is_without_fallback(fakes, backends):
    backends["a"].mode = "error400"
    with router(fakes, ["a", "b"]) as client:
        resp = chat(client, temperature=9)
        metrics = client.get("/metrics").json()
    assert resp.status_code == 400
    assert resp.json() == backends["a"].refusal()
    assert resp.headers[ROUTED_HEADER] == "a" and resp.headers[FALLBACKS_HEADER] == "0"
    assert backends["b"].requests == []
    assert metrics["client_errors"] == 1 and metrics["backends"]["a"]["client_errors"] == 1
    assert metrics["backends"]["a"]["failures"] == {} and metrics["answered"] == 0


def _stream(client, **fields) -> tuple[httpx.Response, bytes]:
    body = {"model": "auto", "messages": MESSAGES, "stream": True} | fields
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        return resp, resp.read()


def test_a_stream_passes_through_event_by_event(fakes, backends):
    with router(fakes, ["a", "b"]) as client:
        resp, data = _stream(client)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers[ROUTED_HEADER] == "a" and resp.headers[FALLBACKS_HEADER] == "0"
    assert data == b"".join(events("a"))
    assert backends["a"].requests[0]["stream"] is True and backends["a"].requests[0]["model"] == "model-a"


def test_a_stream_falls_back_before_its_first_byte(fakes, backends):
    backends["a"].mode = "error500"
    with router(fakes, ["a", "dead", "b"]) as client:
        resp, data = _stream(client)
        metrics = client.get("/metrics").json()
    assert resp.status_code == 200
    assert resp.headers[ROUTED_HEADER] == "b" and resp.headers[FALLBACKS_HEADER] == "2"
    assert data == b"".join(events("b"))
    assert metrics["backends"]["a"]["failures"] == {"http_5xx": 1}
    assert metrics["backends"]["dead"]["failures"] == {"connect": 1}
    assert metrics["backends"]["b"]["answered_after_fallback"] == 1


def test_a_stream_that_breaks_midway_ends_with_an_error_event_and_no_fallback(fakes, backends):
    backends["a"].mode = "cut"
    with router(fakes, ["a", "b"]) as client:
        resp, data = _stream(client)
        metrics = client.get("/metrics").json()
    assert resp.status_code == 200 and resp.headers[ROUTED_HEADER] == "a"
    sent = b"".join(events("a")[:2])
    assert data.startswith(sent)
    last = json.loads(data[len(sent):].removeprefix(b"data: ").strip())
    assert last["error"]["code"] == "stream_cut" and "a" in last["error"]["message"]
    assert backends["b"].requests == []
    assert metrics["backends"]["a"]["failures"] == {"stream_cut": 1}


def test_stream_chunks_reach_the_client_before_the_backend_finishes(fakes, backends):
    """Over real HTTP: the first event arrives while the backend still holds the rest (no buffering)."""
    _, urls = fakes
    backends["a"].mode = "hold"
    app = build_app([Backend("a", urls["a"])], fixed_order(["a"]))
    body = {"model": "auto", "messages": MESSAGES, "stream": True}
    with running(app) as base, httpx.Client(timeout=20) as client:
        with client.stream("POST", base + "/v1/chat/completions", json=body) as resp:
            assert resp.headers[ROUTED_HEADER] == "a"
            chunks = resp.iter_bytes()
            got = next(chunks)
            assert events("a")[0].startswith(got)           # the first event, while the backend waits
            backends["a"].gate.set()
            got += b"".join(chunks)
    assert got == b"".join(events("a"))


def test_when_every_backend_fails_the_answer_is_502_naming_each(fakes, backends):
    backends["a"].mode = "error500"
    with router(fakes, ["a", "dead"]) as client:
        resp = chat(client)
        metrics = client.get("/metrics").json()
    error = assert_openai_error(resp, 502, "backends_failed")
    assert "a: HTTP 500" in error["message"] and "dead: connection failed" in error["message"]
    assert metrics["failed"] == 1 and metrics["answered"] == 0


def test_when_the_last_failure_is_a_timeout_the_answer_is_504(fakes, backends):
    backends["a"].mode = "sleep"
    with router(fakes, ["dead", "a"], timeouts={"a": 0.5}) as client:
        resp, _ = _stream(client)
    error = assert_openai_error(resp, 504, "backend_timeout")
    assert "dead: connection failed" in error["message"] and "a: no answer within 0.5 s" in error["message"]


BAD = [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_request"),
    (json.dumps({"model": "auto"}).encode(), 400, "invalid_messages"),
    (json.dumps({"messages": []}).encode(), 400, "invalid_messages"),
    (json.dumps({"messages": [{"content": "hi"}]}).encode(), 400, "invalid_messages"),
    (json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "invalid_messages"),
    (json.dumps({"messages": MESSAGES, "model": "gpt-9"}).encode(), 400, "model_not_found"),
    (json.dumps({"messages": MESSAGES, "model": 3}).encode(), 400, "invalid_model"),
    (json.dumps({"messages": MESSAGES, "stream": 1}).encode(), 400, "invalid_stream"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "invalid_json"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 3000}]}).encode(), 413, "request_too_large"),
    (json.dumps({"messages": [{"role": "user", "content": "y" * 700}] * 2}).encode(), 413, "messages_too_large"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD, ids=[c for _, _, c in BAD[:-2]] + ["body", "contents"])
def test_bad_requests_get_the_openai_error_shape(fakes, backends, body, status, code):
    with router(fakes, ["a"], max_body_bytes=2048, max_message_chars=1000) as client:
        resp = client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        metrics = client.get("/metrics").json()
    assert_openai_error(resp, status, code)
    assert backends["a"].requests == []
    assert metrics["bad_requests"] == 1 and metrics["backends"]["a"]["routed"] == 0


def test_the_body_limit_holds_without_a_content_length(fakes, backends):
    body = json.dumps({"messages": [{"role": "user", "content": "z" * 5000}]}).encode()
    with router(fakes, ["a"], max_body_bytes=2048) as client:
        resp = client.post("/v1/chat/completions", content=(body[i:i + 512] for i in range(0, len(body), 512)))
    assert_openai_error(resp, 413, "request_too_large")
    assert backends["a"].requests == []


def test_a_client_naming_a_backend_goes_there_first_then_rank_order(fakes, backends):
    with router(fakes, ["a", "b", "c"]) as client:
        first = chat(client, model="c")
        backends["c"].mode = "error500"
        second = chat(client, model="c")
        metrics = client.get("/metrics").json()
    assert first.headers[ROUTED_HEADER] == "c" and first.headers[FALLBACKS_HEADER] == "0"
    assert second.headers[ROUTED_HEADER] == "a" and second.headers[FALLBACKS_HEADER] == "1"
    assert [r["model"] for r in backends["c"].requests] == ["model-c", "model-c"]
    assert len(backends["a"].requests) == 1 and backends["b"].requests == []
    assert metrics["backends"]["c"]["routed"] == 2 and metrics["backends"]["a"]["routed"] == 0


def test_a_rank_function_that_fails_leaves_the_configured_order(fakes, backends):
    def rank(_request):
        raise KeyError("broken policy")

    with router(fakes, ["b", "a"], rank=rank) as client:
        resp = chat(client)
        metrics = client.get("/metrics").json()
    assert resp.status_code == 200 and resp.headers[ROUTED_HEADER] == "b"
    assert metrics["rank_errors"] == 1


def test_models_health_and_unknown_paths(fakes, backends):
    with router(fakes, ["a", "b"]) as client:
        models = client.get("/v1/models").json()
        health = client.get("/health")
        missing = client.get("/v1/embeddings")
        wrong_method = client.get("/v1/chat/completions")
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["auto", "a", "b"]
    assert all(m["object"] == "model" for m in models["data"])
    assert health.status_code == 200
    assert_openai_error(missing, 404, "not_found")
    assert_openai_error(wrong_method, 405, "method_not_allowed")


def test_the_api_key_goes_to_its_backend_only_and_never_into_a_log(fakes, backends, monkeypatch, caplog):
    _, urls = fakes
    monkeypatch.setenv("ROUTE_TEST_KEY", "sk-route-secret-123")
    backends["a"].mode = "error500"
    specs = [Backend("a", urls["a"], api_key_env="ROUTE_TEST_KEY"), Backend("b", urls["b"])]
    caplog.set_level(logging.DEBUG)
    with TestClient(build_app(specs, fixed_order(["a", "b"]))) as client:
        resp = chat(client, messages=[{"role": "user", "content": SECRET_CONTENT}])
    assert resp.status_code == 200 and resp.headers[ROUTED_HEADER] == "b"
    assert backends["a"].headers[0]["authorization"] == "Bearer sk-route-secret-123"
    assert "authorization" not in backends["b"].headers[0]
    assert "sk-route-secret-123" not in caplog.text and SECRET_CONTENT not in caplog.text
    lines = [r.getMessage() for r in caplog.records if r.name == "hacrl_fed.route"]
    assert len(lines) == 1 and "chosen=a answered_by=b status=200 fallbacks=1 (a: HTTP 500)" in lines[0]
    monkeypatch.delenv("ROUTE_TEST_KEY")
    with pytest.raises(ValueError, match="ROUTE_TEST_KEY"):
        build_app(specs, fixed_order(["a", "b"]))


def test_concurrent_requests_are_routed_and_counted_each(fakes, backends):
    """20 requests at once over real HTTP, each falling back from a to b (streams and plain alike)."""
    _, urls = fakes
    backends["a"].mode = "error500"
    app = build_app([Backend("a", urls["a"]), Backend("b", urls["b"])], fixed_order(["a", "b"]))

    async def ask(client: httpx.AsyncClient, base: str, i: int) -> tuple[str, str, bytes]:
        body = {"messages": [{"role": "user", "content": f"q{i}"}], "stream": i % 2 == 0}
        resp = await client.post(base + "/v1/chat/completions", json=body)
        return resp.headers[ROUTED_HEADER], resp.headers[FALLBACKS_HEADER], resp.content

    async def main(base: str) -> list[tuple[str, str, bytes]]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(ask(client, base, i) for i in range(20)))

    with running(app) as base:
        answers = asyncio.run(main(base))
        with httpx.Client() as client:
            metrics = client.get(base + "/metrics").json()
    assert [(name, n) for name, n, _ in answers] == [("b", "1")] * 20
    assert all(content == b"".join(events("b")) for _, _, content in answers[::2])
    assert sorted(r["messages"][0]["content"] for r in backends["b"].requests) == sorted(f"q{i}" for i in range(20))
    assert metrics["requests"] == 20 and metrics["answered"] == 20
    assert metrics["backends"]["a"]["failures"] == {"http_5xx": 20} and metrics["backends"]["a"]["routed"] == 20
    assert metrics["backends"]["b"]["answered_after_fallback"] == 20


def test_backend_options_are_checked():
    backends = backends_from_options(["a=http://h:1/v1/", "b=https://api.example.org/openai/v1"],
                                     api_models=["b=org/model-7b"], api_key_envs=["b=B_KEY"], timeout_s=5)
    assert [(x.name, x.base_url, x.model, x.api_key_env, x.timeout_s) for x in backends] == [
        ("a", "http://h:1/v1", "a", None, 5), ("b", "https://api.example.org/openai/v1", "org/model-7b", "B_KEY", 5)]
    for models, extra, message in [
        ([], {}, "at least one"), (["a"], {}, "NAME=URL"), (["a=ftp://h/v1"], {}, "http"),
        (["a=http://h:1"], {}, "no path"), (["a=http://u:p@h/v1"], {}, "credentials"),
        (["a=http://h/v1", "a=http://g/v1"], {}, "twice"), (["auto=http://h/v1"], {}, "auto"),
        (["a=http://h/v1"], {"api_models": ["z=m"]}, "z"), (["a=http://h/v1"], {"api_key_envs": ["a=1BAD"]}, "1BAD"),
        (["a=http://h/v1"], {"timeout_s": 0}, "timeout_s"),
    ]:
        with pytest.raises(ValueError, match=message):
            backends_from_options(models, **extra)
    assert fixed_order(["a", "b", "c"], "c,a")({}) == ["c", "a", "b"]
    with pytest.raises(ValueError, match="no --model names"):
        fixed_order(["a"], "a,x")
    with pytest.raises(ValueError, match="twice"):
        fixed_order(["a", "b"], "a,a")


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "just-a-name"], "expected NAME=URL"),
    (["--model", "a=http://127.0.0.1:9/v1", "--model", "a=http://127.0.0.1:8/v1"], "'a' is given twice"),
    (["--model", "a=http://127.0.0.1:9/v1", "--order", "b"], "'b', which no --model names"),
    (["--model", "a=http://127.0.0.1:9/v1", "--api-key-env", "a=ROUTE_UNSET_VAR_X"], "ROUTE_UNSET_VAR_X"),
])
def test_the_cli_refuses_bad_options_with_one_line(args, message, monkeypatch):
    monkeypatch.delenv("ROUTE_UNSET_VAR_X", raising=False)
    result = CliRunner().invoke(cli_app, ["route", "serve", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"the router exited ({proc.returncode}):\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < end, f"the router did not answer /health:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


def test_the_router_process_in_front_of_transformers_serve_with_the_openai_client(tmp_path):
    """``hacrl-fed route serve`` as a process: a dead backend first, a real ``transformers serve`` second."""
    import openai

    model = build_tiny_model("tiny-llama-bpe", tmp_path / "model")
    port, dead = free_port(), free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    log = tmp_path / "router.log"
    with transformers_serve(model, tmp_path / "serve.log") as url, open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "hacrl_fed.cli", "route", "serve",
                                 "--model", f"down=http://127.0.0.1:{dead}/v1", "--model", f"tiny={url}",
                                 "--api-model", f"tiny={model}", "--port", str(port), "--timeout-s", "120"],
                                stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_healthy(base, proc, log)
            client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
            raw = client.chat.completions.with_raw_response.create(model="auto", messages=MESSAGES, max_tokens=4)
            completion = raw.parse()
            assert raw.headers[ROUTED_HEADER] == "tiny" and raw.headers[FALLBACKS_HEADER] == "1"
            assert isinstance(completion.choices[0].message.content, str)
            with client.chat.completions.with_streaming_response.create(
                    model="auto", messages=MESSAGES, max_tokens=4, stream=True) as streamed:
                assert streamed.headers[ROUTED_HEADER] == "tiny"
                chunks = list(streamed.parse())
            assert chunks and all(c.object == "chat.completion.chunk" for c in chunks)
            assert any(c.choices and c.choices[0].finish_reason for c in chunks)
            with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
                metrics = json.load(r)
            assert metrics["backends"]["tiny"]["answered"] == 2
            assert metrics["backends"]["down"]["failures"] == {"connect": 2}
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
    text = log.read_text()
    assert text.count("chosen=down answered_by=tiny status=200 fallbacks=1") == 2, text[-3000:]


def test_a_knn_router_file_sends_each_request_to_the_backend_it_predicts_best(fakes, backends, tmp_path):
    """``route serve --router``: a router.json whose calibration says a answers sums and b answers leg counts."""
    from hacrl_fed.route.router import Router

    sums = [f"What is {i} plus {i + 3}? Add the numbers." for i in range(8)]
    legs = [f"A farm has {i} cows and {i + 1} hens. How many legs are there?" for i in range(8)]
    Router(models=["a", "b"], texts=sums + legs, tasks=["sum"] * 8 + ["legs"] * 8,
           correct=[[1.0] * 8 + [0.0] * 8, [0.0] * 8 + [1.0] * 8], cost=[1.0, 2.0], k=3).save(tmp_path / "r.json")
    rank = Router.load(tmp_path / "r.json").request_ranker(["a", "b", "c"])
    with router(fakes, ["a", "b", "c"], rank=rank) as client:
        to_b = client.post("/v1/chat/completions", json={"messages": [
            {"role": "system", "content": "Solve."},
            {"role": "user", "content": "A farm has 4 cows and 2 hens. How many legs are there?"}]})
        to_a = client.post("/v1/chat/completions", json={"messages": [
            {"role": "user", "content": [{"type": "text", "text": "What is 12 plus 30? Add the numbers."}]}]})
        backends["b"].mode = "error500"
        fallback = client.post("/v1/chat/completions", json={"messages": [
            {"role": "user", "content": "A farm has 9 cows and 1 hen. How many legs are there?"}]})
    assert to_b.headers[ROUTED_HEADER] == "b" and to_a.headers[ROUTED_HEADER] == "a"
    # b fails: the next by prediction (a) answers, c (unknown to the router) stays last
    assert fallback.headers[ROUTED_HEADER] == "a" and fallback.headers[FALLBACKS_HEADER] == "1"
    with pytest.raises(ValueError, match="not --model names"):
        Router.load(tmp_path / "r.json").request_ranker(["a", "c"])
