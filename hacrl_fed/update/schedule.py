"""Learning-rate schedules with warm-up (transformers ``get_{constant,linear,cosine}_schedule_with_warmup``).

The multiplier λ of ``optim.lr`` is a function of the schedule position s alone, so a resumed run
(which restores the step number) continues the schedule exactly; nothing of it is checkpointed.
With N = ``schedule_steps`` and W warm-up steps (``warmup_steps``, or ``ceil(warmup_ratio · N)``):

    s < W:      λ(s) = s / W                                                    (linear warm-up)
    constant:   λ(s) = 1
    linear:     λ(s) = max(0, (N − s) / max(1, N − W))
    cosine:     λ(s) = ½ · (1 + cos(π · min(1, (s − W) / max(1, N − W))))

Position: update k (0-based, all epochs) of the M updates of training step t (1-based) sits at
s = (t − 1) + k / M. With one update per step this is transformers' schedule over N optimizer steps
(TRL ``lr_scheduler_type``, ``warmup_steps``, ``warmup_ratio``), including its first warm-up update at
lr 0. Pure functions; no torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hacrl_fed.update.optim_config import OptimConfig

__all__ = ["lr_factor", "scheduled_lr", "warmup_steps"]


def warmup_steps(optim: OptimConfig) -> float:
    """W: ``optim.warmup_steps``, or ``ceil(warmup_ratio · schedule_steps)`` (transformers' rounding).

    Raises ``ValueError`` for a ratio without ``schedule_steps``.
    """
    if optim.warmup_ratio:
        if optim.schedule_steps is None:
            raise ValueError("optim.warmup_ratio needs optim.schedule_steps (the run's number of steps)")
        return float(math.ceil(optim.warmup_ratio * optim.schedule_steps))
    return float(optim.warmup_steps)


def lr_factor(position: float, kind: str, *, warmup: float, total: float | None) -> float:
    """λ(s) of the module docstring for schedule ``kind`` (``constant`` | ``linear`` | ``cosine``).

    ``position`` s ≥ 0 and ``warmup`` W ≥ 0 in training steps; ``total`` N (None only for ``constant``).
    Raises ``ValueError`` for an unknown kind, a negative position, or a decay without ``total``.
    """
    if position < 0 or warmup < 0:
        raise ValueError(f"schedule position and warm-up must be >= 0, got {position}, {warmup}")
    if kind not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown lr_scheduler_type {kind!r}; valid: constant, linear, cosine")
    if position < warmup:
        # λ = s / W      (transformers: current_step / max(1, num_warmup_steps))
        return position / max(1.0, warmup)
    if kind == "constant":
        return 1.0
    if total is None:
        raise ValueError(f"lr_scheduler_type {kind!r} needs schedule_steps (the run's number of steps)")
    span = max(1.0, total - warmup)
    if kind == "linear":
        # λ = (N − s) / (N − W), never below 0
        return max(0.0, (total - position) / span)
    # λ = ½ (1 + cos(π · progress)), progress = (s − W) / (N − W), held at 1 past N (transformers' cosine
    # would rise again there; a run given more steps than its schedule stays at 0)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, (position - warmup) / span))))


def scheduled_lr(optim: OptimConfig, step: int, update: int, updates: int) -> float:
    """The lr of update ``update`` (0-based) of the ``updates`` updates of training step ``step`` (1-based).

    Raises ``ValueError`` for ``step < 1``, ``update`` outside ``0..updates − 1``, or a schedule that needs
    ``schedule_steps`` without it.
    """
    if step < 1 or not 0 <= update < updates:
        raise ValueError(f"need step >= 1 and 0 <= update < updates, got {step}, {update}, {updates}")
    if optim.needs_schedule_steps and optim.schedule_steps is None:
        raise ValueError(f"optim.lr_scheduler_type = {optim.lr_scheduler_type!r} / warmup_ratio needs "
                         "optim.schedule_steps (the run's number of steps)")
    position = (step - 1) + update / updates
    total = None if optim.schedule_steps is None else float(optim.schedule_steps)
    return optim.lr * lr_factor(position, optim.lr_scheduler_type, warmup=warmup_steps(optim), total=total)
