"""benchmarks/simulate_under_load.py: what it records of a run under CPU burners — each attempt's exit code, the
operator's cause line, a run cut at the wall-clock limit, the sites' not-carried-out lines, and the table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import simulate_under_load as bench  # noqa: E402


def test_steps_override_changes_only_the_run_steps_line(tmp_path):
    cfg = tmp_path / "sim.toml"
    cfg.write_text('[run]\nrun_id = "x"\nsteps = 2\nprompts_per_step = 2\n[[agents]]\nname = "a"\n')
    work = tmp_path / "work"
    work.mkdir()
    copy = bench.with_steps(cfg, 5, work)
    assert copy != cfg
    assert copy.read_text() == cfg.read_text().replace("steps = 2\n", "steps = 5\n")
    assert bench.with_steps(cfg, None, tmp_path) == cfg


def test_steps_override_of_a_config_without_steps_names_the_file(tmp_path):
    cfg = tmp_path / "sim.toml"
    cfg.write_text('[run]\nrun_id = "x"\n')
    with pytest.raises(SystemExit, match="sim.toml has no 'steps = N' line"):
        bench.with_steps(cfg, 3, tmp_path)


def test_an_attempt_keeps_the_exit_code_and_the_cause_lines(tmp_path):
    script = ("print('step 1 done'); "
              "print('run ended: finished:failed (No heartbeat received from the task); run the same command to resume'); "
              "raise SystemExit(1)")
    rec = bench.attempt([sys.executable, "-c", script], timeout=60, log_path=tmp_path / "a.log")
    assert rec["rc"] == 1
    assert rec["cause_lines"] == ["run ended: finished:failed (No heartbeat received from the task); "
                                  "run the same command to resume"]
    assert rec["last_line"].endswith("run the same command to resume")


def test_an_attempt_past_its_limit_is_stopped_and_recorded_as_a_timeout(tmp_path):
    rec = bench.attempt([sys.executable, "-c", "import time; time.sleep(60)"], timeout=1, log_path=tmp_path / "b.log")
    assert str(rec["rc"]).startswith("timeout after 1 s")
    assert rec["wall_s"] < 30


def test_the_sites_not_carried_out_lines_are_read_from_the_run_logs(tmp_path):
    logs = tmp_path / "run" / "logs"
    logs.mkdir(parents=True)
    (logs / "site-alice.log").write_text("ready\nWARNING an order from the coordinator was not carried out: "
                                         "Flower withdrew the task before it ran\nstep 2 trained\n")
    (logs / "superlink.log").write_text("INFO all fine\n")
    assert bench.log_causes(tmp_path / "run") == [
        "site-alice.log: WARNING an order from the coordinator was not carried out: Flower withdrew the task before it ran"]
    assert bench.log_causes(tmp_path / "missing") == []


def test_the_table_shows_a_failed_attempt_with_its_cause_and_the_resume_that_finished(tmp_path):
    (tmp_path / "cells").mkdir()
    cause = "run ended by Flower: No heartbeat received from the task; run the same command to resume"
    cell = {"burners": 32, "cpus": 2, "load_mean": 30.5, "load_max": 34.0, "completed": True,
            "site_lines": ["site-a.log: not carried out"],
            "attempts": [{"rc": 1, "wall_s": 400.2, "step": 1, "cause_lines": ["error: x", cause]},
                         {"rc": 0, "wall_s": 300.0, "step": 4, "cause_lines": []}]}
    (tmp_path / "cells" / "burners-32.json").write_text(json.dumps(cell))
    (tmp_path / "meta.json").write_text(json.dumps({"command": "python benchmarks/simulate_under_load.py"}))
    rows = [r for r in bench.summarize(tmp_path).splitlines() if r.startswith("| 32 ")]
    assert rows == [f"| 32 | 2 | 30.5 / 34.0 | 0 | 1 | 400 | 1 | {cause} |  |",
                    "| 32 | 2 | 30.5 / 34.0 | 1 | 0 | 300 | 4 |  | 1 |"]
    assert (tmp_path / "results.md").read_text().startswith("# `hacrl-fed simulate` beside CPU burners")
