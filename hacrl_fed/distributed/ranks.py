"""What every rank of a sharded site holds and does: the sharded policy, its AdamW, and the commands rank 0 sends.

Every rank runs the same :func:`hacrl_fed.update.loop.hacpo_update` on the same rows (rank 0 broadcasts them with
its torch RNG state, so dropout draws the same masks); FSDP2 averages the N identical gradients, so each update is
the single-process update with parameters, gradients and AdamW state split N ways (docs/distributed.md, "What is
sharded"). The likelihood screen's weights (``row_gate``) are computed once, by rank 0's screens, and broadcast.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hacrl_fed.checkpoints.sharded import load_sharded, rename_optim, save_sharded
from hacrl_fed.distributed.fsdp import (
    empty_model,
    full_state_dict,
    load_full_state_dict,
    mixed_precision,
    reshard,
    shard_model,
)
from hacrl_fed.distributed.group import broadcast
from hacrl_fed.update.loop import hacpo_update, make_optimizer

__all__ = ["RankState", "Setup", "UpdateJob"]

PREFIX = "lm."
"""How the sharded root names the Hugging Face parameters (:class:`~hacrl_fed.distributed.fsdp.ShardedCausalLM`)."""


@dataclass
class Setup:
    """What rank 0 tells every rank at start: the model's Hugging Face config and how it is trained."""

    config: Any
    dtype: torch.dtype
    device_type: str
    autocast: str
    optim: Any
    frozen: list[str] = field(default_factory=list)
    """Hugging Face names of the parameters not trained (``model.train_embeddings = false``)."""
    with_ref: bool = False
    """A frozen reference copy for the KL term (``algo.kl_coef > 0``)."""
    gradient_checkpointing: bool = False


@dataclass
class UpdateJob:
    """One :func:`hacpo_update` call, as rank 0 broadcasts it (rows, advantages and every setting)."""

    rows: list
    advantages: list[float]
    ratios: dict
    algo: Any
    optim: Any
    kwargs: dict[str, Any]
    """``learner, temperature, pad_id, source_rotation, step, max_response_tokens, autocast_dtype``."""
    gated: bool
    train_mode: bool
    rng_state: torch.Tensor
    cuda_rng_state: torch.Tensor | None = None
    """Rank 0's CUDA generator state (dropout on a GPU draws from it), None on a CPU."""


class RankState:
    """One rank's sharded policy (``root``), optimizer and reference model, built from rank 0's ``full`` weights
    (a Hugging Face state dict on rank 0, None elsewhere). Collective: every rank builds it together."""

    def __init__(self, setup: Setup, mesh, full: dict[str, torch.Tensor] | None) -> None:
        self.setup = setup
        self.device = torch.device(setup.device_type, torch.cuda.current_device()) \
            if setup.device_type == "cuda" else torch.device("cpu")
        self.root = self._sharded(mesh, full, trainable=True)
        self.optimizer = make_optimizer(self.root, setup.optim)
        self.ref = self._sharded(mesh, full, trainable=False) if setup.with_ref else None

    def _sharded(self, mesh, full, *, trainable: bool):
        s = self.setup
        lm = empty_model(s.config, s.dtype)
        if trainable and s.gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for name, p in lm.named_parameters():
            p.requires_grad_(trainable and name not in s.frozen)
        root = shard_model(lm, mesh, mp_policy=mixed_precision(self.device, s.autocast))
        load_full_state_dict(root, full, self.device)
        return root.train(False)

    # ---------------------------------------------------------------- commands (every rank runs each)

    def update(self, job: UpdateJob, *, row_gate=None, on_update=None) -> dict[str, float]:
        """Run the job's update on this rank's shards. Rank 0 passes its screens' ``row_gate`` (its weights are
        broadcast); the other ranks receive them. Returns the update's metrics (the same on every rank)."""
        torch.set_rng_state(job.rng_state)
        if job.cuda_rng_state is not None:
            torch.cuda.set_rng_state(job.cuda_rng_state)
        gate = None
        if job.gated:
            gate = _broadcasting_gate(row_gate) if row_gate is not None else _received_gate
        self.root.train(job.train_mode)
        try:
            return hacpo_update(self.root, self.optimizer, job.rows, job.advantages, job.ratios, job.algo, job.optim,
                                ref_model=self.ref, on_update=on_update, row_gate=gate, **job.kwargs)
        finally:
            self.root.train(False)
            reshard(self.root)
            if self.ref is not None:
                reshard(self.ref)

    def gather(self) -> dict[str, torch.Tensor]:
        """The full weights on rank 0 (Hugging Face names, CPU), {} elsewhere."""
        return full_state_dict(self.root)

    def save(self, directory: str) -> None:
        """This rank's shard of weights and AdamW state into ``directory`` (DCP)."""
        save_sharded(directory, self.root, self.optimizer, prefix=PREFIX)

    def load(self, directory: str) -> None:
        """Weights and AdamW state from a sharded checkpoint in ``directory``, resharded to this group."""
        load_sharded(directory, self.root, self.optimizer, prefix=PREFIX)

    def load_full(self, full: dict[str, Any] | None) -> None:
        """Rank 0's full weights and full AdamW state (``{"model": ..., "optim": ...}`` with Hugging Face names;
        None on the other ranks): a single-process checkpoint resumed into N processes."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        load_full_state_dict(self.root, full["model"] if full else None, self.device)
        optim = rename_optim(full["optim"], "", PREFIX) if full and full.get("optim") else {}
        if broadcast(bool(optim)):   # rank 0's answer on every rank
            set_optimizer_state_dict(self.root, self.optimizer, optim,
                                     options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))


def _broadcasting_gate(gate):
    def run(rows, sums):
        try:
            weights = [float(w) for w in gate(rows, sums)]
        except Exception as err:   # the other ranks wait for the weights: tell them, then fail here too
            broadcast(f"{type(err).__name__}: {err}")
            raise
        return broadcast(weights)
    return run


def _received_gate(rows, sums):
    weights = broadcast(None)
    if isinstance(weights, str):
        raise RuntimeError(f"rank 0's row gate failed: {weights}")
    return weights
