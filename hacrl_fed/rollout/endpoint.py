"""Rollouts from an OpenAI-compatible chat-completions endpoint (a rollout-only site, docs/cross-vendor.md).

:class:`EndpointRolloutSource` asks ``POST {base_url}/chat/completions`` through the ``openai`` client library
for ``n`` responses to each prompt of a step, with the plan's temperature, top-p and token cap and the site's
stop strings. It works with servers that support none of ``n``, ``logprobs`` and ``seed``:

* ``n``: asked for when the server may accept it; a server that answers with fewer choices (``transformers
  serve`` returns one) or refuses it (HTTP 400) gets the rest as single concurrent requests, and is not
  asked for ``n`` again.
* ``logprobs``: asked for (``logprobs=true``, ``top_logprobs=0``) unless configured off; when a choice
  carries the log-probs of its sampled tokens (vLLM; start it with ``--logprobs-mode processed_logprobs`` so
  they are taken after temperature and top-p, as the protocol requires) their sum is the behaviour log-prob
  (:func:`behaviour_logprob`), else the sample has none (the wire's presence flag stays unset). Entries that do
  not spell the choice's content (:func:`spells_content`: one entry for a long answer, tokens of another text)
  are not a log-prob of that text: the sample has none either (it then trains as a row without a behaviour
  log-prob). A server that refuses the parameter (HTTP 400) is not asked again.
* ``seed``: sent (best effort; derived per request from the plan's seed).
* redirects: never followed. A 3xx answer fails the step with the origin it pointed to (scheme, host, port: no
  path or query, which may carry a token): a rollout-only site's rows come only from the server its config
  names, as ``route serve`` takes answers only from its configured backends. Configure the final URL.

Bounds: at most ``max_concurrency`` requests in flight; each request at most ``timeout_s``; the step's budget
(``step_budget_s``, or the plan's deadline if sooner) is a hard bound on the whole call (requests still running
then are abandoned and end at their own timeout); retries with exponential back-off on
429, 5xx, timeouts and connection errors (the ``openai`` client's, ``max_retries``); a reply body of at most
``max_reply_bytes``, parsed as JSON and validated field by field (:func:`parse_choices`). Any failure raises
:class:`EndpointError` with the cause: the step is lost for this site only (a batch needs every sample).
The API key is read from the environment variable the config names; it is never logged, stored or sent
anywhere but to the endpoint. An endpoint that echoes it back (an ``Authorization`` header in an error body, in
a choice's content or any other field) does not put it anywhere: every reply body and error text is redacted
(:mod:`hacrl_fed.rollout.redact`) before it is parsed or becomes an :class:`EndpointError`, and the choices of a
reply that held the key carry no behaviour log-prob (their text is no longer what was sampled).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hacrl_fed.rollout.redact import Redactor

__all__ = ["EndpointError", "EndpointRolloutSource", "EndpointSample", "EndpointSettings", "behaviour_logprob",
           "parse_choices", "redirect_refusal", "spells_content"]

log = logging.getLogger("hacrl_fed.worker")

LOGPROB_TOLERANCE = 1e-4
"""A token log-prob may exceed 0 by float rounding up to this much (nats), as on the wire."""


class EndpointError(RuntimeError):
    """The endpoint could not deliver the step's rollouts; ``str(self)`` is the cause (no secret in it)."""


