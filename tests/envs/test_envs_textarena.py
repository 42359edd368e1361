"""The TextArena adapter: games solved by scripted agents, TextArena's invalid-move rule, reward mapping,
plain-text observations, offline play and determinism."""

from __future__ import annotations

import random
import re
import socket

import pytest

from hacrl_fed.envs import Episode, EpisodeSpec, check_trajectory, make_env, replay
from hacrl_fed.envs.textarena_env import MAX_ACTION_CHARS

GUESS = "textarena/GuessTheNumber-v0"
INVALID_NOTICE = "You attempted an invalid move. Reason: "


def _solve_guess(spec: EpisodeSpec) -> Episode:
    episode = Episode(spec)
    lo, hi = spec.config.get("min_number", 1), spec.config.get("max_number", 20)
    while not episode.over:
        guess = (lo + hi) // 2
        obs = episode.step(f"[{guess}]").observation
        assert obs in ("The target number is higher.", "The target number is lower.") or obs.startswith("Game over.")
        lo, hi = (guess + 1, hi) if "higher" in obs else (lo, guess - 1)
    return episode


@pytest.mark.parametrize("seed", [0, 1, 2, 17, 2**63 - 1])
def test_binary_search_wins_guess_the_number(seed):
    episode = _solve_guess(EpisodeSpec(GUESS, {}, seed, 8))
    assert episode.done and episode.reward == 1.0 and episode.agent_turns <= 5
    assert episode.observations[-1] == "Game over. Congratulations! You guessed the correct number."


def test_a_larger_range_is_solved_within_log2_turns():
    spec = EpisodeSpec(GUESS, {"min_number": 0, "max_number": 1000}, 5, 10)
    episode = _solve_guess(spec)
    assert episode.reward == 1.0 and episode.agent_turns <= 10
    assert "between 0 and 1000 within 10 turns" in episode.observations[0]


def test_the_first_observation_is_the_prompt_in_plain_text():
    first = make_env(EpisodeSpec(GUESS, {}, 0, 8)).reset()
    assert first.startswith("You are Player 0. You are playing Guess The Number.")
    assert "[5]" in first and "\x1b" not in first


def test_a_repeated_guess_is_a_notice_then_a_second_invalid_move_ends_the_game():
    """TextArena's rule: one invalid move is answered and may be resubmitted; two in a row end the game."""
    spec = EpisodeSpec(GUESS, {}, 0, 8)
    messages = ["[1]", "[1]", "[1]"]  # seed 0's number is above 1
    result = replay(spec, messages)
    assert result.observations[1] == "The target number is higher."
    assert result.observations[2] == (f"{INVALID_NOTICE}Invalid move. Player 0 has already guessed the number. "
                                      "Please resubmit a valid move and remember to follow the game rules to avoid "
                                      "penalties.")
    assert result.done and result.reward == 0.0
    assert result.observations[3] == ("Game over. Invalid Move: Invalid move. Player 0 has already guessed the "
                                      "number.")
    # a valid move in between resets the allowance
    assert not replay(spec, ["[1]", "[1]", "[2]", "[2]"]).done


@pytest.mark.parametrize("allowance", [0, 3])
def test_error_allowance_sets_how_many_invalid_moves_in_a_row_are_answered(allowance):
    spec = EpisodeSpec(GUESS, {"error_allowance": allowance}, 0, 8)
    result = replay(spec, ["no guess"] * (allowance + 1))
    assert all(o.startswith(INVALID_NOTICE) for o in result.observations[1:-1])
    assert result.done and result.reward == 0.0 and result.observations[-1].startswith("Game over. Invalid Move")


def test_an_unparseable_message_is_an_invalid_move():
    result = replay(EpisodeSpec(GUESS, {}, 0, 8), ["I think it is 7", "seven"])
    assert result.observations[1].startswith(INVALID_NOTICE + "Invalid move format.")
    assert result.done and result.reward == 0.0


def test_partial_reward_is_textarenas_completion_share():
    spec = EpisodeSpec(GUESS, {"reward": "partial"}, 0, 8)
    number = _target(spec)
    guess = 1 if number > 10 else 20
    result = replay(spec, [f"[{guess}]", f"[{guess}]", f"[{guess}]"])
    assert result.done and result.reward == pytest.approx(1 - abs(guess - number) / 19)
    assert replay(EpisodeSpec(GUESS, {}, 0, 8), [f"[{guess}]"] * 3).reward == 0.0


def _target(spec: EpisodeSpec) -> int:
    """The secret number, found by trying every guess in a fresh episode (no peeking into the game)."""
    for n in range(1, 21):
        if replay(spec, [f"[{n}]"]).done:
            return n
    raise AssertionError("no number wins")


