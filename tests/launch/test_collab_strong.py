"""The collaboration benchmark with the strong contributor (``run_collab.py --contributor strong:P``) and the peer
distillation recipe, end to end on the tiny task suite: the script serves ``benchmarks/strong_contributor.py``
in-process, the coordinator re-verifies its worked solutions at the configured accuracy, and the learners'
distillation term takes its rows above their group's baseline (the tiny models never solve a task, so every
verified contributor row is above it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import run_collab  # noqa: E402

LEARNERS = ("gemma-unigram", "llama-bpe")


def test_the_strong_contributor_feeds_the_distillation_term(tmp_path):
    out = tmp_path / "collab"
    argv = ["--pair", "tiny-tasks", "--seeds", "1", "--steps", "2", "--recipes", "hacpo_cross_family_distill",
            "--contributor", "strong:1.0", "--contributor-name", "strong", "--out", str(out)]
    assert run_collab.main(argv) == 0
    cell = json.loads((out / "cells" / "hacpo_cross_family_distill+contrib-s0.json").read_text())
    assert [s["accuracy"] for s in cell["contributor_steps"]] == [1.0, 1.0]
    for learner in LEARNERS:
        rows = [s["contributor"] for s in cell["per_step"][learner]]
        assert all(r["rows"] == 4.0 for r in rows)
        # every pooled worked solution is right, the learner's own rows are not: all of them are distilled
        assert [r["distill_rows"] for r in rows] == [4.0, 4.0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["contributor"]["source"] == "strong:1.0"


@pytest.mark.parametrize("bad", ["strong:1.5", "strong:x"])
def test_a_bad_accuracy_is_refused(tmp_path, bad, capsys):
    with pytest.raises(SystemExit) as err:
        run_collab.main(["--pair", "tiny-tasks", "--contributor", bad, "--out", str(tmp_path / "o")])
    assert err.value.code == 2 and "must be a number in [0, 1]" in capsys.readouterr().err
