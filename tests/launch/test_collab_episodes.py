"""The collaboration benchmark on episodes (docs/multi-turn.md): each held-out game's reward is kept per instance,
the win rate is the share at reward 1, and the mean reward (partial rewards of lost games included) is reported
with a paired interval against GSPO."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from inproc import StepResult  # noqa: E402
from run_collab import _step_summary, accuracy, paired_interval, reward_of, summarize  # noqa: E402

AGENTS = ("a", "b")


def _cell(recipe: str, seed: int, rewards: list[float]) -> dict:
    entries = {f"guess-{i}": x for i, x in enumerate(rewards)}
    step = {"peers": {}, "generate_s": 1.0, "train_s": 1.0}
    return {"recipe": recipe, "seed": seed, "steps": 1, "train_s": 2.0, "eval_s": 1.0,
            "after": {a: {"held_out": dict(entries)} for a in AGENTS},
            "per_step": {a: [dict(step)] for a in AGENTS}}


def _out_dir(tmp_path: Path, *, steps: int, eval_size: int) -> Path:
    """A results directory with its meta.json for two seeds of the ``episodes`` pair, and no cells yet."""
    out = tmp_path / "collab"
    (out / "cells").mkdir(parents=True)
    meta = {"command": "run_collab.py --pair episodes", "pair": "episodes", "steps": steps, "seeds": 2,
            "prompts_per_step": 2, "samples_per_prompt": 2, "eval_size": eval_size, "models": {a: a for a in AGENTS},
            "eval_sets": ["held_out"]}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def test_episode_cells_give_the_win_rate_and_the_mean_reward_with_paired_intervals(tmp_path):
    out = _out_dir(tmp_path, steps=1, eval_size=4)
    before = [0.0, 0.2, 0.4, 1.0]
    (out / "before.json").write_text(json.dumps({"agents": {a: {"held_out": {f"guess-{i}": x for i, x in
                                                                              enumerate(before)}} for a in AGENTS}}))
    cells = {("gspo", 0): [0.0, 0.3, 0.5, 1.0], ("gspo", 1): [0.1, 0.3, 0.5, 0.9],
             ("hacpo_cross_family", 0): [0.5, 0.6, 1.0, 1.0], ("hacpo_cross_family", 1): [0.4, 0.6, 0.8, 1.0]}
    for (recipe, seed), rewards in cells.items():
        (out / "cells" / f"{recipe}-s{seed}.json").write_text(json.dumps(_cell(recipe, seed, rewards)))
    summary = summarize(out)

    assert summary["before"]["a"]["held_out"] == 0.25                      # one game of four won
    assert summary["before_reward"]["a"]["held_out"] == pytest.approx(0.4)
    hcf = summary["recipes"]["hacpo_cross_family"]["agents"]["a"]["held_out"]
    assert hcf["per_seed"] == [0.5, 0.25]                                  # won: reward 1, not 0.9
    assert hcf["reward"]["per_seed"] == pytest.approx([0.775, 0.7])
    mean, low, high = hcf["reward"]["vs_gspo"]
    assert mean == pytest.approx((0.775 + 0.7 - 0.45 - 0.45) / 2) and low <= mean <= high
    assert "reward" in summary["recipes"]["gspo"]["agents"]["b"]["held_out"]
    md = (out / "results.md").read_text()
    assert "## Mean episode reward, held-out" in md and "| before training | – | 40.0 | " in md


def test_the_reward_pairing_and_the_win_rate_read_the_same_entries():
    a = [{"seed": 0, "after": {"x": {"held_out": {"p0": 1.0, "p1": 0.5}}}}]
    b = [{"seed": 0, "after": {"x": {"held_out": {"p0": 0.25, "p1": 0.5}}}}]
    assert paired_interval(a, b, "x", "held_out", value=reward_of)[0] == pytest.approx(0.375)
    assert paired_interval(a, b, "x", "held_out")[0] == pytest.approx(0.5)   # wins: 1 of 2 against 0 of 2
    assert accuracy({"p0": 0.99, "p1": 1.0}) == 0.5


def test_turns_per_training_episode_are_averaged_over_the_cells_that_recorded_them(tmp_path):
    out = _out_dir(tmp_path, steps=2, eval_size=2)
    (out / "before.json").write_text(json.dumps({"agents": {a: {"held_out": {"guess-0": 0.5, "guess-1": 0.5}}
                                                            for a in AGENTS}}))
    for seed, turns in ((0, None), (1, (2.0, 4.0))):      # seed 0 written before turns were recorded
        cell = _cell("gspo", seed, [0.5, 1.0])
        for a in AGENTS:
            cell["per_step"][a] = [{"step": i + 1, "accuracy": 0.6, "own_grad_frac": 0.5, "updates": 2.0,
                                    "zero_grad_updates": 0.0, "peers": {}, "generate_s": 1.0, "train_s": 1.0,
                                    **({} if turns is None else {"turns_mean": turns[i], "done_frac": 0.5 * i})}
                                   for i in range(2)]
        (out / "cells" / f"gspo-s{seed}.json").write_text(json.dumps(cell))
    summary = summarize(out)

    g = summary["recipes"]["gspo"]["agents"]["a"]["own_gradient"]
    assert g["turns_mean"] == pytest.approx(3.0) and g["done_frac"] == pytest.approx(0.25) and g["turns_cells"] == 1
    md = (out / "results.md").read_text()
    assert "a: mean rollout reward / own rows with a gradient" in md and "| GSPO (isolated) | 60.0 / 50.0 % /" in md
    assert "## Turns per episode in training" in md and "| GSPO (isolated) | 1 of 2 | 3.0 / 25 % | 3.0 / 25 % |" in md


def test_a_step_summary_keeps_the_workers_episode_metrics_and_only_on_episodes():
    report = {"metrics": {"updates": 2.0}, "per_source": {"a": {"grad_frac": 0.5}}}
    played = StepResult(1, {"a": 0.4}, {"a": report}, {"a": 3.0}, {"a": 2.0},
                        generate_metrics={"a": {"stop_frac": 1.0, "episode/turns_mean": 3.5,
                                                "episode/done_frac": 0.75}})
    s = _step_summary("a", played)
    assert (s["turns_mean"], s["done_frac"], s["own_grad_frac"]) == (3.5, 0.75, 0.5)
    one_shot = StepResult(1, {"a": 0.4}, {"a": report}, {"a": 3.0}, {"a": 2.0}, generate_metrics={"a": {}})
    assert "turns_mean" not in _step_summary("a", one_shot)


def test_a_step_summary_keeps_what_the_screens_did_to_each_peer():
    report = {"metrics": {"updates": 1.0}, "per_source": {"a": {"grad_frac": 0.5},
                                                           "b": {"rows": 16.0, "screened_out": 3.0},
                                                           "api": {"rows": 4.0, "screened_out": 12.0}}}
    step = StepResult(1, {"a": 0.4}, {"a": report}, {"a": 3.0}, {"a": 2.0}, generate_metrics={"a": {}})
    s = _step_summary("a", step, contributors=("api",))
    assert list(s["peers"]) == ["b"] and (s["peers"]["b"]["rows"], s["peers"]["b"]["screened_out"]) == (16.0, 3.0)
