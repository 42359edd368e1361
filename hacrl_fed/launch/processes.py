"""Starting Flower's processes and the agent worker with explicit ports and flags.

Building blocks of ``hacrl-fed server``, ``hacrl-fed client`` and ``hacrl-fed simulate``
(flower-notes.md, Appendix): every function takes the ports, TLS files and flags it needs and
starts the process under a :class:`~hacrl_fed.launch.supervise.Supervisor`.

* :func:`flwr_env` — environment for every Flower process: a private ``FLWR_HOME``, telemetry and
  update checks off.
* :func:`write_flwr_config` — ``$FLWR_HOME/config.toml`` with one SuperLink connection.
* :func:`start_superlink`, :func:`start_supernode`, :func:`start_worker` — long-running processes,
  returned once they listen (TCP port / worker address file + Health).
* :func:`start_warm_superlink`, :func:`start_warm_supernode` — either with its executor (below): how the
  commands start them.
* :func:`start_executor` — the warm task executor (:mod:`hacrl_fed.flower.executor`) that runs the
  ServerApp / ClientApp tasks of a SuperLink / SuperNode started with ``isolation="process"``.
* :func:`register_supernode` — ``flwr supernode register`` of an agent's node-auth public key.
* :func:`install_app`, :func:`start_run`, :func:`stop_run`, :func:`run_status` — the Flower app.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import IO

import tomli_w

from hacrl_fed.launch.supervise import ManagedProcess, Supervisor, find_executable, wait_for_tcp
from hacrl_fed.site.worker_link import wait_until_healthy

__all__ = [
    "CONNECTION",
    "check_importable",
    "flwr_env",
    "format_node_config",
    "has_text",
    "install_app",
    "register_supernode",
    "run_outcome",
    "run_status",
    "start_run",
    "start_executor",
    "start_superlink",
    "start_supernode",
    "start_warm_superlink",
    "start_warm_supernode",
    "start_worker",
    "stop_run",
    "write_flwr_config",
    "write_superexec_secret",
]

CONNECTION = "hacrl"
"""Name of the SuperLink connection in the private ``$FLWR_HOME/config.toml``."""
_RUN_ID = re.compile(r"Successfully started run (\d+)")


def flwr_env(flwr_home: str | Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default ``os.environ``) plus ``FLWR_HOME``, ``FLWR_TELEMETRY_ENABLED=0``, ``FLWR_DISABLE_UPDATE_CHECK=1``,
    and this interpreter's script directory first on ``PATH`` (Flower starts ``flower-superexec``,
    ``flwr-serverapp`` and ``flwr-clientapp`` by name, and they must import this installation)."""
    env = dict(os.environ if base is None else base)
    env.update(FLWR_HOME=str(Path(flwr_home).absolute()), FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1")
    scripts = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([scripts, *[p for p in env.get("PATH", "").split(os.pathsep) if p and p != scripts]])
    return env


def write_flwr_config(flwr_home: str | Path, address: str, *, insecure: bool, root_certificates: str | None,
                      name: str = CONNECTION) -> Path:
    """Write ``$FLWR_HOME/config.toml`` with the SuperLink connection ``name`` (the default one)."""
    conn: dict[str, object] = {"address": address}
    if insecure:
        conn["insecure"] = True
    elif root_certificates:
        conn["root-certificates"] = str(Path(root_certificates).absolute())
    home = Path(flwr_home)
    home.mkdir(parents=True, exist_ok=True)
    path = home / "config.toml"
    path.write_text(tomli_w.dumps({"superlink": {"default": name, name: conn}}), encoding="utf-8")
    return path


def format_node_config(values: Mapping[str, str | int | float | bool]) -> str:
    """``--node-config`` value: space-separated ``key=value`` with TOML-quoted strings.

    Raises ValueError for keys or string values Flower's parser cannot carry (spaces in keys,
    quotes in values).
    """
    parts = []
    for key, value in values.items():
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", key):
            raise ValueError(f"node config key {key!r}: use letters, digits, '_', '.', '-'")
        if isinstance(value, str) and ('"' in value or "\\" in value):
            raise ValueError(f"node config value of {key!r} must not contain quotes or backslashes")
        parts.append(f"{key}={json.dumps(value)}")
    return " ".join(parts)


def check_importable(modules: Sequence[str], python: str = sys.executable, env: Mapping[str, str] | None = None) -> None:
    """Import ``modules`` in a fresh ``python`` process (as Flower's app processes will).

    Raises RuntimeError with the interpreter's error when one of them cannot be imported.
    """
    code = "import importlib,sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    res = subprocess.run([python, "-c", code, *modules], capture_output=True, text=True, env=env, timeout=120)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise RuntimeError(f"{python} cannot import {', '.join(modules)} ({last}); install hacrl-fed into the "
                           f"environment that runs flower-superlink/flower-supernode")


