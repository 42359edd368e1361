"""Reading an environment's configuration (a JSON object) with checked types and ranges.

Every reader raises :class:`ValueError` with a message that names the key and what it accepts; booleans are
never taken for integers (JSON ``true`` is not ``1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hacrl_fed.envs.base import thaw

__all__ = ["bool_param", "check_keys", "choice_param", "int_param", "object_param", "str_param"]


def check_keys(config: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Raise :class:`ValueError` when ``config`` has a key outside ``allowed`` (the message lists them)."""
    allowed = sorted(allowed)
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise ValueError(f"unknown config key(s) {', '.join(map(repr, unknown))}; accepted: "
                         f"{', '.join(allowed) if allowed else 'none'}")


def int_param(config: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    """``config[key]`` (``default`` when absent) as an integer in ``lo..hi``."""
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"config {key!r} must be an integer in {lo}..{hi}, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"config {key!r} must be in {lo}..{hi}, got {value}")
    return value


def bool_param(config: Mapping[str, Any], key: str, default: bool) -> bool:
    """``config[key]`` (``default`` when absent), a boolean."""
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"config {key!r} must be true or false, got {value!r}")
    return value


def str_param(config: Mapping[str, Any], key: str, max_chars: int = 128) -> str:
    """``config[key]``, a required non-empty string of at most ``max_chars`` characters."""
    if key not in config:
        raise ValueError(f"config {key!r} is required")
    value = config[key]
    if not isinstance(value, str) or not 1 <= len(value) <= max_chars:
        raise ValueError(f"config {key!r} must be a string of 1..{max_chars} characters, got {value!r:.80}")
    return value


def choice_param(config: Mapping[str, Any], key: str, default: str, choices: Iterable[str]) -> str:
    """``config[key]`` (``default`` when absent), one of ``choices``."""
    choices = tuple(choices)
    value = config.get(key, default)
    if value not in choices:
        raise ValueError(f"config {key!r} must be one of {', '.join(map(repr, choices))}, got {value!r:.80}")
    return value


def object_param(config: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``config[key]`` (``{}`` when absent) as a plain dict; it must be a JSON object."""
    value = config.get(key, {})
    if not isinstance(value, Mapping):
        raise ValueError(f"config {key!r} must be a JSON object, got {value!r:.80}")
    return thaw(value)
