"""Episodes of multi-turn environments as a data source (``data.source = "episodes"``, docs/multi-turn.md).

``data.envs`` names environments of the registry (:mod:`hacrl_fed.envs`), each with its configuration, a weight
and a label (the task every episode carries: capability per task, reports); ``data.eval_envs`` are held-out
environments, evaluated and never trained. One problem is one environment instance (:class:`EpisodeSpec`):
the environment, its configuration, a seed and ``data.max_turns``.

Seeds follow the procedural task suite (:mod:`hacrl_fed.data.tasks`): held-out instances of every environment
use seeds ``[0, eval_size)`` for every run seed; training instances ``[TRAIN_SEED_BASE + data.seed ·
TRAIN_SEED_STRIDE, … + n)``. The ranges are disjoint by construction (checked). Every environment is made and
reset once here, so a bad id or configuration fails at start-up with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hacrl_fed.data.problem import DataError, Problem
from hacrl_fed.data.tasks import MAX_EVAL_ITEMS, TRAIN_SEED_BASE, TRAIN_SEED_STRIDE, task_counts

if TYPE_CHECKING:
    from hacrl_fed.config import DataConfig, EnvTaskSpec

__all__ = ["episode_problems", "load_episode_problems"]


def _check_env(spec: EnvTaskSpec, max_turns: int) -> None:
    """Make and reset the environment once (seed 0). Raises :class:`DataError` naming the environment."""
    from hacrl_fed.envs import EpisodeSpec, make_env

    try:
        make_env(EpisodeSpec(env_id=spec.name, config=dict(spec.config), seed=0, max_turns=max_turns)).reset()
    except (ValueError, TypeError, KeyError) as err:
        raise DataError(f"environment {spec.label!r} ({spec.name}): {' '.join(str(err).split())[:300]}") from None


def episode_problems(spec: EnvTaskSpec, seeds: Sequence[int], max_turns: int) -> list[Problem]:
    """One episode problem per seed of environment ``spec``: id ``<label>-<seed>``, no text or answer, style
    ``episode``, source the label, ``episode`` the instance."""
    from hacrl_fed.envs import EpisodeSpec

    return [Problem(f"{spec.label}-{s}", "", "", "episode", spec.label,
                    EpisodeSpec(env_id=spec.name, config=dict(spec.config), seed=int(s), max_turns=max_turns))
            for s in seeds]


def load_episode_problems(cfg: DataConfig) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)`` of an ``episodes`` source (module docstring). Raises :class:`DataError`."""
    if cfg.eval_size > MAX_EVAL_ITEMS:
        raise DataError(f"data.eval_size {cfg.eval_size} is above {MAX_EVAL_ITEMS} episodes per environment")
    for spec in [*cfg.envs, *cfg.eval_envs]:
        _check_env(spec, cfg.max_turns)
    first = TRAIN_SEED_BASE + cfg.seed * TRAIN_SEED_STRIDE
    train: list[Problem] = []
    for spec, n in zip(cfg.envs, task_counts(cfg.envs, cfg.num_problems), strict=True):
        train += episode_problems(spec, range(first, first + n), cfg.max_turns)
    held: list[Problem] = []
    for spec in [*cfg.envs, *cfg.eval_envs]:
        held += episode_problems(spec, range(cfg.eval_size), cfg.max_turns)
    ids = [p.id for p in train + held]
    if len(set(ids)) != len(ids):   # seed ranges overlap: a bug, not a data problem
        raise DataError("training and held-out episodes share a seed")
    return train, held
