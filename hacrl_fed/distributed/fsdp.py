"""FSDP2 sharding of a Hugging Face causal LM for the HACPO update (``torch.distributed.fsdp.fully_shard``).

Layout: one FSDP group per decoder layer, plus a root group (:class:`ShardedCausalLM`) holding what is left: the
token embedding, the final norm and the LM head (tied or not). Every rank holds 1/N of each group's parameters,
gradients and AdamW state; a group's full parameters exist only while its forward or backward runs.

The update reads a model the way :func:`hacrl_fed.update.logprobs.token_logprobs` does: it calls the decoder and
then applies the LM head's weight itself (chunked, never the full logits). :class:`ShardedCausalLM` is shaped for
that: its own ``forward`` *is* the decoder, so the root group is gathered when the decoder runs, stays gathered for
the LM head (FSDP2 keeps the root's parameters after its forward, since backward needs them at once) and its
gradients are reduce-scattered at the end of backward. ``get_decoder()`` returns a callable that goes through
the root's forward, ``get_output_embeddings()`` the (gathered) LM head.

Source: the FSDP2 recipe of torchtitan / the PyTorch FSDP2 tutorial (per-block ``fully_shard``, then the root).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

__all__ = ["ShardedCausalLM", "decoder_layers", "empty_model", "full_state_dict", "load_full_state_dict", "mixed_precision",
           "reshard", "shard_model"]


def decoder_layers(lm: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a Hugging Face causal LM (``lm.model.layers`` for Llama, Gemma-3, Qwen, ...).
    Raises ``TypeError`` for a model without them (e.g. a ``peft`` wrapper: LoRA is not sharded)."""
    decoder = getattr(lm, "model", None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise TypeError(f"{type(lm).__name__} has no decoder layers at .model.layers; the sharded trainer takes a "
                        "plain Hugging Face causal LM (full fine-tuning, no LoRA)")
    return layers


class _Decoder:
    """What ``ShardedCausalLM.get_decoder()`` returns: calls run the root's FSDP forward (the decoder)."""

    def __init__(self, root: ShardedCausalLM) -> None:
        self._root = root

    def __call__(self, *args, **kwargs):
        return self._root(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        return self._root.lm.model.parameters(recurse)


class ShardedCausalLM(nn.Module):
    """The FSDP2 root around a Hugging Face causal LM ``lm``; ``forward`` runs ``lm``'s decoder (last hidden states).

    Looks like a causal LM to :func:`~hacrl_fed.update.logprobs.unwrap_causal_lm` (``get_decoder``,
    ``get_output_embeddings``, ``config``), so :func:`hacrl_fed.update.loop.hacpo_update` trains it unchanged.
    Its parameter names are ``lm.`` + the Hugging Face names.
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.config = lm.config

    def forward(self, *args, **kwargs):
        return self.lm.model(*args, **kwargs)

    def get_decoder(self) -> _Decoder:
        return _Decoder(self)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm.get_output_embeddings()


def mixed_precision(device: torch.device, autocast: str):
    """FSDP2's ``MixedPrecisionPolicy`` for ``model.autocast``: on CUDA with ``"bfloat16"`` the gathered parameters
    are bf16 and gradients are reduced in float32 (the sharded float32 weights and AdamW state stay float32);
    otherwise None (full precision; gloo on a CPU reduces float32)."""
    if device.type != "cuda" or autocast != "bfloat16":
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_model(lm: nn.Module, mesh, *, mp_policy=None) -> ShardedCausalLM:
    """Shard ``lm`` in place over the 1-D device ``mesh`` (each decoder layer, then the root) and return the root.

    ``lm`` may live on the meta device (then :func:`load_full_state_dict` fills it) or hold real weights (each
    rank keeps its shard). Raises ``TypeError`` for a model without decoder layers.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    for layer in decoder_layers(lm):
        fully_shard(layer, **kwargs)
    root = ShardedCausalLM(lm)
    fully_shard(root, **kwargs)
    return root


def _prefixed(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"lm.{k}": v for k, v in state.items()}


def load_full_state_dict(root: ShardedCausalLM, full: Mapping[str, torch.Tensor] | None, device: torch.device) -> None:
    """Give every rank its shard of rank 0's full Hugging Face state dict ``full`` (other ranks pass None).

    A root with parameters on the meta device (:func:`empty_model`) is first allocated on ``device``, then rank 0 broadcasts each
    tensor and every rank keeps its shard, so no rank but 0 ever holds the whole model. Collective.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if any(p.is_meta for p in root.parameters()):
        buffers = {name: b.detach().clone() for name, b in root.named_buffers()}   # not in any state dict
        root.to_empty(device=device)
        with torch.no_grad():
            for name, b in root.named_buffers():
                b.copy_(buffers[name])
    set_model_state_dict(root, _prefixed(full) if full is not None else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True))


def empty_model(config, dtype: torch.dtype) -> nn.Module:
    """A causal LM of Hugging Face ``config`` whose parameters are on the meta device (no memory) and whose buffers
    (rotary frequencies) are computed for real on the CPU, as :func:`load_full_state_dict` needs them."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        lm = AutoModelForCausalLM.from_config(config, dtype=dtype)
    lm.tie_weights()   # from_config leaves tied embeddings as two parameters; the shards must share one
    return lm


def full_state_dict(root: ShardedCausalLM) -> dict[str, torch.Tensor]:
    """The full Hugging Face state dict (names without ``lm.``) on rank 0's CPU, {} on the other ranks. Collective:
    every rank must call it (each gathers one tensor at a time, so rank 0's peak is one tensor above the result)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k[3:]: v for k, v in state.items() if k.startswith("lm.")}


def reshard(root: nn.Module) -> None:
    """Free the gathered parameters FSDP2 keeps after a forward without backward (e.g. a no-grad forward of the
    root): every FSDP group of ``root`` back to its shard."""
    from torch.distributed.fsdp import FSDPModule

    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
