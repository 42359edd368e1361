"""benchmarks/task_baseline.py: the share of groups that carry a gradient, alone and joint, and its table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import task_baseline as bench  # noqa: E402


def test_a_group_carries_a_gradient_only_when_its_rewards_differ():
    own = {"p0": 0, "p1": 1, "p2": 4, "p3": 3}
    assert bench.signal_share(own) == 0.5
    assert bench.signal_share({"p0": 0, "p1": 0}) == 0.0
    assert bench.signal_share({}) == 0.0
    assert bench.signal_share({"p0": 1}, samples=1) == 0.0


def test_the_joint_group_has_a_gradient_where_either_agent_is_right_some_of_the_time():
    alone = {"p0": 0, "p1": 0, "p2": 0, "p3": 4}
    peer = {"p0": 2, "p1": 0, "p2": 4, "p3": 4}
    assert bench.signal_share(alone) == 0.0
    # p0: 0 + 2 of 8, p2: 0 + 4 of 8 are mixed; p1 all wrong; p3 all right
    assert bench.signal_share(alone, peer) == 0.5
    # a problem only one agent answered counts as all wrong for the other
    assert bench.signal_share({"p0": 4}, {"p1": 1}) == 1.0


def _cell(agent: str, label: str, correct: dict[str, int]) -> dict:
    return {"agent": agent, "label": label, "generator": label.rsplit("-", 1)[0], "config": {},
            "problems": len(correct),
            "greedy": {"accuracy": 0.0, "correct": {k: 0 for k in correct}, "samples": 1, "outcomes": {}},
            "sampled": {"accuracy": sum(correct.values()) / (4 * len(correct)), "correct": correct, "samples": 4,
                        "outcomes": {}}}


def test_summary_writes_the_signal_table_only_for_tasks_both_agents_have(tmp_path: Path):
    (tmp_path / "cells").mkdir()
    (tmp_path / "meta.json").write_text(json.dumps({"commands": ["x"], "system_prompt": "s", "max_new_tokens": 8}))
    cells = [_cell("gemma3", "chain_sum-l1", {"a": 0, "b": 0}), _cell("smollm2", "chain_sum-l1", {"a": 1, "b": 0}),
             _cell("smollm2", "products-l1", {"a": 2, "b": 2})]
    for c in cells:
        (tmp_path / "cells" / f"{c['agent']}--{c['label']}.json").write_text(json.dumps(c))
    bench.summarize(tmp_path)
    md = (tmp_path / "results.md").read_text()
    table = md.split("## Groups that carry a gradient")[1]
    assert "| task | gemma3 alone | smollm2 alone | joint |" in table
    assert "| chain_sum-l1 | 0 | 50 | 50 |" in table
    assert "products-l1" not in table
