"""benchmarks/episode_strategies.py: reference Guess The Number strategies played in the project's environment,
and the count of a cell's held-out games scored as each strategy scores them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("episode_strategies", ROOT / "benchmarks" / "episode_strategies.py")
strategies = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(strategies)

GAMES = strategies.held_out_games(ROOT / "examples" / "episodes.toml")


def test_bisection_wins_every_held_out_game_and_the_example_move_almost_none():
    bisect = [strategies.play(spec, strategies.bisection) for spec in GAMES.values()]
    ten = [strategies.play(spec, strategies.always_ten) for spec in GAMES.values()]
    assert len(GAMES) == 32 and bisect == [1.0] * 32
    assert sum(r >= 1.0 for r in ten) < 5 and all(0.0 <= r < 1.0 for r in ten if r < 1.0)


def test_a_cell_playing_like_the_walk_is_counted_on_every_game(tmp_path):
    walk = {pid: strategies.play(spec, strategies.walk_from_ten) for pid, spec in GAMES.items()}
    (tmp_path / "cells").mkdir()
    (tmp_path / "meta.json").write_text(json.dumps({"config": "examples/episodes.toml"}))
    off = dict(walk, **{next(iter(walk)): 0.5})     # one game scored otherwise
    cell = {"after": {"a": {"held_out": walk}, "b": {"held_out": off}}}
    (tmp_path / "cells" / "hacpo-s0.json").write_text(json.dumps(cell))
    ten = {pid: strategies.play(spec, strategies.always_ten) for pid, spec in GAMES.items()}
    (tmp_path / "before.json").write_text(json.dumps({"agents": {"a": {"held_out": ten}}}))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "episode_strategies.py"), "--results",
                          str(tmp_path)], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    wins = sum(r >= 1.0 for r in walk.values())
    assert 0 < wins < 32
    assert f"| hacpo-s0 | a | {wins} | " in out and out.split("| hacpo-s0 | a |")[1].split("\n")[0].count("| 32 |") == 1
    row_before = out.split("| before training | a |")[1].split("\n")[0]
    assert row_before.startswith(f" {sum(r >= 1.0 for r in ten.values())} | 32 |")
    row_b = out.split("| hacpo-s0 | b |")[1].split("\n")[0]
    assert "| 31 |" in row_b and "| 32 |" not in row_b


def _refusal(results: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "episode_strategies.py"), "--results",
                           str(results)], capture_output=True, text=True, cwd=ROOT)


def test_a_folder_without_meta_is_refused_with_the_reason(tmp_path):
    res = _refusal(tmp_path)
    assert res.returncode == 2 and "meta.json not found" in res.stderr


def test_a_folder_of_another_task_or_without_config_is_refused_with_the_reason(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps({"config": "examples/default.toml"}))
    res = _refusal(tmp_path)
    assert res.returncode == 2 and "not all textarena/GuessTheNumber-v0 episodes" in res.stderr
    assert "Traceback" not in res.stderr
    (tmp_path / "meta.json").write_text(json.dumps({"pair": "episodes"}))
    res = _refusal(tmp_path)
    assert res.returncode == 2 and "names no config" in res.stderr and "Traceback" not in res.stderr


def test_bisection_uses_the_configured_range():
    spec = next(iter(GAMES.values()))     # 1..100 in 7 guesses: bisection on 1..20 would lose most games
    wide = [type(spec)(env_id=spec.env_id, config={**spec.config, "max_number": 100}, seed=s, max_turns=7)
            for s in range(8)]
    assert strategies.number_range(wide[0]) == (1, 100)
    assert [strategies.play(w, strategies.bisection) for w in wide] == [1.0] * 8
