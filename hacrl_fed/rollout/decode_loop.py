"""``model.engine = "loop"``: a batched decode loop on the training model, written for decoding (docs/engines.md).

:class:`LoopRolloutEngine` samples from the same model, weights and forward as :class:`HFRolloutEngine`
(``generate`` replaced, everything else inherited: sub-batching, seeding, scoring, the EOS and stop-string
conventions, :func:`~hacrl_fed.rollout.engine.complete_samples`), so a weight refresh costs nothing (it *is* the
training model) and its behaviour log-probs are the ``generation`` pass's. What it does differently:

* **Finished rows leave the batch.** ``generate`` keeps every row in every forward until the last one ends;
  here a row that ended (EOS or a stop string) is dropped from the batch and from the KV cache
  (``Cache.batch_select_indices``) before the next step, so a step costs what the rows still running cost.
* **One pass over the logits per step**: the behaviour log-prob (log-softmax(logits / T), untruncated, hacpo-spec
  §8.3 step 3) and the sampling distribution come from the same tensor; no logits processor, no stopping-criteria
  objects, no per-step copy of the whole id matrix; the LM head runs on the last prompt position only at prefill.
* **Stop strings on the running rows only**: the tail of a row is decoded only while it runs and only when its
  new token is no EOS.
* **A draw per (seed, step, row)**: each step draws one uniform per row of the sub-batch from the forked global
  stream and samples by inverse CDF (``searchsorted`` of the cumulative truncated distribution), so a row's draw
  does not depend on what the other rows of its sub-batch generate or when they end. Greedy decoding takes the arg-max of the same float32
  logits as ``generate`` and gives the same tokens up to float ties; sampled rows are reproducible for a seed but
  are other draws than ``generate``'s ``multinomial`` (same distribution).

Top-k / top-p truncate as ``transformers``' ``TopKLogitsWarper`` / ``TopPLogitsWarper`` do (temperature first,
then top-k, then top-p, at least one token kept). Under bf16 / fp16 (weights or autocast) ``behaviour_logprobs =
"auto"`` re-scores teacher-forced exactly as the ``hf`` engine does.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from hacrl_fed.rollout.engine import FinishReason, HFRolloutEngine, Sampling, _row_logprobs, stop_string_in_tail
from hacrl_fed.tokenization.retokenize import cut_at_stop_strings, split_generated

__all__ = ["LoopRolloutEngine", "truncate_logits"]


def truncate_logits(z: Tensor, top_k: int, top_p: float) -> Tensor:
    """Tempered logits ``z`` [B, V] with what top-k, then top-p, exclude set to −inf (the ``transformers`` warpers'
    rule: top-k keeps every token ≥ the k-th largest; top-p drops the smallest tokens whose cumulative probability
    is ≤ 1 − p, keeping at least the largest). ``top_k = 0`` and ``top_p = 1`` are off; returns ``z`` itself then."""
    if 0 < top_k < z.shape[-1]:
        kth = torch.topk(z, top_k, dim=-1).values[:, -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = torch.sort(z, descending=False, dim=-1)
        drop = sorted_z.softmax(dim=-1).cumsum(dim=-1) <= (1 - top_p)
        drop[:, -1:] = False
        z = z.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return z


class LoopRolloutEngine(HFRolloutEngine):
    """:class:`HFRolloutEngine` whose ``generate`` is a hand-written decode loop (module docstring).

    Same arguments, errors and :class:`~hacrl_fed.rollout.engine.RolloutEngine` interface as
    :class:`HFRolloutEngine`; ``name = "loop"``. Needs a ``transformers`` causal LM whose forward takes
    ``past_key_values`` or ``cache`` (a ``DynamicCache``), ``attention_mask`` and ``position_ids`` (every decoder model of
    ``transformers`` ≥ 4.57, ``peft``-wrapped or not).
    """

    name = "loop"

    def __init__(self, model, tokenizer, **kwargs) -> None:
        super().__init__(model, tokenizer, **kwargs)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        self._keep_last = "logits_to_keep" in params
        self._cache_kw = "cache" if "cache" in params else "past_key_values"   # transformers renames it (5.40)

    def _forward(self, ids: Tensor, mask: Tensor, positions: Tensor, cache) -> Tensor:
        """float32 logits [B, V] of the last position of ``ids`` [B, S] given the cache."""
        extra = {"logits_to_keep": 1} if self._keep_last else {}
        extra[self._cache_kw] = cache
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
        return out.logits[:, -1, :].float()

    def _generate_batch(self, prompts: list[tuple[int, ...]],
                        sp: Sampling) -> list[tuple[tuple[int, ...], FinishReason, tuple[float, ...] | None]]:
        """Decode one sub-batch (left-padded prefill, then one token per running row per step).

        Returns (response ids, finish reason, per-token behaviour log-probs or None to re-score) per row.
        """
        from transformers import DynamicCache

        device, n = self.device, len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width + sp.max_new_tokens), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[b, width - len(p):width] = 1
        mask = mask.to(device)
        positions = (mask[:, :width].cumsum(-1) - 1).clamp(min=0)   # generate's rule: pads at 1, harmless, masked
        positions = positions.masked_fill(mask[:, :width] == 0, 1)
        cache = DynamicCache(config=getattr(self.model, "config", None))
        logits = self._forward(ids.to(device), mask[:, :width], positions, cache)
        next_pos = positions[:, -1:] + 1
        eos = torch.tensor(self.eos_ids, device=device)
        keep_lp = self.behaviour_logprobs == "generation"
        inv_t = 1.0 / sp.logprob_temperature
        rows: list[list[int]] = [[] for _ in range(n)]
        sampled: list[list[float]] = [[] for _ in range(n)]
        eos_lp: list[list[float]] = [[] for _ in range(n)]
        alive = torch.arange(n, device=device)            # original row of each batch row
        for step in range(sp.max_new_tokens):
            logp = torch.log_softmax(logits * inv_t if inv_t != 1.0 else logits, dim=-1)
            if sp.greedy:
                tok = logits.argmax(dim=-1)
            else:
                u = torch.rand(n, dtype=torch.float64)[alive.cpu()].to(device)   # one draw per original row
                z = truncate_logits(logits / sp.temperature, sp.top_k, sp.top_p)
                cdf = torch.softmax(z, dim=-1, dtype=torch.float64).cumsum(-1)
                tok = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).squeeze(1).clamp_(max=z.shape[-1] - 1)
            tok_l = tok.tolist()
            lp_l = logp.gather(1, tok.unsqueeze(1)).squeeze(1).tolist() if keep_lp else None
            eos_l = logp[:, self.eos_ids[0]].tolist() if keep_lp else None
            done = torch.isin(tok, eos).tolist()
            for j, r in enumerate(alive.tolist()):
                rows[r].append(tok_l[j])
                if keep_lp:
                    sampled[r].append(lp_l[j])
                    eos_lp[r].append(eos_l[j])
                if not done[j] and self.stop_strings and stop_string_in_tail(self.tokenizer, rows[r],
                                                                                       self.stop_strings):
                    done[j] = True
            if all(done) or step == sp.max_new_tokens - 1:
                break
            if any(done):
                keep = torch.tensor([j for j, d in enumerate(done) if not d], device=device)
                cache.batch_select_indices(keep)
                alive, tok, mask, next_pos = alive[keep], tok[keep], mask[keep], next_pos[keep]
            mask[:, width + step] = 1
            logits = self._forward(tok.unsqueeze(1), mask[:, :width + step + 1], next_pos, cache)
            next_pos = next_pos + 1
        result: list[tuple[tuple[int, ...], FinishReason, tuple[float, ...] | None]] = []
        for r in range(n):
            resp, finish = split_generated(rows[r], self.eos_ids, sp.max_new_tokens)
            if self.stop_strings:
                resp, finish = cut_at_stop_strings(self.tokenizer, resp, finish, self.stop_strings, self.eos_ids[0])
            lps = _row_logprobs(rows[r], resp, sampled[r], eos_lp[r], self.eos_ids[0]) if keep_lp else None
            result.append((tuple(resp), finish, lps))  # type: ignore[arg-type]
        return result
