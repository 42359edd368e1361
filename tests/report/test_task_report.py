"""The run report per task: held-out before → after per task, rollout accuracy and P̂(t), from metrics.jsonl."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from hacrl_fed.coordinator.step_record import task_scores
from hacrl_fed.report.run_report import build_report, plot_report, render_markdown


def _step(step: int, acc: dict, cap: dict) -> dict:
    return {"event": "step", "step": step, "timing": {"step_s": 5.0},
            "agents": {"a": {"status": "trained", "accuracy": 0.5, "capability": 0.5, "per_source": {},
                             "task_accuracy": acc, "task_capability": cap}}}


def _eval(step: int, sums: float, words: float) -> dict:
    return {"event": "eval", "step": step, "agents": {"a": {"avg@1": (sums + words) / 2, "task/sums/accuracy": sums,
                                                             "task/words/accuracy": words}}}


def test_per_task_section_and_plot(tmp_path):
    records = [_eval(0, 0.25, 0.0), _step(1, {"sums": 0.5}, {"sums": 0.5}),
               _step(2, {"sums": 1.0, "words": 0.0}, {"sums": 0.75, "words": 1e-8}), _eval(2, 0.75, 0.125)]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["tasks"]["sums"]["a"] == {"held_out_before": 0.25, "held_out_after": 0.75,
                                            "rollout_accuracy": 0.75, "final_capability": 0.75}
    assert report["tasks"]["words"]["a"]["rollout_accuracy"] == 0.0
    md = render_markdown(report)
    assert "## Per task" in md
    assert "| sums | 25.0% → 75.0% | 75.0% / 0.750 |" in md
    assert plot_report(report, tmp_path / "plot.png").stat().st_size > 0


def test_a_single_task_run_has_no_per_task_section(tmp_path):
    report = build_report([_step(1, {}, {}), {"event": "eval", "step": 1, "agents": {"a": {"avg@1": 0.5}}}],
                          run_dir=tmp_path, phases={}, agents={})
    assert report["tasks"] == {} and "## Per task" not in render_markdown(report)


def test_task_scores_count_each_held_out_prompt_once_and_ignore_the_rest():
    tasks = {"s1": "sums", "s2": "sums", "w1": "words"}
    results = [NS(prompt_id="s1", correct=1, total=1), NS(prompt_id="s1", correct=0, total=1),   # a repeat
               NS(prompt_id="s2", correct=0, total=1), NS(prompt_id="w1", correct=5, total=1),   # out of range
               NS(prompt_id="zz", correct=1, total=1)]                                            # not held out
    assert task_scores(results, tasks) == pytest.approx({"task/sums/accuracy": 0.5})
