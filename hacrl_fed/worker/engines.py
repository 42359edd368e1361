"""Which rollout engine a site runs: ``model.engine = "hf" | "vllm"`` (docs/engines.md).

:func:`build_engine` is the one place that picks; the vLLM engine's module (and vllm itself) is imported only
when it is asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hacrl_fed.rollout.engine import HFRolloutEngine, RolloutEngine

__all__ = ["build_engine", "require_engine"]


def require_engine(name: str) -> None:
    """Raises ``VLLMUnavailableError`` (an ``ImportError``, one line) when ``name`` is ``"vllm"`` and vllm cannot
    be imported in this environment; nothing is imported for ``"hf"``."""
    if name == "vllm":
        from hacrl_fed.rollout.vllm_engine import require_vllm

        require_vllm()


def build_engine(loaded, model_cfg, *, stop_strings: Sequence[str] = (), max_batch_sequences: int = 32,
                 logprob_chunk_tokens: int = 1024, work_dir: str | Path, max_model_len: int | None = None,
                 seed: int = 0) -> RolloutEngine:
    """The rollout engine ``model_cfg.engine`` names for a loaded model (:class:`~hacrl_fed.worker.models.LoadedModel`).

    ``hf``: :class:`HFRolloutEngine` on the model itself. ``vllm``: a colocated
    :class:`~hacrl_fed.rollout.vllm_engine.VLLMRolloutEngine` (imported only then) started from the model's
    Hugging Face directory or hub id, or — for a GGUF file or a packaged alias, which vLLM cannot load — from an
    export of the loaded model written to ``work_dir/vllm-model``; ``max_model_len`` bounds prompt + response.
    Raises ``VLLMUnavailableError`` (an ``ImportError``) when vllm is asked for and not importable.
    """
    if model_cfg.engine == "hf":
        return HFRolloutEngine(loaded.model, loaded.tokenizer, max_batch_sequences=max_batch_sequences,
                               logprob_chunk_tokens=logprob_chunk_tokens, stop_strings=stop_strings,
                               behaviour_logprobs=model_cfg.behaviour_logprobs, autocast_dtype=loaded.autocast_dtype)
    require_engine("vllm")                          # before anything is exported
    from hacrl_fed.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings
    settings = VLLMSettings(gpu_memory_utilization=model_cfg.gpu_memory_utilization,
                            enable_sleep_mode=model_cfg.enable_sleep_mode,
                            tensor_parallel_size=model_cfg.tensor_parallel_size,
                            dtype=VLLMSettings.for_model_dtype(model_cfg.dtype), max_model_len=max_model_len,
                            lora_rank=model_cfg.lora_rank, seed=seed, trust_remote_code=model_cfg.trust_remote_code)
    src = loaded.source
    if src.gguf_file is None and src.alias is None:
        model_path = src.path
    else:
        from hacrl_fed.checkpoints.store import export_hf

        model_path = str(export_hf(loaded.model, loaded.tokenizer, Path(work_dir) / "vllm-model"))
    return VLLMRolloutEngine(loaded.model, loaded.tokenizer, settings=settings, model_path=model_path,
                             work_dir=work_dir, stop_strings=stop_strings,
                             behaviour_logprobs=model_cfg.behaviour_logprobs, autocast_dtype=loaded.autocast_dtype,
                             max_batch_sequences=max_batch_sequences, logprob_chunk_tokens=logprob_chunk_tokens)
