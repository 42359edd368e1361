"""``hacrl-fed server --config server.toml``: the coordinator host (ARCHITECTURE.md §1).

1. validate the config and the roster (a regular file of bounded size), resolve every path (relative to the
   current directory), check that the SuperLink port is free (else one line naming it and the process holding
   it), the first rows of the data files load, the output directory can be created, and the installed
   hacrl_fed is importable by the interpreter Flower's app processes use;
2. write ``<run dir>/server.resolved.json`` (what the ServerApp reads) and a private ``FLWR_HOME``
   (``<run dir>/flwr/config.toml`` with one SuperLink connection);
3. start ``flower-superlink`` (TLS and SuperNode authentication by default, ``--database``, no
   runtime dependency installation; telemetry and update checks off) with ``--isolation process`` and the warm
   executor that runs its ServerApp (:mod:`hacrl_fed.flower.executor`);
4. register every roster agent's SuperNode key (``flwr supernode register --name <agent>``);
5. ``flwr run <run dir>/flwr_app hacrl --run-config ... --stream`` and stream its log;
6. on completion, SIGINT or SIGTERM: stop the run, then every process (no orphans).

The coordinator state lives in the run directory, so running the same command again resumes the
run at the last finished step.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from hacrl_fed.config import ConfigError, ServerConfig, absolute_path
from hacrl_fed.launch import processes as launch
from hacrl_fed.launch.run_end import run_end_line
from hacrl_fed.launch.supervise import ManagedProcess, Shutdown, Supervisor, port_problem

__all__ = ["resolve_server_config", "run_server"]

log = logging.getLogger("hacrl_fed.server")


def resolve_server_config(cfg: ServerConfig, base: str | Path | None = None) -> ServerConfig:
    """A copy with every file path absolute (relative paths are relative to ``base``, default the CWD)."""
    b = Path(base or Path.cwd())
    cfg = cfg.model_copy(deep=True)
    cfg.roster = absolute_path(cfg.roster, b)  # type: ignore[assignment]
    sl = cfg.superlink
    sl.ca_cert, sl.server_cert, sl.server_key = (absolute_path(sl.ca_cert, b), absolute_path(sl.server_cert, b), absolute_path(sl.server_key, b))
    cfg.run.output_dir = absolute_path(cfg.run.output_dir, b)  # type: ignore[assignment]
    sl.database = absolute_path(sl.database, b) or str(Path(cfg.run.output_dir) / cfg.run.run_id / "superlink.db")
    data = cfg.run.data
    if data.source == "file" or (data.path and (b / data.path).exists()):
        data.path = absolute_path(data.path, b)
    data.eval_path = absolute_path(data.eval_path, b)
    return cfg


def _check_cert_covers_loopback(cert_path: str) -> None:
    """The SuperLink's own processes reach it on 127.0.0.1, so its certificate must name that address."""
    from cryptography import x509

    from hacrl_fed.launch.preflight import read_small

    pem = read_small(cert_path, "superlink.server_cert", "certificate")  # ConfigError naming the key
    try:
        cert = x509.load_pem_x509_certificate(pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound) as err:
        raise ConfigError(f"{cert_path}: not a usable server certificate ({err})") from None
    if ipaddress.ip_address("127.0.0.1") not in sans.get_values_for_type(x509.IPAddress):
        raise ConfigError(f"{cert_path}: the certificate must include the SAN 127.0.0.1 (Flower's own processes "
                          f"connect there); recreate it with `hacrl-fed keys certs --san 127.0.0.1 --san <your host>`")


def _preflight(cfg: ServerConfig) -> None:
    """Fail fast, with one clear message, on anything the run would trip over later."""
    from hacrl_fed.launch.preflight import check_data, check_report_to, check_writable, read_small
    from hacrl_fed.protocol.keys import Roster, RosterError

    sl = cfg.superlink
    busy = port_problem(sl.host, sl.port)
    if busy:
        raise ConfigError(f"superlink.port: {busy}; stop it, or choose another superlink.port")
    try:
        roster = Roster.load(cfg.roster)  # bounded: a regular file of at most MAX_ROSTER_BYTES
    except RosterError as err:
        raise ConfigError(f"roster: {err}") from None
    if len(roster) < cfg.run.min_agents:
        raise ConfigError(f"{cfg.roster}: {len(roster)} agent(s), but run.min_agents is {cfg.run.min_agents}")
    if sl.node_auth:
        missing = [a for a in roster if not roster.node_key(a)]
        if missing:
            raise ConfigError(f"{cfg.roster}: node_key missing for {', '.join(missing)} (superlink.node_auth = true "
                              f"registers every agent's SuperNode key)")
    if not sl.insecure:
        for key in ("ca_cert", "server_cert", "server_key"):
            f = getattr(sl, key)
            if not Path(f).exists():
                raise ConfigError(f"{f}: no such file (create TLS files with `hacrl-fed keys certs`)")
            read_small(f, f"superlink.{key}", "TLS file")
        _check_cert_covers_loopback(sl.server_cert)  # type: ignore[arg-type]
    check_data(cfg.run.data)
    check_report_to(cfg.run)
    check_writable(cfg.run.output_dir, "run.output_dir")
    from hacrl_fed.coordinator.rounds import check_saved_state

    # StateError; the state's terms are the run mode's, as the loop that resumes it will check them
    check_saved_state(cfg.run, Path(cfg.run.output_dir) / cfg.run.run_id)
    launch.check_importable(["hacrl_fed.flower.server_app", "hacrl_fed.flower.client_app"])