@dataclass(frozen=True)
class EndpointSettings:
    """How to reach the endpoint and how hard to try (``[agent.endpoint]`` in a site's TOML).

    Attributes:
        base_url: ``http(s)://host:port/v1``.
        model: the endpoint's model name (``--api-model``).
        api_key_env: name of the environment variable holding the API key; None or unset: no key
            (a local server). The value is never logged.
        max_concurrency: requests in flight at once (≥ 1).
        timeout_s: seconds one request may take (connect + reply).
        max_retries: retries of one request on 429 / 5xx / timeout / connection errors, with back-off.
        step_budget_s: seconds all requests of one step may take together.
        logprobs: ask for the sampled tokens' log-probs.
        n: ``auto``: ask for G choices in one request while the server honours it; ``never``: single requests.
        max_reply_bytes: largest reply body read (bytes).
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    max_concurrency: int = 4
    timeout_s: float = 120.0
    max_retries: int = 3
    step_budget_s: float = 1800.0
    logprobs: bool = True
    n: str = "auto"
    max_reply_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True)
class EndpointSample:
    """One response of the endpoint.

    ``text``: the message content; ``finish_reason``: ``stop`` or ``length``; ``logprob_sum``: Σ log π of the
    content tokens plus, for a stop whose terminal EOS the server reported, that EOS (nats), or None when the
    server gave no log-probs; ``eos_logprob``: that EOS term (None without one); ``token_count``: tokens of the
    sum (with log-probs), else the server's ``completion_tokens`` for a single-choice reply, else 0 (unknown).
    """

    prompt_index: int
    sample_index: int
    text: str
    finish_reason: str
    logprob_sum: float | None
    token_count: int
    eos_logprob: float | None = None


def behaviour_logprob(entries: Sequence[Any], finish_reason: str, content: str,
                      stop: Sequence[str] = ()) -> tuple[float, int, float | None] | None:
    """``(Σ log π, tokens, eos term or None)`` from a choice's ``logprobs.content`` entries (vLLM shape:
    ``{"token": str, "logprob": float, "bytes": [int] | None, "top_logprobs": [...]}``, one per sampled token),
    or None when the entries do not spell ``content`` (:func:`spells_content`): then they are no log-prob of it.

    EOS convention of the project (``rollout.proto``): for a ``stop`` response whose last entry is the
    terminal EOS the server sampled (a token that is not part of the content: empty bytes, or a special token's
    text after the content), its log-prob is part of the sum and the count and returned as the EOS term;
    otherwise the sum covers the content tokens (and, for a response cut at one of the ``stop`` strings, the
    tokens that spelled it) and there is no EOS term. Raises ``ValueError`` for a non-finite or positive
    log-prob or no entry.
    """
    values = []
    for e in entries:
        lp = _field(e, "logprob")
        if isinstance(lp, bool) or not isinstance(lp, int | float) or not math.isfinite(lp) or lp > LOGPROB_TOLERANCE:
            raise ValueError(f"token log-prob {lp!r} is not a finite number <= 0")
        values.append(float(lp))
    if not values:
        raise ValueError("no token log-probs")
    pieces = [_entry_bytes(e) for e in entries]
    stop = stop if finish_reason == "stop" else ()
    if finish_reason == "stop" and len(values) >= 2:
        last = entries[-1]
        if _field(last, "bytes") == [] or _field(last, "token") in ("", None):    # an EOS that renders as nothing
            return (math.fsum(values), len(values), values[-1]) if spells_content(pieces[:-1], content) else None
    if spells_content(pieces, content, stop):
        return math.fsum(values), len(values), None
    if finish_reason == "stop" and len(values) >= 2 and spells_content(pieces[:-1], content):
        return math.fsum(values), len(values), values[-1]                 # a special token's text after it
    return None


def _field(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, dict) else getattr(entry, name, None)


def _entry_bytes(entry: Any) -> bytes | None:
    """An entry's UTF-8 bytes: its ``bytes`` list when that is one (0..255 each), else its ``token`` text; None
    when it has neither."""
    raw = _field(entry, "bytes")
    if isinstance(raw, list) and all(isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 256 for b in raw):
        return bytes(raw)
    token = _field(entry, "token")
    if isinstance(token, str):
        try:
            return token.encode("utf-8")
        except UnicodeEncodeError:
            return None
    return None


def spells_content(pieces: Sequence[bytes | None], content: str, stop: Sequence[str] = ()) -> bool:
    """Whether the sampled tokens' bytes ``pieces``, joined, are exactly ``content`` (UTF-8), or, for a response
    cut at a stop string, ``content`` followed by one of ``stop`` and less than the last token beyond it (the
    server truncates the text at the stop string, not the tokens). Linear in the bytes."""
    if not pieces or any(p is None for p in pieces):
        return False
    joined, target = b"".join(pieces), content.encode("utf-8", "surrogatepass")
    if joined == target:
        return True
    if not stop or not joined.startswith(target):
        return False
    rest = joined[len(target):]
    return any(s and rest.startswith(s.encode("utf-8")) and len(rest) - len(s.encode("utf-8")) < len(pieces[-1])
               for s in stop)


def parse_choices(body: bytes, *, max_chars: int, max_tokens: int) -> tuple[list[dict], int | None]:
    """Validate a chat-completions reply body → (choices as dicts with ``text``, ``finish_reason``,
    ``logprobs`` (list or None)), ``usage.completion_tokens`` or None).

    Raises ``ValueError`` naming the problem: not JSON (or nested too deeply), not an object, no ``choices``
    list, a choice without string content or with a lone surrogate (not UTF-8 encodable), a content
    longer than ``max_chars`` characters, an unknown finish reason, more log-prob
    entries than ``max_tokens``.
    """
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"the reply is not JSON ({err.__class__.__name__}: {str(err)[:80]})") from None
    except RecursionError:
        raise ValueError("the reply is not JSON (nested too deeply)") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise ValueError("the reply has no 'choices' list")
    out = []
    for c in data["choices"]:
        msg = c.get("message") if isinstance(c, dict) else None
        text = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(text, str):
            raise ValueError("a choice has no string message.content")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a choice's content is not valid Unicode (a lone surrogate)") from None
        if len(text) > max_chars:
            raise ValueError(f"a choice has {len(text)} characters, more than {max_tokens} tokens can make")
        finish = c.get("finish_reason")
        if finish not in ("stop", "length", "eos", "eos_token"):
            raise ValueError(f"unknown finish_reason {str(finish)[:40]!r}")
        lp = c.get("logprobs")
        entries = lp.get("content") if isinstance(lp, dict) else None
        if entries is not None and (not isinstance(entries, list) or len(entries) > max_tokens + 1):
            raise ValueError(f"logprobs.content is not a list of at most {max_tokens + 1} entries")
        index = c.get("index", len(out))
        out.append({"text": text, "finish_reason": "length" if finish == "length" else "stop",
                    "logprobs": entries or None, "index": index if isinstance(index, int) else len(out)})
    usage = data.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return out, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0 else None


class _Refused(Exception):
    """HTTP 400 for a request with ``n`` or ``logprobs``: retry without it."""


class EndpointRolloutSource:
    """Generates a step's rollouts at an OpenAI-compatible endpoint (module docstring).

    ``client``: an ``openai.OpenAI`` to use (tests); default one built from ``settings``. Raises
    :class:`EndpointError` at construction when ``api_key_env`` names an unset variable.
    """

    def __init__(self, settings: EndpointSettings, *, client: Any = None) -> None:
        import openai

        self.settings = settings
        key = "EMPTY"
        if settings.api_key_env:
            key = os.environ.get(settings.api_key_env, "")
            if not key:
                raise EndpointError(f"the API key variable {settings.api_key_env!r} is not set")
        for name in ("openai", "httpx", "httpx2", "httpcore"):   # their debug lines may carry request headers
            logger = logging.getLogger(name)
            logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
        self.redactor = Redactor([key] if settings.api_key_env else [])
        self.client = client or openai.OpenAI(base_url=settings.base_url, api_key=key, max_retries=settings.max_retries,
                                              timeout=settings.timeout_s,
                                              http_client=openai.DefaultHttpxClient(follow_redirects=False))
        self._use_n = settings.n == "auto"
        self._use_logprobs = settings.logprobs
        self._flags = threading.Lock()

    @property
    def name(self) -> str:
        return f"endpoint:{self.settings.model}"

    def generate(self, messages: Sequence[list[dict[str, str]]], n: int, *, temperature: float, top_p: float,
                 max_tokens: int, stop: Sequence[str] = (), seed: int = 0, top_k: int = 0,
                 deadline: float | None = None, max_chars: int | None = None) -> list[EndpointSample]:
        """``n`` samples for each chat ``messages[i]`` (list of ``{"role", "content"}``), sample indices
        0..n−1, ordered by prompt then sample. ``deadline``: UNIX seconds no request may pass (the sooner of it
        and ``step_budget_s`` from now). ``top_k`` > 0 goes in the request body as ``top_k`` (vLLM; others may
        ignore it). Raises :class:`EndpointError` (first cause) when any sample cannot be had."""
        s = self.settings
        end = time.time() + s.step_budget_s
        end = min(end, deadline) if deadline else end
        cap = max_chars if max_chars is not None else 128 * max(1, max_tokens)
        params = {"temperature": float(temperature), "top_p": float(top_p), "max_tokens": int(max_tokens)}
        if stop:
            params["stop"] = list(stop)[:4]          # the OpenAI API takes at most 4
        extra = {"top_k": int(top_k)} if top_k > 0 else None
        got: list[list[EndpointSample]] = [[] for _ in messages]
        outstanding = [0] * len(messages)
        errors: list[str] = []
        pool = cf.ThreadPoolExecutor(max_workers=max(1, s.max_concurrency), thread_name_prefix="endpoint")
        try:
            pending: dict[cf.Future, tuple[int, int]] = {}

            def submit(i: int, k: int) -> None:
                outstanding[i] += 1
                req_seed = (seed * 1_000_003 + i) * 1009 + len(got[i]) + outstanding[i]
                fut = pool.submit(self._request, messages[i], k, params, extra, req_seed, end, cap, max_tokens)
                pending[fut] = (i, k)

            for i in range(len(messages)):
                if self._use_n and n > 1:
                    submit(i, n)
                else:
                    for _ in range(n):
                        submit(i, 1)
            while pending and not errors:
                # the step's budget is a hard bound: a reply trickling in (or the client's retries) cannot pass it
                done, _ = cf.wait(pending, timeout=max(0.0, end - time.time()), return_when=cf.FIRST_COMPLETED)
                if not done:
                    errors.append(f"the step's endpoint budget ({s.step_budget_s:.0f} s or the plan's deadline) ran "
                                  f"out with {len(pending)} request(s) unanswered")
                    break
                for fut in done:
                    i, asked = pending.pop(fut)
                    outstanding[i] -= 1
                    try:
                        choices = fut.result()
                        for c in choices[: n - len(got[i])]:
                            got[i].append(_sample(i, len(got[i]), c, params.get("stop", ())))
                    except EndpointError as err:
                        errors.append(str(err))
                        continue
                    if asked > 1 and len(choices) < asked:
                        with self._flags:
                            if self._use_n:
                                log.info("the endpoint returned %d of %d choices: asking one by one from now on",
                                         len(choices), asked)
                            self._use_n = False
                    if outstanding[i] == 0 and not errors:
                        for _ in range(n - len(got[i])):
                            submit(i, 1)
        finally:   # requests still running end at their own timeout; nobody waits for them
            pool.shutdown(wait=False, cancel_futures=True)
        if errors:
            raise EndpointError(errors[0] + (f" (+{len(errors) - 1} more failed requests)" if len(errors) > 1 else ""))
        return [x for row in got for x in row]

    def _request(self, msgs, n: int, params: dict, extra: dict | None, seed: int, end: float, cap: int,
                 max_tokens: int) -> list[dict]:
        for _ in range(3):                            # at most: drop n, drop logprobs, then fail
            try:
                return self._once(msgs, n, params, extra, seed, end, cap, max_tokens)
            except _Refused as why:
                with self._flags:
                    if str(why) == "n" and self._use_n:
                        self._use_n = False
                        log.info("the endpoint refused n > 1: asking one by one from now on")
                    elif str(why) == "logprobs" and self._use_logprobs:
                        self._use_logprobs = False
                        log.info("the endpoint refused logprobs: its rollouts carry no behaviour log-prob")
                if str(why) == "n":
                    n = 1
        raise EndpointError("the endpoint refused the request (HTTP 400) also without n and logprobs")

    def _once(self, msgs, n: int, params: dict, extra: dict | None, seed: int, end: float, cap: int,
              max_tokens: int) -> list[dict]:
        import openai

        left = end - time.time()
        if left <= 0:
            raise EndpointError(f"the step's endpoint budget ({self.settings.step_budget_s:.0f} s or the plan's "
                                "deadline) ran out")
        want_lp = self._use_logprobs
        kw: dict[str, Any] = dict(params, model=self.settings.model, messages=list(msgs), seed=int(seed) & (2**31 - 1),
                                  timeout=min(self.settings.timeout_s, left))
        if n > 1:
            kw["n"] = n
        if want_lp:
            kw |= {"logprobs": True, "top_logprobs": 0}
        if extra:
            kw["extra_body"] = extra
        try:
            with self.client.chat.completions.with_streaming_response.create(**kw) as resp:
                body = bytearray()
                for chunk in resp.iter_bytes():
                    body += chunk
                    if len(body) > self.settings.max_reply_bytes:
                        raise EndpointError(f"the reply exceeds {self.settings.max_reply_bytes} bytes")
                    if time.time() > end:
                        raise EndpointError("the step's endpoint budget ran out while reading a reply")
        except openai.BadRequestError as err:
            if n > 1:
                raise _Refused("n") from None
            if want_lp:
                raise _Refused("logprobs") from None
            raise EndpointError(f"the endpoint refused the request: HTTP 400 {self._short(err)}") from None
        except openai.APIStatusError as err:
            if 300 <= err.status_code < 400:
                raise EndpointError(redirect_refusal(err.response)) from None
            raise EndpointError(f"the endpoint answered HTTP {err.status_code} (after "
                                f"{self.settings.max_retries} retries for 429/5xx): {self._short(err)}") from None
        except openai.APITimeoutError:
            raise EndpointError(f"no reply within {kw['timeout']:.0f} s (after {self.settings.max_retries} "
                                "retries)") from None
        except openai.APIConnectionError as err:
            raise EndpointError(f"cannot reach the endpoint {self.settings.base_url}: {self._short(err)}") from None
        except EndpointError:
            raise
        except Exception as err:   # a body cut short, a broken stream: this site's step fails, nothing else
            raise EndpointError(f"the reply could not be read: {type(err).__name__}: {self._short(err)}") from None
        clean = self.redactor.data(bytes(body))      # before parsing: no field of the reply can carry the key on
        try:
            choices, tokens = parse_choices(clean, max_chars=cap, max_tokens=max_tokens)
        except ValueError as err:
            raise EndpointError(f"bad reply: {self.redactor.text(str(err))}") from None
        for c in choices:
            c["usage_tokens"] = tokens if len(choices) == 1 else None
            if len(clean) != len(body) or clean != body:
                c["logprobs"] = None                 # the text is not what was sampled any more
        return choices

    def _short(self, err: BaseException) -> str:
        """An exception's text for an :class:`EndpointError`: the known secret redacted, then cut to 200
        printable characters (redacted first, so no part of the key survives the cut)."""
        return _short(self.redactor.text(str(err)))


def redirect_refusal(response: Any) -> str:
    """The cause for a refused 3xx ``response`` (an ``httpx.Response``): its status and the origin its
    ``Location`` points to, without path or query."""
    from urllib.parse import urlsplit

    location = str(response.headers.get("location", ""))[:2000]
    try:
        target = urlsplit(str(response.request.url.join(location))) if location else None
        origin = f"{target.scheme}://{target.hostname}{f':{target.port}' if target.port else ''}" if target else "?"
    except (ValueError, TypeError):
        origin = "?"
    return (f"the endpoint answered with a redirect (HTTP {response.status_code} to {_short(origin)}): not followed, "
            "rows come only from the configured URL (configure the final one)")


def _short(text: str) -> str:
    text = " ".join(text.split())
    return "".join(ch if ch.isprintable() else " " for ch in text[:200])


def _sample(i: int, j: int, c: dict, stop: Sequence[str] = ()) -> EndpointSample:
    """A validated choice → :class:`EndpointSample` (log-prob values that are no log-probs: EndpointError;
    entries that do not spell the content: no behaviour log-prob)."""
    text, finish = c["text"], c["finish_reason"]
    if c["logprobs"]:
        try:
            found = behaviour_logprob(c["logprobs"], finish, text, stop)
        except ValueError as err:
            raise EndpointError(f"bad reply: {err}") from None
        if found is not None:
            return EndpointSample(i, j, text, finish, *found)
        log.warning("the endpoint's %d log-prob entries do not spell its %d-character answer: no behaviour "
                    "log-prob for that sample", len(c["logprobs"]), len(text))
        return EndpointSample(i, j, text, finish, None, int(c.get("usage_tokens") or 0), None)
    return EndpointSample(i, j, text, finish, None, int(c.get("usage_tokens") or 0), None)
