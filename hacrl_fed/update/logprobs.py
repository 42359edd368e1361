"""Selected-token log-probs of a causal LM, computed without a full ``[tokens, vocab]`` log-softmax.

The base model (decoder) produces the last hidden states once; the LM head is then applied to
``chunk_tokens`` positions at a time and each chunk yields only ``log π(y_t | y_<t)`` of the token
actually present, so peak memory grows with ``chunk_tokens × vocab`` instead of
``batch × seq × vocab`` (ARCHITECTURE §5, §7). With Gemma's 262 144-entry vocabulary this is what
lets two CPU workers share one machine.

Two backward paths give the same values and gradients:

* plain ``nn.Linear`` head (the usual case, tied or not): :class:`_LinearSelectedLogProb`, a
  hand-written backward that recomputes each chunk's logits and forms ``onehot − softmax`` in place
  (one ``[chunk, V]`` float32 buffer live at a time);
* any other head (LoRA-wrapped, quantized): autograd per chunk under
  :func:`torch.utils.checkpoint.checkpoint`. Autograd keeps several ``[chunk, V]`` temporaries, so this
  path saves far less (``benchmarks/bench_logprobs.py``).

Alignment convention (shared by every caller): ``out[b, t] = log π(input_ids[b, t] | input_ids[b, :t])``,
0 at ``t = 0``, at padding, and at the first real token of a left-padded row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from hacrl_fed.tokenization.packing import PackedPrompts


def unwrap_causal_lm(model: nn.Module) -> tuple[nn.Module, nn.Module, object]:
    """Return ``(decoder, lm_head, text_config)`` of a causal LM, also through ``peft`` wrappers.

    The decoder maps ``input_ids`` to last hidden states (final norm applied); the LM head maps
    hidden states to logits. Raises ``TypeError`` when either cannot be found.
    """
    inner = model
    if hasattr(inner, "get_base_model"):  # peft.PeftModel
        inner = inner.get_base_model()
    decoder = None
    if hasattr(inner, "get_decoder"):
        try:
            decoder = inner.get_decoder()
        except (AttributeError, NotImplementedError):
            decoder = None
    if decoder is None or decoder is inner:
        decoder = getattr(inner, "model", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if decoder is None or head is None:
        raise TypeError(f"{type(model).__name__} is not a causal LM with a decoder and an output embedding")
    config = getattr(inner, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return decoder, head, config


def _logit_transform(config) -> tuple[float | None, float]:
    """(final-logit softcap, multiplicative logit scale) the model's own forward applies to logits."""
    cap = getattr(config, "final_logit_softcapping", None)
    scale = 1.0
    if getattr(config, "logit_scale", None) is not None:  # Cohere: logits * logit_scale
        scale *= float(config.logit_scale)
    if getattr(config, "logits_scaling", None) is not None:  # Granite: logits / logits_scaling
        scale /= float(config.logits_scaling)
    return (float(cap) if cap else None), scale


def _transform(logits: Tensor, cap: float | None, scale: float, inv_temperature: float) -> Tensor:
    """Raw head output -> sampling logits (in place on a float32 tensor): scale, softcap, temperature."""
    if scale != 1.0:
        logits.mul_(scale)
    if cap is not None:
        logits.div_(cap).tanh_().mul_(cap)
    if inv_temperature != 1.0:
        logits.mul_(inv_temperature)
    return logits


def _chunk_logprobs(hidden: Tensor, targets: Tensor, head: nn.Module, cap: float | None, scale: float,
                    inv_temperature: float, with_entropy: bool = False) -> tuple[Tensor, Tensor]:
    """log-softmax(head(hidden))[targets] for one chunk through autograd, and (``with_entropy``, detached) the
    entropy −Σ_v p_v log p_v of each position. hidden [N, H], targets [N] -> float32 [N], [N] (or [0])."""
    logits = head(hidden).float()
    if scale != 1.0:
        logits = logits * scale
    if cap is not None:
        logits = torch.tanh(logits / cap) * cap
    if inv_temperature != 1.0:
        logits = logits * inv_temperature
    selected = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    lse = torch.logsumexp(logits, dim=-1)
    entropy = logits.new_empty(0)
    if with_entropy:
        with torch.no_grad():
            # H = logsumexp(z) − Σ_v softmax(z)_v · z_v
            entropy = lse.detach() - (torch.softmax(logits.detach(), dim=-1) * logits.detach()).sum(-1)
    return selected - lse, entropy


