"""``hacrl-fed client``: one site (ARCHITECTURE.md §1) — the agent worker plus a Flower SuperNode.

1. resolve the site config (``--config client.toml`` and flags; paths relative to the current
   directory), check it before anything starts (:func:`check_site`: the agent is in the roster,
   the signing and node keys exist and match the roster, the model name resolves, ``--port`` is
   free, the checkpoints belong to ``--run-id`` when given), lock ``<output_dir>/<agent>/`` (a
   second client there stops with one line naming the first one's pid) and write the config to
   ``<output_dir>/<agent>/client.resolved.toml``;
2. write a fresh worker token (``<output_dir>/<agent>/worker.token``, mode 0600: every call to the
   worker must carry it, :mod:`hacrl_fed.protocol.worker_token`), start the agent worker
   (``hacrl-fed worker``, loopback only; its progress lines — one per trained step — are shown on
   the terminal) and wait until Health answers ready — or, with ``--worker-address``, attach to a
   worker someone else runs (e.g. in a vLLM environment), with the token of the file that worker
   uses (``--worker-token-file``, the same default), and only check its Health;
3. start ``flower-supernode`` with TLS (``--root-certificates``) and SuperNode authentication
   (``--auth-supernode-private-key``) or ``--insecure``, its own ClientApp API port, and the node
   config ``agent-name=... worker-address=... worker-token-file=...`` the per-message ClientApp reads;
   with ``--isolation process`` and the warm executor that forks every ClientApp task from a process that
   has imported it once (:mod:`hacrl_fed.flower.executor`); an order the site does not carry out is
   reported in one line with its cause (:class:`~hacrl_fed.site.watch.TaskWatcher`);
4. supervise them: a SuperNode (or executor) that exits (SuperLink not reachable yet, key not registered yet,
   coordinator restarted) is restarted with backoff, and connection trouble is reported in plain
   words (:class:`~hacrl_fed.site.watch.SupernodeWatcher`); if the worker exits, or on
   SIGINT/SIGTERM, everything is stopped and the command exits.

A site keeps running after a run ends (it cannot tell a finished run from a restarting
coordinator); stop it with Ctrl-C: the worker then saves a checkpoint of the steps it trained since
the last one. A restarted client resumes from the worker's newest intact checkpoint and rejoins the
running run.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import tomli_w

from hacrl_fed.atomic import DirLock
from hacrl_fed.config import ClientConfig, ConfigError, absolute_path
from hacrl_fed.launch import processes as launch
from hacrl_fed.launch.supervise import ManagedProcess, Shutdown, Supervisor, free_port, port_problem
from hacrl_fed.protocol.worker_token import TOKEN_FILE, TokenFileError, read_token, write_token
from hacrl_fed.site.watch import SupernodeWatcher, TaskWatcher, worker_line_visible
from hacrl_fed.site.worker_link import WorkerError, wait_until_healthy

__all__ = ["check_site", "check_worker_health", "fill_site_layout", "resolve_client_config", "run_client"]

log = logging.getLogger("hacrl_fed.client")


def resolve_client_config(cfg: ClientConfig, base: str | Path | None = None) -> ClientConfig:
    """A copy with every file path absolute (relative to ``base``, default the CWD)."""
    b = Path(base or Path.cwd())
    cfg = cfg.model_copy(deep=True)
    agent = cfg.agent
    agent.private_key, agent.roster = absolute_path(agent.private_key, b), absolute_path(agent.roster, b)
    agent.checkpoint_dir = absolute_path(agent.checkpoint_dir, b)
    cfg.root_certificates, cfg.node_key = absolute_path(cfg.root_certificates, b), absolute_path(cfg.node_key, b)
    cfg.output_dir = absolute_path(cfg.output_dir, b)  # type: ignore[assignment]
    model = agent.model
    if model.name_or_path and (b / model.name_or_path).exists():
        model.name_or_path = absolute_path(model.name_or_path, b)  # type: ignore[assignment]
    model.cache_dir = absolute_path(model.cache_dir, b)
    return cfg


def fill_site_layout(cfg: ClientConfig, base: str | Path | None = None) -> ClientConfig:
    """Fill unset key and certificate paths from the documented site layout under ``base`` (default
    the CWD) when those files exist: ``keys/<agent>.ed25519.key``, ``keys/<agent>.node.key``
    (``hacrl-fed keys gen --out keys``), ``roster.toml`` and ``ca.crt``. Returns a copy."""
    b = Path(base or Path.cwd())
    cfg = cfg.model_copy(deep=True)
    name = cfg.agent.name
    found = {"agent.private_key": b / "keys" / f"{name}.ed25519.key", "agent.roster": b / "roster.toml",
             "node_key": b / "keys" / f"{name}.node.key", "root_certificates": b / "ca.crt"}
    for key, path in found.items():
        owner = cfg.agent if key.startswith("agent.") else cfg
        field = key.removeprefix("agent.")
        if getattr(owner, field) is None and path.is_file() and not (field == "root_certificates" and cfg.insecure):
            setattr(owner, field, str(path))
            log.info("using %s = %s", key, path)
    return cfg


def _preflight(cfg: ClientConfig) -> None:
    if not cfg.insecure and not cfg.root_certificates:
        raise ConfigError("TLS needs root_certificates (the coordinator's ca.crt, --root-certificates), "
                          "or set insecure = true (loopback testing only)")
    for what, path in (("root_certificates", cfg.root_certificates), ("node_key", cfg.node_key),
                       ("agent.private_key", cfg.agent.private_key), ("agent.roster", cfg.agent.roster)):
        if path and not Path(path).is_file():
            raise ConfigError(f"{what}: {path}: " + ("not a regular file" if Path(path).exists() else "no such file"))


def _node_public_key(path: str) -> str:
    """OpenSSH public form of a SuperNode private key file. Raises ConfigError."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from hacrl_fed.launch.preflight import read_small

    try:
        key = serialization.load_ssh_private_key(read_small(path, "node_key", "SuperNode key", 64 << 10), password=None)
    except ConfigError:
        raise
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(f"node_key: {path}: not an unencrypted OpenSSH private key ({err})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"node_key: {path}: SuperNode authentication needs an EC key (`hacrl-fed keys gen`)")
    return key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                         serialization.PublicFormat.OpenSSH).decode("ascii")


