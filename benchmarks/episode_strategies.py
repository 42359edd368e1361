"""Which fixed strategy a trained model's held-out Guess The Number play scores like.

A benchmark cell of ``run_collab.py --pair episodes`` keeps, per agent, the reward of each held-out game played
greedily (1 for a win, else ``1 − |last guess − target| / 19`` with partial rewards). This script plays three
reference strategies on the same held-out games (the ``[run.data]`` of the cell's config: its environment,
``max_turns`` and ``eval_size`` seeds), in this project's own environment adapter, and counts for every cell and
agent the games whose reward equals each strategy's:

* ``always [10]``: the system prompt's example move every turn (what both packaged models play before training);
* ``walk from [10]``: ``[10]`` first, then one step toward the hint (``higher`` → +1, ``lower`` → −1);
* ``bisection``: the middle of the range still possible (wins every game of 1..20 in 5 guesses).

The range of a game is its configuration's (``min_number`` … ``max_number``, 1 … 20 by default); a folder whose
held-out games are not all Guess The Number, or whose ``meta.json`` names no readable config, is refused (exit 2).

Equal rewards on a lost game mean a last guess as far from the target (the same guess, or its mirror across the
target); on a won game, a win within the turns. A model that matches a strategy on every game scores exactly as
that strategy, whatever its moves were. The models before training (``before.json``) come first, then every cell.

    python benchmarks/episode_strategies.py --results benchmarks/results/collab-episodes
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GAME = "textarena/GuessTheNumber-v0"

Move = Callable[[list[tuple[int, str]], int, int], int]
"""A strategy: the history of (guess, hint) pairs so far and the game's range (lowest, highest) → the next guess."""


def always_ten(history: list[tuple[int, str]], low: int, high: int) -> int:
    return 10


def walk_from_ten(history: list[tuple[int, str]], low: int, high: int) -> int:
    if not history:
        return 10
    guess, hint = history[-1]
    return guess + 1 if hint == "higher" else guess - 1 if hint == "lower" else guess


def bisection(history: list[tuple[int, str]], low: int, high: int) -> int:
    for guess, hint in history:
        if hint == "higher":
            low = max(low, guess + 1)
        elif hint == "lower":
            high = min(high, guess - 1)
    return (low + high) // 2


STRATEGIES: dict[str, Move] = {"always [10]": always_ten, "walk from [10]": walk_from_ten, "bisection": bisection}


def hint_of(feedback: str) -> str:
    """``higher`` / ``lower`` from the game's feedback text, ``""`` when it says neither."""
    text = feedback.lower()
    return "higher" if "higher" in text else "lower" if "lower" in text else ""


def number_range(spec) -> tuple[int, int]:
    """(lowest, highest) number of a Guess The Number instance, as the environment adapter configures the game."""
    from hacrl_fed.envs.textarena_env import GAMES

    kwargs = GAMES[GAME.removeprefix("textarena/")].kwargs(spec.config, spec.max_turns)
    return kwargs["min_number"], kwargs["max_number"]


def play(spec, strategy: Move) -> float:
    """The episode reward of ``strategy`` on the game instance ``spec`` (``hacrl_fed.envs.EpisodeSpec``)."""
    from hacrl_fed.envs import make_env

    low, high = number_range(spec)
    env = make_env(spec)
    env.reset()
    history: list[tuple[int, str]] = []
    for _ in range(spec.max_turns):
        guess = strategy(history, low, high)
        step = env.step(f"[{guess}]")
        if step.done:
            return step.reward
        history.append((guess, hint_of(step.observation)))
    return 0.0


def held_out_games(config: Path) -> dict[str, object]:
    """Problem id → episode spec of the held-out games of ``config`` (a ``SimulateConfig`` TOML). Raises
    :class:`ValueError` (``ConfigError``, ``DataError``) for a bad config, or one whose held-out problems are not all
    Guess The Number episodes."""
    from hacrl_fed.config import SimulateConfig, load_config
    from hacrl_fed.data.episodes import load_episode_problems

    cfg = load_config(config, SimulateConfig)
    _, held = load_episode_problems(cfg.run.data)
    other = sorted({p.episode.env_id for p in held} - {GAME})
    if not held or other:
        raise ValueError(f"{config}: its held-out problems are not all {GAME} episodes"
                         + (f" ({', '.join(other)})" if other else " (none)"))
    return {p.id: p.episode for p in held}


def table(results: Path) -> str:
    """A markdown table: per cell and agent, wins and the games scored as each strategy scores them."""
    meta = json.loads((results / "meta.json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), str):
        raise ValueError(f"{results}/meta.json names no config")
    games = held_out_games(ROOT / meta["config"])
    reference = {name: {pid: play(spec, move) for pid, spec in games.items()} for name, move in STRATEGIES.items()}
    names = list(STRATEGIES)
    lines = [f"Held-out games: {len(games)}, of `{meta['config']}`; a cell counts the games whose greedy reward "
             "equals the strategy's.", "",
             "| cell | agent | won | " + " | ".join(f"as {n}" for n in names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    rows = [(f"strategy: {n}", "–", reference[n]) for n in names]
    before = results / "before.json"
    if before.is_file():
        agents = json.loads(before.read_text(encoding="utf-8"))["agents"]
        rows += [("before training", agent, sets["held_out"]) for agent, sets in sorted(agents.items())]
    for path in sorted((results / "cells").glob("*.json")):
        cell = json.loads(path.read_text(encoding="utf-8"))
        rows += [(path.stem, agent, sets["held_out"]) for agent, sets in sorted(cell["after"].items())]
    for label, agent, got in rows:
        same = [matches(got, reference[n]) for n in names]
        lines.append(f"| {label} | {agent} | {sum(v >= 1.0 for v in got.values())} | "
                     + " | ".join(map(str, same)) + " |")
    return "\n".join(lines)


def matches(got: dict[str, float], reference: dict[str, float]) -> int:
    """The games of ``reference`` (problem id → reward) whose reward ``got`` equals (within 1e-9)."""
    return sum(pid in got and abs(got[pid] - r) < 1e-9 for pid, r in reference.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks/results/collab-episodes",
                    help="a run_collab.py --pair episodes output folder (meta.json and cells/)")
    args = ap.parse_args(argv)
    if not (args.results / "meta.json").is_file():
        print(f"error: {args.results}/meta.json not found: pass a run_collab.py --pair episodes --out folder",
              file=sys.stderr)
        return 2
    try:
        print(table(args.results))
    except ValueError as err:   # ConfigError, DataError, a bad meta.json (json.JSONDecodeError is one too)
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