@pytest.mark.parametrize("mode", ["win", "partial"])
def test_the_game_ends_at_the_last_turn_with_its_completion_share(mode):
    """At the spec's max_turns-th message the game ends (done) with its state's reward: the completion share
    with partial rewards (closeness of the last guess), 0 with win rewards; its prompt states the limit."""
    spec = EpisodeSpec(GUESS, {"reward": mode}, 0, 2)
    assert "within 2 turns" in replay(spec, []).observations[0]
    number = _target(spec)
    wrong = [n for n in (10, 11, 12) if n != number][:2]
    result = replay(spec, [f"[{n}]" for n in wrong])
    assert result.done and result.agent_turns == 2
    assert result.reward == (pytest.approx(1 - abs(wrong[-1] - number) / 19) if mode == "partial" else 0.0)
    hint = "higher" if number > wrong[-1] else "lower"
    assert result.observations[-1] == f"The target number is {hint}.\nGame over. No turns left (2 used)."
    # invalid messages count as turns too, and a game never played well earns nothing
    nothing = replay(spec, ["no", "[0]"])
    assert nothing.done and nothing.reward == 0.0


def test_tower_of_hanoi_solved_in_one_message_or_seven():
    moves = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]
    one = replay(EpisodeSpec("test/textarena/TowerOfHanoi-v0", {}, 0, 1), [" ".join(moves)])
    seven = replay(EpisodeSpec("test/textarena/TowerOfHanoi-v0", {}, 0, 7), moves)
    assert one.done and one.reward == 1.0 and seven.done and seven.reward == 1.0
    assert "C: [3, 2, 1]" in seven.observations[-1]


def test_mastermind_and_frozen_lake_answer_in_plain_text():
    mm = replay(EpisodeSpec("textarena/Mastermind-v0", {}, 3, 4), ["[1 2 3 4]"])
    assert re.fullmatch(r"Submitted \[1 2 3 4\]\. Feedback: \d black peg\(s\), \d white peg\(s\)\.",
                        mm.observations[1]) or mm.done
    fl = Episode(EpisodeSpec("test/textarena/FrozenLake-v0", {}, 3, 4))
    assert "Current Board:" in fl.observations[0] and " P " in fl.observations[0]
    step = fl.step("[right]")
    assert "You moved right to position (0, 1)." in step.observation or "wall" in step.observation


def test_every_curated_game_plays_offline_deterministically(monkeypatch):
    """No network (any connection attempt raises), the same seed and messages give the same observations."""
    def refuse(*args, **kwargs):
        raise AssertionError("network access")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    actions = {"textarena/GuessTheNumber-v0": lambda r: f"[{r.randint(1, 20)}]",
               "textarena/Mastermind-v0": lambda r: "[" + " ".join(map(str, r.sample(range(1, 7), 4))) + "]",
               "test/textarena/TowerOfHanoi-v0": lambda r: "[" + " ".join(r.sample("ABC", 2)) + "]",
               "test/textarena/FrozenLake-v0": lambda r: r.choice(["[up]", "[down]", "[left]", "[right]"]),
               "test/textarena/Minesweeper-v0-small": lambda r: f"[{r.randint(0, 4)} {r.randint(0, 4)}]"}
    for env_id, act in actions.items():
        seen = set()
        for seed in range(6):
            rng = random.Random(1000 + seed)  # not the game's own seed: it would guess the number
            messages = [act(rng) for _ in range(10)]
            runs = []
            for _ in range(2):
                episode = Episode(EpisodeSpec(env_id, {}, seed, 10))
                for m in messages:
                    if episode.over:
                        break
                    episode.step(m)
                runs.append((episode.observations, episode.reward))
                random.seed(seed + 100)  # the process's random state must not matter
            assert runs[0] == runs[1], env_id
            assert all("\x1b" not in o and len(o) <= 4096 for o in runs[0][0])
            turns = [("env", runs[0][0][0])]
            for m, o in zip(messages, runs[0][0][1:], strict=False):
                turns += [("agent", m), ("env", o)]
            check = check_trajectory(EpisodeSpec(env_id, {}, seed, 10), turns)
            assert check.ok, (env_id, check.reason)
            seen.add(tuple(runs[0][0][:3]))
        if env_id != "test/textarena/TowerOfHanoi-v0":  # Hanoi has no randomness
            assert len(seen) > 1, f"{env_id}: every seed played the same"


def test_an_overlong_message_is_cut_before_the_game_reads_it():
    spec = EpisodeSpec(GUESS, {}, 0, 4)
    huge = "[" + "9" * 5000 + "]"  # int() refuses more than 4300 digits
    result = replay(spec, [huge])
    assert result.observations[1].startswith(INVALID_NOTICE + "Invalid move format.")
    assert len(huge[:MAX_ACTION_CHARS]) == MAX_ACTION_CHARS