def check_site(cfg: ClientConfig, *, own_worker: bool = True) -> None:
    """Check a resolved site config before anything starts or loads; raise ConfigError with one line.

    Always: TLS material exists (unless ``insecure``), the node key exists and is an EC key
    (unless ``insecure``), ``output_dir`` can be created and written; roster and key files are regular files
    of bounded size (errors name the key). With a roster: the agent is listed, and the node key matches its
    ``node_key`` entry. With ``own_worker`` (the client starts the worker): a roster and a signing
    key are required, the signing key matches the roster's ``ed25519`` entry, the model name
    resolves (:func:`hacrl_fed.worker.models.check_model_name`: no download, no model loading), its reward
    functions load, and with
    ``run_id`` set, the site's newest checkpoint (if any) belongs to that run.
    """
    from hacrl_fed.protocol.keys import KeyFileError, Roster, RosterError, load_signing_key, public_key_b64

    _preflight(cfg)
    agent, name = cfg.agent, cfg.agent.name
    layout = "run `hacrl-fed keys gen --name {0} --out keys` in this directory, or give {1}"
    if own_worker and not agent.roster:
        raise ConfigError("no roster: put the roster you received into roster.toml here, or set agent.roster")
    try:
        roster = Roster.load(agent.roster) if agent.roster else None  # bounded: a regular file of limited size
    except RosterError as err:
        raise ConfigError(f"agent.roster: {err}") from None
    if roster is not None and name not in roster:
        raise ConfigError(f"agent {name!r} is not in the roster {agent.roster} (it lists {', '.join(roster)}); "
                          f"check --name, or ask the coordinator for the current roster")
    if not cfg.insecure and not cfg.node_key:
        raise ConfigError(f"no SuperNode key for {name!r}: " + layout.format(name, "--node-key / node_key"))
    if own_worker and not agent.private_key:
        raise ConfigError(f"no signing key for {name!r}: " + layout.format(name, "agent.private_key"))
    try:
        signing = load_signing_key(agent.private_key) if roster is not None and own_worker else None
    except KeyFileError as err:
        raise ConfigError(f"agent.private_key: {err}") from None
    if signing is not None and roster is not None and public_key_b64(signing) != \
            public_key_b64(roster.public_key(name)):
        raise ConfigError(f"{agent.private_key} is not the signing key of {name!r} in {agent.roster}")
    from hacrl_fed.launch.preflight import check_writable

    check_writable(cfg.output_dir, "output_dir")  # the site directory (lock, logs) goes there
    if own_worker and agent.checkpoint_dir:
        check_writable(agent.checkpoint_dir, "agent.checkpoint_dir")
    if cfg.node_key and not cfg.insecure:
        public = _node_public_key(cfg.node_key)
        if roster is not None and roster.node_key(name) and roster.node_key(name) != public:
            raise ConfigError(f"{cfg.node_key} is not the SuperNode key of {name!r} in {agent.roster}")
    if agent.endpoint is not None:
        if roster is not None and not roster.rollout_only(name):
            raise ConfigError(f"{name!r} runs at an endpoint (rollout-only) but its entry in {agent.roster} lacks "
                              "role = \"rollout_only\": the coordinator would send it train orders")
        env = agent.endpoint.api_key_env
        if own_worker and env and not os.environ.get(env):
            raise ConfigError(f"agent.endpoint.api_key_env: the environment variable {env!r} is not set")
        own_worker = False                          # nothing to load or train: no model name, rewards or checkpoints
    if own_worker:
        from hacrl_fed.worker.models import ModelLoadError, check_model_name

        try:
            check_model_name(agent.model.name_or_path, agent.model.gguf_file)
        except ModelLoadError as err:
            raise ConfigError(str(err)) from None
        from hacrl_fed.launch.preflight import check_rewards

        check_rewards([agent], key="agent")
        held = _checkpoint_run(Path(agent.checkpoint_dir or Path(cfg.output_dir) / name / "checkpoints"))
        if cfg.run_id and held and held[0] != cfg.run_id:
            raise ConfigError(f"run_id {cfg.run_id!r}: {held[2]} holds checkpoints of run {held[0]!r} (step "
                              f"{held[1]}); move them away or use another --output-dir to join {cfg.run_id!r}")


