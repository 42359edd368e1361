"""The coordinator does not trust its run directory: every field of ``state.json`` is validated when it is read
back (one line naming the file and the field), a ``next_plan`` of another run or step is dropped, ``metrics.jsonl``
with a garbage line or an offset inside a line is read, a state that records no metrics history while the file
holds some is refused, and links out of the run directory are refused (issue 25, D5)."""

from __future__ import annotations

import base64
import json
import logging

import pytest

from fedutil import make_plan
from hacrl_fed.coordinator.rounds import run_coordinator
from hacrl_fed.coordinator.state import CoordinatorState, MetricsLog, StateError, load_state, save_state
from inprocess import InProcessTransport
from test_rounds import make_setup, read_metrics, sites


def _saved(path, **fields) -> None:
    """A valid state of run ``r`` at step 5, then ``fields`` written over it as raw JSON."""
    save_state(path, CoordinatorState(run_id="r", config_digest="d", step=5, metrics_offset=10))
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


BAD_FIELDS = {
    "step_text": ("step", "3"),
    "step_bool": ("step", True),
    "step_beyond_run": ("step", 10**12),
    "offset_float": ("metrics_offset", 1.5),
    "offset_huge": ("metrics_offset", 10**30),
    "totals_list": ("totals", [1]),
    "totals_agent_number": ("totals", {"a": 5}),
    "totals_text_value": ("totals", {"a": {"rows": "x"}}),
    "totals_huge_value": ("totals", {"a": {"rows": 1e300}}),
    "elapsed_text": ("elapsed_s", "x"),
    "elapsed_negative": ("elapsed_s", -1.0),
    "restarts_negative": ("restarts", -1),
    "restarts_float": ("restarts", 1.5),
    "last_eval_after_step": ("last_eval_step", 99),
    "trained_steps_not_lists": ("trained_steps", {"a": 3}),
    "trained_steps_text": ("trained_steps", {"a": [1, "2"]}),
    "trained_steps_descending": ("trained_steps", {"a": [3, 2]}),
    "trained_steps_after_step": ("trained_steps", {"a": [1, 9]}),
    "sampler_list": ("sampler", [1]),
    "capability_text": ("capability", "x"),
    "pending_list": ("pending", [1]),
    "pending_other_step": ("pending", {"step": 7, "agents": {}}),
    "pending_agents_list": ("pending", {"step": 5, "agents": [1]}),
    "next_plan_number": ("next_plan", 5),
    "version_text": ("version", "1"),
    "run_id_number": ("run_id", 5),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_every_state_field_is_validated_naming_file_and_field(tmp_path, case):
    field, value = BAD_FIELDS[case]
    path = tmp_path / "state.json"
    _saved(path, **{field: value})
    with pytest.raises(StateError) as err:
        load_state(path, run_id="r", config_digest="d", steps=20)
    message = str(err.value)
    assert str(path) in message and repr(field) in message and "\n" not in message, message


def test_a_state_file_that_is_not_an_object_or_not_a_regular_file_is_refused(tmp_path):
    import os

    path = tmp_path / "state.json"
    for text in ("[1, 2]", "5", "[" * 100000 + "]" * 100000):
        path.write_text(text)
        with pytest.raises(StateError, match="state.json"):
            load_state(path, run_id="r", config_digest="d")
    path.unlink()
    os.mkfifo(path)  # reading it would block forever
    with pytest.raises(StateError, match="not a regular file"):
        load_state(path, run_id="r", config_digest="d")


def test_a_state_with_more_steps_than_the_run_is_refused(tmp_path, federation):
    setup = make_setup(tmp_path, federation, steps=1)
    run_coordinator(setup, InProcessTransport(sites(federation)))
    data = json.loads(setup.state_path.read_text())
    data["step"] = 10**12
    setup.state_path.write_text(json.dumps(data))
    with pytest.raises(StateError, match=r"state.json.*'step'.*run.steps is 1"):
        run_coordinator(make_setup(tmp_path, federation, steps=1), InProcessTransport(sites(federation)))


def _plan_b64(run_id: str, step: int) -> str:
    return base64.b64encode(make_plan(step, run_id=run_id).SerializeToString()).decode()


@pytest.mark.parametrize("next_plan", [_plan_b64("other-run", 6), _plan_b64("r", 9), "!!not base64!!",
                                       base64.b64encode(b"\xff\xfe garbage").decode()])
def test_a_next_plan_of_another_run_or_step_is_dropped_with_a_warning(tmp_path, caplog, next_plan):
    path = tmp_path / "state.json"
    _saved(path, next_plan=next_plan)
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.coordinator"):
        state = load_state(path, run_id="r", config_digest="d")
    assert state.next_plan == ""
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0] and "next_plan" in warnings[0]


def test_the_next_plan_of_this_run_and_the_next_step_is_kept(tmp_path):
    path, plan = tmp_path / "state.json", _plan_b64("r", 6)
    _saved(path, next_plan=plan)
    assert load_state(path, run_id="r", config_digest="d").next_plan == plan


@pytest.mark.parametrize("part", ["capability", "sampler"])
def test_an_unusable_capability_or_sampler_state_names_the_file_and_field(tmp_path, federation, part):
    setup = make_setup(tmp_path, federation, steps=1)
    run_coordinator(setup, InProcessTransport(sites(federation)))
    data = json.loads(setup.state_path.read_text())
    data[part] = {"window": "wide", "history": 3, "version": "x"}
    setup.state_path.write_text(json.dumps(data))
    with pytest.raises(StateError) as err:
        run_coordinator(make_setup(tmp_path, federation, steps=2), InProcessTransport(sites(federation)))
    assert str(setup.state_path) in str(err.value) and repr(part) in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- metrics.jsonl


