"""A worker whose trainer runs over several processes (``agent.trainer.world_size > 1``, docs/distributed.md).

:func:`shard_worker` turns a freshly built :class:`~hacrl_fed.worker.agent.AgentWorker` into rank 0 of its site's
sharded trainer (:class:`hacrl_fed.distributed.site.ShardedSite`): the trainer updates the shards, the worker's model
keeps the full weights for generation, fingerprints and exports, and checkpoints are written by every rank. When a
rank dies or hangs, the train request fails with the cause, every rank is stopped and started again, and the worker
resumes its newest checkpoint (its initial weights when it has none): the coordinator records the site as failed for
that step and the site trains on from the checkpoint.
"""

from __future__ import annotations

import atexit
import logging

from hacrl_fed.distributed.checkpoint import ShardedCheckpoints
from hacrl_fed.distributed.group import RankFailure
from hacrl_fed.distributed.site import ShardedSite
from hacrl_fed.worker.models import load_model, model_fingerprint

__all__ = ["shard_worker"]

log = logging.getLogger("hacrl_fed.worker")


def shard_worker(worker, keep_checkpoints: int) -> ShardedSite:
    """Start the site's other ranks and hand the worker's training to them (before any checkpoint is resumed).
    Raises ``ValueError`` for a LoRA model, :class:`RankFailure` when the group does not form."""
    cfg = worker.cfg
    if worker.loaded.is_lora:
        raise ValueError("agent.trainer.world_size > 1 trains the full model: set model.lora_rank = 0")
    t = cfg.trainer
    site = ShardedSite(worker.model, world_size=t.world_size, optim=cfg.optim, autocast=cfg.model.autocast,
                       with_ref=worker.trainer.ref_model is not None,
                       gradient_checkpointing=cfg.model.gradient_checkpointing, local_ranks=t.local_ranks,
                       addr=t.master_addr, port=t.master_port, timeout_s=t.timeout_s)
    atexit.register(site.close)
    close = worker.close

    def close_all() -> None:          # the worker's close stops its ranks too
        site.close()
        close()

    worker.close = close_all
    _attach(worker, site)
    worker.checkpoints = ShardedCheckpoints(worker.checkpoints.root, site, keep_last=keep_checkpoints)

    def update(*args, **kwargs):
        try:
            return site.update(*args, **kwargs)
        except RankFailure as err:
            log.error("%s; restarting the site's training processes from the last checkpoint", err)
            _recover(worker, site)
            raise

    worker.trainer.update_fn = update
    return site


def _attach(worker, site: ShardedSite) -> None:
    worker.trainer.model = site.model
    worker.trainer.optimizer = site.optimizer
    worker.trainer.ref_model = site.ref_model


def _recover(worker, site: ShardedSite) -> None:
    """Start the ranks again and resume the newest checkpoint (else the initial weights)."""
    found = None
    try:
        site.restart()
        _attach(worker, site)
        found = worker.checkpoints.load_latest(worker.model, site.optimizer, fingerprint=model_fingerprint,
                                               restore=lambda s: worker.trainer.guard.load_state_dict(
                                                   s.extra.get("screens")))
        if found is None:
            worker.model.load_state_dict(load_model(worker.cfg.model).model.state_dict())
            site.load_full(worker.model.state_dict(), None)
    except Exception as err:  # noqa: BLE001 - the failure being reported is the rank's; this one is logged
        log.error("the site's training processes could not be restarted: %s", err)
        return
    step, run_id, capability = (found[1].step, found[1].run_id, found[1].capability) if found else (0, "", b"")
    worker.trainer.step, worker.trainer.run_id, worker.trainer.capability = step, run_id, capability
    worker._saved_step = step
    worker.engine.weights_updated()
    log.warning("resumed step %d after the failure (%s)", step, found[0] if found else "initial weights")
