"""The environment interface: an episode's instance (:class:`EpisodeSpec`), one step's answer (:class:`EnvStep`)
and the protocol every environment implements (:class:`Environment`), docs/multi-turn.md.

An :class:`EpisodeSpec` is what travels on the wire (``hacrl_fed.v1.EpisodeSpec``) and is all a peer needs to
re-create the environment and replay an episode: the registry id, the configuration (a JSON object, canonical on
the wire), the seed and the agent-turn budget. Every bound is checked where a spec is built, from Python values
or from the wire, with a :class:`ValueError` that names the field.

Observations are bounded text: :func:`bound_observation` cuts anything longer than
:data:`MAX_OBSERVATION_CHARS` the same way everywhere, so a generating site and a replaying peer see the same
string.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

__all__ = ["MAX_CONFIG_BYTES", "MAX_ENV_ID_CHARS", "MAX_OBSERVATION_CHARS", "MAX_SEED", "MAX_TURNS", "EnvStep",
           "Environment", "EpisodeSpec", "bound_observation", "canonical_config", "check_env_id",
           "thaw"]

MAX_TURNS = 32
"""Most agent turns an episode may have (``EpisodeSpec.max_turns`` is 1..MAX_TURNS)."""
MAX_CONFIG_BYTES = 4096
"""Longest canonical configuration, in UTF-8 bytes."""
MAX_ENV_ID_CHARS = 128
"""Longest registry id (printable ASCII, no whitespace)."""
MAX_SEED = 2**63 - 1
"""Largest seed (the wire's uint64 is cut to the range every language's signed 64-bit integer holds)."""
MAX_OBSERVATION_CHARS = 4096
"""Longest observation, in characters (code points); longer text is cut by :func:`bound_observation`."""

_CUT_MARK = "\n[… cut]"
_ENV_ID = re.compile(r"[!-~]+")


def check_env_id(env_id: object) -> str:
    """``env_id`` itself when it is 1..:data:`MAX_ENV_ID_CHARS` printable ASCII characters without whitespace;
    else :class:`ValueError`."""
    if not isinstance(env_id, str):
        raise ValueError(f"env_id must be a string, not {type(env_id).__name__}")
    if not 1 <= len(env_id) <= MAX_ENV_ID_CHARS or not _ENV_ID.fullmatch(env_id):
        raise ValueError(f"env_id must be 1..{MAX_ENV_ID_CHARS} printable ASCII characters without whitespace, "
                         f"got {env_id[:MAX_ENV_ID_CHARS + 8]!r}")
    return env_id


def canonical_config(config: object) -> str:
    """The canonical JSON text of a configuration: ``json.dumps(config, sort_keys=True, separators=(",", ":"))``.

    ``config`` must be a JSON object (a mapping with string keys at every level; values: objects, lists,
    strings, finite numbers, booleans, null) whose canonical text is at most :data:`MAX_CONFIG_BYTES` UTF-8
    bytes. Raises :class:`ValueError` naming what is wrong.

    >>> canonical_config({"b": [1, 2.5], "a": {"x": None}})
    '{"a":{"x":null},"b":[1,2.5]}'
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a JSON object (a mapping), not {type(config).__name__}")
    _check_json_value(config, "config", 0)
    try:
        text = json.dumps(thaw(config), sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"config is not JSON: {err}") from None
    size = len(text.encode("utf-8"))
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"config is {size} bytes as canonical JSON, at most {MAX_CONFIG_BYTES}")
    return text


_MAX_DEPTH = 64


def _check_json_value(value: Any, where: str, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"{where}: nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{where}: keys must be strings, got {key!r}")
            _check_json_value(item, f"{where}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json_value(item, f"{where}[{i}]", depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{where}: {value} is not a JSON number")
    elif not (value is None or isinstance(value, (str, int, bool))):
        raise ValueError(f"{where}: {type(value).__name__} is not a JSON value")


