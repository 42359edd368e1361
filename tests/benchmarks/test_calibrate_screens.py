"""Smoke test of ``benchmarks/calibrate_screens.py`` on the tiny pair (its main path; ``tests/screens/test_rules.py``
tests its :func:`span_surprise`): every learner's rows of every class are scored, the rows and the table are
written, and ``--summary-only`` rebuilds the same table from the rows."""

from __future__ import annotations

import json

import calibrate_screens


def test_the_tiny_pair(tmp_path, capsys):
    out = tmp_path / "calibration"
    assert calibrate_screens.main(["--pair", "tiny", "--prompts", "1", "--samples", "2", "--seeds", "1",
                                   "--out", str(out)]) == 0
    rec = json.loads((out / "rows.json").read_text())
    assert rec["rows_per_class"] == 2 and set(rec["learners"]) == {"llama-bpe", "gemma-unigram"}
    for classes in rec["learners"].values():
        assert set(classes) == set(calibrate_screens.CLASSES)
        assert all(len(rows) == 2 for rows in classes.values())          # B × G rows of each class, each scored
    table = (out / "results.md").read_text()
    (out / "results.md").unlink()
    capsys.readouterr()
    assert calibrate_screens.main(["--summary-only", "--out", str(out)]) == 0
    assert (out / "results.md").read_text() == table
