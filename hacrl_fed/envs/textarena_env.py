"""Single-player TextArena games (``textarena==0.7.4``) as environments: ids ``textarena/<TextArena id>``.

Registered (:data:`GAMES`): the games that run offline, are deterministic given the seed and the agent's
messages, and on which a 135M-parameter instruct model (SmolLM2-135M-Instruct) makes some progress — measured,
docs/multi-turn.md "Environments":

* ``textarena/GuessTheNumber-v0`` — guess a number in ``[min_number, max_number]`` (1..20) from higher/lower
  hints, one bracketed number per turn (``[7]``); binary search wins in ⌈log2(range + 1)⌉ guesses. 12.5 % of the
  model's first messages are valid guesses (3 % win at once); random valid guesses win 34 % of 8-turn episodes.
* ``textarena/Mastermind-v0`` — find a code of ``code_length`` (4) distinct digits 1..``num_numbers`` (6) from
  black/white pegs (``[1 2 3 4]``). 6 % of the model's first messages are valid; random valid guesses win 4.5 %
  of 8-turn episodes, and every one earns a ``"partial"`` reward (mean 0.44).

Offline and deterministic as well, but beyond that model (:data:`MORE_GAMES`, not registered; register one with
``register("textarena/<id>", factory("<id>"))``): ``TowerOfHanoi-v0`` (3 disks from A to C, ``[A C]``; several
moves in one message are played in order; 1 of 64 first messages valid, random valid moves never solve it in 8
turns), ``FrozenLake-v0`` (a 4 × 4 grid with 3 holes, ``[down]``; 1 of 64 valid, never solved in 8 random valid
moves), ``Minesweeper-v0-small`` (5 × 5, 5 mines, ``[2 3]``; 0 of 64 valid).

Left out: the word games (Hangman, Wordle, Crosswords …) need NLTK corpora (downloaded on import; offline they
raise ``LookupError``); TwentyQuestions and GuessWho call an online model; Countdown-v0 raises in ``reset`` in
0.7.4. FifteenPuzzle, LightsOut, Sokoban, RushHour, PegJump, Bandit and Blackjack are offline and deterministic
through this adapter too, but random moves in their format win none of 20 episodes of 32 turns; 2048 (6 of 20
at its ultra-easy target) and Secretary (3 of 20, a game of chance) were not tried with the model.

Observations: the first is the game's prompt (and its board, where it shows one); after each message, the
game's feedback to the player (its descriptions, boards and invalid-move notices, never the player's own
message echoed back), and when the game ends its closing reason (``Game over. …``). Plain text: TextArena's
rich renderers (ANSI) are not used, and any escape sequence is removed.

Configuration (a JSON object): the game's constructor arguments listed per game (:data:`GAMES`,
:data:`MORE_GAMES`), checked for type and range (defaults: TextArena's own registration of that id);
``reward``: ``"win"`` (default) or ``"partial"``; ``error_allowance``: 0..32 (default 1, TextArena's). An
invalid move (bad format, out of range, repeated guess; in Minesweeper also revealing a mine) is answered with
TextArena's notice and may be resubmitted ``error_allowance`` times in a row; the next invalid move ends the
game.

Turn limit: the game ends at the spec's ``max_turns``-th agent message, valid or not (``Game over. No turns
left …``, done), not won: reward 0 with ``"win"``, the completion share of the game's state then (at most 0.99)
with ``"partial"``. The game's own limit is set to ``max_turns`` too (its prompt states it) but never reached
first: TextArena counts only valid moves and checks one move late.

Reward: with ``"win"`` 1.0 when the game ends won (TextArena's reward 1) and 0.0 otherwise (lost, out of
turns, ended by invalid moves); with ``"partial"`` TextArena's final reward clipped to [0, 1]: 1 for a win, else
its completion share (``_get_percentage_completion``: closeness of the last guess, pegs, disks in place on C,
distance walked, safe cells cleared) — the same whether the game ended by invalid moves or out of turns, so
ending early never pays more.

Agent messages longer than :data:`MAX_ACTION_CHARS` are cut to that length before the game reads them (the
games parse integers with ``int``, which refuses more than 4300 digits). A game that raises on a message ends
the episode with reward 0 and says so in the observation.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hacrl_fed.envs.base import MAX_TURNS, EnvStep, EpisodeSpec
from hacrl_fed.envs.params import bool_param, check_keys, choice_param, int_param

__all__ = ["ENV_PREFIX", "GAMES", "MAX_ACTION_CHARS", "MORE_GAMES", "REWARD_MODES", "TextArenaEnv", "factories",
           "factory"]

ENV_PREFIX = "textarena/"
MAX_ACTION_CHARS = 2000
"""Agent messages are cut to this many characters before the game reads them."""
REWARD_MODES = ("win", "partial")
_PLAYER_ACTION = "PLAYER_ACTION"
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


@dataclass(frozen=True)
class Game:
    """A curated TextArena game.

    Attributes:
        entry: ``module:Class`` of the game in the textarena package.
        keys: the configuration keys it accepts (besides ``reward``).
        kwargs: ``(config, max_turns) → constructor arguments``; raises :class:`ValueError` for a bad value.
    """

    entry: str
    keys: tuple[str, ...]
    kwargs: Callable[[Mapping[str, Any], int], dict[str, Any]]


def _guess_the_number(config: Mapping[str, Any], max_turns: int) -> dict[str, Any]:
    lo = int_param(config, "min_number", 1, 0, 999)
    hi = int_param(config, "max_number", 20, 1, 1000)
    if lo >= hi:
        raise ValueError(f"config 'min_number' ({lo}) must be below 'max_number' ({hi})")
    return {"min_number": lo, "max_number": hi, "max_turns": max_turns}


def _mastermind(config: Mapping[str, Any], max_turns: int) -> dict[str, Any]:
    length = int_param(config, "code_length", 4, 1, 8)
    numbers = int_param(config, "num_numbers", 6, 1, 9)
    duplicates = bool_param(config, "duplicate_numbers", False)
    if not duplicates and length > numbers:
        raise ValueError(f"config 'code_length' ({length}) exceeds 'num_numbers' ({numbers}) without duplicates")
    return {"code_length": length, "num_numbers": numbers, "duplicate_numbers": duplicates, "max_turns": max_turns}


def _tower_of_hanoi(config: Mapping[str, Any], max_turns: int) -> dict[str, Any]:
    return {"num_disks": int_param(config, "num_disks", 3, 1, 6), "max_turns": max_turns}


def _frozen_lake(config: Mapping[str, Any], max_turns: int) -> dict[str, Any]:
    size = int_param(config, "size", 4, 2, 8)
    holes = int_param(config, "num_holes", 3, 0, size * size // 3)
    return {"size": size, "num_holes": holes,
            "randomize_start_goal": bool_param(config, "randomize_start_goal", False)}


def _minesweeper(config: Mapping[str, Any], max_turns: int) -> dict[str, Any]:
    rows = int_param(config, "rows", 5, 3, 12)
    cols = int_param(config, "cols", 5, 3, 12)
    # TextArena places mines by rejection outside the first reveal's 3×3 zone: at most rows·cols − 9 of them
    mines = int_param(config, "num_mines", 5, 1, rows * cols - 9)
    return {"rows": rows, "cols": cols, "num_mines": mines, "max_turns": max_turns}


GAMES: dict[str, Game] = {
    "GuessTheNumber-v0": Game("textarena.envs.GuessTheNumber.env:GuessTheNumberEnv", ("min_number", "max_number"),
                              _guess_the_number),
    "Mastermind-v0": Game("textarena.envs.Mastermind.env:MastermindEnv",
                          ("code_length", "num_numbers", "duplicate_numbers"), _mastermind),
}
"""TextArena id → game, registered as ``textarena/<id>``."""

MORE_GAMES: dict[str, Game] = {
    "TowerOfHanoi-v0": Game("textarena.envs.TowerOfHanoi.env:TowerOfHanoiEnv", ("num_disks",), _tower_of_hanoi),
    "FrozenLake-v0": Game("textarena.envs.FrozenLake.env:FrozenLakeEnv",
                          ("size", "num_holes", "randomize_start_goal"), _frozen_lake),
    "Minesweeper-v0-small": Game("textarena.envs.Minesweeper.env:MinesweeperEnv", ("rows", "cols", "num_mines"),
                                 _minesweeper),
}
"""Offline, deterministic games beyond a 135M-parameter model, not registered by default (:func:`factory`)."""


def _game_class(entry: str) -> type:
    module, name = entry.split(":")
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ImportError(f"the TextArena environments need textarena: pip install textarena==0.7.4 ({err})") from None


def _render(messages: list[tuple[Any, ...]]) -> str:
    """The game's messages to the player as plain text, one per line; the player's own actions left out."""
    parts = []
    for _, text, kind in messages:
        if getattr(kind, "name", "") == _PLAYER_ACTION:
            continue
        text = _ANSI.sub("", str(text)).strip()
        if text:
            parts.append(text)
    return "\n".join(parts)


class TextArenaEnv:
    """One episode of a curated TextArena game (:data:`GAMES` or :data:`MORE_GAMES`).

    Args:
        game_id: a key of :data:`GAMES` or :data:`MORE_GAMES` (without the ``textarena/`` prefix).
        config: the game's configuration keys, ``reward`` (``"win"`` or ``"partial"``) and ``error_allowance``.
        seed: the game's seed (TextArena seeds the global ``random`` with it; the registry isolates that).
        max_turns: the game's turn limit, where it has one (the spec's ``max_turns``).

    Raises :class:`ValueError` for an unknown game or a bad configuration.
    """

    def __init__(self, game_id: str, config: Mapping[str, Any], seed: int, max_turns: int) -> None:
        game = GAMES.get(game_id) or MORE_GAMES.get(game_id)
        if game is None:
            raise ValueError(f"unknown TextArena game {game_id!r}; curated: {', '.join([*GAMES, *MORE_GAMES])}")
        check_keys(config, (*game.keys, "reward", "error_allowance"))
        self._reward_mode = choice_param(config, "reward", "win", REWARD_MODES)
        self._error_allowance = int_param(config, "error_allowance", 1, 0, MAX_TURNS)
        self._kwargs = game.kwargs(config, max_turns)
        self._entry, self._seed, self._max_turns = game.entry, seed, max_turns
        self._game: Any = None
        self._done = False
        self._turns = 0

    def reset(self) -> str:
        """Start the game: the prompt (and the board, for the games that show one)."""
        self._game = _game_class(self._entry)(**self._kwargs)
        self._game.reset(num_players=1, seed=self._seed)
        self._game.state.error_allowance = self._error_allowance
        self._done, self._turns = False, 0
        _, messages = self._game.get_observation()
        return _render(messages)

    def step(self, message: str) -> EnvStep:
        """Play ``message`` (cut to :data:`MAX_ACTION_CHARS`): the game's feedback, and when it ends the closing
        reason and the mapped reward. Raises :class:`RuntimeError` before :meth:`reset` or after the end."""
        if self._game is None or self._done:
            raise RuntimeError("step() needs a running game: call reset() first; the game is over")
        self._turns += 1
        try:
            done, _ = self._game.step(message[:MAX_ACTION_CHARS])
            _, messages = self._game.get_observation()
            if done:
                rewards, info = self._game.close()
                raw, reason = (rewards or {}).get(0), (info or {}).get(0, {}).get("reason") or "The game ended."
            elif self._turns >= self._max_turns:  # the episode's last message: the game ends here, not won
                share = self._game._get_percentage_completion() if self._reward_mode == "partial" else 0.0
                raw, reason = min(float(share), 0.99), f"No turns left ({self._max_turns} used)."
        except Exception as err:  # noqa: BLE001 - a game bug on odd text ends the episode, deterministically
            self._done = True
            return EnvStep(f"Game over. The game could not process this message ({type(err).__name__}).", True, 0.0)
        text = _render(messages)
        if not done and self._turns < self._max_turns:
            return EnvStep(text or "(no feedback)", False, 0.0)
        self._done = True
        closing = f"Game over. {_ANSI.sub('', str(reason)).strip()}"
        return EnvStep(f"{text}\n{closing}" if text else closing, True, self._reward(raw))

    def _reward(self, raw: Any) -> float:
        if raw is None:
            return 0.0
        raw = float(raw)
        if self._reward_mode == "win":
            return 1.0 if raw >= 1.0 else 0.0
        return min(max(raw, 0.0), 1.0)


def factory(game_id: str) -> Callable[[EpisodeSpec], TextArenaEnv]:
    """The registry factory of a curated game (a key of :data:`GAMES` or :data:`MORE_GAMES`). Raises
    :class:`ValueError` for another id."""
    if game_id not in GAMES and game_id not in MORE_GAMES:
        raise ValueError(f"unknown TextArena game {game_id!r}; curated: {', '.join([*GAMES, *MORE_GAMES])}")

    def make(spec: EpisodeSpec) -> TextArenaEnv:
        return TextArenaEnv(game_id, spec.config, spec.seed, spec.max_turns)

    make.__doc__ = f"The TextArena game {game_id} of ``spec`` (:class:`TextArenaEnv`)."
    return make


def factories() -> dict[str, Callable[[EpisodeSpec], TextArenaEnv]]:
    """Registry id (``textarena/<id>``) → factory, for every game of :data:`GAMES`."""
    return {ENV_PREFIX + game_id: factory(game_id) for game_id in GAMES}
