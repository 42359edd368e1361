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
    meta = json.loads((out / "meta.json").read_text())
    assert meta["eval_sets"] == ["held_out", "families"]
    assert set(meta["tasks"].values()) == {"chain_sum", "spell_backward", "leg_counting"}
    cell = json.loads((out / "cells" / "hacpo_cross_family_task-s1.json").read_text())
    outcomes = {v for per in cell["after"].values() for s in per.values() for v in s.values()}
    assert outcomes <= {"correct", "truncated", "no_answer", "wrong_answer", "verifier_error"} and outcomes
    summary = json.loads((out / "results.json").read_text())
    rec = summary["recipes"]["hacpo_cross_family_task"]["agents"]["llama-bpe"]
    assert set(rec["tasks"]) == {"chain_sum", "spell_backward", "leg_counting"}
    assert rec["tasks"]["leg_counting"]["set"] == "families" and rec["tasks"]["chain_sum"]["set"] == "held_out"
    assert set(rec["held_out"]["gains"]) == {"format_fixed", "content_fixed", "format_broken", "content_broken"}
    assert summary["noise"]["llama-bpe"]["held_out"]["seeds"] == 2
    for section in ("## Noise and minimum detectable effect", "## Held-out task families", "## Per task",
                    "## Format or content", "## Does an agent gain most where its peer is stronger?"):
        assert section in first
    again = _run(out)
    assert again.count("done already") == 4
