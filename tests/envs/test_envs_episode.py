"""The episode rule, replays (deterministic, also across processes) and the check of trajectories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hacrl_fed.envs import Episode, EpisodeSpec, check_trajectory, replay, turns_from_proto
from hacrl_fed.v1 import rollout_pb2

GUESS = "textarena/GuessTheNumber-v0"
REPO = Path(__file__).resolve().parents[2]


def binary_search(spec: EpisodeSpec) -> list[str]:
    """A scripted agent's messages for GuessTheNumber (1..20) until the episode ends."""
    episode, lo, hi, messages = Episode(spec), 1, 20, []
    while not episode.over:
        guess = (lo + hi) // 2
        messages.append(f"My guess: [{guess}]")
        obs = episode.step(messages[-1]).observation
        lo, hi = (guess + 1, hi) if "higher" in obs else (lo, guess - 1)
    return messages


def trajectory(observations: list[str], messages: list[str], final: bool = True) -> list[tuple[str, str]]:
    turns = [("env", observations[0])]
    for i, m in enumerate(messages):
        turns.append(("agent", m))
        if final or i + 1 < len(messages):
            turns.append(("env", observations[i + 1]))
    return turns


def test_replay_follows_the_rule_and_is_deterministic():
    spec = EpisodeSpec(GUESS, {}, 3, 8)
    messages = binary_search(spec)
    first, second = replay(spec, messages), replay(spec, messages)
    assert first == second
    assert first.done and first.reward == 1.0 and first.agent_turns == len(messages) <= 5
    assert len(first.observations) == len(messages) + 1
    assert first.observations[-1].startswith("Game over. Congratulations")


def test_an_episode_without_done_ends_at_max_turns_with_reward_zero():
    spec = EpisodeSpec("calculator", {"task": "basic_arithmetic"}, 3, 2)
    messages = ["hmm", "<calc>1+1</calc>"]  # the calculator says done only at a boxed answer
    result = replay(spec, messages)
    assert not result.done and result.reward == 0.0 and result.agent_turns == 2
    with pytest.raises(ValueError, match="agent message 2 comes after the episode ended.*max_turns = 2"):
        replay(spec, [*messages, "\\boxed{1}"])
    check = check_trajectory(spec, trajectory(result.observations, messages))
    assert check.ok and check.reward == 0.0
    won = binary_search(EpisodeSpec(GUESS, {}, 3, 8))
    with pytest.raises(ValueError, match="after the episode ended.*said done"):
        replay(EpisodeSpec(GUESS, {}, 3, 8), [*won, "[1]"])


def _until_the_end(spec: EpisodeSpec, messages: list[str]) -> list[str]:
    episode = Episode(spec)
    for i, m in enumerate(messages):
        if episode.over:
            return messages[:i]
        episode.step(m)
    return messages


def test_replays_agree_across_processes():
    """Same spec and messages in a fresh interpreter (another hash seed, random seeded differently)."""
    cases = [(EpisodeSpec(GUESS, {}, 11, 6), ["[10]", "[5]", "oops", "[15]", "[12]"]),
             (EpisodeSpec("test/textarena/Minesweeper-v0-small", {}, 5, 4), ["[2 2]", "[0 0]", "[4 4]", "[0 4]"]),
             (EpisodeSpec("textarena/Mastermind-v0", {}, 9, 3), ["[1 2 3 4]", "[4 3 2 1]", "[5 6 1 2]"]),
             (EpisodeSpec("calculator", {"task": "basic_arithmetic"}, 4, 3), ["<calc>1/3</calc>", "\\boxed{7}"])]
    cases = [(s, _until_the_end(s, m)) for s, m in cases]
    here = [replay(s, m) for s, m in cases]
    code = (
        "import json, random, sys\nrandom.seed(99)\n"
        "from hacrl_fed.envs import EpisodeSpec, register, replay, textarena_env\n"
        "register('test/textarena/Minesweeper-v0-small', textarena_env.factory('Minesweeper-v0-small'))\n"
        "out = []\n"
        "for s, m in json.loads(sys.stdin.read()):\n"
        "    r = replay(EpisodeSpec(**s), m)\n"
        "    out.append([r.observations, r.done, r.reward, r.agent_turns])\n"
        "print(json.dumps(out))\n"
    )
    payload = json.dumps([[{"env_id": s.env_id, "config": s.config_dict(), "seed": s.seed, "max_turns": s.max_turns},
                           m] for s, m in cases])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", code], input=payload, capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    there = json.loads(done.stdout.strip().splitlines()[-1])
    assert there == [[r.observations, r.done, r.reward, r.agent_turns] for r in here]


