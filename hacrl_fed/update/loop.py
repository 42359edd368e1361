"""One learner's HACPO update for one training step (hacpo-spec §8.3 step 6d; paper Algorithm 1).

    rows (own + foreign, learner tokens) ─ order: own first, then each source in sorted order
      └ epochs × mini-batches of ``optim.mini_batch_rows``      (one AdamW step each; stepwise m)
          └ micro-batches by padded-token budget ``optim.micro_batch_tokens`` (rows sharing a prompt packed)
              token log-probs (chunked LM head) → compute_loss → backward (sums to the mini-batch mean)
          grad-norm clip → optimizer step

The old log-prob of every row is its ``behaviour_logprob_sum`` over ``behaviour_token_count``
tokens: the source's pre-update policy in the source's tokenization for foreign rows, the
learner's own pre-update forward for own rows. A foreign row whose source sent none (the wire's presence
flag, ``TrainingRow.has_behaviour_logprob``) is trained by ``AlgoConfig.missing_behaviour_logprob``
(:func:`hacrl_fed.algo.extensions.missing_logprob_objective`). It is never replaced by the current
(detached) log-prob — verl's on-policy shortcut would silently corrupt the cross ratio
(spec §6). Rows are never shuffled, so the stepwise index m of every row is well defined;
by default m counts only the updates that hold cross rows (``AlgoConfig.stepwise_index``,
:func:`hacrl_fed.algo.losses.stepwise_indices`, docs/algorithm.md).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from hacrl_fed.algo.capability import RatioKey, row_ratio
from hacrl_fed.update.logprobs import packing_unsupported, token_logprobs
from hacrl_fed.algo.losses import LossInputs, compute_loss, stepwise_indices
from hacrl_fed.update.schedule import scheduled_lr
from hacrl_fed.tokenization.packing import pack_rows, pair_cost, plan_packed_microbatches
from hacrl_fed.tokenization.views import TrainingRow, collate

if TYPE_CHECKING:
    from hacrl_fed.algo.config import AlgoConfig
    from hacrl_fed.update.optim_config import OptimConfig


RowGate = Callable[[Sequence[TrainingRow], Sequence[float]], Sequence[float]]
"""``gate(rows, content_logprob_sums) -> weights``: called once per micro-batch with its rows and the learner's
Σ log π over each row's content tokens (nats; the response without a terminal EOS, an episode's agent turns without
their EOS; detached, from the forward
the update computes anyway). Each foreign row's advantage is multiplied by its weight in [0, 1] (0: no
gradient; the row still counts in the mini-batch mean, like a row clamped out of the cross window); own rows
are always weight 1 (:mod:`hacrl_fed.screens`)."""


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer update: ``rows`` = indices into the ordered rows, ``m`` = stepwise index."""

    rows: tuple[int, ...]
    m: int
    epoch: int


def make_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters with ``optim``'s lr, betas, eps and weight decay.

    On torch's fused kernel (``fused=True``) when every trainable parameter is a floating-point tensor on the
    CPU or a CUDA device, torch's default otherwise: the same formula to float round-off (SmolLM2-135M's GSPO
    step in ``benchmarks/bench_vs_trl.py``, 2 × 4: 0.015 % of the weights differ from the for-loop result, by
    at most 6e-8), without the default's temporaries: on the CPU (for-loop) ``sqrt(v)`` and
    ``sqrt(v) / sqrt(1 − β₂ᵗ)`` the size of each parameter — 0.21 GiB at the 49152 × 576 tied embedding, on
    top of the first step's new state: that step's peak RSS, 2.70 → 2.48 GiB — on CUDA (foreach) for every
    parameter at once. TRL's default too (``adamw_torch_fused``). A checkpoint's optimizer state keeps the
    implementation it was saved with (``fused`` is in its ``param_groups``).

    Raises ``ValueError`` if the model has no trainable parameter.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas), eps=optim.eps,
                             weight_decay=optim.weight_decay, fused=fused or None)


def source_order(sources: Sequence[str], rotation: int = 0) -> list[str]:
    """Sources in sorted name order, rotated left by ``rotation`` (e.g. the step number).

    Later mini-batches get tighter stepwise bounds (Eq. 14), so a fixed order would always give
    the same source the tightest window; rotating by step spreads that evenly over N − 1 sources.
    """
    ordered = sorted(set(sources))
    if not ordered:
        return []
    k = rotation % len(ordered)
    return ordered[k:] + ordered[:k]


