"""The run report's peer-distillation section: λ_t, rows distilled by source and their NLL, from metrics.jsonl."""

from __future__ import annotations

from hacrl_fed.report.run_report import build_report, render_markdown


def _step(step: int, train: dict) -> dict:
    return {"event": "step", "step": step, "trained": ["gemma3"], "timing": {"step_s": 10.0},
            "agents": {"gemma3": {"status": "trained", "accuracy": 0.25, "capability": 0.25, "train": train,
                                  "per_source": {"gemma3": {"rows": 8}, "smollm2": {"rows": 8}}}}}


def test_distillation_section_lists_each_update(tmp_path):
    records = [_step(1, {"distill_coef": 0.5, "distill_rows": 6.0, "distill_nll": 1.25,
                         "src/smollm2/distill_rows": 4.0, "src/strong/distill_rows": 2.0}),
               _step(2, {"distill_coef": 0.25, "distill_rows": 0.0, "distill_nll": 0.0}),
               {"event": "run_end", "run_id": "r", "steps": 2}]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["steps"][0]["agents"]["gemma3"]["distill"]["per_source"] == {"smollm2": 4.0, "strong": 2.0}
    md = render_markdown(report)
    assert "## Peer distillation" in md
    lines = [line for line in md.splitlines() if line.startswith("| 1 | gemma3") or line.startswith("| 2 | gemma3")]
    assert lines[0].split(" | ")[2:] == ["0.500", "6", "smollm2 4, strong 2", "1.250 |"]
    assert lines[1].split(" | ")[2:] == ["0.250", "0", "-", "- |"]


def test_no_distillation_metrics_no_section(tmp_path):
    records = [_step(1, {"loss": 0.1})]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["steps"][0]["agents"]["gemma3"]["distill"] == {}
    assert "## Peer distillation" not in render_markdown(report)
