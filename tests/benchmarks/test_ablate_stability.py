"""Smoke test of ``benchmarks/ablate_stability.py``: one variant, one seed, one step of one tiny agent trained
alone; the cell, the shared "before" evaluation and the results table are written, and ``--summary-only``
rebuilds the table from the cells without training."""

from __future__ import annotations

import json
from pathlib import Path

import ablate_stability

ROOT = Path(__file__).resolve().parents[2]


def test_one_cell_on_a_tiny_agent(tmp_path, capsys):
    out = tmp_path / "stability"
    argv = ["--config", str(ROOT / "examples" / "tiny.toml"), "--agent", "llama-bpe", "--variants", "skip0",
            "--seeds", "1", "--steps", "1", "--eval-size", "2", "--out", str(out)]
    assert ablate_stability.main(argv) == 0
    cell = json.loads((out / "cells" / "llama-bpe-skip0-s0.json").read_text())
    assert cell["variant"] == "skip0" and cell["optim"]["skip_zero_grad_updates"] is True
    assert len(cell["after"]["held_out"]) == len(cell["after"]["words"]) == 2      # --eval-size problems, both sets
    assert [s["step"] for s in cell["per_step"]] == [1] and cell["per_step"][0]["metrics"]["updates"] >= 1
    before = json.loads((out / "before-llama-bpe.json").read_text())
    assert set(before["held_out"]) == set(cell["after"]["held_out"])              # the same problems after
    table = (out / "results-llama-bpe.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| skip0 |"))
    assert row.split(" | ")[1] == "1"                                              # one seed
    (out / "results-llama-bpe.md").unlink()
    capsys.readouterr()
    assert ablate_stability.main(["--summary-only", "--agent", "llama-bpe", "--out", str(out)]) == 0
    assert (out / "results-llama-bpe.md").read_text() == table
