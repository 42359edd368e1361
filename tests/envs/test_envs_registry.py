"""The registry: built-in ids, errors that name the valid ids or the problem, registration, isolation."""

from __future__ import annotations

import random

import pytest

from hacrl_fed.envs import EnvStep, EpisodeSpec, env_ids, make_env, register, textarena_env

CURATED = ["textarena/GuessTheNumber-v0", "textarena/Mastermind-v0"]
MORE = ["textarena/TowerOfHanoi-v0", "textarena/FrozenLake-v0", "textarena/Minesweeper-v0-small"]


class _Dice:
    """An environment that draws from the global random module (as third-party games do)."""

    def __init__(self, spec: EpisodeSpec) -> None:
        self.sides = spec.config.get("sides", 6)
        if not isinstance(self.sides, int) or self.sides < 2:
            raise ValueError("sides must be an integer ≥ 2")

    def reset(self) -> str:
        return f"first roll {random.randint(1, self.sides)}"

    def step(self, message: str) -> EnvStep:
        return EnvStep(f"roll {random.randint(1, self.sides)} " + "x" * len(message), False, 0.0)


if "test/dice" not in env_ids():
    register("test/dice", _Dice)


def test_the_built_in_environments_are_registered():
    assert set(CURATED) | {"calculator"} <= set(env_ids())
    assert not set(MORE) & set(env_ids())  # beyond a 135M-parameter model: registered only on purpose
    assert list(env_ids()) == sorted(env_ids())


def test_an_unknown_id_names_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown environment 'textarena/Chess-v0'; registered: .*calculator.*"
                                         r"textarena/GuessTheNumber-v0"):
        make_env(EpisodeSpec("textarena/Chess-v0", {}, 0, 4))


@pytest.mark.parametrize(("env_id", "config", "message"), [
    ("textarena/GuessTheNumber-v0", {"max_number": 1001}, r"'max_number' must be in 1\.\.1000"),
    ("textarena/GuessTheNumber-v0", {"max_number": "20"}, "'max_number' must be an integer"),
    ("textarena/GuessTheNumber-v0", {"max_number": True}, "'max_number' must be an integer"),
    ("textarena/GuessTheNumber-v0", {"min_number": 30, "max_number": 20}, "must be below"),
    ("textarena/GuessTheNumber-v0", {"max_turns": 5},
     "unknown config key.*'max_turns'.*accepted: error_allowance, max_number, min_number, reward"),
    ("textarena/GuessTheNumber-v0", {"reward": "dense"}, "'reward' must be one of 'win', 'partial'"),
    ("textarena/GuessTheNumber-v0", {"error_allowance": 33}, r"'error_allowance' must be in 0\.\.32"),
    ("textarena/Mastermind-v0", {"code_length": 7, "num_numbers": 6}, "exceeds 'num_numbers'"),
    ("test/textarena/Minesweeper-v0-small", {"rows": 3, "cols": 3, "num_mines": 1}, r"'num_mines' must be in 1\.\.0"),
    ("test/textarena/TowerOfHanoi-v0", {"num_disks": 7}, r"'num_disks' must be in 1\.\.6"),
    ("calculator", {}, "'task' is required"),
    ("calculator", {"task": "no_such_task"}, "no generator 'no_such_task'"),
    ("calculator", {"task": "basic_arithmetic", "task_config": {"min_terms": 0}}, "bad task_config"),
    ("calculator", {"task": "basic_arithmetic", "task_config": []}, "'task_config' must be a JSON object"),
    ("test/textarena/FrozenLake-v0", {"size": 4, "num_holes": 6}, r"'num_holes' must be in 0\.\.5"),
    ("test/dice", {"sides": 1}, "sides must be an integer"),
])
def test_a_bad_config_names_the_environment_and_the_problem(env_id, config, message):
    with pytest.raises(ValueError, match=message) as err:
        make_env(EpisodeSpec(env_id, config, 0, 4))
    assert str(err.value).startswith(f"environment {env_id!r}: ")


def test_register_refuses_duplicates_bad_ids_and_non_callables():
    with pytest.raises(ValueError, match="already registered"):
        register("calculator", _Dice)
    with pytest.raises(ValueError, match="printable ASCII"):
        register("bad id", _Dice)
    with pytest.raises(TypeError, match="callable"):
        register("test/not-callable", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown TextArena game 'Chess-v0'; curated: GuessTheNumber-v0"):
        textarena_env.factory("Chess-v0")
    with pytest.raises(TypeError, match="EpisodeSpec"):
        make_env({"env_id": "calculator"})  # type: ignore[arg-type]


def test_an_environment_draws_from_its_own_stream_and_leaves_the_global_one_alone():
    spec = EpisodeSpec("test/dice", {"sides": 1000}, 42, 4)

    def play(disturb: bool) -> list[str]:
        env = make_env(spec)
        out = [env.reset()]
        for i in range(3):
            if disturb:
                random.seed(i)  # the caller's use of random does not reach the environment
                random.random()
            out.append(env.step("m").observation)
        return out

    random.seed(123)
    before = random.getstate()
    first = play(disturb=False)
    assert random.getstate() == before  # the process's stream is as it was
    assert play(disturb=True) == first
    assert play(disturb=False) != [o for o in play_with_seed(43)]


def play_with_seed(seed: int) -> list[str]:
    env = make_env(EpisodeSpec("test/dice", {"sides": 1000}, seed, 4))
    return [env.reset()] + [env.step("m").observation for _ in range(3)]


def test_observations_are_bounded_by_the_wrapper():
    env = make_env(EpisodeSpec("test/dice", {}, 0, 4))
    env.reset()
    obs = env.step("y" * 10_000).observation
    assert len(obs) == 4096 and obs.endswith("[… cut]")
    with pytest.raises(TypeError, match="must be a string"):
        env.step(b"bytes")  # type: ignore[arg-type]
