"""Coordinator state persistence and the rollback-able metrics log."""

from __future__ import annotations

import json
import math
import os

import pytest

from hacrl_fed.coordinator.state import CoordinatorState, MetricsLog, StateError, load_state, run_digest, save_state


def test_state_round_trips_and_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "c" / "state.json"
    state = CoordinatorState(run_id="r", config_digest="d", step=5, sampler={"epoch": 1, "offset": 3},
                             capability={"history": {"a": [0.25]}}, metrics_offset=1234)
    state.add_totals("a", rows=4, reason_x=1)
    state.add_totals("a", rows=2)
    save_state(path, state)
    loaded = load_state(path, run_id="r", config_digest="d")
    assert loaded == state and loaded.totals == {"a": {"rows": 6, "reason_x": 1}}

    # a crash while writing (os.replace fails) leaves the previous state intact and no temp file
    state.step = 6

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        save_state(path, state)
    monkeypatch.undo()
    assert load_state(path, run_id="r", config_digest="d").step == 5
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_missing_state_is_none_and_bad_state_is_refused(tmp_path):
    path = tmp_path / "state.json"
    assert load_state(path, run_id="r", config_digest="d") is None
    path.write_text("{not json")
    with pytest.raises(StateError, match="unreadable"):
        load_state(path, run_id="r", config_digest="d")
    path.write_text(json.dumps({"run_id": "r", "config_digest": "d", "step": -1}))
    with pytest.raises(StateError, match="malformed"):
        load_state(path, run_id="r", config_digest="d")
    path.write_text(json.dumps({"run_id": "r", "config_digest": "d", "surprise": 1}))
    with pytest.raises(StateError, match="malformed"):
        load_state(path, run_id="r", config_digest="d")
    save_state(path, CoordinatorState(run_id="r", config_digest="d"))
    with pytest.raises(StateError, match="not 'other'"):
        load_state(path, run_id="other", config_digest="d")
    with pytest.raises(StateError, match="different settings"):
        load_state(path, run_id="r", config_digest="changed")


def test_state_with_nan_is_not_written(tmp_path):
    with pytest.raises(ValueError):
        save_state(tmp_path / "s.json", CoordinatorState(run_id="r", config_digest="d", elapsed_s=math.nan))


def test_digest_depends_on_settings_not_key_order():
    assert run_digest({"a": 1, "b": [1, 2]}) == run_digest({"b": [1, 2], "a": 1})
    assert run_digest({"a": 1}) != run_digest({"a": 2})


def test_metrics_log_appends_and_rolls_back(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    first = log.append({"event": "step", "step": 1, "x": math.inf})
    log.append({"event": "step", "step": 2})
    assert [r["step"] for r in log.read()] == [1, 2]
    assert log.read()[0]["x"] is None  # strict JSON: non-finite numbers become null
    again = MetricsLog(path, offset=first)
    assert [r["step"] for r in again.read()] == [1]
    again.append({"event": "step", "step": 2, "redo": True})
    assert [r.get("redo", False) for r in again.read()] == [False, True]
    with pytest.raises(StateError, match="expects at least"):
        MetricsLog(path, offset=10**6)
