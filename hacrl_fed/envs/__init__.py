"""Multi-turn environments (docs/multi-turn.md "Environments"): the instance of an episode (:class:`EpisodeSpec`)
and the interface every environment implements."""

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

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_OBSERVATION_CHARS",
    "MAX_SEED",
    "MAX_TURNS",
    "EnvStep",
    "Environment",
    "EpisodeSpec",
    "bound_observation",
]