def _finished(tmp_path, federation, steps=1):
    setup = make_setup(tmp_path, federation, steps=steps)
    run_coordinator(setup, InProcessTransport(sites(federation)))
    return setup


def test_a_garbage_line_in_the_metrics_is_skipped_with_a_warning(tmp_path, federation, caplog):
    setup = _finished(tmp_path, federation)
    lines = setup.metrics_path.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[0])["event"] == "run_start"
    lines[0] = b"#" * (len(lines[0]) - 1) + b"\n"  # same length: the state's offset still points at a line end
    setup.metrics_path.write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.coordinator"):
        state = run_coordinator(make_setup(tmp_path, federation, steps=2), InProcessTransport(sites(federation)))
    assert state.step == 2
    end = json.loads(setup.metrics_path.read_bytes().splitlines()[-1])
    assert end["event"] == "run_end" and end["steps"] == 2
    assert any(f"{setup.metrics_path}:1" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_metrics_records_that_are_not_objects_or_lack_fields_do_not_crash_the_run_end(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('[1]\n5\n{"event": "step"}\n{"event": "step", "timing": {"step_s": "x"}}\n'
                    '{"event": "step", "trained": true, "timing": {"step_s": 2.0, "overhead_s": 1.0}}\n')
    log = MetricsLog(path, offset=path.stat().st_size)
    assert len(log.read()) == 3  # the objects
    from hacrl_fed.coordinator.rounds import _run_end

    end = _run_end(CoordinatorState(run_id="r", config_digest="d", step=3), log)
    assert end["mean_step_s"] == 2.0 and end["mean_overhead_s"] == 1.0


def test_an_offset_inside_a_line_rolls_back_to_the_last_whole_line(tmp_path, federation, caplog):
    setup = _finished(tmp_path, federation)
    data = json.loads(setup.state_path.read_text())
    data["metrics_offset"] -= 5  # inside the run_end line
    setup.state_path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="hacrl_fed.coordinator"):
        run_coordinator(make_setup(tmp_path, federation, steps=2), InProcessTransport(sites(federation)))
    records = read_metrics(setup)  # every line is whole JSON
    assert [r["event"] for r in records].count("run_end") == 1 and records[-1]["event"] == "run_end"
    assert any(str(setup.metrics_path) in r.getMessage() and "inside a line" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("how", ["offset_zero", "state_removed"])
def test_metrics_history_without_a_state_that_records_it_is_not_truncated(tmp_path, federation, how):
    setup = _finished(tmp_path, federation)
    before = setup.metrics_path.read_bytes()
    if how == "offset_zero":
        data = json.loads(setup.state_path.read_text())
        data["metrics_offset"] = 0
        setup.state_path.write_text(json.dumps(data))
    else:
        setup.state_path.unlink()
    with pytest.raises(StateError) as err:
        run_coordinator(make_setup(tmp_path, federation, steps=2), InProcessTransport(sites(federation)))
    assert str(setup.metrics_path) in str(err.value) and "\n" not in str(err.value)
    assert setup.metrics_path.read_bytes() == before


def test_a_run_start_line_written_before_the_first_state_is_dropped(tmp_path, federation):
    """A crash between the first metrics line and the first state leaves only a run_start line: a restart starts
    the run over."""
    setup = make_setup(tmp_path, federation, steps=1)
    setup.metrics_path.parent.mkdir(parents=True)
    setup.metrics_path.write_text(json.dumps({"event": "run_start", "run_id": "run-a", "step": 0}) + "\n")
    run_coordinator(setup, InProcessTransport(sites(federation)))
    events = [r["event"] for r in read_metrics(setup)]
    assert events[0] == "run_start" and events.count("run_start") == 1


def test_a_metrics_file_linked_out_of_the_run_directory_is_refused(tmp_path, federation):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me\n")
    setup = make_setup(tmp_path, federation, steps=1)
    setup.run_dir.mkdir(parents=True)
    setup.metrics_path.symlink_to(outside)
    with pytest.raises(StateError) as err:
        run_coordinator(setup, InProcessTransport(sites(federation)))
    assert str(setup.metrics_path) in str(err.value) and "outside the run directory" in str(err.value)
    assert outside.read_text() == "keep me\n"


@pytest.mark.parametrize("link", ["file", "folder"])
def test_a_state_file_linked_out_of_the_run_directory_is_refused(tmp_path, federation, link):
    elsewhere = tmp_path / "elsewhere"
    _finished(elsewhere, federation)
    setup = make_setup(tmp_path, federation, steps=2)
    setup.run_dir.mkdir(parents=True)
    if link == "file":
        setup.state_path.parent.mkdir()
        setup.state_path.symlink_to(elsewhere / "run" / "coordinator" / "state.json")
    else:
        setup.state_path.parent.symlink_to(elsewhere / "run" / "coordinator")
    before = (elsewhere / "run" / "coordinator" / "state.json").read_bytes()
    with pytest.raises(StateError, match="outside the run directory"):
        run_coordinator(setup, InProcessTransport(sites(federation)))
    assert (elsewhere / "run" / "coordinator" / "state.json").read_bytes() == before
