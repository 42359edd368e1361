"""What every environment made by the registry is wrapped in: a private random stream and checked, bounded
results.

Third-party games (TextArena's among them) draw from the global :mod:`random` module and even re-seed it. So
that an episode depends only on its spec and the agent's messages, and never on what else the process did with
:mod:`random` (or changes it), :class:`IsolatedEnv` gives each environment instance its own state of the global
generator, seeded from the spec: around every ``reset`` / ``step`` call the process's state is saved, the
instance's state is put in, and afterwards the instance's state is kept and the process's restored. Calls are
serialized by one process-wide lock, so two environments in two threads never see each other's draws; code
outside the environments that uses :mod:`random` from another thread at the same moment is not covered.
numpy's global generator is not isolated (no curated environment uses it).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hacrl_fed.envs.base import Environment, EnvStep, bound_observation

__all__ = ["IsolatedEnv"]

_LOCK = threading.RLock()
T = TypeVar("T")


class IsolatedEnv:
    """An :class:`~hacrl_fed.envs.base.Environment` around ``env`` whose global-``random`` draws come from a
    private stream seeded with ``seed`` (an int), whose observations are cut by
    :func:`~hacrl_fed.envs.base.bound_observation` and whose results are type-checked.

    Raises :class:`TypeError` when the wrapped environment returns something else than a string (``reset``) or
    an :class:`~hacrl_fed.envs.base.EnvStep` with a string observation (``step``), or when ``message`` is not a
    string.
    """

    def __init__(self, env: Environment, seed: int) -> None:
        self._env = env
        self._state = random.Random(seed).getstate()

    @property
    def inner(self) -> Environment:
        """The wrapped environment."""
        return self._env

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        with _LOCK:
            saved = random.getstate()
            random.setstate(self._state)
            try:
                return fn(*args)
            finally:
                self._state = random.getstate()
                random.setstate(saved)

    def reset(self) -> str:
        """The first observation (bounded)."""
        obs = self._call(self._env.reset)
        if not isinstance(obs, str):
            raise TypeError(f"{type(self._env).__name__}.reset() returned {type(obs).__name__}, not str")
        return bound_observation(obs)

    def step(self, message: str) -> EnvStep:
        """The environment's answer to ``message``: observation bounded, ``done`` a bool, ``reward`` a finite
        float (a non-finite reward becomes 0.0)."""
        if not isinstance(message, str):
            raise TypeError(f"an agent message must be a string, not {type(message).__name__}")
        out = self._call(self._env.step, message)
        if not isinstance(out, EnvStep) or not isinstance(out.observation, str):
            raise TypeError(f"{type(self._env).__name__}.step() returned {out!r:.200}, not an EnvStep")
        reward = float(out.reward)
        return EnvStep(bound_observation(out.observation), bool(out.done), reward if math.isfinite(reward) else 0.0)
