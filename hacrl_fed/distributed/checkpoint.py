"""Checkpoints of a sharded site: every rank writes its shard, the directory appears only when all have.

:class:`ShardedCheckpoints` is the worker's :class:`~hacrl_fed.checkpoints.store.CheckpointManager` with the weights
and AdamW state written by every rank through ``torch.distributed.checkpoint`` (DCP) into the temporary directory the
manager creates; rank 0 then adds ``rng.pt`` and ``state.json`` (``"sharded": N``, sizes and SHA-256 of every DCP file)
and renames the directory into place. A rank killed mid-save makes the save fail (the collective breaks), the
temporary directory is removed, and the previous checkpoint stays the newest (:attr:`CheckpointManager.latest`).

Loading takes either form: a sharded checkpoint is read by every rank (DCP reshards it, so N may differ from the
writer's); a single-process checkpoint (``model.safetensors``, ``optimizer.pt``) is read by rank 0 into the plain
model and a full AdamW state, and broadcast into the shards. A plain single-process worker reads a sharded
checkpoint too (:meth:`CheckpointManager.load_tensors`). The Hugging Face export needs nothing here: the worker's
plain model holds the full weights after every step.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hacrl_fed.checkpoints.store import CheckpointManager, TrainingState
from hacrl_fed.distributed.site import ShardedSite

__all__ = ["ShardedCheckpoints"]


class ShardedCheckpoints(CheckpointManager):
    """Checkpoints of ``site`` under ``root`` (``model`` and ``optimizer`` arguments: the worker's plain model and
    the site's sharded optimizer)."""

    def __init__(self, root: str | Path, site: ShardedSite, keep_last: int = 3) -> None:
        super().__init__(root, keep_last=keep_last)
        self.site = site

    def _write(self, d: Path, model, optimizer, state: TrainingState) -> None:
        self.site.save(str(d))
        self._write_meta(d, state, lora=False, sharded=self.site.world_size)

    def load_tensors(self, d: Path, meta: dict, model, optimizer) -> None:
        if meta.get("sharded"):
            self.site.load(str(d))
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        plain = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
        CheckpointManager.load_tensors(d, meta, model, plain if (d / "optimizer.pt").is_file() else None)
        full_optim = None
        if plain.state:
            full_optim = get_optimizer_state_dict(model, plain, options=StateDictOptions(full_state_dict=True))
        self.site.load_full(model.state_dict(), full_optim)
