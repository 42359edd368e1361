"""The command-line values both ``route eval`` and ``route serve`` take: ``NAME=VALUE`` pairs keyed by a
``--model`` name, OpenAI-compatible API base URLs, and API keys read from environment variables. Pure parsing,
no network; every error is a one-line ``ValueError`` naming the option (never a key's value)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlsplit

__all__ = ["check_base_url", "check_known", "pairs", "read_api_key"]


def pairs(values: Sequence[str], option: str, what: str) -> dict[str, str]:
    """``NAME=WHAT`` strings → {NAME: WHAT}; ValueError for a missing ``=``, an empty side or a repeated NAME."""
    out: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise ValueError(f"{option} {value[:120]!r}: expected NAME={what}")
        if name.strip() in out:
            raise ValueError(f"{option}: {name.strip()!r} is given twice")
        out[name.strip()] = rest.strip()
    return out


def check_known(option: str, given: Mapping[str, str], names: Iterable[str]) -> None:
    """ValueError when ``given`` (the pairs of ``option``) names something no ``--model`` names."""
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"{option} names {', '.join(unknown)}, which no --model names")


def check_base_url(url: str) -> str:
    """``url`` without a trailing ``/`` when it is an API base ``http(s)://HOST[:PORT]/PATH`` (e.g.
    ``http://127.0.0.1:8000/v1``); raises ``ValueError`` naming the problem (no scheme or host, credentials,
    query or fragment in it, a bad port, no path)."""
    if not isinstance(url, str) or not url or len(url) > 2000 or any(c.isspace() for c in url):
        raise ValueError(f"{str(url)[:80]!r} is not a URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s)://HOST:PORT/v1 URL")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(f"{parts.scheme}://{parts.hostname}...: a base URL has no credentials, query or fragment "
                         "(an API key goes in --api-key-env)")
    try:
        parts.port
    except ValueError:
        raise ValueError(f"{url!r}: bad port") from None
    if parts.path.strip("/") == "":
        raise ValueError(f"{url!r} has no path: give the API base, e.g. {parts.scheme}://{parts.netloc}/v1")
    return url.rstrip("/")


def read_api_key(name: str, variable: str) -> str:
    """The API key of backend ``name`` from the environment variable ``variable``; ValueError when it is unset
    or empty (the message names the variable, never a value)."""
    key = os.environ.get(variable or "", "")
    if not key:
        raise ValueError(f"backend {name}: the API key variable {variable!r} is not set")
    return key