class _LinearSelectedLogProb(torch.autograd.Function):
    """Selected-token log-probs through a linear LM head with a hand-written, chunked backward.

    Forward keeps only the per-position logsumexp [N]; backward recomputes each chunk's logits and forms
    d log p(y)/d logits = onehot(y) - softmax in place, so one [chunk, V] float32 buffer (two with
    softcapping) plus the [V, H] weight gradient is the whole extra memory. The second output is the
    per-position entropy (``with_entropy``; [0] otherwise), formed in the same buffer, never differentiated.
    Under ``torch.autocast`` the backward recomputes the logits under the same autocast state as the forward
    (as ``torch.amp.custom_bwd`` does), so its softmax matches the forward's logsumexp.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, chunk, cap, scale, inv_temperature, with_entropy=False):
        device_type = hidden.device.type
        ctx.autocast = (device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        entropy = torch.empty(hidden.shape[0] if with_entropy else 0, dtype=torch.float32, device=hidden.device)
        for s in range(0, hidden.shape[0], chunk):
            z = _transform(F.linear(hidden[s:s + chunk], weight, bias).float(), cap, scale, inv_temperature)
            selected = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1)
            top = z.amax(dim=-1, keepdim=True)  # logsumexp in place: no second [chunk, V] buffer
            if with_entropy:
                e = z.sub_(top).exp_()
                total = e.sum(dim=-1, keepdim=True)
                lse[s:s + chunk] = total.log().add_(top).squeeze(-1)
                # H = −Σ_v p_v log p_v with p = e / Σ e, in place (xlogy(0, 0) = 0)
                entropy[s:s + chunk] = e.div_(total).xlogy_(e).sum(dim=-1).neg_()
            else:
                lse[s:s + chunk] = z.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(-1))
            out[s:s + chunk] = selected - lse[s:s + chunk]
            del z
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.consts = (chunk, cap, scale, inv_temperature)
        ctx.mark_non_differentiable(entropy)
        return out, entropy

    @staticmethod
    def backward(ctx, grad_out, _grad_entropy=None):
        device_type, enabled, dtype = ctx.autocast
        with torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled):
            return _LinearSelectedLogProb._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx, grad_out):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        chunk, cap, scale, inv_temperature = ctx.consts
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], chunk):
            h, g = hidden[s:s + chunk], grad_out[s:s + chunk].float()
            z = F.linear(h, weight, bias).float()
            if scale != 1.0:
                z.mul_(scale)
            t = z.div_(cap).tanh_() if cap is not None else None
            z = t * (cap * inv_temperature) if cap is not None else z.mul_(inv_temperature)
            # d/dz [z_y - logsumexp(z)] = onehot(y) - softmax(z); times the incoming gradient g
            dz = z.sub_(lse[s:s + chunk, None]).exp_().mul_(-g[:, None])
            dz.scatter_add_(-1, targets[s:s + chunk, None], g[:, None])
            dz.mul_(inv_temperature * scale)
            if t is not None:
                dz.mul_(t.square_().neg_().add_(1.0))  # d cap·tanh(u/cap) / du = 1 - tanh²
                del t
            dz = dz.to(weight.dtype)
            if need_h:
                grad_h[s:s + chunk] = dz @ weight
            if need_w:
                grad_w.addmm_(dz.t().float(), h.float())
            if need_b:
                grad_b += dz.float().sum(0)
            del z, dz
        grad_w = None if grad_w is None else grad_w.to(weight.dtype)
        grad_b = None if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


_PACKED_FAMILIES = {"llama": False, "gemma3_text": True}
"""model_type -> its decoder takes a ``{layer type: mask}`` dict (Gemma-3: sliding and full layers); the
families whose decoder takes a custom 4-D mask as given, so shared-prompt packing is exact (tests/algo)."""


def packing_unsupported(model: nn.Module) -> str | None:
    """Why ``token_logprobs(packed=...)`` cannot run ``model`` exactly, or None when it can (a Llama or
    Gemma-3 text decoder under ``sdpa`` or ``eager`` attention, also through ``peft``)."""
    try:
        config = unwrap_causal_lm(model)[2]
    except TypeError as exc:
        return str(exc)
    kind, attn = getattr(config, "model_type", None), getattr(config, "_attn_implementation", None)
    if kind not in _PACKED_FAMILIES:
        return f"model_type {kind!r} is not one of {sorted(_PACKED_FAMILIES)}"
    if attn not in ("sdpa", "eager"):
        return f"attention implementation {attn!r} ignores a custom 4-D mask (sdpa or eager needed)"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    return None


def _packed_mask(packed: PackedPrompts, config, dtype: torch.dtype) -> Tensor | dict[str, Tensor]:
    """The decoder's attention mask of a packed batch: [S, 1, L, L], a query attends the prompt and causally
    its own segment (padding only itself); bool for sdpa, additive float for eager; Gemma-3 adds the sliding
    layers' mask (window over the positions in the row)."""
    seg, pos = packed.segments, packed.position_ids
    q, k = seg[:, :, None], seg[:, None, :]
    width = seg.shape[1]
    eye = torch.eye(width, dtype=torch.bool, device=seg.device)
    allowed = (torch.ones_like(eye).tril() & (q >= 0) & ((k == 0) | (k == q))) | eye

    def form(mask: Tensor) -> Tensor:
        if config._attn_implementation == "sdpa":
            return mask[:, None]
        return torch.zeros(mask[:, None].shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask[:, None], torch.finfo(dtype).min)

    if not _PACKED_FAMILIES[config.model_type]:
        return form(allowed)
    sliding = allowed & ((pos[:, :, None] - pos[:, None, :]) < config.sliding_window)
    return {"full_attention": form(allowed), "sliding_attention": form(sliding)}


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """Position ids [B, T] counting only attended tokens (left or right padding); 0 at leading padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, *, temperature: float = 1.0,
                   chunk_tokens: int = 1024, fused: bool | None = None, score_mask: Tensor | None = None,
                   return_entropy: bool = False, packed: PackedPrompts | None = None) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probs of the tokens in ``input_ids`` under ``model``, chunked over the LM head.

    Args:
        model: a Hugging Face causal LM (``*ForCausalLM``), optionally ``peft``-wrapped.
        input_ids: LongTensor [B, T]; padding on the right (training) or on the left (generation).
        attention_mask: LongTensor/BoolTensor [B, T], 1 for real tokens; position ids are derived from it.
        temperature: logits are divided by it (the sampling temperature; pass 1.0 for greedy).
        chunk_tokens: positions per LM-head chunk; the extra peak memory is about
            ``chunk_tokens × vocab × 4`` bytes (×2 with softcapping) plus the head's weight gradient.
        fused: ``None`` (default) picks the hand-written chunked backward for a plain ``nn.Linear`` head
            and otherwise (LoRA-wrapped or quantized heads) autograd through
            :func:`torch.utils.checkpoint.checkpoint` per chunk; ``True``/``False`` force one.
        score_mask: optional Bool/Long [B, T], the positions whose log-prob is wanted (e.g. the response
            mask). The LM head — most of the work with a large vocabulary — then runs only there; every
            other position is 0 in the output. ``None`` scores every position.
        return_entropy: also return the entropy of the predictive distribution at every scored position,
            H[b, t] = −Σ_v π(v | input_ids[b, :t]) log π(v | input_ids[b, :t]) in nats (same logits:
            softcap, temperature), float32 [B, T], 0 where not scored, detached. Formed from the logits the
            log-probs already compute, in the same chunk buffer: no extra LM-head pass.

    Returns:
        FloatTensor [B, T] (float32): ``out[b, t] = log π(input_ids[b, t] | input_ids[b, :t])`` after
        final-logit softcapping (if the config has one) and temperature; 0 at ``t = 0``, at padding and at
        the first real token of a left-padded row. Differentiable w.r.t. the model's parameters when grad
        is enabled (each chunk is recomputed in backward). With ``return_entropy``: ``(out, entropy)``.

    Raises:
        ValueError: on mismatched shapes, a non-positive temperature or chunk size.
        TypeError: when ``model`` has no decoder / output embedding, or ``fused=True`` with a non-Linear head.
        ValueError: ``packed`` for a model :func:`packing_unsupported` rejects.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} "
                         "must both be [B, T]")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for log-probs (use 1.0 for greedy), got {temperature}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if score_mask is not None and score_mask.shape != input_ids.shape:
        raise ValueError(f"score_mask {tuple(score_mask.shape)} must be [B, T] like input_ids {tuple(input_ids.shape)}")
    decoder, head, config = unwrap_causal_lm(model)
    cap, scale = _logit_transform(config)
    mask = attention_mask.bool()
    if packed is None:
        out = decoder(input_ids=input_ids, attention_mask=attention_mask.long(),
                      position_ids=position_ids_from_mask(mask), use_cache=False)
    elif (why := packing_unsupported(model)) is not None:
        raise ValueError(f"packed log-probs are not exact for this model: {why}")
    else:
        out = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                      attention_mask=_packed_mask(packed, config, next(decoder.parameters()).dtype))
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]   # [B or S, T or L, H]

    # position t is scored from hidden state t-1; both t and t-1 must be real tokens
    valid = torch.zeros_like(mask)
    valid[:, 1:] = mask[:, 1:] & mask[:, :-1]
    if score_mask is not None:
        valid &= score_mask.bool()
    if packed is None:
        h = hidden[:, :-1][valid[:, 1:]]                                               # [N, H]
    else:  # the state before row b's token t sits at packed.index[b, t - 1]
        h = hidden.reshape(-1, hidden.shape[-1])[packed.index[:, :-1][valid[:, 1:]]]
    targets = input_ids[:, 1:][valid[:, 1:]]                                          # [N]
    inv_t = 1.0 / temperature
    grad = torch.is_grad_enabled() and (h.requires_grad or any(p.requires_grad for p in head.parameters()))
    if fused is None:
        fused = type(head) is nn.Linear
    elif fused and type(head) is not nn.Linear:
        raise TypeError(f"fused=True needs a plain torch.nn.Linear LM head, got {type(head).__name__}")
    parts, entropies = [], []
    if fused and h.shape[0]:
        lp, ent = _LinearSelectedLogProb.apply(h, head.weight, head.bias, targets, chunk_tokens, cap, scale, inv_t,
                                               return_entropy)
        parts.append(lp)
        entropies.append(ent)
    else:
        for s in range(0, h.shape[0], chunk_tokens):
            args = (h[s:s + chunk_tokens], targets[s:s + chunk_tokens], head, cap, scale, inv_t, return_entropy)
            lp, ent = checkpoint(_chunk_logprobs, *args, use_reentrant=False) if grad else _chunk_logprobs(*args)
            parts.append(lp)
            entropies.append(ent)
    result = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if parts:
        result = result.masked_scatter(valid, torch.cat(parts))
    elif grad and hidden.requires_grad:
        result = result + 0.0 * hidden.sum()  # keep the graph: backward through an empty batch is a no-op
    if not return_entropy:
        return result
    entropy = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    if entropies:
        entropy = entropy.masked_scatter(valid, torch.cat(entropies).detach())
    return result, entropy
