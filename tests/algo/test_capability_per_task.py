"""Capability per task (``algo.capability_scope = "task"``): windows per task, ratios per prompt, advantages."""

from __future__ import annotations

import json

import pytest
import torch

from hacrl_fed.algo.advantages import advantage_inputs, group_advantages_reference, row_advantages
from hacrl_fed.algo.capability import CapabilityTracker, row_ratio, task_ratios
from hacrl_fed.algo.config import AlgoConfig


def test_task_windows_keep_the_steps_where_the_task_appeared():
    t = CapabilityTracker(window=2)
    t.update({"a": 0.5}, {"a": {"sums": 1.0, "words": 0.0}})
    t.update({"a": 0.25}, {"a": {"sums": 0.5}})                   # no word problem this step
    t.update({"a": 0.0}, {"a": {"sums": 0.0}})
    assert t.task_capabilities("a") == pytest.approx({"sums": 0.25, "words": 1e-8})   # floored like P̂
    assert t.capability("a") == pytest.approx(0.125)                                  # the paper's P̂ unchanged
    assert t.task_capabilities("nobody") == {}
    with pytest.raises(ValueError, match="finite"):
        t.update({"a": 0.5}, {"a": {"sums": float("nan")}})
    assert t.steps == 3


def test_task_windows_survive_a_checkpoint_and_old_state_still_loads():
    t = CapabilityTracker(window=3)
    t.update({"a": 0.5, "b": 0.1}, {"a": {"sums": 0.75}, "b": {"sums": 0.25}})
    state = json.loads(json.dumps(t.state_dict()))
    u = CapabilityTracker(window=3)
    u.load_state_dict(state)
    assert u.task_capabilities("b") == {"sums": 0.25} and u.state_dict() == t.state_dict()
    old = {k: v for k, v in state.items() if k != "tasks"}           # a coordinator state written before tasks
    u.load_state_dict(old)
    assert u.task_capabilities("a") == {} and u.capability("a") == 0.5
    with pytest.raises(ValueError, match="malformed"):
        u.load_state_dict(state | {"tasks": {"a": {"sums": [0.1] * 4}}})   # longer than the window


def test_task_ratios_use_the_prompts_task_and_fall_back_to_the_global_ratio():
    caps = {"k": {"sums": 0.8, "words": 0.1}, "j": {"sums": 0.2, "words": 0.5}}
    prompts = {"p1": "sums", "p2": "words", "p3": "riddles", "p4": ""}
    out = task_ratios({"j": 1.5}, caps, "k", prompts)
    assert out[("j", "p1")] == pytest.approx(0.25)                  # j weaker than k on sums
    assert out[("j", "p2")] == pytest.approx(5.0)                   # and stronger on word problems
    assert ("j", "p3") not in out and ("j", "p4") not in out
    assert [row_ratio(out, "j", p) for p in ("p1", "p2", "p3", "p4")] == pytest.approx([0.25, 5.0, 1.5, 1.5])
    assert task_ratios({"j": 1.0}, {"k": {"sums": 1.0}, "j": {"sums": 1e-8}}, "k", {"p": "sums"})[("j", "p")] == 0.1


class Row:
    def __init__(self, pid, src, reward):
        self.prompt_id, self.source_agent, self.reward, self.sample_index = pid, src, reward, 0
        self.is_own = src == "k"


def test_the_baseline_weights_each_prompts_peer_rows_by_that_prompts_ratio():
    rows = [Row("p1", "k", 1.0), Row("p1", "k", 0.0), Row("p1", "j", 1.0), Row("p1", "j", 0.0),
            Row("p2", "k", 0.0), Row("p2", "k", 0.0), Row("p2", "j", 1.0), Row("p2", "j", 1.0)]
    ratios = {"j": 1.0, ("j", "p1"): 0.25, ("j", "p2"): 5.0}
    inputs = advantage_inputs(rows, ratios, learner="k")
    assert inputs.source_ratio.tolist() == [1.0, 1.0, 0.25, 0.25, 1.0, 1.0, 5.0, 5.0]
    got = row_advantages(rows, ratios, AlgoConfig(), learner="k")
    want = group_advantages_reference([r.reward for r in rows], [0, 0, 0, 0, 1, 1, 1, 1],
                                      [1.0, 1.0, 4.0, 4.0, 1.0, 1.0, 0.2, 0.2], [r.is_own for r in rows])
    assert got == pytest.approx(want)
    glob = row_advantages(rows, {"j": 1.0}, AlgoConfig(), learner="k")   # the paper's global scope differs
    assert glob != pytest.approx(got)
    assert torch.isfinite(torch.tensor(got)).all()


def test_scope_is_a_named_option_and_the_paper_preset_stays_global():
    assert AlgoConfig.preset("hacpo").capability_scope == "global"
    assert AlgoConfig.preset("hacpo_cross_family", capability_scope="task").capability_scope == "task"
    with pytest.raises(ValueError):
        AlgoConfig(capability_scope="prompt")
