"""Named extensions of the HACPO objective: the terms beyond the paper, each selected by an ``AlgoConfig`` option
that the ``hacpo`` preset leaves off (docs/algorithm.md).

The paper's math is :mod:`hacrl_fed.algo.losses` (Eqs. 10–14, 47–53) and :mod:`hacrl_fed.algo.advantages`; this
module holds what the project adds, registered by name in :mod:`hacrl_fed.algo.registry` beside the paper's entries
(the registry imports it on first use), so :func:`hacrl_fed.algo.losses.compute_loss` reaches each one by its name
and never by an ``if``:

* ``CROSS_OBJECTIVES["self"]``: naive sharing, :func:`naive_cross_objective` (``cross_objective = "self"``);
* ``MISSING_LOGPROB_OBJECTIVES``: foreign rows without a behaviour log-prob (``missing_behaviour_logprob``),
  :func:`success_only_objective`, :func:`luffy_shaping_objective`;
* ``LOSS_AGGREGATIONS``: DAPO's token mean (:func:`token_mean`) and Dr. GRPO's constant normalizer
  (:func:`constant_normalizer`).

A new extension term goes here: its formula and source in the docstring, an ``AlgoConfig`` option off by default,
registered under its name. The cross-family options that change the paper's own cross term in place
(``cross_ratio_unit``, ``cross_below_window``, ``cross_above_window``) stay inside
:func:`hacrl_fed.algo.losses.hacpo_cross_objective` and :func:`hacrl_fed.algo.losses.cross_log_ratio`.

Shapes as in :mod:`hacrl_fed.algo.losses`: B rows, T padded positions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hacrl_fed.algo.losses import LossInputs, RowTerms, cross_log_ratio, sequence_surrogate
from hacrl_fed.algo.registry import CROSS_OBJECTIVES, LOSS_AGGREGATIONS, MISSING_LOGPROB_OBJECTIVES

if TYPE_CHECKING:
    from hacrl_fed.algo.config import AlgoConfig


# ----------------------------------------------------------------------------- cross rows


@CROSS_OBJECTIVES.register("self")
def naive_cross_objective(inputs: LossInputs, cfg: AlgoConfig) -> RowTerms:
    """Naive sharing (the paper's "Naive Collaborative Baseline", whose loss it leaves unspecified, spec §10;
    this is the project's reading): a foreign row gets the GSPO self objective with the source's behaviour
    log-prob as its old log-prob (two lengths), no ω, no stepwise window. Also used when
    ``ratio_level="token"``: a foreign row has no per-token old log-probs in the learner's tokens.
    The ratio follows the cross-ratio conventions (:func:`cross_log_ratio`: content tokens, unit)."""
    log_s = cross_log_ratio(inputs, unit=cfg.cross_ratio_unit, max_abs_log_ratio=cfg.max_abs_log_ratio)
    return sequence_surrogate(log_s, inputs, cfg)


# ----------------------------------------------------------------------------- rows without a behaviour log-prob


def missing_logprob_objective(inputs: LossInputs, cfg: AlgoConfig) -> RowTerms:
    """Objective of foreign rows whose source sent no behaviour log-prob (``cfg.missing_behaviour_logprob``).

    Without π_j,old(y) the cross ratio s of Eq. 11 is undefined, so HACPO's clamp cannot place the row;
    these rules are named extensions (not the paper), applied to such rows only:

    * ``success_only`` (default; the project's ``success_gated`` rule of ``cross_below_window`` with s unknown,
      i.e. a verified success is trusted only as far as the window's most off-policy edge; success-only
      supervised terms of learning from samples without a behaviour probability, cf. LUFFY arXiv 2504.14945):
      J = l_m · sg(l_m)^α · r_{j→k} · A · u for A > 0, J = 0 (no gradient) for A ≤ 0, with
      u = exp(m − sg(m)), m = (1/L_k) Σ_t log π_k(y_t) (value 1, gradient ∇m); l_m = ``cross_lower_bound(m)``
      (1 when ``cross_clip`` is off). Gradient l_m^(1+α)·r·A·∇ mean log π_k.
    * ``luffy_shaping`` (LUFFY arXiv 2504.14945 Eq. 6–7: off-policy behaviour probability taken as 1,
      regularized importance sampling f(π) = π/(π + γ)): J = r_{j→k} · A · (1/L_k) Σ_t π_k(y_t)/(π_k(y_t) + γ),
      every row, no clip; per-token gradient γ·π/(π + γ)² ·∇ log π — large for tokens the learner finds
      unlikely, vanishing for the ones it already predicts.

    r_{j→k} is the capability ratio (Eq. 10) when ``capability_gradient`` and the HACPO cross objective are on,
    else 1. Rows [B] → RowTerms; ``ratio`` reports the weight used (l_m, or the mean shaped probability);
    ``clip_low`` marks a dropped non-success.
    """
    return MISSING_LOGPROB_OBJECTIVES.get(cfg.missing_behaviour_logprob)(inputs, cfg)


def _no_logprob_terms(inputs: LossInputs, cfg: AlgoConfig) -> tuple[Tensor, ...]:
    """``(lp, resp, zeros, l_k, adv, omega)`` shared by the rules without a behaviour log-prob."""
    lp = inputs.token_logprobs
    resp = inputs.response_mask.bool()
    zeros = torch.zeros_like(lp)
    l_k = resp.sum(-1).clamp(min=1).to(lp.dtype)
    adv = inputs.advantages.to(lp.dtype)
    use_omega = cfg.capability_gradient and cfg.cross_objective == "hacpo"
    omega = inputs.capability_ratio.to(lp.dtype) if use_omega else torch.ones_like(adv)
    return lp, resp, zeros, l_k, adv, omega


@MISSING_LOGPROB_OBJECTIVES.register("success_only")
def success_only_objective(inputs: LossInputs, cfg: AlgoConfig) -> RowTerms:
    """``success_only`` of :func:`missing_logprob_objective`: J = l_m · sg(l_m)^α · r_{j→k} · A · u for A > 0,
    else 0. Rows [B] → RowTerms (``ratio`` = l_m, ``clip_low`` marks a dropped non-success)."""
    lp, resp, zeros, l_k, adv, omega = _no_logprob_terms(inputs, cfg)
    edge = cfg.cross_lower_bound(inputs.update_index) if cfg.cross_clip else 1.0
    mean_logp = torch.where(resp, lp, zeros).sum(-1) / l_k
    unit = torch.exp(mean_logp - mean_logp.detach())       # value 1, gradient ∇ mean log π_k
    success = adv > 0
    # J = l_m · sg(l_m)^α · r · A · u   for A > 0;   0 otherwise
    weight = edge * edge ** cfg.alpha
    obj = torch.where(success, weight * unit * omega * adv, torch.zeros_like(adv))
    ratio = torch.full_like(adv, edge).detach()
    dropped = (~success).to(lp.dtype)
    has_grad = (success & (omega != 0)).to(lp.dtype)
    return RowTerms(obj, ratio, dropped, torch.zeros_like(adv), has_grad)


@MISSING_LOGPROB_OBJECTIVES.register("luffy_shaping")
def luffy_shaping_objective(inputs: LossInputs, cfg: AlgoConfig) -> RowTerms:
    """``luffy_shaping`` of :func:`missing_logprob_objective` (LUFFY arXiv 2504.14945 Eq. 6–7):
    J = r_{j→k} · A · (1/L_k) Σ_t π_k(y_t)/(π_k(y_t) + γ). Rows [B] → RowTerms (``ratio`` = the mean shaped
    probability)."""
    lp, resp, zeros, l_k, adv, omega = _no_logprob_terms(inputs, cfg)
    p = torch.exp(torch.where(resp, lp, zeros))
    # f(π) = π / (π + γ), token mean over the response
    shaped = torch.where(resp, p / (p + cfg.luffy_gamma), zeros).sum(-1) / l_k
    obj = shaped * omega * adv
    has_grad = ((adv != 0) & (omega != 0)).to(lp.dtype)
    return RowTerms(obj, shaped.detach(), torch.zeros_like(adv), torch.zeros_like(adv), has_grad)


# ----------------------------------------------------------------------------- aggregation


def _row_lengths(row_loss: Tensor, inputs: LossInputs) -> Tensor:
    """L_i, response tokens of each row, 0 for rows outside ``loss_mask``. [B]"""
    lengths = inputs.response_mask.bool().sum(-1).to(row_loss.dtype)
    return lengths if inputs.loss_mask is None else lengths * inputs.loss_mask.to(row_loss.dtype)


@LOSS_AGGREGATIONS.register("token_mean")
def token_mean(row_loss: Tensor, inputs: LossInputs) -> Tensor:
    """L = Σ_i L_i · loss_i / Σ_i L_i over the mini-batch (DAPO arXiv 2503.14476 Eq. 8; TRL ``"dapo"``).
    ``inputs.num_tokens`` = Σ_i L_i of the whole mini-batch, so micro-batch results add up. [B] → scalar."""
    lengths = _row_lengths(row_loss, inputs)
    n_tok = float(lengths.sum()) if inputs.num_tokens is None else float(inputs.num_tokens)
    # L = Σ_i Σ_t loss_{i,t} / Σ_i L_i,   loss_{i,t} = loss_i for the row's tokens
    return (lengths * row_loss).sum() / max(n_tok, 1.0)


@LOSS_AGGREGATIONS.register("constant")
def constant_normalizer(row_loss: Tensor, inputs: LossInputs) -> Tensor:
    """L = Σ_i L_i · loss_i / (n · L_max) (Dr. GRPO arXiv 2503.20783 §3.1; TRL ``"dr_grpo"``). Raises
    ``ValueError`` without ``inputs.max_response_tokens``. [B] → scalar."""
    if inputs.max_response_tokens is None or inputs.max_response_tokens < 1:
        raise ValueError("loss_aggregation = 'constant' needs LossInputs.max_response_tokens (L_max >= 1)")
    n = row_loss.shape[0] if inputs.num_sequences is None else inputs.num_sequences
    # L = Σ_i Σ_t loss_{i,t} / (n · L_max)      (a constant: no length bias either way)
    return (_row_lengths(row_loss, inputs) * row_loss).sum() / (n * inputs.max_response_tokens)
