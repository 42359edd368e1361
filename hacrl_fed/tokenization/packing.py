"""Shared-prompt packing: the G responses to one prompt as one sequence ``[prompt, resp_1, …, resp_k]``.

A training micro-batch (:func:`hacrl_fed.tokenization.views.collate`) holds each row as ``prompt + response``,
so a prompt shared by k rows is run through the model k times. Packed, it runs once: every response attends
to the prompt and causally to itself only, with position ids restarting at ``len(prompt)`` for each response,
so each response token sees exactly the context (and the positions) it has in its own row. The model-side
mask and the log-probs are :func:`hacrl_fed.update.logprobs.token_logprobs` (``packed=``); this module only
plans and lays out the tokens. Pure tensor bookkeeping, no model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedPrompts", "pack_rows", "pair_cost", "plan_packed_microbatches"]


@dataclass(frozen=True)
class PackedPrompts:
    """A micro-batch of B rows laid out as S packed sequences of width L.

    ``input_ids`` [S, L] (padding = ``pad_id``), ``position_ids`` [S, L] (a token's position in its own row;
    0 at padding), ``segments`` [S, L] (0 the prompt, k ≥ 1 the k-th response of the sequence, −1 padding),
    ``index`` [B, T]: flat index into ``S·L`` of row b's token t (0 beyond the row's length).
    """

    input_ids: Tensor
    position_ids: Tensor
    segments: Tensor
    index: Tensor

    def to(self, device: torch.device | str) -> PackedPrompts:
        """The same layout on ``device``."""
        return PackedPrompts(*(t.to(device) for t in (self.input_ids, self.position_ids, self.segments, self.index)))


def pair_cost(config) -> float:
    """Linear work per token over attention work per token pair of a decoder layer, from a HF text config
    (hidden ``d``, ``h`` query / ``kv`` key-value heads of ``hd``, MLP width ``f``; gated MLP):
    ``(2d·hd·(h + kv) + 3d·f) / (2h·hd)`` — 3072 for SmolLM2-135M. ``inf`` when the config lacks a size."""
    d, h, f = (getattr(config, k, None) for k in ("hidden_size", "num_attention_heads", "intermediate_size"))
    if not (isinstance(d, int) and isinstance(h, int) and isinstance(f, int) and h > 0):
        return math.inf
    hd = getattr(config, "head_dim", None) or d // h
    kv = getattr(config, "num_key_value_heads", None) or h
    return (2 * d * hd * (h + kv) + 3 * d * f) / (2 * h * hd)


def _split_group(prompt_len: int, lengths: list[int], pair_cost: float, budget: int) -> list[list[int]]:
    """Split one prompt's responses (positions into ``lengths``) into packs of about the cheapest size.

    Per response the packed cost is ``(P + kR)(1 + (P + kR)/pair_cost) / k`` (linear work per token, attention
    per token pair); its minimum is at ``k = (P/R)·sqrt(1 + pair_cost/P)``. A pack never exceeds ``budget``.
    """
    mean = max(1.0, sum(lengths) / len(lengths))
    best = prompt_len / mean * math.sqrt(1.0 + pair_cost / max(prompt_len, 1))
    k = len(lengths) if best >= len(lengths) else max(1, round(best))
    packs: list[list[int]] = []
    for i in range(len(lengths)):
        if packs and len(packs[-1]) < k and prompt_len + sum(lengths[j] for j in packs[-1]) + lengths[i] <= budget:
            packs[-1].append(i)
        else:
            packs.append([i])
    return packs


def plan_packed_microbatches(prompts: Sequence[Sequence[int]], response_lens: Sequence[int], token_budget: int,
                             pair_cost: float = math.inf) -> list[list[list[int]]]:
    """Micro-batches of packs of row positions ``0..len−1``: rows with identical ``prompts`` share a pack.

    Args:
        prompts: each row's prompt token ids; response_lens: each row's response length (tokens).
        token_budget: packed tokens of one forward: (packs × longest packed length) ≤ budget, as
            ``plan_microbatches`` counts padded rows; a single pack longer than it is its own micro-batch.
        pair_cost: linear work per token / attention work per token pair of the model (``inf``: one pack per
            prompt as far as the budget allows); it sets how many responses a pack takes.

    Returns:
        ``micro[m][p]`` = the row positions of pack p of micro-batch m (every row exactly once; packs longest
        first). Raises ``ValueError`` on mismatched lengths.
    """
    if len(prompts) != len(response_lens):
        raise ValueError(f"{len(prompts)} prompts but {len(response_lens)} response lengths")
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(tuple(p), []).append(i)
    packs: list[tuple[int, list[int]]] = []
    for prompt, rows in groups.items():
        for pack in _split_group(len(prompt), [response_lens[i] for i in rows], pair_cost, token_budget):
            members = [rows[j] for j in pack]
            packs.append((len(prompt) + sum(response_lens[i] for i in members), members))
    packs.sort(key=lambda p: -p[0])
    out: list[list[list[int]]] = []
    widths: list[int] = []
    for width, members in packs:
        if out and (len(out[-1]) + 1) * widths[-1] <= token_budget:
            out[-1].append(members)
        else:
            out.append([members])
            widths.append(width)
    return out


def pack_rows(input_ids: Tensor, prompt_lens: Tensor, response_lens: Tensor, packs: Sequence[Sequence[int]],
              pad_id: int) -> PackedPrompts:
    """Lay out the collated rows ``input_ids`` [B, T] (right padding) as the ``packs`` (row positions).

    Every row of a pack must carry the same prompt (its first ``prompt_lens[b]`` tokens); each row is in exactly
    one pack. Raises ``ValueError`` otherwise.
    """
    B, T = input_ids.shape
    if sorted(b for pack in packs for b in pack) != list(range(B)):
        raise ValueError(f"packs {[list(p) for p in packs]} must hold each of the {B} rows exactly once")
    plen, rlen = prompt_lens.tolist(), response_lens.tolist()
    width = max(plen[p[0]] + sum(rlen[b] for b in p) for p in packs)
    ids = torch.full((len(packs), width), int(pad_id), dtype=torch.long)
    pos = torch.zeros((len(packs), width), dtype=torch.long)
    seg = torch.full((len(packs), width), -1, dtype=torch.long)
    index = torch.zeros((B, T), dtype=torch.long)
    for s, pack in enumerate(packs):
        P = plen[pack[0]]
        prompt = input_ids[pack[0], :P]
        ids[s, :P], pos[s, :P], seg[s, :P] = prompt, torch.arange(P), 0
        at = P
        for k, b in enumerate(pack, start=1):
            R = rlen[b]
            if plen[b] != P or not torch.equal(input_ids[b, :P], prompt):
                raise ValueError(f"row {b} does not share the prompt of row {pack[0]} in its pack")
            ids[s, at:at + R], pos[s, at:at + R], seg[s, at:at + R] = input_ids[b, P:P + R], torch.arange(P, P + R), k
            index[b, :P] = s * width + torch.arange(P)
            index[b, P:P + R] = s * width + torch.arange(at, at + R)
            at += R
    return PackedPrompts(ids, pos, seg, index)