def start_superlink(sup: Supervisor, *, host: str, port: int, database: str | Path, env: Mapping[str, str],
                    insecure: bool = False, ca_cert: str | None = None, server_cert: str | None = None,
                    server_key: str | None = None, node_auth: bool = True, timeout_s: float = 60.0,
                    isolation: str = "subprocess", superexec_secret: str | Path | None = None) -> ManagedProcess:
    """Start ``flower-superlink`` (Fleet, Control and Runtime APIs on ``host:port``); return when it listens.

    Runtime dependency installation is disabled. ``isolation="process"``: the SuperLink starts no
    ``flower-superexec``; :func:`start_executor` runs its ServerApp tasks, authenticated with the secret in
    ``superexec_secret`` (a file; see :func:`write_superexec_secret`). Raises ValueError for contradictory flags,
    RuntimeError / TimeoutError (with the log tail) when it does not come up.
    """
    argv = [find_executable("flower-superlink"), "--host", host, "--port", str(port), "--database", str(database),
            "--disable-runtime-dependency-installation", *_isolation_args(isolation, superexec_secret)]
    if insecure:
        if node_auth:
            raise ValueError("SuperNode authentication needs TLS")
        argv.append("--insecure")
    else:
        if not (ca_cert and server_cert and server_key):
            raise ValueError("TLS needs ca_cert, server_cert and server_key")
        argv += ["--ssl-ca-certfile", str(ca_cert), "--ssl-certfile", str(server_cert), "--ssl-keyfile", str(server_key)]
    if node_auth:
        argv.append("--enable-supernode-auth")
    proc = sup.start("superlink", argv, env=env)
    _wait_listening(proc, "127.0.0.1" if host in ("0.0.0.0", "::", "") else host, port, timeout_s)
    return proc


def _wait_listening(proc: ManagedProcess, host: str, port: int, timeout_s: float) -> None:
    """Wait until ``proc`` itself (or a child) listens on ``port``: another program there does not count."""
    try:
        wait_for_tcp(host, port, timeout_s, alive=proc.alive, owner=proc.pid)
    except (RuntimeError, TimeoutError) as err:
        raise RuntimeError(f"{proc.name} did not start: {err}\n{proc.tail()}") from None


def start_supernode(sup: Supervisor, name: str, *, superlink: str, port: int, node_config: Mapping[str, str],
                    env: Mapping[str, str], insecure: bool = False, root_certificates: str | None = None,
                    node_key: str | None = None, on_line: Callable[[str], None] | None = None,
                    isolation: str = "subprocess", superexec_secret: str | Path | None = None) -> ManagedProcess:
    """Start ``flower-supernode`` connecting to ``superlink`` (host:port); its ClientApp API on 127.0.0.1:``port``.

    ``on_line`` receives every line of its log (e.g. a :class:`~hacrl_fed.site.watch.SupernodeWatcher`).
    ``isolation="process"``: the SuperNode starts no ``flower-superexec``; :func:`start_executor` runs its
    ClientApp tasks (authenticated with the secret in the file ``superexec_secret``, if given).
    Raises ValueError when TLS is wanted but no root certificate is given.
    """
    argv = [find_executable("flower-supernode"), "--superlink", superlink, "--port", str(port),
            "--node-config", format_node_config(node_config), *_isolation_args(isolation, superexec_secret)]
    if insecure:
        argv.append("--insecure")
    elif root_certificates:
        argv += ["--root-certificates", str(root_certificates)]
    else:
        raise ValueError("a TLS connection needs root_certificates (the coordinator's CA), or insecure=True")
    if node_key:
        argv += ["--auth-supernode-private-key", str(node_key)]
    return sup.start(name, argv, env=env, on_line=on_line)


