"""Known secrets (API keys) cut out of text before it is relayed, recorded or logged.

A server may echo what it was sent: an ``Authorization`` header in an HTTP error body, in a completion's content
or in any other field. Whatever a rollout-only site records (a step error the coordinator keeps, a signed row) and
whatever ``route serve`` relays to its clients passes through :class:`Redactor` first: every occurrence of a known
secret, in the forms it can take in a JSON or HTTP text (as is, JSON-escaped, percent-encoded), becomes
:data:`REDACTED`. A stream is redacted across chunk boundaries (:class:`StreamRedactor`): a secret split between
two chunks is still found: a chunk's tail that could begin a secret (a proper prefix of one of its forms) is held
back until the next chunk shows whether it does; any other byte goes on at once.

Only secrets the process holds are known; a server that transforms a key (base64, reversed) is not covered.
CPU: linear in the text per secret form.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import quote

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "Redactor", "StreamRedactor"]

REDACTED = "[redacted]"
MIN_SECRET_CHARS = 4
"""Shorter values are not treated as secrets (a one-letter "key" would redact every text)."""


class Redactor:
    """Replaces every known secret in a text or a byte string with :data:`REDACTED`.

    ``secrets``: the values to hide (empty or shorter than :data:`MIN_SECRET_CHARS` ones are ignored).
    """

    def __init__(self, secrets: Iterable[str | None]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if isinstance(secret, str) and len(secret) >= MIN_SECRET_CHARS:
                forms |= {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1],
                          quote(secret, safe="")}
        # longest first, so that a form containing another is replaced whole
        self.forms = sorted(forms, key=len, reverse=True)
        self.byte_forms = [f.encode("utf-8", "surrogatepass") for f in self.forms]
        self.longest = max((len(b) for b in self.byte_forms), default=0)

    def __bool__(self) -> bool:
        return bool(self.forms)

    def text(self, text: str) -> str:
        """``text`` with every secret form replaced."""
        for form in self.forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return text

    def data(self, data: bytes) -> bytes:
        """``data`` (bytes) with every secret form (UTF-8) replaced."""
        for form in self.byte_forms:
            if form in data:
                data = data.replace(form, REDACTED.encode())
        return data

    def stream(self) -> StreamRedactor:
        """A :class:`StreamRedactor` for one stream."""
        return StreamRedactor(self)


class StreamRedactor:
    """Redacts a byte stream chunk by chunk: :meth:`feed` returns what may be sent now, :meth:`flush` the rest at
    the end. Holds back only a tail that could begin a secret form (at most ``longest form − 1`` bytes)."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor, self.held = redactor, b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.redactor:
            return chunk
        data = self.redactor.data(self.held + chunk)
        keep = next((k for k in range(min(len(data), self.redactor.longest - 1), 0, -1)
                     if any(f.startswith(data[-k:]) for f in self.redactor.byte_forms)), 0)
        self.held = data[len(data) - keep:]
        return data[:len(data) - keep]

    def flush(self) -> bytes:
        out, self.held = self.held, b""
        return out
