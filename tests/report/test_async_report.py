"""The run report of an asynchronous run (docs/async.md): its ``update`` lines count as each site's trained steps,
with the accuracy of the site's batch of that plan, and each site's "after" is its own last evaluation."""

from __future__ import annotations

from hacrl_fed.report.run_report import build_report, render_markdown


def records() -> list[dict]:
    out = [{"event": "run_start", "run_id": "r", "mode": "async", "time": 0.0},
           {"event": "eval", "step": 0, "prompts": 4, "agents": {"fast": {"avg@1": 0.25}, "slow": {"avg@1": 0.25}}}]
    for agent, plans in (("fast", (1, 2, 3)), ("slow", (1, 3))):
        for i, plan in enumerate(plans, 1):
            out.append({"event": "batch", "agent": agent, "plan": plan, "status": "accepted", "accuracy": plan / 10,
                        "capability": 0.2, "task_accuracy": {}})
            out.append({"event": "update", "agent": agent, "own_step": i, "plan": plan, "status": "trained",
                        "per_source": {}, "train": {}, "train_rejected": [], "bytes_in": 100, "bytes_out": 50,
                        "order_s": 2.0})
    out += [{"event": "eval", "step": 3, "agent": "fast", "prompts": 4, "agents": {"fast": {"avg@1": 0.75}}},
            {"event": "eval", "step": 2, "agent": "slow", "prompts": 4, "agents": {"slow": {"avg@1": 0.5}}},
            {"event": "run_end", "run_id": "r", "mode": "async", "steps": 3, "updates": {"fast": 3, "slow": 2}}]
    return out


def test_an_async_run_reports_each_sites_updates_and_last_evaluation(tmp_path):
    report = build_report(records(), run_dir=tmp_path, phases={}, agents={})
    fast, slow = report["agents"]["fast"], report["agents"]["slow"]
    assert (fast["steps_trained"], slow["steps_trained"]) == (3, 2)
    assert (fast["accuracy_before"], fast["accuracy_after"], slow["accuracy_after"]) == (0.25, 0.75, 0.5)
    assert fast["wire_bytes_per_step"] == 150
    assert [s["agents"]["fast"]["accuracy"] for s in report["steps"] if "fast" in s["agents"]] == [0.1, 0.2, 0.3]
    assert "| slow |" in render_markdown(report)
