"""Sharded checkpoint files (``torch.distributed.checkpoint``) of a site trained over N processes.

A sharded checkpoint directory holds, beside ``rng.pt`` and ``state.json`` (:mod:`hacrl_fed.checkpoints.store`),
the DCP files ``.metadata`` and ``__<rank>_0.distcp``: the model's weights under their Hugging Face names and the
AdamW state keyed by those names, each rank writing its own shard. DCP reshards on load, so the same files load
into any number of processes, including a plain single-process model (:func:`load_sharded` without a process group,
what :meth:`CheckpointManager.load` does for a ``sharded`` checkpoint).

``prefix`` is how the live model names its parameters relative to the Hugging Face names (``"lm."`` for the
sharded root of :mod:`hacrl_fed.distributed.fsdp`, ``""`` for a plain model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["load_sharded", "rename_optim", "save_sharded"]


def _rename(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    return {(new + k[len(old):] if k.startswith(old) else k): v for k, v in state.items()}


def rename_optim(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (``get_optimizer_state_dict``) with prefix ``old`` of every
    name replaced by ``new``."""
    groups = [dict(g, params=[new + p[len(old):] if p.startswith(old) else p for p in g["params"]])
              for g in state.get("param_groups", [])]
    return {"state": _rename(state.get("state", {}), old, new), "param_groups": groups}


def _state(model, optimizer, prefix: str) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    out = {"model": _rename(get_model_state_dict(model), prefix, "")}
    if optimizer is not None:
        out["optim"] = rename_optim(get_optimizer_state_dict(model, optimizer), prefix, "")
    return out


def save_sharded(directory: str | Path, model, optimizer, *, prefix: str = "") -> None:
    """Write this rank's shard of ``model`` and ``optimizer`` into ``directory`` (every rank calls it; rank 0 writes
    ``.metadata`` once every rank's shard is written). Raises on a failed write or a rank that fails meanwhile."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state(model, optimizer, prefix), checkpoint_id=str(directory))


def load_sharded(directory: str | Path, model, optimizer=None, *, prefix: str = "") -> None:
    """Load a sharded checkpoint into ``model`` (and ``optimizer``), resharded to this process group (or into a
    plain model when no group is initialised). Raises on missing or mismatched tensors."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    state = _state(model, optimizer, prefix)
    dcp.load(state, checkpoint_id=str(directory), no_dist=not (dist.is_available() and dist.is_initialized()))
    set_model_state_dict(model, _rename(state["model"], "", prefix), options=StateDictOptions(strict=True))
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, rename_optim(state["optim"], "", prefix))
