"""Peer distillation: a supervised term on verified peer successes beside the HACPO loss (a named extension; off by
default, the ``hacpo`` preset unchanged).

Why: reinforcement learning with verifiable rewards sharpens what a learner already samples; new capability comes
with distillation (arXiv 2504.13837, 2505.14216). HACPO's cross objective weighs a peer's row by the learner's own
probability of it (the clamped ratio c ≤ 1 and sg(c)^α, paper Eqs. 10–14), so text the learner would almost never
write — a peer's worked solution of a task it cannot yet solve — reaches its gradient with a weight near the clip
floor. LUFFY (arXiv 2504.14945) mixes off-policy expert traces into GRPO for this reason, prime-rl admits another
model's rollouts only through a supervised loss, and small models learn best from short reasoning of small teachers
(arXiv 2502.12143).

The term (``AlgoConfig.peer_distill_coef`` λ₀ > 0 turns it on)::

    L = L_HACPO + λ_t · L_PD
    L_PD = (1/N) Σ_{i ∈ D} ω_i · NLL_i,      NLL_i = −(1/L_i) Σ_{t ∈ response_i} log π_θ(y_{i,t} | x_i, y_{i,<t})
    D    = { foreign rows i in the loss with A_i · g_i > 0 }   (verified successes above their group's baseline,
                                                                after the screens: g_i is the row gate's weight)
    ω_i  = 1 ("indicator")  or  A_i · g_i ("advantage": advantage-weighted regression, Peng et al. 2019)
    λ_t  = λ₀ ("constant")  or  λ₀ · max(0, 1 − (t − 1)/T) ("linear", T = ``peer_distill_steps``, t the 1-based step)

N is the mini-batch's row count (the normalizer of the sequence mean, spec §6), so the shares of a mini-batch's
micro-batches add up to the mini-batch's term. The learner's own rows never enter D: on its own samples the term
would only sharpen what it already writes. A row the screens leave out (g_i = 0) or below its baseline never enters
D, so a peer reaches this term only with rows that also reach the HACPO cross objective with a positive advantage.

Pure tensor functions; shapes as :class:`hacrl_fed.algo.losses.LossInputs` (B rows, T positions); the loss adds the
term in :func:`hacrl_fed.algo.losses.compute_loss`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["distill_coef", "distill_rows", "distill_weights", "peer_distill_loss"]


def distill_coef(coef: float, schedule: str, step: int | None, steps: int | None) -> float:
    """λ_t of training step ``step`` (1-based; None = the first step). ``constant``: λ₀; ``linear``:
    λ₀ · max(0, 1 − (t − 1)/T) with T = ``steps``. Raises ``ValueError`` for an unknown schedule or a linear
    schedule without ``steps`` ≥ 1."""
    if schedule == "constant":
        return float(coef)
    if schedule != "linear":
        raise ValueError(f"unknown peer distillation schedule {schedule!r} (constant, linear)")
    if steps is None or steps < 1:
        raise ValueError("the linear peer distillation schedule needs peer_distill_steps >= 1")
    t = 1 if step is None else int(step)
    return float(coef) * max(0.0, 1.0 - (t - 1) / steps)


def distill_rows(advantages: Tensor, is_own: Tensor, loss_mask: Tensor | None = None) -> Tensor:
    """bool [B]: D, the foreign rows in the loss whose (gated) advantage is positive."""
    rows = ~is_own.bool() & (advantages > 0)
    return rows if loss_mask is None else rows & loss_mask.bool()


def distill_weights(advantages: Tensor, rows: Tensor, weighting: str = "indicator") -> Tensor:
    """float [B]: ω_i on the rows of D, 0 elsewhere. ``indicator``: 1; ``advantage``: A_i · g_i. Raises
    ``ValueError`` for an unknown weighting."""
    if weighting == "indicator":
        w = torch.ones_like(advantages, dtype=torch.float32)
    elif weighting == "advantage":
        w = advantages.detach().float()
    else:
        raise ValueError(f"unknown peer distillation weighting {weighting!r} (indicator, advantage)")
    return torch.where(rows, w, torch.zeros_like(w))


def peer_distill_loss(token_logprobs: Tensor, response_mask: Tensor, weights: Tensor,
                      num_sequences: int | None = None) -> tuple[Tensor, Tensor]:
    """``(L_PD, nll)``: the scalar term (with grad) and the detached per-row NLL_i [B] (0 for rows of no tokens).

    Args:
        token_logprobs: float [B, T] learner log π_θ (0 at padding).
        response_mask: bool [B, T] the response tokens trained (L_i = row sum).
        weights: float [B] ω_i (0 outside D).
        num_sequences: N, rows of the whole mini-batch; None = B.
    """
    mask = response_mask.bool()
    lengths = mask.sum(-1).clamp(min=1).to(token_logprobs.dtype)
    nll = -torch.where(mask, token_logprobs, torch.zeros_like(token_logprobs)).sum(-1) / lengths
    n = token_logprobs.shape[0] if num_sequences is None else int(num_sequences)
    term = (weights.to(token_logprobs.dtype) * nll).sum() / max(1, n)
    return term, nll.detach()
