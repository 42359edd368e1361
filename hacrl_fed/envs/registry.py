"""The environment registry: id → factory, and :func:`make_env`.

Built in: the curated TextArena games (``textarena/…``, :mod:`hacrl_fed.envs.textarena_env`) and the calculator
tool-use task (``calculator``, :mod:`hacrl_fed.envs.calculator`). :func:`register` adds more; every site and the
coordinator must register the same factories under the same ids, or their replays differ.
"""

from __future__ import annotations

from collections.abc import Callable

from hacrl_fed.envs import calculator, textarena_env
from hacrl_fed.envs.base import Environment, EpisodeSpec, check_env_id
from hacrl_fed.envs.isolation import IsolatedEnv

__all__ = ["Factory", "env_ids", "make_env", "register"]

Factory = Callable[[EpisodeSpec], Environment]
"""Makes the environment of a spec; raises :class:`ValueError` for a configuration it does not accept."""

_FACTORIES: dict[str, Factory] = {}


def register(env_id: str, factory: Factory) -> None:
    """Register ``factory`` under ``env_id`` (1..128 printable ASCII characters, no whitespace).

    Raises :class:`ValueError` for a malformed or already registered id, :class:`TypeError` for a factory that
    is not callable.
    """
    check_env_id(env_id)
    if not callable(factory):
        raise TypeError(f"the factory of {env_id!r} must be callable, got {type(factory).__name__}")
    if env_id in _FACTORIES:
        raise ValueError(f"environment {env_id!r} is already registered")
    _FACTORIES[env_id] = factory


def env_ids() -> tuple[str, ...]:
    """Every registered id, sorted."""
    return tuple(sorted(_FACTORIES))


def make_env(spec: EpisodeSpec) -> Environment:
    """A fresh environment for ``spec`` (call its ``reset()`` first), wrapped in
    :class:`~hacrl_fed.envs.isolation.IsolatedEnv`: private random stream seeded with ``spec.seed``, bounded
    observations.

    Raises :class:`ValueError` for an unknown id (the message lists the registered ones) or a configuration the
    environment refuses (the message names the id and the problem); :class:`TypeError` when ``spec`` is not an
    :class:`~hacrl_fed.envs.base.EpisodeSpec`.
    """
    if not isinstance(spec, EpisodeSpec):
        raise TypeError(f"make_env needs an EpisodeSpec, not {type(spec).__name__}")
    factory = _FACTORIES.get(spec.env_id)
    if factory is None:
        raise ValueError(f"unknown environment {spec.env_id!r}; registered: {', '.join(env_ids())}")
    try:
        env = factory(spec)
    except ValueError as err:
        raise ValueError(f"environment {spec.env_id!r}: {err}") from None
    return IsolatedEnv(env, spec.seed)


for _id, _factory in textarena_env.factories().items():
    register(_id, _factory)
register(calculator.ENV_ID, calculator.make_calculator)