def order_rows(rows: Sequence[TrainingRow], learner: str, rotation: int = 0) -> list[int]:
    """Indices of ``rows``: the learner's own rows first (input order), then each source agent in
    :func:`source_order` (input order within a source), as [O] does (spec §5.3)."""
    own = [i for i, r in enumerate(rows) if r.source_agent == learner]
    by_source: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        if r.source_agent != learner:
            by_source[r.source_agent].append(i)
    return own + [i for source in source_order(list(by_source), rotation) for i in by_source[source]]


def plan_minibatches(is_own: Sequence[bool], mini_batch_rows: int, *, epochs: int = 1,
                     stepwise_index: str = "cross_update") -> list[MiniBatch]:
    """Consecutive mini-batches of the ordered rows, repeated per epoch, with their stepwise m.

    m counts across epochs (it is "updates performed so far within the step", Eq. 14). See
    :func:`hacrl_fed.algo.losses.stepwise_indices` for the two modes (T11, T16).
    """
    if mini_batch_rows < 1 or epochs < 1:
        raise ValueError(f"mini_batch_rows and epochs must be >= 1, got {mini_batch_rows}, {epochs}")
    n = len(is_own)
    chunks = [tuple(range(s, min(s + mini_batch_rows, n))) for s in range(0, n, mini_batch_rows)]
    flat = [(epoch, c) for epoch in range(epochs) for c in chunks]
    ms = stepwise_indices([not all(is_own[i] for i in c) for _, c in flat], stepwise_index)
    return [MiniBatch(c, m, epoch) for (epoch, c), m in zip(flat, ms, strict=True)]


def plan_microbatches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Split positions 0..len−1 into micro-batches whose padded size (rows × longest) fits the budget.

    Rows are taken longest first; a single row longer than the budget forms its own micro-batch.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= token_budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def _validate(rows: Sequence[TrainingRow], advantages: Sequence[float], ratios: Mapping[RatioKey, float],
              algo: AlgoConfig, learner: str) -> None:
    if len(rows) != len(advantages):
        raise ValueError(f"{len(rows)} rows but {len(advantages)} advantages")
    for row, adv in zip(rows, advantages, strict=True):
        where = f"row {row.prompt_id}/{row.sample_index} from {row.source_agent!r}"
        if bool(row.is_own) != (row.source_agent == learner):
            raise ValueError(f"{where}: is_own={row.is_own} disagrees with learner {learner!r}")
        if not row.is_own and not algo.share_rollouts:
            raise ValueError(f"{where}: foreign row given to an isolated learner (algo.share_rollouts = false)")
        if not row.is_own and not (math.isfinite(r := row_ratio(ratios, row.source_agent, row.prompt_id)) and r > 0):
            raise ValueError(f"{where}: no valid capability ratio for source (ratios for {sorted(ratios)})")
        if not row.prompt_ids or not row.response_ids:
            raise ValueError(f"{where}: empty prompt or response")
        if row.is_own and not row.has_behaviour_logprob:
            raise ValueError(f"{where}: an own row always has its behaviour log-prob")
        if row.has_behaviour_logprob and (row.behaviour_token_count < 1
                                          or not math.isfinite(row.behaviour_logprob_sum)):
            raise ValueError(f"{where}: behaviour log-prob needs a finite sum over >= 1 token")
        if not math.isfinite(adv):
            raise ValueError(f"{where}: advantage {adv} is not finite")