def _checkpoint_run(root: Path) -> tuple[str, int, Path] | None:
    """(run id, step, directory) of the newest checkpoint under ``root`` as its ``state.json`` says (no
    integrity check: the worker verifies when it loads), or None. The ``latest`` pointer is followed only to a
    checkpoint inside ``root`` (:meth:`~hacrl_fed.checkpoints.store.CheckpointManager.latest`)."""
    import json

    from hacrl_fed.atomic import read_bounded
    from hacrl_fed.checkpoints.store import MAX_META_BYTES, CheckpointManager

    newest = CheckpointManager(root).latest()
    if newest is None:
        return None
    try:
        meta = json.loads(read_bounded(newest / "state.json", MAX_META_BYTES).decode("utf-8"))
        return str(meta["run_id"]), int(meta["step"]), newest
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None


def _worker_argv(config: Path, address: str, address_file: Path, token_file: Path) -> list[str]:
    return [sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(config), "--address", address,
            "--address-file", str(address_file), "--token-file", str(token_file)]


def _supernode_loop(sup: Supervisor, cfg: ClientConfig, address: str, token_file: Path, port: int,
                    env: dict[str, str], worker: ManagedProcess | None, secret_file: Path) -> int:
    """Keep a SuperNode and its ClientApp executor running while the worker lives; restart them with backoff when
    one exits (SuperLink not up yet, key not registered yet, coordinator restarted); each start writes a fresh
    SuperExec secret to ``secret_file``. Returns 1 when the worker dies or a restart cannot help."""
    emit = lambda level, msg: log.log(level, "%s", msg)  # noqa: E731
    watcher, tasks = SupernodeWatcher(cfg.superlink, cfg.node_key, emit), TaskWatcher(emit)
    log.info("connecting to the coordinator at %s as %r (SuperNode log: %s)", cfg.superlink, cfg.agent.name,
             sup.log_dir / "supernode.log")
    backoff = 1.0
    while True:
        node, executor = launch.start_warm_supernode(
            sup, "supernode", superlink=cfg.superlink, port=port, env=env,
            node_config={"agent-name": cfg.agent.name, "worker-address": address, "worker-token-file": str(token_file)},
            secret_file=secret_file, insecure=cfg.insecure,
            root_certificates=cfg.root_certificates, node_key=cfg.node_key, on_line=watcher.feed,
            on_task_line=tasks.feed, echo=sys.stdout, echo_filter=worker_line_visible)
        started = time.monotonic()
        while node.alive() and executor.alive() and (worker is None or worker.alive()):
            time.sleep(0.5)
        if worker is not None and not worker.alive():
            log.error("the worker exited with code %s; stopping the site (log: %s)\n%s", worker.returncode,
                      worker.log_path, worker.tail())
            return 1
        code, task_code = node.returncode, executor.returncode
        sup.stop(executor)
        sup.stop(node)
        if watcher.fatal:  # a restart cannot help
            log.error("%s; stopping the site (choose another --port)", watcher.fatal)
            return 1
        if task_code == 2:  # it cannot import the ClientApp: a restart cannot help
            log.error("the ClientApp executor cannot start (log: %s): %s", executor.log_path, executor.tail(3))
            return 1
        if time.monotonic() - started > 120:
            backoff = 1.0
        why = (f"flower-supernode exited ({watcher.exit_reason(code)})" if code is not None
               else f"the ClientApp executor exited with code {task_code} (log: {executor.log_path})")
        log.info("%s; restarting it in %.0f s", why, backoff)
        time.sleep(backoff)
        backoff = min(2 * backoff, 30.0)


