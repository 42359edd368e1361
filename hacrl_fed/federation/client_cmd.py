"""``hacrl-fed client``: one site (ARCHITECTURE.md §1) — the agent worker plus a Flower SuperNode.

1. resolve the site config (``--config client.toml`` and flags; paths relative to the current
   directory) and write it to ``<output_dir>/<agent>/client.resolved.toml``;
2. start the agent worker (``hacrl-fed worker``, loopback only) and wait until Health answers
   ready — or, with ``--worker-address``, attach to a worker someone else runs (e.g. in a vLLM
   environment) and only check its Health;
3. start ``flower-supernode`` with TLS (``--root-certificates``) and SuperNode authentication
   (``--auth-supernode-private-key``) or ``--insecure``, its own ClientApp API port, and the node
   config ``agent-name=... worker-address=...`` the per-message ClientApp reads;
4. supervise both: a SuperNode that exits (SuperLink not reachable yet, key not registered yet,
   coordinator restarted) is restarted with backoff; if the worker exits, or on SIGINT/SIGTERM,
   everything is stopped and the command exits.

A restarted client resumes from the worker's latest checkpoint and rejoins the running run.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import tomli_w

from hacrl_fed.config import ClientConfig, ConfigError
from hacrl_fed.federation import launch
from hacrl_fed.federation.supervise import ManagedProcess, Shutdown, Supervisor, free_port
from hacrl_fed.federation.worker_link import WorkerError, wait_until_healthy

__all__ = ["fill_site_layout", "resolve_client_config", "run_client"]

log = logging.getLogger("hacrl_fed.client")


def _abs(path: str | None, base: Path) -> str | None:
    return None if path is None else str((base / Path(path).expanduser()).resolve())


def resolve_client_config(cfg: ClientConfig, base: str | Path | None = None) -> ClientConfig:
    """A copy with every file path absolute (relative to ``base``, default the CWD)."""
    b = Path(base or Path.cwd())
    cfg = cfg.model_copy(deep=True)
    agent = cfg.agent
    agent.private_key, agent.roster = _abs(agent.private_key, b), _abs(agent.roster, b)
    agent.checkpoint_dir = _abs(agent.checkpoint_dir, b)
    cfg.root_certificates, cfg.node_key = _abs(cfg.root_certificates, b), _abs(cfg.node_key, b)
    cfg.output_dir = _abs(cfg.output_dir, b)  # type: ignore[assignment]
    model = agent.model
    if model.name_or_path and (b / model.name_or_path).exists():
        model.name_or_path = _abs(model.name_or_path, b)  # type: ignore[assignment]
    model.cache_dir = _abs(model.cache_dir, b)
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
            raise ConfigError(f"{what}: {path}: no such file")


def _worker_argv(config: Path, address: str, address_file: Path) -> list[str]:
    return [sys.executable, "-m", "hacrl_fed.cli", "worker", "--config", str(config), "--address", address,
            "--address-file", str(address_file)]


def _supernode_loop(sup: Supervisor, cfg: ClientConfig, address: str, port: int, env: dict[str, str],
                    worker: ManagedProcess | None) -> int:
    """Keep a SuperNode running while the worker lives; restart it with backoff when it exits
    (SuperLink not up yet, key not registered yet, coordinator restarted). Returns 1 when the worker dies."""
    backoff = 1.0
    while True:
        node = launch.start_supernode(sup, "supernode", superlink=cfg.superlink, port=port,
                                      node_config={"agent-name": cfg.agent.name, "worker-address": address}, env=env,
                                      insecure=cfg.insecure, root_certificates=cfg.root_certificates,
                                      node_key=cfg.node_key)
        started = time.monotonic()
        while node.alive() and (worker is None or worker.alive()):
            time.sleep(0.5)
        if worker is not None and not worker.alive():
            log.error("the worker exited with code %s; stopping the site\n%s", worker.returncode, worker.tail())
            return 1
        code = node.returncode
        sup.stop(node)
        if time.monotonic() - started > 120:
            backoff = 1.0
        hint = " (SuperLink unreachable, or this node's key is not registered there yet)" if code == 305 else ""
        log.warning("flower-supernode exited with code %s%s; restarting it in %.0f s\n%s", code, hint, backoff,
                    node.tail(5))
        time.sleep(backoff)
        backoff = min(2 * backoff, 30.0)


def run_client(cfg: ClientConfig, *, port: int | None = None, worker_address: str | None = None,
               worker_timeout_s: float = 900.0) -> int:
    """Run the site until the worker exits or a signal arrives. Returns the exit code (0 after a signal).

    ``cfg`` must be resolved (:func:`resolve_client_config`). ``port`` is the SuperNode's
    ClientApp API port (default: a free one). Raises ConfigError before anything starts; a worker
    that fails to start ends the client with a message and code 1.
    """
    _preflight(cfg)
    name = cfg.agent.name
    site_dir = Path(cfg.output_dir) / name
    site_dir.mkdir(parents=True, exist_ok=True)
    resolved = site_dir / "client.resolved.toml"
    resolved.write_text(tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    env = launch.flwr_env(site_dir / "flwr")
    with Supervisor(site_dir / "logs") as sup:
        sup.handle_signals()
        try:
            worker = None
            if worker_address is None:
                worker, address = launch.start_worker(sup, "worker", _worker_argv(resolved, cfg.agent.worker_address,
                                                                                 site_dir / "worker.address"),
                                                      address_file=site_dir / "worker.address",
                                                      timeout_s=worker_timeout_s)
            else:
                address = worker_address
            health = wait_until_healthy(address, worker_timeout_s)
            if health.agent_id != name:
                raise ConfigError(f"the worker at {address} is agent {health.agent_id!r}, not {name!r}")
            log.info("worker %s ready at %s (last trained step %d)", name, address, health.step)
            return _supernode_loop(sup, cfg, address, port or free_port(), env, worker)
        except Shutdown as sig:
            log.info("%s: stopping the site", sig)
            return 0
        except (RuntimeError, WorkerError) as err:
            log.error("%s", err)
            return 1
