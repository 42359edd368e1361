"""The run report's screen section: what each learner's screens did to each source, from metrics.jsonl."""

from __future__ import annotations

import pytest

from hacrl_fed.report.run_report import build_report, render_markdown


def _step(step: int, mallory: dict, gemma: dict, refused=()) -> dict:
    return {"event": "step", "step": step, "trained": ["smollm2"], "timing": {"step_s": 10.0},
            "agents": {"smollm2": {"status": "trained", "accuracy": 0.5, "capability": 0.5,
                                   "per_source": {"smollm2": {"rows": 8}, "mallory": mallory, "gemma3": gemma},
                                   "train_rejected": list(refused)}}}


def test_screens_section_sums_the_run_and_lists_quarantines(tmp_path):
    honest = {"screen_rows": 8, "screened_rows": 0, "coordinator_disagreements": 1, "standing": 0.0}
    records = [
        _step(1, {"screen_rows": 8, "screened_rows": 4, "screened_tail_cut": 4, "standing": 1.0}, honest),
        _step(2, {"screen_rows": 8, "screened_rows": 4, "screened_tail_cut": 3, "screened_likelihood": 1,
                  "quarantined_rows": 8, "standing": 2.0}, honest,
              refused=["mallory: quarantined by this site since step 2 (3 flagged steps); its 8 rows are not trained"]),
        {"event": "run_end", "run_id": "r", "steps": 2},
    ]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    s2 = report["steps"][1]["agents"]["smollm2"]
    assert s2["screens"]["mallory"]["quarantined_rows"] == 8 and "smollm2" not in s2["screens"]
    md = render_markdown(report)
    assert "## Screens" in md
    row = next(line for line in md.splitlines() if line.startswith("| mallory→smollm2"))
    assert row.split(" | ")[1:4] == ["16", "7", "-"] and row.rstrip(" |").endswith("quarantined")
    gemma = next(line for line in md.splitlines() if line.startswith("| gemma3→smollm2"))
    assert gemma.split(" | ")[-3:-1] == ["2", "-"] and gemma.rstrip(" |").endswith("trusted")
    assert "* step 2, smollm2: mallory: quarantined by this site since step 2" in md


def test_no_screen_metrics_no_section(tmp_path):
    records = [{"event": "step", "step": 1, "agents": {"a": {"per_source": {"b": {"rows": 4}}}}}]
    assert "## Screens" not in render_markdown(build_report(records, run_dir=tmp_path, phases={}, agents={}))


def test_rows_a_screen_left_out_count_as_not_reaching_the_gradient(tmp_path):
    """peer grad = rows with a gradient / rows received: 2 of 8 trained rows had one and 3 of 8 received were
    left out at step 1 (5 trained), 2 of 8 at step 2 (no screen left any out) → 4 of 16, not 4 of 13."""
    def step(n: int, trained: int, out: int, grad_frac: float) -> dict:
        gemma = {"screen_rows": 8, "screened_rows": out, "screened_out": out, "screened_phrase_cut": out,
                 "rows": trained, "grad_frac": grad_frac, "s_mean": 0.5, "clip_low": 0.5, "clip_high": 0.0}
        return {"event": "step", "step": n, "timing": {"step_s": 10.0}, "agents": {"smollm2": {
            "status": "trained", "accuracy": 0.5, "capability": 0.5, "per_source": {"smollm2": {"rows": 8}, "gemma3": gemma}}}}

    records = [step(1, 5, 3, 2 / 5), step(2, 8, 0, 2 / 8), {"event": "run_end", "run_id": "r", "steps": 2}]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["agents"]["smollm2"]["peer_grad_frac"] == pytest.approx(4 / 16)
    assert report["steps"][0]["agents"]["smollm2"]["cross"]["gemma3"]["received"] == 8
    md = render_markdown(report)
    step1 = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    assert "gemma3→smollm2 0.500 (50.0%/0.0%, 2/8)" in step1
    screens = next(line for line in md.splitlines() if line.startswith("| gemma3→smollm2"))
    assert screens.split(" | ")[1] == "16" and screens.split(" | ")[9] == "3"   # rows seen, left out


def test_without_screen_metrics_the_trained_and_truncated_rows_are_the_rows_received(tmp_path):
    b = {"rows": 6, "dropped_truncated": 2, "grad_frac": 0.5, "s_mean": 0.9, "clip_low": 0.0, "clip_high": 0.0}
    records = [{"event": "step", "step": 1, "agents": {"a": {"per_source": {"b": b}}}}]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["agents"]["a"]["peer_grad_frac"] == pytest.approx(3 / 8)
    assert "b→a 0.900 (0.0%/0.0%, 3/8)" in render_markdown(report)