def _start_worker(sup: Supervisor, cfg: ClientConfig, resolved: Path, site_dir: Path, token_file: Path,
                  timeout_s: float) -> tuple[ManagedProcess, str, str]:
    """Write a fresh worker token to ``token_file`` and start ``hacrl-fed worker`` with it; its progress lines
    go to the terminal. Returns the process, its address and the token. Raises RuntimeError (one line plus the
    log path) when it exits or is not healthy in time, OSError when the token cannot be written."""
    if cfg.agent.endpoint is not None:
        log.info("starting the worker of %s: rollouts from %s at %s (rollout-only)", cfg.agent.name,
                 cfg.agent.model.name_or_path, cfg.agent.endpoint.url)
    else:
        log.info("starting the worker of %s: loading %s", cfg.agent.name, cfg.agent.model.name_or_path)
    addr_file = site_dir / "worker.address"
    token = write_token(token_file)
    try:
        argv = _worker_argv(resolved, cfg.agent.worker_address, addr_file, token_file)
        proc, address = launch.start_worker(sup, "worker", argv, address_file=addr_file, token=token,
                                            timeout_s=timeout_s, echo=sys.stdout, echo_filter=worker_line_visible)
        return proc, address, token
    except RuntimeError as err:
        first, _, rest = str(err).partition("\n")
        errors = [line for line in rest.splitlines() if line.startswith("error: ")]
        raise RuntimeError(f"{first.rstrip(':')}: {errors[-1].removeprefix('error: ')}" if errors else str(err)) from None


