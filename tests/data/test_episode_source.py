"""``data.source = "episodes"`` (docs/multi-turn.md): environment instances as problems, held-out and training seeds
disjoint, every environment checked at start-up, and the configuration refused when it does not fit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hacrl_fed.config import DataConfig
from hacrl_fed.data.datasets import load_problems
from hacrl_fed.data.problem import DataError
from hacrl_fed.data.tasks import TRAIN_SEED_BASE

GUESS = {"name": "textarena/GuessTheNumber-v0", "label": "guess"}
CALC = {"name": "calculator", "config": {"task": "products", "task_config": {"min_digits": 2, "max_digits": 2}}}


def test_episodes_are_instances_with_disjoint_seeds():
    cfg = DataConfig(source="episodes", num_problems=10, eval_size=3, max_turns=4, envs=[GUESS, CALC],
                     eval_envs=[{**GUESS, "label": "guess-held", "config": {"max_number": 50}}], seed=2)
    train, held = load_problems(cfg)
    assert len(train) == 10 and len(held) == 3 * 3
    assert {p.source for p in train} == {"guess", "calculator"} and "guess-held" in {p.source for p in held}
    for p in train + held:
        assert p.episode is not None and p.answer_style == "episode" and not p.problem and not p.answer
        assert p.episode.max_turns == 4 and p.id == f"{p.source}-{p.episode.seed}"
    assert all(p.episode.seed >= TRAIN_SEED_BASE for p in train) and all(p.episode.seed < 3 for p in held)


def test_a_bad_environment_fails_at_start_up_naming_it():
    cfg = DataConfig(source="episodes", envs=[{"name": "textarena/NoSuchGame-v0", "label": "nope"}])
    with pytest.raises(DataError, match="nope"):
        load_problems(cfg)
    cfg = DataConfig(source="episodes", envs=[{"name": "calculator", "config": {"task": "no_such_task"}}])
    with pytest.raises(DataError, match="no_such_task"):
        load_problems(cfg)


@pytest.mark.parametrize(("kw", "message"), [
    ({"source": "episodes"}, "needs at least one environment"),
    ({"source": "episodes", "envs": [GUESS, GUESS]}, "labels must be unique"),
    ({"source": "reasoning_gym", "tasks": [{"name": "chain_sum"}], "envs": [GUESS]}, "apply to data.source = 'episodes'"),
    ({"source": "episodes", "envs": [GUESS], "max_turns": 33}, "max_turns"),
])
def test_a_configuration_that_does_not_fit_is_refused(kw, message):
    with pytest.raises(ValidationError, match=message):
        DataConfig(**kw)
