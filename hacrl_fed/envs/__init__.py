"""Multi-turn environments (docs/multi-turn.md "Environments"): the instance of an episode (:class:`EpisodeSpec`),
the registry (:func:`make_env`, :func:`register`, :func:`env_ids`), the episode rule with replays and the check
of a trajectory (:class:`Episode`, :func:`replay`, :func:`check_trajectory`).

Built-in environments: single-player TextArena games (``textarena/GuessTheNumber-v0`` …,
:mod:`hacrl_fed.envs.textarena_env`) and a calculator tool-use task (``calculator``,
:mod:`hacrl_fed.envs.calculator`).
"""

from hacrl_fed.envs.base import (
    MAX_CONFIG_BYTES,
    MAX_OBSERVATION_CHARS,
    MAX_SEED,
    MAX_TURNS,
    Environment,
    EnvStep,
    EpisodeSpec,
    bound_observation,
)
from hacrl_fed.envs.episode import Episode, Replay, TrajectoryCheck, check_trajectory, replay, turns_from_proto
from hacrl_fed.envs.registry import env_ids, make_env, register

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_OBSERVATION_CHARS",
    "MAX_SEED",
    "MAX_TURNS",
    "EnvStep",
    "Environment",
    "Episode",
    "EpisodeSpec",
    "Replay",
    "TrajectoryCheck",
    "bound_observation",
    "check_trajectory",
    "env_ids",
    "make_env",
    "register",
    "replay",
    "turns_from_proto",
]
