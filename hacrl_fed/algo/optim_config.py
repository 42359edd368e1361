"""Optimizer settings of the learner update: AdamW, mini-batches, micro-batches by token budget.

The ``optim`` section of an agent's config (:class:`hacrl_fed.config.AgentConfig`; ``hacrl_fed.config``
re-exports :class:`OptimConfig`). It lives beside the update it configures
(:mod:`hacrl_fed.algo.update`), so the math imports nothing above ``algo/``. Pure data; no I/O, no torch.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["OptimConfig"]

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class OptimConfig(BaseModel):
    """Learner update: AdamW, mini-batches, micro-batches by token budget."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: PositiveFloat = 1e-5
    """AdamW learning rate (the paper's 1e-6 is for 1.7B–8B models; small models need more)."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8
    grad_clip: PositiveFloat = 1.0
    """Global grad-norm clip per optimizer update."""
    mini_batch_rows: PositiveInt = 64
    """Rows per optimizer update (one update = one mini-batch = one stepwise index m)."""
    micro_batch_tokens: PositiveInt = 4096
    """Token budget of one forward/backward (padded prompt + response tokens)."""
    logprob_chunk_tokens: PositiveInt = 1024
    """Positions per chunk when computing selected-token log-probs (no full [T, V] log-softmax)."""
    epochs: PositiveInt = 1
    seed: int = 0
    skip_zero_grad_updates: bool = True
    """Skip the optimizer step of a mini-batch whose gradient is exactly zero (every advantage 0, or every
    cross row outside its clip window) and count it (``zero_grad_updates``). AdamW would otherwise still move
    the weights by its momentum and weight decay with no signal from the batch (what verl and TRL do)."""
