"""The run report of an episode run: the held-out mean reward before → after and the turns per training episode,
from metrics.jsonl (docs/multi-turn.md); nothing of it in a one-shot run's report."""

from __future__ import annotations

import pytest

from hacrl_fed.report.run_report import build_report, render_markdown


def _step(step: int, turns: float, done: float) -> dict:
    gen = {"rss_bytes": 1.0, "episode/turns_mean": turns, "episode/done_frac": done, "episode/context_cut_frac": 0.0}
    return {"event": "step", "step": step, "timing": {"step_s": 5.0},
            "agents": {"a": {"status": "trained", "accuracy": 0.6, "capability": 0.6, "per_source": {},
                             "generate": gen}}}


def _eval(step: int, won: float, reward: float) -> dict:
    return {"event": "eval", "step": step, "agents": {"a": {"avg@1": won, "reward_mean": reward}}}


def test_an_episode_run_reports_the_mean_reward_and_the_turns(tmp_path):
    records = [_eval(0, 0.03125, 0.74), _step(1, 2.0, 1.0), _step(2, 4.0, 0.5), _eval(2, 0.25, 0.84)]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["episodes"]["a"] == pytest.approx({"reward_before": 0.74, "reward_after": 0.84, "turns_mean": 3.0,
                                                     "done_frac": 0.75})
    assert report["steps"][1]["agents"]["a"]["episode"]["turns_mean"] == 4.0
    md = render_markdown(report)
    assert "## Episodes" in md and "| a | 74.0 → 84.0 | 3.0 | 75.0% |" in md


def test_a_one_shot_run_has_no_episode_section(tmp_path):
    records = [{"event": "eval", "step": 0, "agents": {"a": {"avg@1": 0.5}}},
               {"event": "step", "step": 1, "timing": {}, "agents": {"a": {"status": "trained", "accuracy": 0.5,
                                                                              "capability": 0.5, "per_source": {}}}},
               {"event": "eval", "step": 1, "agents": {"a": {"avg@1": 0.75}}}]
    report = build_report(records, run_dir=tmp_path, phases={}, agents={})
    assert report["episodes"] == {} and "## Episodes" not in render_markdown(report)