class _Stats:
    """Accumulates per-row and per-update diagnostics into the returned metrics."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.updates: dict[str, list[float]] = defaultdict(list)
        self.tokens = 0
        self.entropy_sum = 0.0
        self.entropy_tokens = 0
        self.masked_rows = 0

    def add_rows(self, sources: list[str], advs: list[float], out) -> None:
        cols = zip(out.rows.ratio.tolist(), out.rows.clip_low.tolist(), out.rows.clip_high.tolist(),
                   out.row_loss.tolist(), out.rows.reached_gradient().tolist(), strict=True)
        distilled = out.distilled.tolist() if out.distilled is not None else [None] * len(sources)
        for src, adv, (s, lo, hi, loss, g), d in zip(sources, advs, cols, distilled, strict=True):
            for key, value in (("s", s), ("clip_low", lo), ("clip_high", hi), ("loss", loss), ("adv", abs(adv)),
                               ("grad", g), ("pos_adv", float(adv > 0)), ("pos_grad", float(adv > 0 and g > 0))):
                self.rows[src][key].append(float(value))
            if d is not None:
                self.rows[src]["distill"].append(float(d))

    def summary(self, rows: Sequence[TrainingRow]) -> dict[str, float]:
        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        u = self.updates
        n_src: dict[str, int] = defaultdict(int)
        no_lp: dict[str, int] = defaultdict(int)
        for row in rows:
            n_src[row.source_agent] += 1
            no_lp[row.source_agent] += not row.has_behaviour_logprob
        out = {"rows": float(len(rows)), "updates": float(len(u["loss"])), "tokens": float(self.tokens),
               "loss": mean(u["loss"]), "pg_loss": mean(u["pg_loss"]), "kl": mean(u["kl"]),
               "grad_norm": mean(u["grad_norm"]), "grad_norm_max": max(u["grad_norm"], default=0.0),
               "skipped_updates": float(sum(u["skipped"])), "zero_grad_updates": float(sum(u["zero_grad"])),
               "lr": mean(u["lr"]), "entropy": self.entropy_sum / max(1, self.entropy_tokens),
               "masked_truncated_rows": float(self.masked_rows)}
        if u["cross_lower_bound"]:
            out |= {"cross_lower_bound_first": u["cross_lower_bound"][0],
                    "cross_lower_bound_last": u["cross_lower_bound"][-1],
                    "stepwise_saturated_updates": float(sum(b >= 1.0 for b in u["cross_lower_bound"]))}
        if u["distill_coef"]:
            n_distilled = sum(sum(col["distill"]) for col in self.rows.values())
            out |= {"distill_coef": mean(u["distill_coef"]), "distill_rows": float(n_distilled),
                    "distill_nll": sum(u["distill_nll_sum"]) / n_distilled if n_distilled else 0.0}
        all_adv = [a for src in self.rows.values() for a in src["adv"]]
        out["adv_abs_mean"] = mean(all_adv)
        out["zero_adv_frac"] = mean([float(a == 0.0) for a in all_adv])
        for src, col in sorted(self.rows.items()):
            out |= {f"src/{src}/rows": float(n_src[src]), f"src/{src}/s_mean": mean(col["s"]),
                    f"src/{src}/s_min": min(col["s"]), f"src/{src}/s_max": max(col["s"]),
                    f"src/{src}/clip_low": mean(col["clip_low"]), f"src/{src}/clip_high": mean(col["clip_high"]),
                    f"src/{src}/adv_abs_mean": mean(col["adv"]), f"src/{src}/loss": mean(col["loss"]),
                    f"src/{src}/grad_frac": mean(col["grad"]),
                    f"src/{src}/pos_adv_rows": sum(col["pos_adv"]), f"src/{src}/pos_adv_grad_rows": sum(col["pos_grad"])}
            if no_lp[src]:
                out[f"src/{src}/no_logprob_rows"] = float(no_lp[src])
            if col["distill"]:
                out[f"src/{src}/distill_rows"] = sum(col["distill"])
        return out


@dataclass(frozen=True)
class _Context:
    model: nn.Module
    ref_model: nn.Module | None
    algo: AlgoConfig
    optim: OptimConfig
    temperature: float
    pad_id: int
    device: torch.device
    max_response_tokens: int | None = None
    autocast_dtype: torch.dtype | None = None
    row_gate: RowGate | None = None
    packing: bool = False
    step: int | None = None

    def in_loss(self, row: TrainingRow) -> bool:
        """The row enters the loss (``mask_truncated_completions`` leaves out rows without their EOS)."""
        return row.ends_with_eos or not self.algo.mask_truncated_completions


def _gate_weights(ctx: _Context, rows: list[TrainingRow], idx: list[int], logp: Tensor,
                  batch: dict[str, Tensor]) -> list[float]:
    """Weight per row of the micro-batch from ``ctx.row_gate`` (1 without one; own rows always 1)."""
    if ctx.row_gate is None:
        return [1.0] * len(idx)
    with torch.no_grad():
        sums = torch.where(batch["response_mask"].bool(), logp, torch.zeros_like(logp)).sum(-1)
        for b, i in enumerate(idx):   # content only: a turn's EOS (every stopped turn of an episode) is not text
            for p in rows[i].eos_positions:
                sums[b] -= logp[b, int(batch["prompt_lens"][b]) + p]
    weights = list(ctx.row_gate([rows[i] for i in idx], sums.tolist()))
    if len(weights) != len(idx):
        raise ValueError(f"row_gate returned {len(weights)} weights for {len(idx)} rows")
    out = []
    for i, w in zip(idx, weights):
        w = float(w)
        if not (math.isfinite(w) and 0.0 <= w <= 1.0):
            raise ValueError(f"row_gate weight {w!r} is not in [0, 1]")
        out.append(1.0 if rows[i].is_own else w)
    return out


def _use_packing(model: nn.Module, optim: OptimConfig) -> bool:
    """Resolve ``optim.shared_prompt_forward`` for ``model`` (``on`` for a model it cannot run: ValueError)."""
    why = packing_unsupported(model) if optim.shared_prompt_forward != "off" else None
    if why is not None and optim.shared_prompt_forward == "on":
        raise ValueError(f"optim.shared_prompt_forward = 'on' but packing is not exact for this model: {why}")
    return optim.shared_prompt_forward != "off" and why is None


def _micro_plan(ctx: _Context, rows: list[TrainingRow], idx: Sequence[int]) -> list[tuple[list[int], list | None]]:
    """Micro-batches of the rows ``idx`` (as row indices) by ``optim.micro_batch_tokens``, each with its packs
    (positions within the micro-batch; None unpacked); a pack's size from the model's :func:`pair_cost`."""
    budget = ctx.optim.micro_batch_tokens
    if not ctx.packing:
        return [([idx[j] for j in m], None)
                for m in plan_microbatches([len(rows[i].prompt_ids) + len(rows[i].response_ids) for i in idx], budget)]
    out = []
    for micro in plan_packed_microbatches([rows[i].prompt_ids for i in idx], [len(rows[i].response_ids) for i in idx],
                                          budget, pair_cost(getattr(ctx.model, "config", None))):
        flat = [j for pack in micro for j in pack]
        where = {j: n for n, j in enumerate(flat)}
        out.append(([idx[j] for j in flat], [[where[j] for j in pack] for pack in micro]))
    return out


def _batch(ctx: _Context, rows: list[TrainingRow], packs: list | None = None) -> dict[str, Any]:
    batch: dict[str, Any] = {k: v.to(ctx.device) for k, v in collate(rows, ctx.pad_id).items()}
    if packs is not None:
        batch["packed"] = pack_rows(batch["input_ids"].cpu(), batch["prompt_lens"].cpu(), batch["response_lens"].cpu(),
                                    packs, ctx.pad_id).to(ctx.device)
    return batch


def _logprobs(ctx: _Context, model: nn.Module, batch: dict[str, Any], *, entropy: bool = False):
    """Response-token log-probs [B, T] (LM head over response positions only; with ``entropy`` also the
    per-token entropy), under autocast if asked; through the packed layout where the batch has one."""
    packed = batch.get("packed")
    if packed is not None and model is not ctx.model and packing_unsupported(model) is not None:
        packed = None
    with torch.autocast(device_type=ctx.device.type, dtype=ctx.autocast_dtype, enabled=ctx.autocast_dtype is not None):
        return token_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=ctx.temperature,
                              chunk_tokens=ctx.optim.logprob_chunk_tokens, score_mask=batch["response_mask"],
                              return_entropy=entropy, packed=packed)


@torch.no_grad()
def _old_token_logprobs(ctx: _Context, rows: list[TrainingRow]) -> dict[int, Tensor]:
    """Per-token log-probs of the own rows under the pre-update policy (GRPO token ratio only), in eval
    mode like the behaviour log-probs of generation (no dropout), whatever mode the update runs in."""
    own = [i for i, r in enumerate(rows) if r.is_own]
    out: dict[int, Tensor] = {}
    was_training = ctx.model.training
    ctx.model.eval()
    try:
        for idx, packs in _micro_plan(ctx, rows, own):
            batch = _batch(ctx, [rows[i] for i in idx], packs)
            logp = _logprobs(ctx, ctx.model, batch)
            for b, i in enumerate(idx):
                out[i] = logp[b][batch["response_mask"][b].bool()].detach()
    finally:
        ctx.model.train(was_training)
    return out


def _micro_inputs(ctx: _Context, rows: list[TrainingRow], idx: list[int], packs: list | None, adv: list[float],
                  ratio: list[float], old_tok: dict[int, Tensor] | None, mb: MiniBatch,
                  n_own_tokens: int, n_tokens: int, stats: _Stats) -> tuple[LossInputs, int]:
    batch = _batch(ctx, [rows[i] for i in idx], packs)
    resp = batch["response_mask"].bool()
    is_own = torch.tensor([rows[i].is_own for i in idx], dtype=torch.bool, device=ctx.device)
    in_loss = torch.tensor([ctx.in_loss(rows[i]) for i in idx], dtype=torch.bool, device=ctx.device)
    logp, entropy = _logprobs(ctx, ctx.model, batch, entropy=True)
    trained = resp & in_loss.unsqueeze(-1)
    # mean token entropy of the policy on the trained tokens (TRL's ``entropy``), from the same logits
    stats.entropy_sum += float(entropy[trained].double().sum())
    stats.entropy_tokens += int(trained.sum())
    weights = _gate_weights(ctx, rows, idx, logp, batch)
    ref = None
    if ctx.ref_model is not None and bool(is_own.any()):
        with torch.no_grad():
            ref = _logprobs(ctx, ctx.ref_model, batch)
    old_tok_t = None
    if old_tok is not None:
        old_tok_t = torch.zeros_like(logp)
        for b, i in enumerate(idx):
            if i in old_tok:
                old_tok_t[b][resp[b]] = old_tok[i].to(logp.dtype)

    def col(values: list[float], dtype=torch.float32) -> Tensor:
        return torch.tensor(values, dtype=dtype, device=ctx.device)

    # cross rows compare content tokens: the EOS excluded on the source side (a single-turn row's terminal EOS,
    # every stopped turn's EOS of an episode) is masked out here
    ratio_mask = resp.clone()
    for b, i in enumerate(idx):
        for p in rows[i].ratio_eos_positions:
            ratio_mask[b, int(batch["prompt_lens"][b]) + p] = False
    source = [rows[i].ratio_source for i in idx]
    inputs = LossInputs(
        token_logprobs=logp, response_mask=resp, advantages=col([adv[i] * w for i, w in zip(idx, weights)]),
        old_logprob_sum=col([total for total, _ in source], torch.float64),
        old_token_count=col([count for _, count in source]), is_own=is_own,
        capability_ratio=col([ratio[i] for i in idx]), update_index=mb.m, old_token_logprobs=old_tok_t,
        ref_token_logprobs=ref, num_sequences=len(mb.rows), num_own_tokens=n_own_tokens, ratio_mask=ratio_mask,
        content_bytes=col([rows[i].content_bytes for i in idx]),
        loss_mask=None if bool(in_loss.all()) else in_loss, num_tokens=n_tokens,
        max_response_tokens=ctx.max_response_tokens,
        has_behaviour_logprob=None if all(rows[i].has_behaviour_logprob for i in idx)
        else torch.tensor([rows[i].has_behaviour_logprob for i in idx], dtype=torch.bool, device=ctx.device),
        train_step=ctx.step)
    return inputs, int(batch["attention_mask"].sum())


def _run_minibatch(ctx: _Context, optimizer: torch.optim.Optimizer, rows: list[TrainingRow], adv: list[float],
                   ratio: list[float], old_tok: dict[int, Tensor] | None, mb: MiniBatch, stats: _Stats) -> None:
    """Accumulate the mini-batch gradient over micro-batches, clip it, take one optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    # trained tokens: an episode's glue between agent turns is context, not counted
    n_own_tokens = sum(rows[i].trained_token_count for i in mb.rows if rows[i].is_own and ctx.in_loss(rows[i]))
    n_tokens = sum(rows[i].trained_token_count for i in mb.rows if ctx.in_loss(rows[i]))
    loss_sum = pg_sum = kl_sum = distill_nll = 0.0
    distill_lam = 0.0                    # λ_t, as the loss computed it (the same for every micro-batch of a step)
    for idx, packs in _micro_plan(ctx, rows, mb.rows):
        inputs, tokens = _micro_inputs(ctx, rows, idx, packs, adv, ratio, old_tok, mb, n_own_tokens, n_tokens, stats)
        out = compute_loss(inputs, ctx.algo)
        # micro losses are normalized by the mini-batch sizes ⇒ their sum is the mini-batch loss
        out.loss.backward()
        stats.tokens += tokens
        loss_sum += float(out.loss.detach())
        pg_sum += out.metrics["hacpo/pg_loss"]
        kl_sum += float(out.kl)
        distill_nll += out.metrics.get("hacpo/distill_nll", 0.0) * out.metrics.get("hacpo/distill_rows", 0.0)
        distill_lam = out.metrics.get("hacpo/distill_coef", distill_lam)
        stats.add_rows([rows[i].source_agent for i in idx], [adv[i] for i in idx], out)
        del inputs, out
    params = [p for group in optimizer.param_groups for p in group["params"]]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, ctx.optim.grad_clip))
    skipped = not (math.isfinite(grad_norm) and math.isfinite(loss_sum))
    zero = not skipped and grad_norm == 0.0 and ctx.optim.skip_zero_grad_updates
    if not skipped and not zero:         # a non-finite update is dropped and counted, never applied
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for key, value in (("loss", loss_sum), ("pg_loss", pg_sum), ("kl", kl_sum), ("grad_norm", grad_norm),
                       ("skipped", float(skipped)), ("zero_grad", float(zero)),
                       ("lr", float(optimizer.param_groups[0]["lr"]))):
        stats.updates[key].append(value)
    if ctx.algo.peer_distill_coef > 0:
        stats.updates["distill_coef"].append(distill_lam)
        stats.updates["distill_nll_sum"].append(distill_nll)
    if ctx.algo.cross_clip and ctx.algo.cross_objective == "hacpo" and not all(rows[i].is_own for i in mb.rows):
        stats.updates["cross_lower_bound"].append(ctx.algo.cross_lower_bound(mb.m))