def run_client(cfg: ClientConfig, *, port: int | None = None, worker_address: str | None = None,
               worker_token_file: str | Path | None = None, worker_timeout_s: float = 900.0) -> int:
    """Run the site until the worker exits or a signal arrives. Returns the exit code (0 after a signal).

    ``cfg`` must be resolved (:func:`resolve_client_config`). ``port`` is the SuperNode's
    ClientApp API port (default: a free one). ``worker_token_file`` (default ``<output_dir>/<agent>/worker.token``)
    holds the worker token: written fresh when this client starts the worker, read (it must exist) when it
    attaches to ``worker_address``. Raises ConfigError (:func:`check_site`, a ``port`` in use, an unusable token
    file of an attached worker) and LockedError (another client runs in this site's directory, named with its
    pid) before anything starts; a worker that fails to start ends the client with a message and code 1.
    """
    check_site(cfg, own_worker=worker_address is None)
    if port is not None and (busy := port_problem("127.0.0.1", port)):
        raise ConfigError(f"--port {port}: {busy}; stop it, or choose another --port")
    name = cfg.agent.name
    site_dir = Path(cfg.output_dir) / name
    token_file = Path(worker_token_file).absolute() if worker_token_file else site_dir / TOKEN_FILE
    if worker_address is not None:
        try:
            read_token(token_file)
        except TokenFileError as err:
            raise ConfigError(f"--worker-token-file: {err}; give the token file the worker at {worker_address} "
                              "uses (hacrl-fed worker --token-file)") from None
    lock = DirLock(site_dir, what=f"the site directory of {name!r}")  # a second client here stops now
    try:
        return _run_site(cfg, site_dir, port, worker_address, token_file, worker_timeout_s)
    finally:
        lock.release()


def check_worker_health(health, cfg: ClientConfig, address: str) -> None:
    """The worker at ``address`` must be this site's agent and run the engine its configuration names.

    ``health`` is the worker's ``HealthResponse`` (an empty ``engine``: a worker from before engines were
    reported, which ran Hugging Face ``generate``). Raises ``ConfigError`` naming both sides.
    """
    name = cfg.agent.name
    if health.agent_id != name:
        raise ConfigError(f"the worker at {address} is agent {health.agent_id!r}, not {name!r}")
    running = health.engine or "hf"
    wanted = "endpoint" if cfg.agent.endpoint is not None else cfg.agent.model.engine
    if running != wanted:
        raise ConfigError(f"the worker at {address} runs the {running!r} engine, this site's configuration says "
                          f"{wanted!r} (agent.model.engine / --engine, or agent.endpoint / --endpoint)")


def _run_site(cfg: ClientConfig, site_dir: Path, port: int | None, worker_address: str | None, token_file: Path,
              worker_timeout_s: float) -> int:
    name = cfg.agent.name
    resolved = site_dir / "client.resolved.toml"
    resolved.write_text(tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    env = launch.flwr_env(site_dir / "flwr")
    with Supervisor(site_dir / "logs") as sup:
        sup.handle_signals()
        try:
            worker = None
            if worker_address is None:
                worker, address, token = _start_worker(sup, cfg, resolved, site_dir, token_file, worker_timeout_s)
            else:
                address, token = worker_address, read_token(token_file)
            health = wait_until_healthy(address, worker_timeout_s, token=token)
            check_worker_health(health, cfg, address)
            if cfg.agent.rollout_only:   # nothing is trained here
                log.info("worker %s ready at %s (rollout-only: its rollouts come from the endpoint)", name, address)
            else:
                log.info("worker %s ready at %s (last trained step %d)", name, address, health.step)
            return _supernode_loop(sup, cfg, address, token_file, port or free_port(), env, worker,
                                   site_dir / "superexec.secret")
        except Shutdown as sig:
            log.info("%s: stopping the site", sig)
            return 0
        except (RuntimeError, WorkerError, TokenFileError) as err:
            log.error("%s", err)
            return 1
