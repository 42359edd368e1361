"""CapabilityTracker: window, floor, warm-up, absent agents, checkpoint state (spec §2, T7, T8)."""

from __future__ import annotations

import json
import math

import pytest

from hacrl_fed.algo.capability import CapabilityTracker, capability_ratio


def test_window_keeps_last_k_including_current():
    t = CapabilityTracker(window=3)
    for v in (1.0, 0.0, 0.0, 0.6):
        t.update({"a": v, "b": 0.3})
    assert t.capability("a") == pytest.approx(0.2)     # (0 + 0 + 0.6) / 3
    assert t.steps == 4


def test_absent_agent_keeps_its_window_and_n_agents():
    t = CapabilityTracker(window=2)
    t.update({"a": 0.2, "b": 0.4, "c": 0.8})
    t.update({"a": 0.4, "c": 0.6})                      # b missed the step
    assert t.capability("b") == pytest.approx(0.4)
    assert t.ratios("a") == pytest.approx({"a": 1.0, "b": 0.4 / 0.3, "c": 0.7 / 0.3})
    assert t.agents == ["a", "b", "c"]


def test_warmup_forces_ratio_one():
    t = CapabilityTracker(window=5, warmup_steps=2)
    t.update({"a": 0.1, "b": 0.9})
    t.update({"a": 0.1, "b": 0.9})
    assert t.ratio("b", "a") == 1.0
    t.update({"a": 0.1, "b": 0.9})
    assert t.ratio("b", "a") == pytest.approx(9.0)


def test_unknown_agent_and_bad_values_raise():
    t = CapabilityTracker()
    with pytest.raises(KeyError, match="no capability values for agent 'x'"):
        t.capability("x")
    t.update({"a": 0.5})
    with pytest.raises(ValueError, match="finite"):
        t.update({"a": 0.5, "b": math.nan})
    assert t.steps == 1 and t.agents == ["a"]         # nothing applied
    with pytest.raises(ValueError):
        CapabilityTracker(window=0)
    with pytest.raises(ValueError):
        capability_ratio(0.5, 0.5, ratio_clip=(2.0, 1.0))


def test_state_roundtrip_through_json():
    t = CapabilityTracker(window=3, warmup_steps=1)
    for i in range(5):
        t.update({"a": i / 10, "b": 1 - i / 10})
    state = json.loads(json.dumps(t.state_dict()))
    u = CapabilityTracker(window=3, warmup_steps=1)
    u.load_state_dict(state)
    assert u.steps == t.steps and u.ratio("a", "b") == t.ratio("a", "b")
    u.update({"a": 1.0, "b": 0.0})
    t.update({"a": 1.0, "b": 0.0})
    assert u.capability("a") == t.capability("a") and u.capability("b") == t.capability("b")


def test_load_rejects_mismatch_and_garbage():
    t = CapabilityTracker(window=3)
    t.update({"a": 0.5})
    with pytest.raises(ValueError, match="window 3"):
        CapabilityTracker(window=5).load_state_dict(t.state_dict())
    with pytest.raises(ValueError, match="malformed"):
        CapabilityTracker(window=3).load_state_dict({"window": 3})
    with pytest.raises(ValueError, match="malformed"):
        CapabilityTracker(window=3).load_state_dict({"window": 3, "steps": 1, "history": {"a": [0.1] * 4}})