def _register_roster(cfg: ServerConfig, env: dict[str, str], key_dir: Path) -> None:
    from hacrl_fed.protocol.keys import Roster

    roster = Roster.load(cfg.roster)
    key_dir.mkdir(parents=True, exist_ok=True)
    keys = {}
    for agent in roster:
        keys[agent] = key_dir / f"{agent}.node.pub"
        keys[agent].write_text(f"{roster.node_key(agent)} {agent}\n", encoding="utf-8")
    with ThreadPoolExecutor(max_workers=min(8, len(keys))) as pool:  # each `flwr` call starts a Python process
        results = dict(zip(keys, pool.map(lambda a: launch.register_supernode(env, keys[a], a), keys)))
    for agent, outcome in results.items():
        log.info("SuperNode key of %s: %s", agent, outcome)


def _watch(run: ManagedProcess, *others: ManagedProcess) -> int:
    """Wait for ``flwr run`` to end; raise RuntimeError (with its log tail) when one of ``others`` exits first."""
    while run.alive():
        for proc in others:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited with code {proc.returncode}:\n{proc.tail()}")
        time.sleep(0.5)
    return int(run.returncode or 0)


def run_server(cfg: ServerConfig, *, echo: IO[str] | None = None) -> int:
    """Run the coordinator host until the run ends or a signal arrives. Returns the exit code.

    ``cfg`` must be resolved (:func:`resolve_server_config`). Raises ConfigError, RosterError and
    RuntimeError (a process did not start) with a one-line reason first.
    """
    _preflight(cfg)
    sl = cfg.superlink
    run_dir = Path(cfg.run.output_dir) / cfg.run.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    resolved = run_dir / "server.resolved.json"
    resolved.write_text(cfg.model_dump_json(indent=1), encoding="utf-8")
    flwr_home = run_dir / "flwr"
    connect = "127.0.0.1" if sl.host in ("0.0.0.0", "::", "") else sl.host
    launch.write_flwr_config(flwr_home, f"{connect}:{sl.port}", insecure=sl.insecure, root_certificates=sl.ca_cert)
    env = launch.flwr_env(flwr_home)
    app_dir = launch.install_app(run_dir / "flwr_app")
    run: ManagedProcess | None = None
    with Supervisor(run_dir / "logs") as sup:
        sup.handle_signals()
        try:
            superlink, executor = launch.start_warm_superlink(
                sup, host=sl.host, port=sl.port, database=sl.database, env=env,
                secret_file=run_dir / "superexec.secret", insecure=sl.insecure, ca_cert=sl.ca_cert,
                server_cert=sl.server_cert, server_key=sl.server_key, node_auth=sl.node_auth)
            if sl.node_auth:
                _register_roster(cfg, env, run_dir / "node_keys")
            run = launch.start_run(sup, app_dir, {"config-path": str(resolved)}, env=env, echo=echo or sys.stdout)
            code = _watch(run, superlink, executor)
        except Shutdown as sig:
            log.info("%s: stopping the run and the SuperLink", sig)
            if run is not None and (rid := launch.run_id_of(run)) is not None:
                launch.stop_run(env, rid)
            return 128 + sig.signum
        rid = launch.run_id_of(run)
        status, details = launch.run_outcome(env, rid) if rid is not None else ("", "")
        log.info("run %s ended: exit code %d, status %r", rid, code, status)
        if (line := run_end_line(rid, status, details, _log_lines(sup.log_dir / "serverapp.log"))) is not None:
            log.error("%s", line)
        return 0 if code == 0 and status.endswith("completed") else 1


def _log_lines(path: Path) -> list[str]:
    """The last 200 lines of a log file ([] if it cannot be read)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()[-200:]
    except OSError:
        return []
