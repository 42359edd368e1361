"""The collaboration benchmark on a task suite, end to end with the tiny models: per-task results, outcomes per
problem (format vs content), the noise section, resumable cells."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(out: Path, *extra: str) -> str:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run_collab.py"), "--pair", "tiny-tasks", "--seeds", "2",
           "--steps", "1", "--recipes", "gspo,hacpo_cross_family_task", "--out", str(out), *extra]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout


def test_task_suite_benchmark_reports_per_task_and_resumes(tmp_path):
    out = tmp_path / "collab"
    first = _run(out)
    progress = [line for line in first.splitlines() if " step 1/1, " in line]   # one line per step of a cell
    assert len(progress) == 4 and progress[0].startswith("[gspo s0] step 1/1, ") and "left): rollouts right" in progress[0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["eval_sets"] == ["held_out", "families"]
    assert set(meta["tasks"].values()) == {"chain_sum", "spell_backward", "leg_counting"}
    cell = json.loads((out / "cells" / "hacpo_cross_family_task-s1.json").read_text())
    outcomes = {v for per in cell["after"].values() for s in per.values() for v in s.values()}
    for agent, sets in cell["after"].items():   # every evaluated response is kept beside its outcome, bounded
        for e, per in sets.items():
            texts = cell["responses"][agent][e]
            assert set(texts) == set(per) and all(isinstance(t, str) and len(t) <= 400 for t in texts.values())
    before = json.loads((out / "before.json").read_text())
    assert set(before["responses"]["llama-bpe"]["families"]) == set(before["agents"]["llama-bpe"]["families"])
    assert outcomes <= {"correct", "truncated", "no_answer", "wrong_answer", "verifier_error"} and outcomes
    summary = json.loads((out / "results.json").read_text())
    rec = summary["recipes"]["hacpo_cross_family_task"]["agents"]["llama-bpe"]
    assert set(rec["tasks"]) == {"chain_sum", "spell_backward", "leg_counting"}
    assert rec["tasks"]["leg_counting"]["set"] == "families" and rec["tasks"]["chain_sum"]["set"] == "held_out"
    assert set(rec["held_out"]["gains"]) == {"format_fixed", "content_fixed", "format_broken", "content_broken"}
    mix = rec["tasks"]["leg_counting"]["outcomes"]    # what the family's answers are: right, wrong, cut, none
    assert set(mix) == {"correct", "wrong_answer", "truncated", "no_answer", "verifier_error"}
    assert abs(sum(mix.values()) - 1) < 1e-9 and abs(mix["correct"] - rec["tasks"]["leg_counting"]["mean"]) < 1e-9
    assert summary["noise"]["llama-bpe"]["held_out"]["seeds"] == 2
    for section in ("## Noise and minimum detectable effect", "## Held-out task families", "## Per task",
                    "## Format or content", "## Does an agent gain most where its peer is stronger?",
                    "## Outcomes on the held-out task families", "## Own rows that carried a gradient"):
        assert section in first
    again = _run(out)
    assert again.count("done already") == 4


def test_noise_gives_the_minimum_detectable_effect_and_the_seeds_for_five_points():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import noise

    def cell(correct: int, n: int = 100) -> dict:
        return {"after": {"a": {"held_out": {f"p{i}": i < correct for i in range(n)}}}}

    got = noise([cell(40), cell(50), cell(60)], "a", "held_out")
    # sd over seeds 0.10 (above the binomial sd of one cell, 0.05): MDE = 2.8016 · √2 · 0.10 / √3
    assert abs(got["sd_seed"] - 0.10) < 1e-9 and abs(got["sd_eval"] - 0.05) < 1e-9
    assert abs(got["mde"] - 2.8016 * 2 ** 0.5 * 0.10 / 3 ** 0.5) < 1e-6
    assert got["seeds_for_5_points"] == 63            # (2.8016 · √2 · 0.10 / 0.05)^2 = 62.8 → 63
    quiet = noise([cell(50), cell(50), cell(50)], "a", "held_out")
    assert quiet["sd_between"] == 0.0 and quiet["sd_seed"] == quiet["sd_eval"]   # evaluation noise is the floor
    assert noise([cell(50)], "a", "held_out")["mde"] is None


def test_paired_mde_removes_what_a_shared_seed_explains():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import paired_mde

    def cell(seed: int, correct: int, n: int = 100) -> dict:
        return {"seed": seed, "after": {"a": {"held_out": {f"p{i}": i < correct for i in range(n)}}}}

    # seeds differ by 20 points, the recipe adds 5 ± 1 on each: the paired difference hardly varies
    a = [cell(0, 35), cell(1, 56), cell(2, 74)]
    b = [cell(0, 30), cell(1, 50), cell(2, 70)]
    got = paired_mde(a, b, "a", "held_out")
    assert got["seeds"] == 3 and abs(got["sd_diff"] - 0.01) < 1e-9
    assert abs(got["mde"] - 2.8016 * 0.01 / 3 ** 0.5) < 1e-6 and got["seeds_for_5_points"] == 2
    assert paired_mde(a[:1], b, "a", "held_out")["mde"] is None


def test_a_named_option_is_compared_with_the_same_recipe_without_it(tmp_path):
    """Capability per task (``hacpo_cross_family_task``) against global capability (``hacpo_cross_family``),
    on the committed task-suite cells: the difference isolates the option."""
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import paired_interval, summarize

    out = tmp_path / "collab-tasks"
    shutil.copytree(ROOT / "benchmarks" / "results" / "collab-tasks", out)
    summary = summarize(out)
    cells = {r: sorted((json.loads(p.read_text()) for p in (out / "cells").glob(f"{r}-s*.json")),
                       key=lambda c: c["seed"]) for r in ("hacpo_cross_family_task", "hacpo_cross_family")}
    got = summary["recipes"]["hacpo_cross_family_task"]["agents"]["smollm2"]["held_out"]["vs"]["hacpo_cross_family"]
    assert got == paired_interval(cells["hacpo_cross_family_task"], cells["hacpo_cross_family"], "smollm2", "held_out")
    assert "hacpo_cross_family_task" not in summary["recipes"]["hacpo_cross_family"]["agents"]["smollm2"]["held_out"]["vs"]
    assert "| HACPO cross-family, capability per task − HACPO cross-family |" in (out / "results.md").read_text()


def test_own_gradient_counts_rows_and_updates_that_carried_a_gradient():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run_collab import own_gradient

    def step(acc: float, frac: float, updates: int, zero: int) -> dict:
        return {"accuracy": acc, "own_grad_frac": frac, "updates": updates, "zero_grad_updates": zero, "peers": {}}

    seed0 = {"per_step": {"a": [step(0.0, 0.0, 2, 2), step(0.25, 0.5, 2, 0)]}}
    seed1 = {"per_step": {"a": [step(0.5, 1.0, 2, 1), step(0.0, 0.0, 2, 2)]}}
    got = own_gradient([seed0, seed1], "a")
    assert got == {"rollout_accuracy": 0.1875, "own_grad_frac": 0.375, "updates": 8, "updates_with_grad": 3}
    assert own_gradient([{"per_step": {"a": [{"accuracy": 0.0, "own_grad_frac": None, "peers": {}}]}}], "a") is None
