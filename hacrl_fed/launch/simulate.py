"""``hacrl-fed simulate``: every agent of a run on one machine, over loopback (ARCHITECTURE.md §1).

The production code path, started by one command: the processes ``hacrl-fed server`` and one
``hacrl-fed client`` per agent would start, bound to 127.0.0.1, under one
:class:`~hacrl_fed.launch.supervise.Supervisor`::

    <output_dir>/<run_id>-<YYYYmmdd-HHMMSS>/     the run directory
      simulate.resolved.json, server.resolved.json
      keys/     roster.toml, <agent>.ed25519.key, <agent>.node.key …  (generated)
      tls/      ca.crt, server.pem, server.key                         (tls = true only)
      <agent>/  client.resolved.toml, worker.token (0600), checkpoints/, export/ (the final model, plain Hugging Face)
      logs/     superlink.log, worker-<agent>.log, supernode-<agent>.log, flwr-run.log
      metrics.jsonl, coordinator/state.json                            (the coordinator's)
      report.md, report.json, plot.png

1. generate every agent's identity and the roster (and TLS material with ``tls = true``);
2. start ``flower-superlink``: insecure on loopback, or TLS + SuperNode auth with every node key registered;
3. start every agent worker at once, each pinned to its device (:func:`worker_env`), each with a fresh
   worker token that every call to it carries (:mod:`hacrl_fed.protocol.worker_token`);
4. start one ``flower-supernode`` per agent, then ``flwr run`` (the ServerApp evaluates every agent
   on the held-out split before the first and after the last step, greedy, via the worker's Evaluate RPC);
5. follow ``metrics.jsonl`` with a progress display (:mod:`hacrl_fed.report.progress`);
6. export every final model (Checkpoint EXPORT), read each worker's peak RSS, stop every process
   (also on Ctrl-C, SIGTERM or a child that dies), and write the report (:mod:`hacrl_fed.report.run_report`).

:func:`run_simulation` returns a :class:`SimulationResult`; ``resume=RUN_DIR`` restarts a run
directory: the coordinator resumes at its last finished step, the workers from their checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hacrl_fed.config import SimulateConfig
from hacrl_fed.launch import processes as launch
from hacrl_fed.launch.run_end import run_end_line
from hacrl_fed.launch.simulate_setup import (
    DEFAULT_CONFIG,
    Layout,
    default_config,
    load_layout,
    prepare_run,
    worker_env,
)
from hacrl_fed.launch.supervise import (
    ManagedProcess,
    Shutdown,
    Supervisor,
    free_port,
)
from hacrl_fed.protocol.worker_token import TOKEN_FILE, TokenFileError, read_token, write_token
from hacrl_fed.site.watch import TaskWatcher

__all__ = ["DEFAULT_CONFIG", "Layout", "SimulationError", "SimulationResult", "default_config", "load_layout",
           "peak_rss_bytes", "prepare_run", "run_simulation", "worker_env"]

log = logging.getLogger("hacrl_fed.simulate")

WORKER_LOAD_TIMEOUT_S = 1800.0
"""Seconds a worker may take to load its model (a cold hub download can be slow)."""
KEEP_CHECKPOINTS = 3
"""Checkpoints a worker keeps (``AgentWorker``'s ``keep_checkpoints``), for the disk estimate."""


class SimulationError(RuntimeError):
    """A process of the simulation failed to start or died; the message has its log tail."""


@dataclass
class SimulationResult:
    """What :func:`run_simulation` did. ``exit_code`` 0 = the run completed and the report was written."""

    run_dir: Path
    exit_code: int
    status: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    """Wall seconds of the phases this process saw (setup, load_models, run, export, report, total)."""
    agents: dict[str, dict[str, object]] = field(default_factory=dict)
    """Per agent: device, load_s, peak_rss_bytes, export_dir."""
    report: dict | None = None


# --------------------------------------------------------------------------- processes


def _launch_workers(sup: Supervisor, layout: Layout, view) -> dict[str, tuple[ManagedProcess, Path, float]]:
    """Start every worker at once (model loading overlaps). Returns name → (process, address file, start time)."""
    cpu_workers = sum(d == "cpu" for d in layout.devices.values())
    started: dict[str, tuple[ManagedProcess, Path, float]] = {}
    for name, client in layout.clients.items():
        site = layout.run_dir / name
        addr_file = site / "worker.address"
        addr_file.unlink(missing_ok=True)
        write_token(token_path(layout, name))
        argv = [sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(site / "client.resolved.toml"),
                "--address", client.agent.worker_address, "--address-file", str(addr_file),
                "--status-file", str(status_path(layout, name)), "--token-file", str(token_path(layout, name))]
        env = worker_env(layout.devices[name], cpu_workers=cpu_workers)
        started[name] = (sup.start(f"worker-{name}", argv, env=env), addr_file, time.monotonic())
        view.loading(name, layout.devices[name], client.agent.model.name_or_path)
    return started


def status_path(layout: Layout, name: str) -> Path:
    """The status file of agent ``name``'s worker (:mod:`hacrl_fed.status`)."""
    return layout.run_dir / name / "status.json"


def token_path(layout: Layout, name: str) -> Path:
    """The worker token file of agent ``name``'s site (written fresh at every start)."""
    return layout.run_dir / name / TOKEN_FILE


def _poll_status(layout: Layout, view) -> None:
    """Hand every worker's status file, as it is now, to the view (a missing or partial one is skipped)."""
    for name in layout.clients:
        try:
            view.status(name, json.loads(status_path(layout, name).read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue


def _await_workers(started: Mapping[str, tuple[ManagedProcess, Path, float]], view,
                   layout: Layout) -> dict[str, tuple[ManagedProcess, str, float]]:
    """Wait until every worker wrote its address and answers Health. Returns name → (process, address, load s)."""
    from hacrl_fed.site.worker_link import WorkerError, wait_until_healthy

    ready: dict[str, tuple[ManagedProcess, str, float]] = {}
    deadline = time.monotonic() + WORKER_LOAD_TIMEOUT_S
    while len(ready) < len(started):
        for name, (proc, addr_file, t0) in started.items():
            if name in ready:
                continue
            if not proc.alive():
                raise SimulationError(f"worker {name} exited with code {proc.returncode} while loading:\n{proc.tail()}")
            if addr_file.exists():
                address = addr_file.read_text(encoding="utf-8").strip()
                try:
                    wait_until_healthy(address, 60.0, token=read_token(token_path(layout, name)), alive=proc.alive)
                except (WorkerError, TokenFileError) as err:
                    raise SimulationError(f"worker {name} at {address} is not healthy: {err}\n{proc.tail()}") from None
                ready[name] = (proc, address, time.monotonic() - t0)
                view.loaded(name, ready[name][2])
        if time.monotonic() > deadline:
            raise SimulationError(f"workers not ready after {WORKER_LOAD_TIMEOUT_S:g} s: "
                                  f"{', '.join(sorted(set(started) - set(ready)))}")
        _poll_status(layout, view)
        time.sleep(0.2)
    _poll_status(layout, view)
    return ready


def _start_superlink(sup: Supervisor, layout: Layout) -> tuple[ManagedProcess, dict[str, str]]:
    """``flower-superlink`` and its ServerApp executor (+ every node key registered with TLS). Returns the SuperLink
    and the ``flwr`` CLI env."""
    sl = layout.server.superlink
    flwr_home = layout.run_dir / "flwr"
    launch.write_flwr_config(flwr_home, f"127.0.0.1:{sl.port}", insecure=sl.insecure, root_certificates=sl.ca_cert)
    env = launch.flwr_env(flwr_home)
    superlink, _ = launch.start_warm_superlink(sup, host=sl.host, port=sl.port, database=sl.database, env=env,
                                               secret_file=layout.run_dir / "superexec.secret", insecure=sl.insecure,
                                               ca_cert=sl.ca_cert, server_cert=sl.server_cert,
                                               server_key=sl.server_key, node_auth=sl.node_auth)
    if sl.node_auth:
        for name, client in layout.clients.items():
            launch.register_supernode(env, str(client.node_key).removesuffix(".key") + ".pub", name)
    return superlink, env


def _start_supernodes(sup: Supervisor, layout: Layout, addresses: Mapping[str, str], view) -> None:
    """One ``flower-supernode`` per agent, its own ``FLWR_HOME`` and ClientApp API port, and its ClientApp executor;
    an order an agent does not carry out is one line on the terminal (:class:`~hacrl_fed.site.watch.TaskWatcher`)."""
    for name, client in layout.clients.items():
        tasks = TaskWatcher(lambda level, msg, name=name: (log.log(level, "%s: %s", name, msg),
                                                          view.message(f"{name}: {msg}")))
        launch.start_warm_supernode(sup, f"supernode-{name}", superlink=client.superlink, port=free_port(),
                                    node_config={"agent-name": name, "worker-address": addresses[name],
                                                 "worker-token-file": str(token_path(layout, name))},
                                    env=launch.flwr_env(layout.run_dir / name / "flwr"),
                                    secret_file=layout.run_dir / name / "superexec.secret", insecure=client.insecure,
                                    root_certificates=client.root_certificates, node_key=client.node_key,
                                    on_task_line=tasks.feed)


def _follow(sup: Supervisor, run: ManagedProcess, layout: Layout, view) -> None:
    """Feed new metrics lines and the workers' status to ``view`` until ``flwr run`` exits; raise if another
    child died."""
    offset = 0
    while True:
        done = not run.alive()
        _poll_status(layout, view)
        if layout.metrics_path.exists():
            with open(layout.metrics_path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[:chunk.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.decode("utf-8").splitlines():
                if line.strip():
                    view.record(json.loads(line))
        if done:
            return
        gone = next((p for p in sup.procs if p is not run and not p.alive()), None)
        if gone is not None:
            raise SimulationError(f"{gone.name} exited with code {gone.returncode} during the run:\n{gone.tail()}")
        time.sleep(0.5)


def peak_rss_bytes(pid: int) -> int | None:
    """Peak resident set size (``VmHWM``) of a live process in bytes; None where /proc does not have it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _export(layout: Layout, workers: Mapping[str, tuple[ManagedProcess, str, float]], view,
            agents: dict[str, dict[str, object]]) -> bool:
    """Checkpoint EXPORT of every worker into ``<run dir>/<agent>/export``; records ``export_dir`` or
    ``export_error`` in ``agents``. Returns True when every export succeeded."""
    import grpc

    from hacrl_fed.v1 import worker_pb2 as wpb
    from hacrl_fed.worker.service import connect

    ok = True
    for name, (_, address, _) in workers.items():
        view.exporting(name)
        try:
            token = read_token(token_path(layout, name))
        except TokenFileError as err:
            ok, agents[name]["export_error"] = False, str(err)
            view.message(f"export of {name} failed: {err}")
            continue
        channel, stub = connect(address, token)
        req = wpb.CheckpointRequest(kind=wpb.CheckpointRequest.EXPORT, path=str(layout.run_dir / name / "export"))
        try:
            agents[name]["export_dir"] = stub.Checkpoint(req, timeout=1800).path
            view.exported(name, str(agents[name]["export_dir"]))
        except grpc.RpcError as err:
            ok = False
            agents[name]["export_error"] = f"{err.code().name}: {err.details()}"
            view.message(f"export of {name} failed: {agents[name]['export_error']}")
        finally:
            channel.close()
    return ok


# --------------------------------------------------------------------------- the run


def _run_flower(sup: Supervisor, layout: Layout, env: Mapping[str, str], view,
                phases: dict[str, float]) -> tuple[int, str]:
    """``flwr run`` of the ServerApp, followed to its end. Returns (exit code, Flower run status); a run that did not
    complete is explained in one line (:func:`~hacrl_fed.launch.run_end.run_end_line`) on the terminal."""
    app_dir = launch.install_app(layout.run_dir / "flwr_app")
    t0 = time.monotonic()
    run = launch.start_run(sup, app_dir, {"config-path": str(layout.run_dir / "server.resolved.json")}, env=env)
    try:
        _follow(sup, run, layout, view)
    except Shutdown:
        if (rid := launch.run_id_of(run)) is not None:
            launch.stop_run(env, rid)
        raise
    phases["run_s"] = time.monotonic() - t0
    rid = launch.run_id_of(run)
    status, details = launch.run_outcome(env, rid) if rid is not None else ("", "")
    try:
        lines = (sup.log_dir / "serverapp.log").read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        lines = []
    resume = f"resume it with `hacrl-fed simulate --resume {layout.run_dir}`"
    if (line := run_end_line(rid, status, details, lines, resume=resume)) is not None:
        log.error("%s", line)
        view.message(line)
    return int(run.returncode or 0), status


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
    """``hacrl_fed.*`` log lines (process starts and stops with their pids …) into ``path`` meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("hacrl_fed")
    old_level = logger.level
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.close()


def run_simulation(cfg: SimulateConfig | None = None, *, output_dir: str | Path | None = None,
                   run_name: str | None = None, resume: str | Path | None = None, console=None,
                   progress: bool = True) -> SimulationResult:
    """Run (or, with ``resume``, continue) a simulated federation end to end; see the module docstring.

    ``run_name`` names the run directory and the run id (default ``<run.run_id>-<time>``; sampling does not
    depend on it: its seeds derive from ``run.seed``, the step and the agent). Returns the result
    once every process is stopped; ``exit_code`` is 0 when the run completed,
    128 + signal number after Ctrl-C/SIGTERM, 1 when the run ended otherwise. Raises ConfigError
    for a bad configuration or run directory and SimulationError (with the log tail) when a
    process fails to start or dies; no child process outlives this call.
    """
    from hacrl_fed.report.progress import SimulationView
    from hacrl_fed.report.run_report import write_report

    t_start = time.monotonic()
    if resume is not None:
        layout = load_layout(resume)
    elif cfg is not None:
        layout = prepare_run(cfg, output_dir=output_dir, run_name=run_name)
    else:
        raise ValueError("give a config or a run directory to resume")
    launch.check_importable(["hacrl_fed.flower.server_app", "hacrl_fed.flower.client_app"])
    result = SimulationResult(layout.run_dir, 1, phases={"setup_s": time.monotonic() - t_start})
    view = SimulationView(layout.config, layout.run_dir, console=console, enabled=progress)
    with _log_to(layout.run_dir / "logs" / "simulate.log"), Supervisor(layout.run_dir / "logs") as sup, view:
        sup.handle_signals()
        log.info("simulating %d agents in %s", len(layout.clients), layout.run_dir)
        try:
            code, status = _run_processes(sup, layout, view, result)
        except Shutdown as sig:
            log.info("%s: stopping every process", sig)
            view.message(f"{sig}: stopping every process")
            result.exit_code = 128 + sig.signum
            return result
        log.info("run ended: exit code %d, Flower status %r; stopping every process", code, status)
    result.status = status
    result.phases["total_s"] = time.monotonic() - t_start  # the report's own ~seconds are not in it
    try:  # also for a run that did not complete: the report shows how far it got
        result.report = write_report(layout.run_dir, phases=result.phases, agents=result.agents)
        view.summary(result.report)
    except (OSError, ValueError) as err:
        view.message(f"no report: {err}")
    result.exit_code = 0 if code == 0 and status.endswith("completed") else 1
    return result


def _run_processes(sup: Supervisor, layout: Layout, view, result: SimulationResult) -> tuple[int, str]:
    """Start everything, run, export; fills ``result.phases`` and ``result.agents``."""
    phases, t0 = result.phases, time.monotonic()
    started = _launch_workers(sup, layout, view)
    _, env = _start_superlink(sup, layout)
    workers = _await_workers(started, view, layout)
    phases["load_models_s"] = time.monotonic() - t0
    view.disk(keep_checkpoints=KEEP_CHECKPOINTS)
    for name, (proc, address, load_s) in workers.items():
        result.agents[name] = {"device": layout.devices[name], "model": layout.clients[name].agent.model.name_or_path,
                               "load_s": load_s, "worker_pid": proc.pid, "worker_address": address}
    t1 = time.monotonic()
    _start_supernodes(sup, layout, {n: w[1] for n, w in workers.items()}, view)
    phases["flower_start_s"] = time.monotonic() - t1
    code, status = _run_flower(sup, layout, env, view, phases)
    if code == 0 and status.endswith("completed"):
        t2 = time.monotonic()
        if not _export(layout, workers, view, result.agents):
            code = 1
        phases["export_s"] = time.monotonic() - t2
    else:
        view.message(f"the run ended with exit code {code}, status {status!r}; see {layout.run_dir / 'logs'}")
    for name, (proc, _, _) in workers.items():
        result.agents[name]["peak_rss_bytes"] = peak_rss_bytes(proc.pid)
    return code, status
