"""The warm task executor (:mod:`hacrl_fed.flower.executor`) on a real SuperLink and SuperNode (loopback,
``--isolation process``), with a probe app (``tests/helpers/warm_app``).

The overload is reproduced without depending on the machine's load: ``flwr-clientapp`` and
``flwr-serverapp`` on ``PATH`` are replaced by scripts that wait 45 s before they start Flower's own — a
task process slower to start than the 30 s Flower allows between claiming a task and its first
heartbeat. With Flower's default launcher every task is then claimed, expires, is handed to a new
process, and so on for ever: the run never gets a reply. With the warm executor, neither script is ever
started and the run completes; an order whose handler raises is reported as not carried out, once. The CPU
a task process has used when its handler starts is compared with
the CPU of Flower's own start-up measured on this machine at the same time (a budget in CPU seconds).

When Flower ends a run itself — its ServerApp task sent no heartbeat for 60 s, reproduced by stopping the
task process (SIGSTOP) — the operator's line names that cause and says how to resume.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hacrl_fed.launch import processes as launch
from hacrl_fed.launch.run_end import RESUME, run_end_line
from hacrl_fed.launch.supervise import Supervisor, free_port
from hacrl_fed.site.watch import TaskWatcher

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "helpers" / "warm_app"
SLOW_START_S = 45


def _slow_scripts(bin_dir: Path, marker: Path) -> None:
    """``flwr-clientapp`` / ``flwr-serverapp`` that note their start in ``marker``, wait, then run Flower's."""
    bin_dir.mkdir()
    for name in ("flwr-clientapp", "flwr-serverapp"):
        real = shutil.which(name, path=str(Path(sys.executable).parent))
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} >> '{marker}'\nsleep {SLOW_START_S}\nexec '{real}' \"$@\"\n")
        script.chmod(0o755)


def _flower_import_cpu_s() -> float:
    """CPU seconds a fresh interpreter spends importing what ``flwr-clientapp`` imports before its first heartbeat."""
    code = "import time; import flwr.supernode.cli; print(time.process_time())"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def _run_probe(tmp_path: Path, sup: Supervisor, env: dict[str, str], rounds: int, fail: bool = False) -> dict:
    app_dir = tmp_path / "app"
    shutil.copytree(APP, app_dir)
    out = tmp_path / "probe.json"
    port = free_port()
    secret = launch.write_superexec_secret(tmp_path / "superexec.secret")
    link = launch.start_superlink(sup, host="127.0.0.1", port=port, database=tmp_path / "link.db", env=env,
                                  insecure=True, node_auth=False, isolation="process", superexec_secret=secret)
    launch.start_executor(sup, "executor-link", runtime_address=f"127.0.0.1:{port}", task="serverapp",
                          preload=["warm_probe"], env=env, parent_pid=link.pid, superexec_secret=secret)
    node_port = free_port()
    node = launch.start_supernode(sup, "supernode", superlink=f"127.0.0.1:{port}", port=node_port,
                                  node_config={"agent-name": "probe"}, env=env, insecure=True,
                                  isolation="process", superexec_secret=secret)
    launch.start_executor(sup, "executor-node", runtime_address=f"127.0.0.1:{node_port}", task="clientapp",
                          preload=["warm_probe"], env=env, parent_pid=node.pid, superexec_secret=secret)
    launch.write_flwr_config(tmp_path / "flwr", f"127.0.0.1:{port}", insecure=True, root_certificates=None)
    run = launch.start_run(sup, app_dir, {"out": str(out), "rounds": rounds, "nodes": 1, "fail": fail}, env=env)
    deadline = time.monotonic() + 240  # a safety net only: the run ends on its own
    while run.alive() and time.monotonic() < deadline:
        assert all(p.alive() for p in sup.procs if p is not run), [(p.name, p.tail()) for p in sup.procs]
        time.sleep(0.5)
    assert out.exists(), f"the run wrote no result:\n{run.tail()}\n{sup.procs[1].tail()}"
    return json.loads(out.read_text())


@pytest.fixture
def env(tmp_path):
    marker = tmp_path / "slow-started"
    _slow_scripts(tmp_path / "slow-bin", marker)
    base = dict(os.environ, PYTHONPATH=os.pathsep.join([str(APP), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    e = launch.flwr_env(tmp_path / "flwr", base)
    e["PATH"] = os.pathsep.join([str(tmp_path / "slow-bin"), e["PATH"]])  # Flower's launcher would find these
    return e


def test_tasks_start_warm_so_slow_task_starts_cannot_lose_a_step(tmp_path, env):
    with Supervisor(tmp_path / "logs") as sup:
        result = _run_probe(tmp_path, sup, env, rounds=2, fail=True)
        budget = _flower_import_cpu_s() / 2
    told: list[tuple[int, str]] = []
    watcher = TaskWatcher(lambda level, msg: told.append((level, msg)))
    for line in (tmp_path / "logs" / "executor-node.log").read_text().splitlines():
        watcher.feed(line)
    assert len(result["failed"]) == 1 and "ZeroDivisionError" in result["failed"][0], result["failed"]
    assert len(told) == 1 and told[0][0] == logging.WARNING, told  # the site's terminal: the failed order only
    assert "not carried out: the ClientApp failed: ZeroDivisionError: integer division or modulo by zero" in told[0][1]
    assert not (tmp_path / "slow-started").exists(), "a task was started by Flower's launcher"
    replies = result["replies"]
    assert len(replies) == 2 and all("error" not in r for r in replies), replies
    assert len({r["pid"] for r in replies}) == 2, "each message has a process of its own"
    for info in [result["server"], *replies]:
        assert info["imported-in"] != info["pid"], "the app was imported before the task process started"
        assert info["cpu-s"] < budget, f"{info['cpu-s']:.2f} CPU-s used before the handler ran (budget {budget:.2f})"


def test_a_run_flower_ends_for_a_silent_serverapp_is_explained_in_one_line(tmp_path, env):
    app_dir = tmp_path / "app"
    shutil.copytree(APP, app_dir)
    port = free_port()
    with Supervisor(tmp_path / "logs") as sup:
        link, executor = launch.start_warm_superlink(sup, host="127.0.0.1", port=port, database=tmp_path / "link.db",
                                                     env=env, secret_file=tmp_path / "superexec.secret",
                                                     insecure=True, node_auth=False)
        launch.write_flwr_config(tmp_path / "flwr", f"127.0.0.1:{port}", insecure=True, root_certificates=None)
        run = launch.start_run(sup, app_dir, {"out": str(tmp_path / "never.json"), "nodes": 1}, env=env)
        deadline = time.monotonic() + 120  # safety nets only: each wait follows what Flower reports
        while not (task := psutil.Process(executor.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.2)
        while (rid := launch.run_id_of(run)) is None or launch.run_status(env, rid) != "running":
            assert time.monotonic() < deadline, run.tail()
            time.sleep(0.5)
        task[0].suspend()  # the ServerApp (waiting for a node that never comes) now sends no heartbeat
        deadline = time.monotonic() + 240
        while not (outcome := launch.run_outcome(env, rid))[0].startswith("finished"):
            assert time.monotonic() < deadline, outcome
            time.sleep(2)
        task[0].resume()
    assert outcome == ("finished:failed", "No heartbeat received from the task")
    line = run_end_line(rid, *outcome)
    assert line == (f"the Flower run {rid} ended (finished:failed): Flower ended it: the ServerApp sent no heartbeat "
                    f"for 60 s (Flower's fixed limit) — this machine is too busy; {RESUME}")
