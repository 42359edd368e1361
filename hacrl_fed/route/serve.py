"""An OpenAI-compatible router in front of several model servers (``hacrl-fed route serve``; docs/routing.md).

:func:`build_app` makes a FastAPI app with these endpoints:

* ``POST /v1/chat/completions``: the request is validated, ranked by the ``rank`` function (backend names in
  preference order) and forwarded with its own fields to the first backend (``model`` replaced by the backend's
  model name); when that backend fails, to the next, in rank order. A client that names a backend in ``model``
  is sent there first, then the rank order follows. The answer carries ``x-hacrl-routed-model`` (the backend
  that answered) and ``x-hacrl-route-fallbacks`` (how many backends failed before it).
* ``GET /v1/models``: ``auto`` and every backend as OpenAI model objects.
* ``GET /health``: 200 ``{"status": "ok"}``.
* ``GET /metrics``: JSON counters (:class:`Metrics`).

Fallback rules: a backend *fails* on a connection error, a timeout, HTTP 5xx or 429 (busy: another backend can
answer), a 2xx reply that is not a JSON object, or a reply over ``max_reply_bytes``; the next backend is then
tried. Any other 4xx is the client's fault and goes back to the client as the backend sent it (status, body),
without a fallback. A stream (``"stream": true``) falls back only before its first byte reaches the client: the
backend's status and first chunk are awaited before the router answers; a stream that breaks later ends with one
SSE event ``data: {"error": {...}}`` (the ``openai`` client raises it). When every backend fails the answer is 502,
or 504 when the last failure was a timeout, naming each backend tried and why.

Every error answer has the OpenAI shape ``{"error": {"message", "type", "param": null, "code"}}``: 400 for a body
that is not a JSON object or has bad fields, 413 for a body or message contents over the limits, 404/405 for
other paths and methods. One log line per request (logger ``hacrl_fed.route``) gives the backend chosen, the one
that answered, the fallbacks and the latency; message contents and API keys are never logged nor put in a message.
A backend that echoes its API key (an ``Authorization`` header in a 4xx body, in a completion, in a stream) does not
hand it to the client: every relayed body and stream chunk is redacted of every backend's key first
(:mod:`hacrl_fed.rollout.redact`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hacrl_fed.rollout.redact import Redactor
from hacrl_fed.route.options import check_base_url, check_known, pairs, read_api_key

__all__ = ["FALLBACKS_HEADER", "ROUTED_HEADER", "Backend", "Metrics", "backends_from_options", "build_app",
           "check_base_url", "error_response", "fixed_order", "serve"]

log = logging.getLogger("hacrl_fed.route")

ROUTED_HEADER = "x-hacrl-routed-model"
FALLBACKS_HEADER = "x-hacrl-route-fallbacks"
AUTO = "auto"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")
_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class Backend:
    """One model server behind the router.

    Attributes:
        name: what clients ask for (a request's ``model``) and what ``x-hacrl-routed-model`` says: letters,
            digits and ``_ . : / -``, at most 128 characters, starting with a letter or digit; not ``auto``.
        base_url: the server's OpenAI-compatible API base ``http(s)://HOST:PORT/v1``; the router posts to
            ``{base_url}/chat/completions``.
        model: the model name sent to the server in place of the client's ``model`` (default: ``name``).
        api_key_env: name of the environment variable holding the server's API key (sent as a bearer token;
            read when the app is built, never logged); None: no key.
        timeout_s: seconds (> 0) the server may take to answer in full, or for a stream to send its first
            chunk; then each later chunk of a stream within this many seconds of the previous one.

    Raises ``ValueError`` naming the bad field (never a key's value).
    """

    name: str
    base_url: str
    model: str = ""
    api_key_env: str | None = None
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) or self.name == AUTO:
            raise ValueError(f"backend name {str(self.name)[:80]!r}: use letters, digits and _.:/- (at most 128, "
                             f"starting with a letter or digit), not {AUTO!r}")
        object.__setattr__(self, "base_url", check_base_url(self.base_url))
        object.__setattr__(self, "model", self.model or self.name)
        if not isinstance(self.model, str) or len(self.model) > 1000:
            raise ValueError(f"backend {self.name}: the model name is not a string of at most 1000 characters")
        if self.api_key_env is not None and not _ENV_VAR.match(str(self.api_key_env)):
            raise ValueError(f"backend {self.name}: {str(self.api_key_env)[:80]!r} is not an environment variable name")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise ValueError(f"backend {self.name}: timeout_s must be a number > 0, got {timeout!r}")


def backends_from_options(models: Sequence[str], *, api_models: Sequence[str] = (),
                          api_key_envs: Sequence[str] = (), timeout_s: float = 120.0) -> list[Backend]:
    """Backends from ``NAME=URL`` strings (``--model``), in their order, with ``NAME=MODEL`` upstream model names
    (``--api-model``) and ``NAME=VAR`` key variables (``--api-key-env``). Raises ``ValueError`` naming the bad
    value: none given, no ``=``, a bad name or URL, a name given twice, an override for an unknown name."""
    if not models:
        raise ValueError("give at least one --model NAME=URL")
    urls = pairs(models, "--model", "URL")
    upstream, keys = pairs(api_models, "--api-model", "MODEL"), pairs(api_key_envs, "--api-key-env", "VAR")
    check_known("--api-model", upstream, urls)
    check_known("--api-key-env", keys, urls)
    return [Backend(name, url, model=upstream.get(name, ""), api_key_env=keys.get(name), timeout_s=timeout_s)
            for name, url in urls.items()]


def fixed_order(names: Sequence[str], order: str | None = None) -> Callable[[dict], list[str]]:
    """A rank function that prefers the same backends for every request: the comma-separated names of ``order``
    first, then the other ``names`` in their order. Raises ``ValueError`` for an unknown or repeated name."""
    preferred = [n.strip() for n in order.split(",")] if order else []
    for i, name in enumerate(preferred):
        if name not in names:
            raise ValueError(f"--order names {name[:80]!r}, which no --model names (known: {', '.join(names)})")
        if name in preferred[:i]:
            raise ValueError(f"--order names {name!r} twice")
    ranking = preferred + [n for n in names if n not in preferred]

    def rank(_request: dict) -> list[str]:
        return list(ranking)

    return rank


class Metrics:
    """The router's counters, safe across threads and tasks (one lock). :meth:`snapshot` is ``GET /metrics``:

    ``{"requests", "bad_requests", "answered", "client_errors", "failed", "rank_errors": int, "backends": {NAME:
    {"routed", "answered", "answered_after_fallback", "client_errors", "fallbacks_from": int, "failures":
    {KIND: int}, "latency_s_total", "latency_s_mean": float}}}``. Per backend: ``routed`` counts the requests it
    was the first choice for, ``answered`` the 2xx answers it gave (``latency_s_*`` over them, seconds from
    the request to the backend until its last byte), ``client_errors`` the 4xx it sent back, ``fallbacks_from``
    the times the router moved on from it to the next backend, ``failures`` its failures by kind (``connect``,
    ``timeout``, ``transport``, ``http_5xx``, ``http_429``, ``bad_reply``, ``too_large``, ``stream_cut``).
    """

    _TOTALS = ("requests", "bad_requests", "answered", "client_errors", "failed", "rank_errors")
    _PER_BACKEND = ("routed", "answered", "answered_after_fallback", "client_errors", "fallbacks_from")

    def __init__(self, names: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(self._TOTALS, 0)
        self._backends: dict[str, dict[str, Any]] = {
            n: dict.fromkeys(self._PER_BACKEND, 0) | {"failures": {}, "latency_s_total": 0.0} for n in names}

    def count(self, key: str, backend: str | None = None) -> None:
        """Add one to a total (``backend`` None) or to a backend's counter."""
        with self._lock:
            (self._totals if backend is None else self._backends[backend])[key] += 1

    def failure(self, backend: str, kind: str) -> None:
        with self._lock:
            failures = self._backends[backend]["failures"]
            failures[kind] = failures.get(kind, 0) + 1

    def answered(self, backend: str, latency_s: float, *, after_fallback: bool) -> None:
        with self._lock:
            self._totals["answered"] += 1
            b = self._backends[backend]
            b["answered"] += 1
            b["answered_after_fallback"] += int(after_fallback)
            b["latency_s_total"] += latency_s

    def snapshot(self) -> dict:
        with self._lock:
            backends = {n: b | {"failures": dict(b["failures"]),
                                "latency_s_mean": b["latency_s_total"] / b["answered"] if b["answered"] else 0.0}
                        for n, b in self._backends.items()}
            return dict(self._totals) | {"backends": backends}


def error_response(status: int, message: str, *, kind: str = "invalid_request_error", code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The OpenAI error shape ``{"error": {"message", "type", "param": null, "code"}}`` with HTTP ``status``."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}},
                        status_code=status, headers=headers)


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class _Failure(Exception):
    """A backend failed; ``kind`` a :class:`Metrics` failure kind, ``reason`` a short phrase without secrets."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind, self.reason = kind, reason


@dataclass(frozen=True)
class _Limits:
    max_body_bytes: int
    max_messages: int
    max_message_chars: int
    max_reply_bytes: int


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, read chunk by chunk and refused (413) past ``limit`` bytes, whatever Content-Length says."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _BadRequest(413, f"the request body is larger than {limit} bytes", "request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _BadRequest(413, f"the request body is larger than {limit} bytes", "request_too_large")
    return bytes(body)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _parse_request(raw: bytes, limits: _Limits, names: Sequence[str]) -> dict:
    """A chat-completions request body → its JSON object, or :class:`_BadRequest` (400; 413 for message contents
    over ``max_message_chars`` characters)."""
    try:
        body = json.loads(raw, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _BadRequest(400, "the request body is not valid JSON", "invalid_json") from None
    if not isinstance(body, dict):
        raise _BadRequest(400, "the request body must be a JSON object", "invalid_request")
    _check_messages(body.get("messages"), limits)
    if not (body.get("stream") is None or isinstance(body["stream"], bool)):
        raise _BadRequest(400, "'stream' must be true or false", "invalid_stream")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _BadRequest(400, "'model' must be a string", "invalid_model")
    if model not in (None, AUTO, *names):
        raise _BadRequest(400, f"unknown model {model[:100]!r}: use {AUTO!r} or one of {', '.join(names)}",
                          "model_not_found")
    return body


def _check_messages(messages: Any, limits: _Limits) -> None:
    if not isinstance(messages, list) or not messages:
        raise _BadRequest(400, "'messages' must be a non-empty list of {role, content} objects", "invalid_messages")
    if len(messages) > limits.max_messages:
        raise _BadRequest(400, f"more than {limits.max_messages} messages", "invalid_messages")
    chars = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not 0 < len(m["role"]) <= 64:
            raise _BadRequest(400, f"messages[{i}] needs a 'role' string", "invalid_messages")
        if "content" not in m or not isinstance(m["content"], str | list | None):
            raise _BadRequest(400, f"messages[{i}] needs 'content' (a string, a list of parts or null)",
                              "invalid_messages")
        content = m["content"]
        chars += len(content) if isinstance(content, str) else len(json.dumps(content)) if content else 0
    if chars > limits.max_message_chars:
        raise _BadRequest(413, f"the messages hold more than {limits.max_message_chars} characters",
                          "messages_too_large")


def _classify(err: BaseException, backend: Backend) -> _Failure:
    """A transport exception → :class:`_Failure` (no URL or header in the reason)."""
    if isinstance(err, TimeoutError | httpx.TimeoutException):
        return _Failure("timeout", f"no answer within {backend.timeout_s:g} s")
    if isinstance(err, httpx.ConnectError):
        return _Failure("connect", f"connection failed ({_short(err)})")
    return _Failure("transport", f"connection broken ({type(err).__name__})")


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())[:120]
    return "".join(ch if ch.isprintable() else " " for ch in text) or type(err).__name__


async def _read_capped(resp: httpx.Response, limit: int) -> bytes:
    body = bytearray()
    async for chunk in resp.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise _Failure("too_large", f"reply larger than {limit} bytes")
    return bytes(body)


async def _first_chunk(chunks: AsyncIterator[bytes]) -> bytes:
    async for chunk in chunks:
        if chunk:
            return chunk
    raise _Failure("bad_reply", "the stream ended before its first byte")


def _sse_error(failure: _Failure, backend: str) -> bytes:
    error = {"message": f"the stream from {backend} broke: {failure.reason}", "type": "upstream_error",
             "param": None, "code": failure.kind}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


class _RelayResponse(StreamingResponse):
    """A StreamingResponse whose relay is closed even when the client goes away (before or during the stream), so
    the backend's stream is released at once."""

    def __init__(self, relay: _Relay, headers: dict[str, str], media_type: str) -> None:
        super().__init__(relay.chunks(), headers=headers, media_type=media_type)
        self.relay = relay

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self.relay.close()


@dataclass
class _Trace:
    """One request on its way: for its log line and the metrics."""

    chosen: str
    stream: bool
    started: float
    failures: list[tuple[str, _Failure]] = field(default_factory=list)

    def fallbacks(self) -> str:
        return "; ".join(f"{name}: {f.reason}" for name, f in self.failures)


class _Router:
    """The state behind the app: backends, rank, limits, metrics and the shared HTTP client (set by the
    app's lifespan)."""

    def __init__(self, backends: Sequence[Backend], rank: Callable[[dict], list[str]], limits: _Limits) -> None:
        if not backends:
            raise ValueError("the router needs at least one backend")
        self.backends = {b.name: b for b in backends}
        if len(self.backends) != len(backends):
            raise ValueError("two backends have the same name")
        self.rank, self.limits = rank, limits
        self.metrics = Metrics(list(self.backends))
        self.keys = {b.name: read_api_key(b.name, b.api_key_env) for b in backends if b.api_key_env}
        self.redactor = Redactor(self.keys.values())
        self.http: httpx.AsyncClient | None = None

    async def chat(self, request: Request) -> Response:
        self.metrics.count("requests")
        started = time.monotonic()
        try:
            body = _parse_request(await _read_body(request, self.limits.max_body_bytes), self.limits,
                                 list(self.backends))
        except _BadRequest as bad:
            self.metrics.count("bad_requests")
            log.info("route: bad request (%d %s)", bad.status, bad.code)
            return error_response(bad.status, bad.message, code=bad.code)
        order = await self._order(body)
        return await self._forward(body, _Trace(order[0], body.get("stream") is True, started), order)

    async def _order(self, body: dict) -> list[str]:
        """Backend names to try, in order: the one the client named, then rank's (the configured order when rank
        fails or names no known backend)."""
        try:
            ranked = [n for n in dict.fromkeys(await run_in_threadpool(self.rank, body)) if n in self.backends]
        except Exception as err:  # a broken rank function must not take the router down
            log.warning("route: the rank function failed (%s); using the configured order", type(err).__name__)
            ranked = []
        if not ranked:
            self.metrics.count("rank_errors")
            ranked = list(self.backends)
        named = body.get("model")
        return [named, *(n for n in ranked if n != named)] if named in self.backends else ranked

    async def _forward(self, body: dict, trace: _Trace, order: list[str]) -> Response:
        self.metrics.count("routed", trace.chosen)
        for i, name in enumerate(order):
            try:
                return await self._attempt(self.backends[name], body, trace)
            except _Failure as failure:
                self.metrics.failure(name, failure.kind)
                trace.failures.append((name, failure))
                if i + 1 < len(order):
                    self.metrics.count("fallbacks_from", name)
        return self._all_failed(trace)

    async def _attempt(self, backend: Backend, body: dict, trace: _Trace) -> Response:
        """Ask ``backend``; its answer as the client's response, or :class:`_Failure`."""
        started = time.monotonic()
        resp, data, chunks = await self._exchange(backend, body | {"model": backend.model}, trace.stream)
        status, headers = resp.status_code, {ROUTED_HEADER: backend.name, FALLBACKS_HEADER: str(len(trace.failures))}
        if status == 429 or status >= 500:
            raise _Failure("http_429" if status == 429 else "http_5xx", f"HTTP {status}")
        if 400 <= status < 500:
            self.metrics.count("client_errors")
            self.metrics.count("client_errors", backend.name)
            self._log(trace, backend.name, status, started)
            return Response(self.redactor.data(data), status, headers=headers,
                            media_type=resp.headers.get("content-type"))
        if not 200 <= status < 300:
            raise _Failure("bad_reply", f"HTTP {status}")
        if chunks is not None:
            relay = _Relay(self, backend, resp, data, chunks, trace, started)
            return _RelayResponse(relay, headers, resp.headers.get("content-type") or "text/event-stream")
        if not _is_json_object(data):
            raise _Failure("bad_reply", "the reply is not a JSON object")
        self.record_answer(trace, backend.name, started)
        return Response(self.redactor.data(data), status, headers=headers, media_type="application/json")

    async def _exchange(self, backend: Backend, payload: dict, stream: bool,
                        ) -> tuple[httpx.Response, bytes, AsyncIterator[bytes] | None]:
        """Send ``payload``; read the whole reply, or for a 2xx stream its first chunk, within the backend's
        timeout → (response, bytes read, the rest of the stream or None). The response is closed unless a stream
        goes on; a transport failure or timeout raises :class:`_Failure`."""
        if self.http is None:
            raise RuntimeError("the router's HTTP client is not started (run the app with its lifespan)")
        request = self.http.build_request(
            "POST", backend.base_url + "/chat/completions", content=json.dumps(payload).encode(),
            headers=self._headers(backend), timeout=httpx.Timeout(backend.timeout_s))
        resp, keep_open = None, False
        try:
            async with asyncio.timeout(backend.timeout_s):
                resp = await self.http.send(request, stream=True)
                if stream and resp.is_success:
                    chunks = resp.aiter_bytes()
                    first = await _first_chunk(chunks)
                    keep_open = True
                    return resp, first, chunks
                return resp, await _read_capped(resp, self.limits.max_reply_bytes), None
        except (TimeoutError, httpx.HTTPError) as err:
            raise _classify(err, backend) from None
        finally:
            if resp is not None and not keep_open:
                await resp.aclose()

    def _headers(self, backend: Backend) -> dict[str, str]:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if backend.name in self.keys:
            headers["authorization"] = f"Bearer {self.keys[backend.name]}"
        return headers

    def record_answer(self, trace: _Trace, name: str, started: float, note: str = "") -> None:
        self.metrics.answered(name, time.monotonic() - started, after_fallback=bool(trace.failures))
        self._log(trace, name, 200, started, note)

    def _log(self, trace: _Trace, name: str, status: int, started: float, note: str = "") -> None:
        log.info("route: chosen=%s answered_by=%s status=%d fallbacks=%d%s stream=%s latency=%.3fs (backend %.3fs)%s",
                 trace.chosen, name, status, len(trace.failures),
                 f" ({trace.fallbacks()})" if trace.failures else "", "yes" if trace.stream else "no",
                 time.monotonic() - trace.started, time.monotonic() - started, f"; {note}" if note else "")

    def _all_failed(self, trace: _Trace) -> JSONResponse:
        self.metrics.count("failed")
        timed_out = trace.failures[-1][1].kind == "timeout"
        status = 504 if timed_out else 502
        log.warning("route: chosen=%s status=%d every backend failed (%s) stream=%s latency=%.3fs", trace.chosen,
                    status, trace.fallbacks(), "yes" if trace.stream else "no", time.monotonic() - trace.started)
        return error_response(status, f"every backend failed: {trace.fallbacks()}", kind="upstream_error",
                              code="backend_timeout" if timed_out else "backends_failed",
                              headers={FALLBACKS_HEADER: str(len(trace.failures) - 1)})

    def models(self, created: int) -> dict:
        names = [AUTO, *self.backends]
        return {"object": "list",
                "data": [{"id": n, "object": "model", "created": created, "owned_by": "hacrl-fed"} for n in names]}


class _Relay:
    """A backend's stream on its way to the client: its chunks as they come, then one record (metrics, log line)
    when it ends, breaks or the client goes away."""

    def __init__(self, router: _Router, backend: Backend, resp: httpx.Response, first: bytes,
                 rest: AsyncIterator[bytes], trace: _Trace, started: float) -> None:
        self.router, self.backend, self.resp, self.first, self.rest = router, backend, resp, first, rest
        self.trace, self.started = trace, started
        self.sent, self.done, self.closed = 0, False, False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The stream, chunk by chunk; a break (transport error, timeout, over the size limit) ends it with one
        SSE error event."""
        limit, broken = self.router.limits.max_reply_bytes, None
        clean = self.router.redactor.stream()          # no backend's key reaches the client, even split in two
        try:
            self.sent = len(self.first)
            yield clean.feed(self.first)
            async for chunk in self.rest:
                self.sent += len(chunk)
                if self.sent > limit:
                    broken = _Failure("too_large", f"stream longer than {limit} bytes")
                    break
                out = clean.feed(chunk)
                if out:
                    yield out
            self.done = True
            tail = clean.flush()
            if tail:
                yield tail
        except (TimeoutError, httpx.HTTPError) as err:
            broken = _classify(err, self.backend)
            broken.kind = "timeout" if broken.kind == "timeout" else "stream_cut"
        finally:
            await self.close(broken)
        if broken is not None:
            yield _sse_error(broken, self.backend.name)

    async def close(self, broken: _Failure | None = None) -> None:
        """Release the backend's stream and record the request, once."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self.resp.aclose()
        note = ""
        if broken is not None:
            self.router.metrics.failure(self.backend.name, broken.kind)
            note = f"the stream broke after {self.sent} bytes: {broken.reason}"
        elif not self.done:
            note = f"the client went away after {self.sent} bytes"
        self.router.record_answer(self.trace, self.backend.name, self.started, note)


def _is_json_object(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data), dict)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False


