"""Rank 0 of a site's sharded trainer: the worker's side of the process group.

:class:`ShardedSite` starts the other ranks of this machine, forms the group, shards the worker's policy over it and
then drives every rank: :meth:`ShardedSite.update` has :func:`hacrl_fed.update.loop.hacpo_update`'s signature
(the worker's :class:`~hacrl_fed.worker.trainer.Trainer` calls it in its place), broadcasts the rows and runs the same
update on every rank, then gathers the updated weights into the worker's plain model, which the rollout engine
generates with, the fingerprint hashes and the export writes.

Failure: a rank that dies makes the running collective fail at once (the :class:`~hacrl_fed.distributed.group.Watchdog`
names it); a rank that hangs makes it fail after ``timeout_s``. Either way the call raises
:class:`~hacrl_fed.distributed.group.RankFailure` with the cause, every rank is stopped, and the group is
:attr:`ShardedSite.broken` until :meth:`ShardedSite.restart`.
"""

from __future__ import annotations

import faulthandler
import logging
import time
from typing import Any

import torch
from torch import nn

from hacrl_fed.distributed.group import (
    RankFailure,
    Watchdog,
    broadcast,
    free_port,
    init_group,
    spawn_ranks,
    stop_ranks,
)
from hacrl_fed.distributed.ranks import RankState, Setup, UpdateJob

__all__ = ["ShardedSite"]

log = logging.getLogger("hacrl_fed.worker")


