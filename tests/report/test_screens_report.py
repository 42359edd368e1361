"""The run report's screen section: what each learner's screens did to each source, from metrics.jsonl."""

from __future__ import annotations

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