def build_app(backends: Sequence[Backend], rank: Callable[[dict], list[str]], *,
              max_body_bytes: int = 2 * 1024 * 1024, max_messages: int = 1024, max_message_chars: int = 1_000_000,
              max_reply_bytes: int = 32 * 1024 * 1024, max_connections: int = 256) -> FastAPI:
    """The router app (module docstring) over ``backends`` (unique names, at least one).

    ``rank(request)`` gets the validated request JSON object and returns backend names in preference order (the
    first is the routed choice, the rest the fallback order); it runs in a worker thread. Unknown names are
    skipped; when it raises or names no known backend the order of ``backends`` is used (counted as
    ``rank_errors``). Limits: request body ``max_body_bytes`` (413), ``max_messages`` messages (400), message
    contents ``max_message_chars`` characters in all (413), a backend's reply or stream ``max_reply_bytes``,
    ``max_connections`` connections to the backends at once. Raises ``ValueError`` for no backends, a repeated
    name or an unset API key variable. ``app.state.router.metrics`` is the :class:`Metrics`. Serve it with
    :func:`serve` (or any ASGI server that runs its lifespan).
    """
    router = _Router(backends, rank, _Limits(max_body_bytes, max_messages, max_message_chars, max_reply_bytes))
    created = int(time.time())
    for name in ("httpx", "httpcore"):   # their debug lines may carry request headers
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=32)
        async with httpx.AsyncClient(limits=limits, follow_redirects=False) as client:
            router.http = client
            yield
        router.http = None

    app = FastAPI(title="hacrl-fed route", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.router = router
    app.add_exception_handler(StarletteHTTPException, _http_error)
    _add_routes(app, router, created)
    return app


def _add_routes(app: FastAPI, router: _Router, created: int) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            return await router.chat(request)
        except Exception as err:  # a bug must answer in the API's shape, not take the process down
            log.error("route: internal error (%s)", type(err).__name__)
            return error_response(500, f"internal router error ({type(err).__name__})", kind="server_error",
                                  code="internal_error")

    @app.get("/v1/models")
    async def models() -> dict:
        return router.models(created)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics() -> dict:
        return router.metrics.snapshot()


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """404, 405 … in the OpenAI error shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return error_response(exc.status_code, str(exc.detail), code=code, headers=getattr(exc, "headers", None))


def _bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on HOST:PORT (port 0: a free one); OSError when it cannot be bound, ValueError for
    a host that does not resolve."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise ValueError(f"host {host!r} does not resolve ({err.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise OSError(err.errno, f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.setblocking(False)
    return sock


def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve ``app`` (from :func:`build_app`) with uvicorn on ``host:port`` (port 0: a free one) until SIGINT or
    SIGTERM; logs the ``http://HOST:PORT/v1`` base to give clients. Raises ``OSError`` when the address cannot be bound (in use,
    not local), ``ValueError`` for a host that does not resolve, ``RuntimeError`` when the app does not start."""
    import uvicorn

    sock = _bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    names = ", ".join(app.state.router.backends)
    log.info("route: serving %s at http://%s:%d/v1", names, shown, bound)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                           timeout_graceful_shutdown=5))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if not server.started:
        raise RuntimeError("the router did not start (see the log above)")