def test_an_honest_trajectory_is_accepted_with_and_without_the_final_observation():
    spec = EpisodeSpec(GUESS, {}, 3, 8)
    messages = binary_search(spec)
    obs = replay(spec, messages).observations
    for final in (True, False):
        check = check_trajectory(spec, trajectory(obs, messages, final))
        assert check.ok and check.reward == 1.0 and check.reason == "ok"


def test_a_forged_observation_is_refused_naming_its_turn():
    spec = EpisodeSpec(GUESS, {}, 3, 8)
    messages = binary_search(spec)
    turns = trajectory(replay(spec, messages).observations, messages)
    forged = list(turns)
    forged[2] = ("env", forged[2][1].replace("higher", "lower").replace("lower.", "higher."))
    check = check_trajectory(spec, forged)
    assert not check.ok and check.reward == 0.0
    assert check.reason.startswith("turn 2: env observation differs from the replay's at character")
    first = list(turns)
    first[0] = ("env", first[0][1] + " ")
    assert check_trajectory(spec, first).reason.startswith("turn 0: env observation differs")


def test_a_forged_ending_is_refused():
    spec = EpisodeSpec(GUESS, {}, 3, 8)
    messages = binary_search(spec)
    obs = replay(spec, messages).observations
    # claiming the game was won one guess early: the replay's answer to that guess is not the closing one
    early = trajectory(obs, messages)[:-3] + [("env", obs[-1])]
    check = check_trajectory(spec, early)
    assert not check.ok and check.reason.startswith(f"turn {len(early) - 1}: env observation differs")
    # stopping before the end (a site out of its token budget): accepted as a forfeit, reward 0 — never the win
    stopped = trajectory(obs, messages)[:-2]
    check = check_trajectory(spec, stopped)
    assert check.ok and check.reward == 0.0 and "not done" in check.reason
    assert check_trajectory(spec, trajectory(obs, messages)).reward == 1.0
    # an agent turn after done
    extra = trajectory(obs, messages) + [("agent", "[1]")]
    check = check_trajectory(spec, extra)
    assert not check.ok and check.reason.startswith(f"turn {len(extra) - 1}: agent turn after the episode ended")
    # more agent turns than max_turns
    short = EpisodeSpec(GUESS, {}, 3, 1)
    obs1 = replay(short, ["[1]"]).observations
    check = check_trajectory(short, trajectory(obs1, ["[1]"]) + [("agent", "[2]")])
    assert not check.ok and "turn 3" in check.reason


def test_wrong_roles_are_refused_naming_the_turn():
    spec = EpisodeSpec(GUESS, {}, 3, 8)
    messages = binary_search(spec)
    turns = trajectory(replay(spec, messages).observations, messages)
    assert check_trajectory(spec, [("agent", "[5]")] + turns).reason.startswith("turn 0: role 'agent'")
    swapped = list(turns)
    swapped[1], swapped[2] = swapped[2], swapped[1]
    assert check_trajectory(spec, swapped).reason.startswith("turn 1: role 'env', expected 'agent'")
    assert check_trajectory(spec, turns[:1] + [("tool", "x")]).reason.startswith("turn 1: role 'tool'")
    assert check_trajectory(spec, [turns[0], ("agent",)]).reason.startswith("turn 1: not a (role, text) pair")
    assert check_trajectory(spec, []).reason.startswith("turn 0: missing")


def test_a_trajectory_longer_than_any_episode_is_refused_before_replaying():
    spec = EpisodeSpec(GUESS, {}, 3, 2)
    turns = [("env", "x"), ("agent", "y")] * 10_000
    check = check_trajectory(spec, turns)
    assert not check.ok and check.reason.startswith("turn 5: beyond the longest episode")


def test_a_spec_the_registry_refuses_is_a_reason_not_an_exception():
    check = check_trajectory(EpisodeSpec("nope", {}, 0, 1), [("env", "x"), ("agent", "y")])
    assert not check.ok and check.reason.startswith("spec: ValueError: unknown environment 'nope'")


def test_turns_from_proto_maps_the_roles():
    turns = [rollout_pb2.Turn(role=rollout_pb2.ENV, text="a"), rollout_pb2.Turn(role=rollout_pb2.AGENT, text="b"),
             rollout_pb2.Turn(text="c")]
    assert turns_from_proto(turns) == [("env", "a"), ("agent", "b"), ("unspecified", "c")]
