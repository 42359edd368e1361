"""Configuration side of ``hacrl-fed simulate``: the built-in demo config, the run directory, device pinning.

:func:`prepare_run` turns a :class:`~hacrl_fed.config.SimulateConfig` into a run directory with
every agent's identity (Ed25519 signing key + SuperNode EC key), the roster, optional loopback TLS
material, and the resolved configs the processes read (:class:`Layout`); :func:`load_layout` reads
it back for ``--resume``. :func:`worker_env` pins one worker to its device. No process is started here.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import tomli_w

from hacrl_fed.config import (
    ClientConfig,
    ConfigError,
    ServerConfig,
    SimulateConfig,
    SuperLinkConfig,
    override_run,
)
from hacrl_fed.launch.client_cmd import resolve_client_config
from hacrl_fed.launch.server_cmd import resolve_server_config
from hacrl_fed.launch.supervise import free_port

__all__ = ["DEFAULT_CONFIG", "FORMAT_PROMPT", "Layout", "default_config", "load_layout", "prepare_run", "worker_env"]


FORMAT_PROMPT = ("Solve the problem. End with the final answer in the form \\boxed{N}. "
                 "Example: Calculate 2 + 3. 2 + 3 = 5, so the answer is \\boxed{5}.")
"""System prompt of the demo: it shows the answer format the verifier demands (a stated answer)."""

DEFAULT_CONFIG: dict = {
    "run": {"run_id": "hacrl-demo", "steps": 3, "prompts_per_step": 2, "samples_per_prompt": 4,
            "sampling": {"temperature": 1.0, "max_new_tokens": 64},
            "data": {"source": "arithmetic", "difficulty": 1, "eval_size": 16, "seed": 0},
            "capability_window": 5, "checkpoint_every": 0, "seed": 0},
    "verifier": {"workers": 1},
    "agents": [
        {"name": "smollm2", "model": {"name_or_path": "smollm2-135m-instruct", "device": "cpu",
                                      "system_prompt": FORMAT_PROMPT, "max_response_tokens": 128},
         "algo": {"name": "hacpo_cross_family", "kl_coef": 0.0},
         "optim": {"lr": 1e-5, "mini_batch_rows": 8, "micro_batch_tokens": 2048}, "verifier": {"workers": 1}},
        {"name": "gemma3", "model": {"name_or_path": "gemma3-270m", "device": "cpu",
                                     "system_prompt": FORMAT_PROMPT, "max_response_tokens": 128},
         "algo": {"name": "hacpo_cross_family", "kl_coef": 0.0},
         "optim": {"lr": 1e-6, "mini_batch_rows": 8, "micro_batch_tokens": 2048, "logprob_chunk_tokens": 256},
         "verifier": {"workers": 1}},
    ],
}
"""The run of ``hacrl-fed simulate`` without ``--config`` (``examples/default.toml`` is the same):
SmolLM2-135M-Instruct and Gemma-3-270M (different family, size and tokenizer) on the built-in
arithmetic problems, a few steps of HACPO cross-family (Gemma at lr 1e-6, docs/benchmarks.md "Base-model
stability") sized for about 10 minutes on 2 CPU cores."""


def default_config(*, run: dict | None = None) -> SimulateConfig:
    """:data:`DEFAULT_CONFIG` validated; ``run``: overrides of its ``[run]`` keys (``config.override_run``)."""
    return SimulateConfig.model_validate(override_run(DEFAULT_CONFIG, run))


@dataclass
class Layout:
    """The resolved configuration of one simulated run and where its files live."""

    run_dir: Path
    config: SimulateConfig
    server: ServerConfig
    clients: dict[str, ClientConfig]
    """Per agent, as its worker reads it (device as the worker sees it, e.g. ``cuda:0``)."""
    devices: dict[str, str]
    """Per agent, the configured device (``cuda:1``, ``cpu`` …)."""

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


# --------------------------------------------------------------------------- run directory


def _stamp() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S")


def _check_agents(cfg: SimulateConfig) -> None:
    """Reject agent settings a simulated run would ignore or that would make every step fail."""
    for i, agent in enumerate(cfg.agents):
        if agent.endpoint is not None:
            raise ConfigError(f"agents[{i}].endpoint: simulate runs and exports local models; join a model behind an "
                              "API as a rollout-only site with `hacrl-fed client --endpoint` (docs/cross-vendor.md)")
        for key in ("private_key", "roster"):
            if getattr(agent, key):
                raise ConfigError(f"agents[{i}].{key}: simulate generates every key and the roster into the run "
                                  f"directory; remove this key (use `hacrl-fed client` for your own keys)")


def _identities(cfg: SimulateConfig, keys_dir: Path) -> dict:
    from hacrl_fed.protocol.keys import generate_identity, roster_entry_toml

    idents = {a.name: generate_identity(a.name, keys_dir) for a in cfg.agents}
    roster = "# hacrl-fed roster of a simulated run (generated)\n\n" + "\n".join(
        roster_entry_toml(n, i.ed25519, i.node_public) for n, i in idents.items())
    (keys_dir / "roster.toml").write_text(roster, encoding="utf-8")
    return idents


def _worker_device(device: str) -> str:
    """The device name a worker sees after :func:`worker_env` pinned it (``cuda:3`` → ``cuda:0``)."""
    return "cuda:0" if device.startswith("cuda") else device


def prepare_run(cfg: SimulateConfig, *, output_dir: str | Path | None = None, run_name: str | None = None) -> Layout:
    """Create the run directory: identities, roster, TLS material (``cfg.tls``) and resolved configs.

    Paths inside ``cfg`` are relative to the current directory. Raises ConfigError (keys set in
    the config, an existing run directory), OSError when writing fails.
    """
    _check_agents(cfg)
    for agent in cfg.agents:  # a device that cannot be pinned fails before anything is written
        worker_env(agent.model.device, cpu_workers=1)
    out = Path(output_dir or cfg.run.output_dir).expanduser().resolve()
    run_id = run_name or f"{cfg.run.run_id[:47]}-{_stamp()}"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", run_id):
        raise ConfigError(f"run name {run_id!r}: use 1-64 letters, digits, '_', '.', '-' (starting with a letter or digit)")
    run_dir = out / run_id
    if run_dir.exists():
        raise ConfigError(f"{run_dir} exists already; pass --resume {run_dir} to continue it")
    run_dir.mkdir(parents=True)
    keys_dir = run_dir / "keys"
    idents = _identities(cfg, keys_dir)
    port = free_port()
    if cfg.tls:
        from hacrl_fed.protocol.certs import generate_tls

        tls = generate_tls(run_dir / "tls", ["127.0.0.1"])
        superlink = SuperLinkConfig(host="127.0.0.1", port=port, insecure=False, ca_cert=str(tls.ca_cert),
                                    server_cert=str(tls.server_cert), server_key=str(tls.server_key), node_auth=True)
    else:
        superlink = SuperLinkConfig(host="127.0.0.1", port=port, insecure=True, node_auth=False)
    run = cfg.run.model_copy(update={"run_id": run_id, "output_dir": str(out)})
    server = resolve_server_config(ServerConfig(run=run, superlink=superlink, roster=str(keys_dir / "roster.toml"),
                                                verifier=cfg.verifier))
    clients, devices = {}, {}
    for agent in cfg.agents:
        a = agent.model_copy(deep=True)
        a.private_key, a.roster = str(idents[a.name].signing_key), str(keys_dir / "roster.toml")
        a.checkpoint_dir = a.checkpoint_dir or str(run_dir / a.name / "checkpoints")
        devices[a.name], a.model.device = a.model.device, _worker_device(a.model.device)
        clients[a.name] = resolve_client_config(ClientConfig(
            agent=a, superlink=f"127.0.0.1:{port}", insecure=not cfg.tls, output_dir=str(run_dir),
            root_certificates=str(superlink.ca_cert) if cfg.tls else None,
            node_key=str(idents[a.name].node_key) if cfg.tls else None))
    layout = Layout(run_dir, cfg, server, clients, devices)
    _write_layout(layout)
    return layout


def _write_layout(layout: Layout) -> None:
    d = layout.run_dir
    (d / "simulate.resolved.json").write_text(json.dumps({
        "config": layout.config.model_dump(mode="json"), "devices": layout.devices,
        "server": layout.server.model_dump(mode="json"),
        "clients": {n: c.model_dump(mode="json") for n, c in layout.clients.items()}}, indent=1), encoding="utf-8")
    (d / "server.resolved.json").write_text(layout.server.model_dump_json(indent=1), encoding="utf-8")
    for name, client in layout.clients.items():
        (d / name).mkdir(parents=True, exist_ok=True)
        text = tomli_w.dumps(client.model_dump(mode="json", exclude_none=True))
        (d / name / "client.resolved.toml").write_text(text, encoding="utf-8")


def load_layout(run_dir: str | Path) -> Layout:
    """The layout :func:`prepare_run` wrote into ``run_dir`` (for ``--resume``), with a fresh free
    SuperLink port (the old one may be taken by now). Raises ConfigError."""
    d = Path(run_dir).expanduser().resolve()
    try:
        data = json.loads((d / "simulate.resolved.json").read_text(encoding="utf-8"))
        layout = Layout(d, SimulateConfig.model_validate(data["config"]), ServerConfig.model_validate(data["server"]),
                        {n: ClientConfig.model_validate(c) for n, c in data["clients"].items()}, dict(data["devices"]))
    except (OSError, ValueError, KeyError) as err:
        raise ConfigError(f"{d}: not a simulate run directory ({' '.join(str(err).split())[:200]})") from None
    port = free_port()
    layout.server.superlink.port = port
    for client in layout.clients.values():
        client.superlink = f"127.0.0.1:{port}"
    _write_layout(layout)
    return layout


def worker_env(device: str, *, cpu_workers: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of one worker, pinned to ``device``.

    ``cuda:i`` ⇒ ``CUDA_VISIBLE_DEVICES`` = the i-th visible GPU (of an inherited
    ``CUDA_VISIBLE_DEVICES`` list, if any), so the worker sees it as ``cuda:0``. ``cpu`` ⇒ no GPU
    visible and ``OMP_NUM_THREADS`` = CPU cores / CPU workers (unless already set), so workers
    that run at the same time do not oversubscribe the cores. ``MALLOC_ARENA_MAX=2`` (unless set)
    keeps the resident memory of the long-running worker flat (ARCHITECTURE §8).
    """
    env = dict(os.environ if base is None else base)
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        if visible and index >= len(visible):
            raise ConfigError(f"device {device!r}: only {len(visible)} GPU(s) visible (CUDA_VISIBLE_DEVICES)")
        env["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)
    elif device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, cpu_workers))))
    env.setdefault("MALLOC_ARENA_MAX", "2")
    return env


