"""``route serve`` never hands a backend's API key to its client, whatever the backend echoes back: a 4xx body
(relayed as the backend sent it), a 2xx completion, or a stream with the key split between two chunks."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.testclient import TestClient

from test_route_serve import running as serve_app

from hacrl_fed.rollout.redact import REDACTED
from hacrl_fed.route.serve import Backend, build_app, fixed_order

KEY = "sk-router-0123456789abcdefghijklmnopqrstuvwxyz"
OTHER_KEY = "sk-other-backend-987654321"


@contextmanager
def running(app: FastAPI):
    """``app`` served as in test_route_serve.py; yields its ``/v1`` base URL."""
    with serve_app(app) as base:
        yield f"{base}/v1"


def echo_app() -> FastAPI:
    """A backend that echoes the Authorization header it receives: 401 (``model`` = ``e401``), in a 200
    completion (``e200``) or in a stream, the header cut in the middle of the key between two chunks."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        auth = request.headers.get("authorization", "")
        if body["model"] == "e401":
            return JSONResponse({"error": {"message": f"invalid credentials: {auth}", "type": "auth"}},
                                status_code=401)
        if body.get("stream"):
            event = ('data: {"choices": [{"index": 0, "delta": {"content": "sent: ' + auth + '"}}]}\n\n').encode()
            cut = event.index(KEY.encode()) + 10

            async def chunks():
                yield event[:cut]
                await asyncio.sleep(0.05)
                yield event[cut:]
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": f"sent: {auth}"},
                             "finish_reason": "stop"}]}

    return app


@pytest.fixture(scope="module")
def echo():
    with running(echo_app()) as url:
        yield url


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv("ROUTE_ECHO_KEY", KEY)
    monkeypatch.setenv("ROUTE_OTHER_KEY", OTHER_KEY)


def client(url: str, model: str) -> TestClient:
    backends = [Backend("echo", url, model=model, api_key_env="ROUTE_ECHO_KEY"),
                Backend("other", url, model="e401", api_key_env="ROUTE_OTHER_KEY")]
    return TestClient(build_app(backends, fixed_order(["echo", "other"])))


def no_key(text: str) -> None:
    for secret in (KEY, OTHER_KEY):
        assert secret[:12] not in text and secret[-12:] not in text, text


@pytest.mark.parametrize("model, status", [("e401", 401), ("e200", 200)])
def test_a_key_echoed_in_a_relayed_body_is_redacted(keyed, echo, model, status):
    with client(echo, model) as c:
        resp = c.post("/v1/chat/completions", json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == status
    no_key(resp.text)
    assert f"Bearer {REDACTED}" in resp.text                    # the rest of the body goes back as sent


def test_a_key_split_between_two_stream_chunks_is_redacted(keyed, echo):
    body = {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with client(echo, "e200") as c, c.stream("POST", "/v1/chat/completions", json=body) as resp:
        data = resp.read().decode()
    assert resp.status_code == 200
    no_key(data)
    assert f"sent: Bearer {REDACTED}" in data and data.endswith("data: [DONE]\n\n")