class ShardedSite:
    """The site's policy sharded over ``world_size`` processes, driven from this one (rank 0).

    Args:
        plain: the worker's loaded Hugging Face causal LM (full weights; kept and updated after every step).
        world_size: processes in all (this one included), >= 2.
        optim: the AdamW settings (``OptimConfig``).
        autocast: ``model.autocast`` (``"bfloat16"`` gives FSDP2 bf16 parameters on CUDA).
        with_ref: shard a frozen reference copy too (``algo.kl_coef > 0``).
        gradient_checkpointing: activation checkpointing in every rank's layers.
        local_ranks: ranks 1..local_ranks are started here; the others (multi-node) join from elsewhere.
        addr, port: the rendezvous (port 0: a free port, single machine only).
        timeout_s: every collective's timeout, and how long the group may take to form.

    Raises :class:`RankFailure` when the group does not form (every rank started here is stopped again).
    """

    def __init__(self, plain: nn.Module, *, world_size: int, optim, autocast: str = "none", with_ref: bool = False,
                 gradient_checkpointing: bool = False, local_ranks: int | None = None, addr: str = "127.0.0.1",
                 port: int = 0, timeout_s: float = 300.0) -> None:
        if world_size < 2:
            raise ValueError(f"a sharded site needs world_size >= 2, got {world_size}")
        self.plain = plain
        self.world_size = world_size
        self.local_ranks = world_size - 1 if local_ranks is None else local_ranks
        self.addr, self.fixed_port, self.timeout_s = addr, port, timeout_s
        param = next(plain.parameters())
        self.device = param.device
        self.setup = Setup(config=plain.config, dtype=param.dtype, device_type=self.device.type, autocast=autocast,
                           optim=optim, frozen=[n for n, p in plain.named_parameters() if not p.requires_grad],
                           with_ref=with_ref, gradient_checkpointing=gradient_checkpointing)
        self.broken: str | None = None
        self.state: RankState | None = None
        self.procs: list = []
        self.watchdog: Watchdog | None = None
        self._start()

    # ---------------------------------------------------------------- the group

    def _start(self) -> None:
        if not faulthandler.is_enabled():
            faulthandler.enable()   # a native crash in a collective leaves rank 0's Python stack in the worker's log
        port = self.fixed_port or free_port(self.addr)
        self.procs = spawn_ranks(range(1, 1 + self.local_ranks), self.world_size, self.addr, port, self.timeout_s,
                                 self.device.type)
        self.watchdog = Watchdog(self.procs, on_death=self._on_death)
        try:
            mesh = init_group(0, self.world_size, self.addr, port, self.device.type, self.timeout_s)
            broadcast(self.setup)
            self.state = RankState(self.setup, mesh, self.plain.state_dict())
        except BaseException as err:
            cause = self.watchdog.cause or f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            self._teardown()
            raise RankFailure(f"the site's {self.world_size} training processes did not start: {cause}") from None
        self.broken = None
        log.info("sharded trainer: %d processes (%s, FSDP2), rendezvous %s:%d", self.world_size,
                 "nccl" if self.device.type == "cuda" else "gloo", self.addr, port)

    def _on_death(self, cause: str) -> None:
        log.error("sharded trainer: %s", cause)

    def _teardown(self, wait_s: float = 0.0) -> None:
        import torch.distributed as dist

        if self.watchdog is not None:
            self.watchdog.stop()
        stop_ranks(self.procs, wait_s=wait_s)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - a broken group may not shut down cleanly; its ranks are gone
                pass
        self.state = None

    def restart(self) -> None:
        """Stop every rank and start the group again from the plain model's weights (the caller then loads its
        last checkpoint). Raises :class:`RankFailure` when the group does not form."""
        self._teardown()
        self._start()

    def close(self) -> None:
        """Tell every rank to stop, then stop whatever is left (idempotent)."""
        stopping = self.state is not None and self.broken is None
        if stopping:
            try:
                broadcast(("stop", None))
            except Exception:  # noqa: BLE001 - the ranks are stopped below either way
                stopping = False
        self._teardown(wait_s=30.0 if stopping else 0.0)

    def _run(self, name: str, payload, fn):
        """Broadcast command ``name`` and run it here too; any failure breaks the group (every rank stopped)."""
        if self.broken is not None or self.state is None:
            raise RankFailure(self.broken or "the site's training processes are stopped")
        try:
            broadcast((name, payload))
            return fn()
        except Exception as err:
            time.sleep(0.5)   # a dead rank: let the watchdog see its exit before naming the cause
            cause = self.watchdog.cause if self.watchdog is not None and self.watchdog.cause else \
                f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            self.broken = f"the site's sharded trainer failed in {name}: {cause}"
            self._teardown()
            raise RankFailure(self.broken) from None

    # ---------------------------------------------------------------- what the worker calls

    def update(self, model, optimizer, rows, advantages, ratios, algo, optim, *, ref_model=None, on_update=None,
               row_gate=None, **kwargs) -> dict[str, float]:
        """:func:`~hacrl_fed.update.loop.hacpo_update` on every rank (``model``, ``optimizer`` and ``ref_model`` are
        this rank's :attr:`model`, :attr:`optimizer` and :attr:`ref_model`), then the full weights into the plain
        model. Adds ``time/gather_weights_s`` to the metrics. Raises :class:`RankFailure` if a rank fails."""
        job = UpdateJob(list(rows), [float(a) for a in advantages], dict(ratios), algo, optim, kwargs,
                        gated=row_gate is not None, train_mode=bool(model.training), rng_state=torch.get_rng_state(),
                        cuda_rng_state=torch.cuda.get_rng_state() if self.device.type == "cuda" else None)
        metrics = self._run("update", job, lambda: self.state.update(job, row_gate=row_gate, on_update=on_update))
        t0 = time.perf_counter()
        self.pull_weights()
        return metrics | {"time/gather_weights_s": time.perf_counter() - t0}

    def pull_weights(self) -> None:
        """Gather the sharded weights into the plain model (collective)."""
        full = self._run("gather", None, self.state.gather)
        with torch.no_grad():
            self.plain.load_state_dict(full, strict=True)

    def save(self, directory: str) -> None:
        """Every rank writes its shard of weights and AdamW state into ``directory`` (DCP)."""
        self._run("save", str(directory), lambda: self.state.save(str(directory)))

    def load(self, directory: str) -> None:
        """Every rank loads a sharded checkpoint; then the plain model gets the weights."""
        self._run("load", str(directory), lambda: self.state.load(str(directory)))
        self.pull_weights()

    def load_full(self, model_state: dict[str, torch.Tensor], optim_state: dict[str, Any] | None) -> None:
        """Shard full weights and a full AdamW state (Hugging Face names) over the ranks: a single-process
        checkpoint resumed here. The plain model must already hold ``model_state``."""
        full = {"model": model_state, "optim": optim_state}
        self._run("load_full", None, lambda: self.state.load_full(full))

    @property
    def model(self) -> nn.Module:
        """This rank's sharded root (what the trainer passes to :meth:`update`)."""
        return self.state.root

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.state.optimizer

    @property
    def ref_model(self) -> nn.Module | None:
        return self.state.ref