def _parse_config_json(text: str) -> dict[str, Any]:
    if len(text.encode("utf-8")) > MAX_CONFIG_BYTES:
        raise ValueError(f"config_json is longer than {MAX_CONFIG_BYTES} bytes")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ValueError(f"config_json is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"config_json must be a JSON object, got {type(value).__name__}")
    if canonical_config(value) != text:
        raise ValueError("config_json is not canonical JSON (sorted keys, no spaces, as EpisodeSpec.to_proto "
                         "writes it)")
    return value


def _check_int(value: object, name: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in {lo}..{hi}, got {value}")
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable copy of a frozen configuration value (mappings → ``dict``, tuples → ``list``)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True, eq=False)
class EpisodeSpec:
    """One environment instance: enough to re-create it and replay an episode.

    Attributes:
        env_id: registry id (:func:`hacrl_fed.envs.env_ids`), 1..128 printable ASCII characters, no whitespace.
        config: the environment's configuration, a JSON object; stored read-only in its canonical form (JSON
            round trip: tuples become lists), at most :data:`MAX_CONFIG_BYTES` bytes as canonical JSON.
        seed: the instance's seed, 0..:data:`MAX_SEED`.
        max_turns: agent turns at most, 1..:data:`MAX_TURNS`; an episode not done after them ends with reward 0.

    Raises :class:`ValueError` for any value out of these bounds. Two specs are equal when their ids, canonical
    configurations (:attr:`config_json`: ``1`` and ``1.0`` differ), seeds and turn budgets are.
    """

    env_id: str
    config: Mapping[str, Any]
    seed: int
    max_turns: int

    def __post_init__(self) -> None:
        check_env_id(self.env_id)
        text = canonical_config(self.config)
        object.__setattr__(self, "config", _freeze(json.loads(text)))
        object.__setattr__(self, "_config_json", text)
        _check_int(self.seed, "seed", 0, MAX_SEED)
        _check_int(self.max_turns, "max_turns", 1, MAX_TURNS)

    def _key(self) -> tuple[str, str, int, int]:
        return (self.env_id, self.config_json, self.seed, self.max_turns)

    def __eq__(self, other: object) -> bool:
        return self._key() == other._key() if isinstance(other, EpisodeSpec) else NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"EpisodeSpec(env_id={self.env_id!r}, config={self.config_json}, seed={self.seed}, "
                f"max_turns={self.max_turns})")

    @property
    def config_json(self) -> str:
        """The canonical JSON text of :attr:`config` (what travels on the wire)."""
        return self._config_json  # type: ignore[attr-defined]

    def config_dict(self) -> dict[str, Any]:
        """A plain, mutable copy of :attr:`config`."""
        return thaw(self.config)

    def to_proto(self) -> Any:
        """The wire message ``hacrl_fed.v1.EpisodeSpec`` (config as canonical JSON)."""
        from hacrl_fed.v1 import rollout_pb2

        return rollout_pb2.EpisodeSpec(env_id=self.env_id, config_json=self.config_json, seed=self.seed,
                                       max_turns=self.max_turns)

    @classmethod
    def from_proto(cls, pb: Any) -> EpisodeSpec:
        """The spec of a wire ``hacrl_fed.v1.EpisodeSpec``. Raises :class:`ValueError` for a bound out of range
        or a ``config_json`` that is not a canonical JSON object of at most :data:`MAX_CONFIG_BYTES` bytes
        (``"{}"`` for an empty configuration; the empty string is refused)."""
        return cls(env_id=check_env_id(pb.env_id), config=_parse_config_json(pb.config_json),
                   seed=_check_int(pb.seed, "seed", 0, MAX_SEED),
                   max_turns=_check_int(pb.max_turns, "max_turns", 1, MAX_TURNS))


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to one agent message.

    Attributes:
        observation: what the agent reads next (at most :data:`MAX_OBSERVATION_CHARS` characters after
            :func:`bound_observation`); when ``done``, the environment's closing message.
        done: the episode is over.
        reward: the episode's reward, meaningful when ``done``; the episode rule clips it to [0, 1].
    """

    observation: str
    done: bool
    reward: float = 0.0


@runtime_checkable
class Environment(Protocol):
    """A multi-turn environment made by :func:`hacrl_fed.envs.make_env`.

    ``reset()`` returns the first observation (the task statement); ``step(message)`` takes one agent message
    and returns an :class:`EnvStep`. Both are deterministic given the spec and the messages so far.
    """

    def reset(self) -> str: ...

    def step(self, message: str) -> EnvStep: ...


def bound_observation(text: str) -> str:
    """``text`` when at most :data:`MAX_OBSERVATION_CHARS` characters, else its head with a cut mark, exactly
    :data:`MAX_OBSERVATION_CHARS` characters long. Idempotent.

    >>> len(bound_observation("x" * 10_000)) == MAX_OBSERVATION_CHARS
    True
    """
    if len(text) <= MAX_OBSERVATION_CHARS:
        return text
    return text[: MAX_OBSERVATION_CHARS - len(_CUT_MARK)] + _CUT_MARK