def hacpo_update(model: nn.Module, optimizer: torch.optim.Optimizer, rows: Sequence[TrainingRow],
                 advantages: Sequence[float], ratios: Mapping[RatioKey, float], algo: AlgoConfig,
                 optim: OptimConfig, *, learner: str, ref_model: nn.Module | None = None,
                 temperature: float = 1.0, pad_id: int | None = None,
                 source_rotation: int = 0, step: int | None = None, max_response_tokens: int | None = None,
                 on_update: Callable[[int, int], None] | None = None,
                 autocast_dtype: torch.dtype | None = None,
                 row_gate: RowGate | None = None) -> dict[str, float]:
    """Run learner ``learner``'s optimizer updates of one step on its own and foreign rows.

    Args:
        model: the learner's causal LM (parameters updated in place). The loss forwards run in the mode the
            caller set (train: dropout active, as TRL); the GRPO old log-probs always in eval mode.
        optimizer: from :func:`make_optimizer` (its parameters are the ones clipped and stepped).
        rows: ``TrainingRow`` s in the learner tokenization (own and foreign, any order).
        advantages: one A per row, same order (e.g. :func:`hacrl_fed.algo.advantages.row_advantages`).
        ratios: r_{j→learner} per foreign source j, or per (j, prompt id) with the capability per task
            (:func:`hacrl_fed.algo.capability.row_ratio`); own rows use 1.
        algo, optim: algorithm and optimizer settings (``optim.epochs`` passes over the rows).
        learner: the learner's agent id (rows with this ``source_agent`` are own rows).
        ref_model: frozen reference for the KL on own rows; required when ``algo.kl_coef > 0``.
        temperature: sampling temperature the log-probs are scaled by (0 = greedy ⇒ 1.0).
        pad_id: padding id (masks come from lengths, so any id works); default from the model config.
        source_rotation: rotates the order of the sources (:func:`source_order`); pass the step so
            no source always gets the tightest stepwise bounds.
        step: the training step (1-based) for the lr schedule (:func:`hacrl_fed.update.schedule.scheduled_lr`):
            with ``optim.has_schedule`` every update sets the optimizer's lr from it; None (or no schedule)
            leaves the optimizer's lr as it is.
        max_response_tokens: the learner's response cap, L_max of ``algo.loss_aggregation = "constant"``.
        on_update: ``on_update(k, M)`` before update k (1-based) of the step's M updates (progress display).
        autocast_dtype: ``torch.bfloat16`` (or ``float16``) runs the forward passes under ``torch.autocast``
            (mixed precision; parameters, gradients, AdamW state and the loss stay in their own dtype,
            float32 normally); None (default): no autocast.
        row_gate: optional :data:`RowGate` (the learner-side screens): scales each foreign row's advantage by
            the weight it returns. None, or weights of 1, leave the update exactly as without it.

    With ``algo.ratio_level == "token"`` (GRPO) the per-token old log-probs of own rows come from one
    no-grad forward of ``model`` before the first optimizer step (the wire carries only sums).

    Returns:
        ``rows, updates, tokens, loss, pg_loss, kl, grad_norm, grad_norm_max, skipped_updates,
        zero_grad_updates, lr`` (mean lr of the updates), ``entropy`` (mean token entropy in nats of the
        policy over the trained response tokens of every loss forward, at the sampling temperature),
        ``masked_truncated_rows, adv_abs_mean, zero_adv_frac, cross_lower_bound_first/last,
        stepwise_saturated_updates`` and per source ``src/<agent>/{rows, s_mean, s_min, s_max, clip_low,
        clip_high, adv_abs_mean, loss, grad_frac, pos_adv_rows, pos_adv_grad_rows}`` (means over updates /
        rows; ``s`` is the ratio before clipping; ``grad_frac`` the share of the source's rows that reached
        the gradient: A ≠ 0 and not clamped; ``pos_adv_*`` count rows with A > 0 and those of them with a
        gradient). With peer distillation on (``algo.peer_distill_coef`` > 0): ``distill_coef`` (mean λ_t),
        ``distill_rows`` (rows distilled, over all updates), ``distill_nll`` (their mean NLL, nats per token)
        and ``src/<agent>/distill_rows``.

    Raises:
        ValueError: inconsistent rows (see the checks in the source), a missing ratio, a missing
            ``ref_model`` with ``kl_coef > 0``, an autocast dtype other than bfloat16 / float16,
            ``optim.shared_prompt_forward = "on"`` for a model packing cannot run exactly — all before any
            parameter changes.
    """
    rows = list(rows)
    _validate(rows, advantages, ratios, algo, learner)
    if algo.kl_coef > 0 and ref_model is None and any(r.is_own for r in rows):
        raise ValueError("algo.kl_coef > 0 needs ref_model (the learner's frozen reference); or set kl_coef = 0")
    if algo.loss_aggregation == "constant" and not max_response_tokens:
        raise ValueError("algo.loss_aggregation = 'constant' needs max_response_tokens (L_max, the learner's cap)")
    stats = _Stats()
    if not rows:
        return stats.summary([])
    order = order_rows(rows, learner, source_rotation)
    rows = [rows[i] for i in order]
    adv = [float(advantages[i]) for i in order]
    ratio = [1.0 if r.is_own else float(row_ratio(ratios, r.source_agent, r.prompt_id)) for r in rows]
    if autocast_dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"autocast_dtype must be None, torch.bfloat16 or torch.float16, got {autocast_dtype}")
    ctx = _Context(model, ref_model, algo, optim, temperature if temperature > 0 else 1.0,
                   _pad_id(model, pad_id), next(model.parameters()).device, max_response_tokens, autocast_dtype,
                   row_gate, _use_packing(model, optim), step)
    stats.masked_rows = sum(not ctx.in_loss(r) for r in rows)
    old_tok = _old_token_logprobs(ctx, rows) if algo.ratio_level == "token" else None
    plan = plan_minibatches([r.is_own for r in rows], optim.mini_batch_rows, epochs=optim.epochs,
                            stepwise_index=algo.stepwise_index)
    for k, mb in enumerate(plan):
        if on_update is not None:
            on_update(k + 1, len(plan))
        if step is not None and optim.has_schedule:
            for group in optimizer.param_groups:
                group["lr"] = scheduled_lr(optim, step, k, len(plan))
        _run_minibatch(ctx, optimizer, rows, adv, ratio, old_tok, mb, stats)
    return stats.summary(rows)


def _pad_id(model: nn.Module, pad_id: int | None) -> int:
    if pad_id is not None:
        return int(pad_id)
    config: Any = getattr(model, "config", None)
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0
