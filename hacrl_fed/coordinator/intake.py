"""Bounds on everything the coordinator reads from a node before it uses, logs or stores it.

A reply is a claim of an untrusted node, whatever transport carried it: the step loop passes every
reply through :func:`bounded_reply` right after an exchange, and :mod:`~hacrl_fed.coordinator.step_record`
bounds what it takes out of a site's ``TrainReport`` and ``EvaluateResponse`` with the same helpers.
Nothing a node sends can then put a NaN or an infinity into ``state.json``, grow a metrics line
without bound, or write terminal control sequences into the coordinator's log:

* metrics: at most :data:`MAX_METRICS` entries, keys of at most :data:`MAX_KEY_CHARS` characters from
  ``[A-Za-z0-9_./@:+-]``, values finite and within ±:data:`MAX_ABS_VALUE` (others dropped);
* free text (errors, names, versions): printable, at most :data:`MAX_TEXT_CHARS` characters;
* serialized protobufs: bytes or nothing; byte counters: non-negative integers.

Pure functions, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from hacrl_fed.protocol.keys import AGENT_NAME_PATTERN

__all__ = ["MAX_ABS_VALUE", "MAX_KEY_CHARS", "MAX_METRICS", "MAX_TEXT_CHARS", "bounded_metrics", "bounded_reply",
           "bounded_text"]

MAX_METRICS = 128
"""Metric entries kept from one reply part."""
MAX_KEY_CHARS = 96
"""Characters of a metric key."""
MAX_TEXT_CHARS = 500
"""Characters kept of one free-text field."""
MAX_ABS_VALUE = 1e15
"""Largest magnitude of a metric value."""
_KEY = re.compile(r"[A-Za-z0-9_./@:+-]{1,%d}" % MAX_KEY_CHARS)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def bounded_text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """``value`` as a printable string of at most ``limit`` characters (control characters → ``?``;
    a cut is marked with ``…``); anything but a string becomes ``''``."""
    if not isinstance(value, str):
        return ""
    text = _CONTROL.sub("?", value[: limit + 1]).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bounded_metrics(values: Any, limit: int = MAX_METRICS) -> dict[str, float]:
    """The first ``limit`` well-formed entries of a metrics mapping (module docstring); ``{}`` for anything
    that is not a mapping."""
    if not isinstance(values, Mapping):
        return {}
    out: dict[str, float] = {}
    for key, value in values.items():
        if len(out) >= limit:
            break
        if not (isinstance(key, str) and _KEY.fullmatch(key)) or isinstance(value, bool):
            continue
        if not isinstance(value, int | float):
            continue
        number = float(value)
        if math.isfinite(number) and abs(number) <= MAX_ABS_VALUE:
            out[key] = number
    return out


def _blob(value: Any) -> bytes | None:
    return bytes(value) if isinstance(value, bytes | bytearray) else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63 else 0


def bounded_reply(reply: Any) -> Any:
    """A copy of a coordinator ``Reply`` whose every field read from the node is bounded (module
    docstring); the site's reported agent name is kept only when it is a well-formed agent name."""
    site = reply.site
    agent = site.agent if isinstance(site.agent, str) and re.fullmatch(AGENT_NAME_PATTERN, site.agent) else ""
    clean_site = dataclasses.replace(
        site, agent=agent, version=bounded_text(site.version, 64), envelope=_blob(site.envelope),
        report=_blob(site.report), evaluation=_blob(site.evaluation), metrics=bounded_metrics(site.metrics),
        generate_metrics=bounded_metrics(site.generate_metrics), generate_error=bounded_text(site.generate_error),
        checkpoint_error=bounded_text(site.checkpoint_error))
    return dataclasses.replace(reply, site=clean_site, error=bounded_text(reply.error),
                               timed_out=bool(reply.timed_out), bytes_in=_count(reply.bytes_in),
                               bytes_out=_count(reply.bytes_out))
