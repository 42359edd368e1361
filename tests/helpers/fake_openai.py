"""A local OpenAI-compatible chat-completions server for tests: scripted behaviours, real HTTP on 127.0.0.1.

``FakeOpenAI(mode)`` answers ``POST /v1/chat/completions`` according to ``mode``:

* ``vllm``: the documented vLLM shape — ``n`` choices, each with ``logprobs.content`` entries
  ``{"token", "logprob", "bytes", "top_logprobs"}`` for the sampled tokens, the terminal EOS included for a stop;
* ``plain``: one choice whatever ``n`` says, no ``logprobs`` (as ``transformers serve`` does);
* ``refuse_n``: HTTP 400 for ``n`` > 1 or ``logprobs``; else as ``plain``;
* ``error500``: HTTP 500 always; ``garbage``: 200 with a body that is not JSON; ``truncated``: a Content-Length
  larger than the body sent; ``slow``: holds the reply until :meth:`release` (or the client gives up);
* ``flaky``: HTTP 429 for the first ``fail_first`` requests, then ``plain``;
* ``echo401`` / ``echo400`` / ``echo500``: that status with the request's ``Authorization`` header in the error
  body; ``echo_content``: 200 whose content (a ``plain`` choice) carries the header; ``echo_finish``: 200 whose
  ``finish_reason`` is the header (a backend that echoes what it was sent);
* ``short_logprobs``: the ``vllm`` shape with one log-prob entry (``"ok"``, 0.0) for the whole content;
* ``redirect``: HTTP 307 to :attr:`location` (another server's URL, keeping the method and body).

``requests`` records every request body (JSON) received, ``headers`` their headers.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ANSWER = "The answer is \\boxed{5}."
TOKENS = ["The", " answer", " is", " \\boxed{5}", "."]
LOGPROBS = [-0.5, -0.25, -0.125, -1.0, -0.0625]
EOS_LOGPROB = -0.75


class FakeOpenAI:
    def __init__(self, mode: str, *, fail_first: int = 0) -> None:
        self.mode = mode
        self.fail_first = fail_first
        self.location = ""
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                owner.requests.append(body)
                owner.headers.append(dict(self.headers))
                owner.handle(self, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def release(self) -> None:
        self._release.set()

    def close(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _send(h, status: int, payload: bytes, *, length: int | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload) if length is None else length))
        h.end_headers()
        h.wfile.write(payload)
        h.wfile.flush()

    def handle(self, h, body: dict) -> None:
        mode = self.mode
        if mode == "flaky":
            if len(self.requests) <= self.fail_first:
                return self._send(h, 429, b'{"error": {"message": "slow down"}}')
            mode = "plain"
        if mode == "error500":
            return self._send(h, 500, b'{"error": {"message": "internal"}}')
        if mode == "redirect":
            h.send_response(307)
            h.send_header("Location", self.location)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return None
        auth = str(h.headers.get("Authorization", ""))
        if mode in ("echo401", "echo400", "echo500"):
            return self._send(h, int(mode[4:]), json.dumps({"error": {"message": f"bad header: {auth}"}}).encode())
        if mode == "garbage":
            return self._send(h, 200, b"<html>not json at all")
        if mode == "truncated":
            h.close_connection = True
            return self._send(h, 200, b'{"choices": [{"message": {"content": "The ans', length=4000)
        if mode == "slow":
            self._release.wait(60)
            mode = "plain"
        if mode == "refuse_n" and (body.get("n", 1) > 1 or body.get("logprobs")):
            return self._send(h, 400, b'{"error": {"message": "n and logprobs are not supported"}}')
        n = body.get("n", 1) if mode in ("vllm", "short_logprobs") else 1
        choices = []
        for i in range(n):
            content = f"{ANSWER} (sent: {auth})" if mode == "echo_content" else ANSWER
            finish = auth if mode == "echo_finish" else "stop"
            choice = {"index": i, "message": {"role": "assistant", "content": content}, "finish_reason": finish}
            if mode == "short_logprobs" and body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": "ok", "logprob": 0.0, "bytes": [111, 107],
                                                   "top_logprobs": []}]}
            elif mode == "vllm" and body.get("logprobs"):
                entries = [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                           for t, lp in zip(TOKENS, LOGPROBS)]
                entries.append({"token": "<|im_end|>", "logprob": EOS_LOGPROB, "bytes": [], "top_logprobs": []})
                choice["logprobs"] = {"content": entries}
            else:
                choice["logprobs"] = None
            choices.append(choice)
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body.get("model", ""),
                 "choices": choices, "usage": {"prompt_tokens": 3, "completion_tokens": 6 * n, "total_tokens": 9}}
        return self._send(h, 200, json.dumps(reply).encode())