def _isolation_args(isolation: str, secret: str | Path | None) -> list[str]:
    if isolation not in ("subprocess", "process"):
        raise ValueError(f"isolation {isolation!r}: expected 'subprocess' or 'process'")
    if isolation == "subprocess":
        return []
    return ["--isolation", "process", *(["--superexec-auth-secret-file", str(secret)] if secret else [])]


def write_superexec_secret(path: str | Path) -> Path:
    """Write a fresh random SuperExec secret (32 bytes, mode 0600) to ``path``: the SuperLink / SuperNode and
    its executor share it, so no one else who reaches the Runtime API can take its tasks."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.unlink(missing_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    return p


EXECUTOR_MODULE = "hacrl_fed.flower.executor"


def start_executor(sup: Supervisor, name: str, *, runtime_address: str, task: str, preload: Sequence[str],
                   env: Mapping[str, str], parent_pid: int, root_certificates: str | None = None,
                   superexec_secret: str | Path | None = None, echo: IO[str] | None = None,
                   echo_filter: Callable[[str], bool] | None = None,
                   on_line: Callable[[str], None] | None = None) -> ManagedProcess:
    """Start the warm task executor (:mod:`hacrl_fed.flower.executor`) for the Runtime API at ``runtime_address``
    of a SuperLink (``task="serverapp"``) or SuperNode (``task="clientapp"``) started with ``isolation="process"``.

    It imports ``preload`` once and forks every task from there; it stops when ``parent_pid`` (that SuperLink or
    SuperNode) is gone. Plain HTTP unless ``root_certificates`` (the Runtime API's CA) is given. Its output goes to
    ``<name>.log``, ``echo`` (lines ``echo_filter`` accepts) and ``on_line`` (e.g. a
    :class:`~hacrl_fed.site.watch.TaskWatcher`). Raises OSError when Python cannot be started.
    """
    # -P: the current directory is not put on sys.path (a checkout of another hacrl_fed there must not shadow ours)
    argv = [sys.executable, "-P", "-m", EXECUTOR_MODULE, "--runtime-api-address", runtime_address, "--task", task,
            "--parent-pid", str(parent_pid), *[a for m in preload for a in ("--preload", m)]]
    argv += ["--root-certificates", str(root_certificates)] if root_certificates else ["--insecure"]
    if superexec_secret:
        argv += ["--superexec-auth-secret-file", str(superexec_secret)]
    return sup.start(name, argv, env=env, echo=echo, echo_filter=echo_filter, on_line=on_line)


SERVER_APP = "hacrl_fed.flower.server_app"
CLIENT_APP = "hacrl_fed.flower.client_app"


def start_warm_superlink(sup: Supervisor, *, host: str, port: int, database: str | Path, env: Mapping[str, str],
                         secret_file: str | Path, insecure: bool = False, ca_cert: str | None = None,
                         server_cert: str | None = None, server_key: str | None = None,
                         node_auth: bool = True) -> tuple[ManagedProcess, ManagedProcess]:
    """:func:`start_superlink` with ``isolation="process"`` and its ServerApp executor (``serverapp``, preloading
    the ServerApp), sharing a fresh secret written to ``secret_file``. Returns (SuperLink, executor)."""
    secret = write_superexec_secret(secret_file)
    link = start_superlink(sup, host=host, port=port, database=database, env=env, insecure=insecure, ca_cert=ca_cert,
                           server_cert=server_cert, server_key=server_key, node_auth=node_auth, isolation="process",
                           superexec_secret=secret)
    connect = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    executor = start_executor(sup, "serverapp", runtime_address=f"{connect}:{port}", task="serverapp",
                              preload=[SERVER_APP], env=env, parent_pid=link.pid,
                              root_certificates=None if insecure else ca_cert, superexec_secret=secret)
    return link, executor


def start_warm_supernode(sup: Supervisor, name: str, *, superlink: str, port: int, node_config: Mapping[str, str],
                         env: Mapping[str, str], secret_file: str | Path, insecure: bool = False,
                         root_certificates: str | None = None, node_key: str | None = None,
                         on_line: Callable[[str], None] | None = None,
                         on_task_line: Callable[[str], None] | None = None, echo: IO[str] | None = None,
                         echo_filter: Callable[[str], bool] | None = None) -> tuple[ManagedProcess, ManagedProcess]:
    """:func:`start_supernode` with ``isolation="process"`` and its ClientApp executor (named ``clientapp`` after
    ``name``'s suffix: ``supernode-alice`` → ``clientapp-alice``), sharing a fresh secret written to
    ``secret_file``. ``on_line`` gets the SuperNode's lines; ``on_task_line``, ``echo``/``echo_filter`` the
    executor's (the ClientApp tasks' output). Returns (SuperNode, executor)."""
    secret = write_superexec_secret(secret_file)
    node = start_supernode(sup, name, superlink=superlink, port=port, node_config=node_config, env=env,
                           insecure=insecure, root_certificates=root_certificates, node_key=node_key, on_line=on_line,
                           isolation="process", superexec_secret=secret)
    executor = start_executor(sup, "clientapp" + name.removeprefix("supernode"), runtime_address=f"127.0.0.1:{port}",
                              task="clientapp", preload=[CLIENT_APP], env=env, parent_pid=node.pid,
                              superexec_secret=secret, on_line=on_task_line, echo=echo, echo_filter=echo_filter)
    return node, executor


WORKER_STOP_GRACE_S = 300.0
"""Seconds a stopped worker gets to finish its request and save its shutdown checkpoint before SIGKILL."""


def start_worker(sup: Supervisor, name: str, argv: Sequence[str], *, address_file: str | Path, token: str,
                 timeout_s: float = 600.0, env: Mapping[str, str] | None = None, echo: IO[str] | None = None,
                 echo_filter: Callable[[str], bool] | None = None,
                 grace_s: float = WORKER_STOP_GRACE_S) -> tuple[ManagedProcess, str]:
    """Start an agent worker (``argv`` must make it write its bound address to ``address_file`` and use the token
    file holding ``token``, which its Health call then carries).

    ``name`` is the process label (log file ``<name>.log``, messages "``<name>`` exited …");
    ``echo``/``echo_filter`` tee its output (:meth:`Supervisor.start`); ``grace_s`` is its stop grace period
    (:data:`WORKER_STOP_GRACE_S`: time for the shutdown checkpoint). Returns the process and its
    address once Health answers ready. Raises RuntimeError with the log tail when it exits or is
    not healthy within ``timeout_s``.
    """
    path = Path(address_file)
    path.unlink(missing_ok=True)
    proc = sup.start(name, argv, env=env, echo=echo, echo_filter=echo_filter, grace_s=grace_s)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if not proc.alive():
            raise RuntimeError(f"{name} exited with code {proc.returncode} before it was ready "
                               f"(log: {proc.log_path}):\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} wrote no address within {timeout_s:g} s (log: {proc.log_path}):\n{proc.tail()}")
        time.sleep(0.2)
    address = path.read_text(encoding="utf-8").strip()
    try:
        wait_until_healthy(address, max(1.0, deadline - time.monotonic()), token=token, alive=proc.alive)
    except Exception as err:  # noqa: BLE001 - reported with the log tail
        raise RuntimeError(f"{name} at {address} is not healthy: {err}\n{proc.tail()}") from None
    return proc, address


def register_supernode(env: Mapping[str, str], public_key: str | Path, name: str, *,
                       connection: str = CONNECTION) -> str:
    """``flwr supernode register <public_key> <connection> --name <name>``.

    Returns "registered" or "already registered". Raises RuntimeError with Flower's message otherwise.
    """
    argv = [find_executable("flwr"), "supernode", "register", str(public_key), connection, "--name", name,
            "--format", "json"]
    res = subprocess.run(argv, capture_output=True, text=True, env=dict(env), timeout=120)
    text = (res.stdout + res.stderr).strip()
    try:
        body = json.loads(res.stdout)
    except json.JSONDecodeError:
        body = {}
    if res.returncode == 0 and body.get("success", True) and "error" not in text.lower():
        return "registered"
    if "already" in text.lower() or "in use" in text.lower():
        return "already registered"
    raise RuntimeError(f"registering the SuperNode key of {name!r} failed: {' '.join(text.split())[:500]}")


def install_app(dest: str | Path) -> Path:
    """Write the Flower app directory (``pyproject.toml`` from the packaged ``flwr_app.toml``) to ``dest``."""
    d = Path(dest)
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    manifest = resources.files("hacrl_fed.flower").joinpath("flwr_app.toml").read_text(encoding="utf-8")
    (d / "pyproject.toml").write_text(manifest, encoding="utf-8")
    return d


def start_run(sup: Supervisor, app_dir: str | Path, run_config: Mapping[str, str | int | float | bool], *,
              env: Mapping[str, str], connection: str = CONNECTION, echo: IO[str] | None = None) -> ManagedProcess:
    """``flwr run <app_dir> <connection> --run-config <file> --stream``; its output is the run's log.

    The run config overrides are written to ``<app_dir>/run_config.toml`` (no quoting problems).
    """
    overrides = Path(app_dir).parent / "run_config.toml"
    overrides.write_text(tomli_w.dumps(dict(run_config)), encoding="utf-8")
    argv = [find_executable("flwr"), "run", str(app_dir), connection, "--run-config", str(overrides), "--stream"]
    return sup.start("flwr-run", argv, env=env, echo=echo, echo_filter=has_text)


def has_text(line: str) -> bool:
    """False for Flower's empty log lines (``INFO :`` and nothing else), which only clutter a terminal."""
    return bool(re.sub(r"^\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s*:", "", line).strip())


def run_id_of(proc: ManagedProcess) -> int | None:
    """The Flower run id the latest ``flwr run`` printed, if it did."""
    try:
        found = _RUN_ID.findall(proc.log_path.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None
    return int(found[-1]) if found else None  # the log file is appended to across restarts


def run_status(env: Mapping[str, str], run_id: int, *, connection: str = CONNECTION) -> str:
    """Status of a run as ``flwr list`` reports it (e.g. ``finished:completed``); '' if unknown."""
    return run_outcome(env, run_id, connection=connection)[0]


def run_outcome(env: Mapping[str, str], run_id: int, *, connection: str = CONNECTION) -> tuple[str, str]:
    """(status, status details) of a run as ``flwr list --format json`` reports them (e.g. ``finished:failed``,
    ``No heartbeat received from the task``); ('', '') if unknown."""
    argv = [find_executable("flwr"), "list", connection, "--run-id", str(run_id), "--format", "json"]
    res = subprocess.run(argv, capture_output=True, text=True, env=dict(env), timeout=60)
    try:
        runs = json.loads(res.stdout).get("runs", [])
    except (json.JSONDecodeError, AttributeError):
        return "", ""
    return (str(runs[0].get("status", "")), str(runs[0].get("status-details", ""))) if runs else ("", "")


def stop_run(env: Mapping[str, str], run_id: int, *, connection: str = CONNECTION) -> bool:
    """``flwr stop <run_id>``; True if Flower accepted it."""
    argv = [find_executable("flwr"), "stop", str(run_id), connection, "--format", "json"]
    res = subprocess.run(argv, capture_output=True, text=True, env=dict(env), timeout=60)
    return res.returncode == 0
