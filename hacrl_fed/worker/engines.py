"""Which rollout engine a site runs: ``model.engine`` names an entry of
:data:`hacrl_fed.registries.ROLLOUT_ENGINES` (``hf``, ``vllm``, a registered engine or an import path;
docs/engines.md, docs/extending.md).

:func:`build_engine` is the one place that builds one, through the engine's factory
(:class:`~hacrl_fed.rollout.factory.EngineRequest` → :class:`~hacrl_fed.rollout.engine.RolloutEngine`); the
built-in factories are :func:`hf_engine`, :func:`loop_engine`, :func:`ct2_engine` and :func:`vllm_engine`. The vLLM
and CTranslate2 engines' modules (and vllm / ctranslate2 themselves) are imported only when they are asked for.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hacrl_fed.registries import ROLLOUT_ENGINES
from hacrl_fed.rollout.engine import HFRolloutEngine, RolloutEngine
from hacrl_fed.rollout.factory import EngineRequest

__all__ = ["AUTO", "auto_choice", "auto_engine", "build_engine", "ct2_engine", "hf_engine", "loop_engine",
           "require_engine", "resolve_engine", "vllm_engine"]

log = logging.getLogger(__name__)

AUTO = "auto"
"""The engine name that builds ``ct2`` (float32) where it can run and ``hf`` elsewhere (:func:`auto_choice`)."""


def hf_engine(request: EngineRequest) -> RolloutEngine:
    """``model.engine = "hf"``: :class:`HFRolloutEngine` (Hugging Face ``generate``) on the training model itself."""
    return HFRolloutEngine(request.model, request.tokenizer, max_batch_sequences=request.max_batch_sequences,
                           logprob_chunk_tokens=request.logprob_chunk_tokens, stop_strings=request.stop_strings,
                           behaviour_logprobs=request.model_cfg.behaviour_logprobs,
                           autocast_dtype=request.autocast_dtype)


def loop_engine(request: EngineRequest) -> RolloutEngine:
    """``model.engine = "loop"``: :class:`~hacrl_fed.rollout.decode_loop.LoopRolloutEngine`, a decode loop on the
    training model itself (finished rows leave the batch; docs/engines.md). Same settings as ``hf``."""
    from hacrl_fed.rollout.decode_loop import LoopRolloutEngine

    return LoopRolloutEngine(request.model, request.tokenizer, max_batch_sequences=request.max_batch_sequences,
                             logprob_chunk_tokens=request.logprob_chunk_tokens, stop_strings=request.stop_strings,
                             behaviour_logprobs=request.model_cfg.behaviour_logprobs,
                             autocast_dtype=request.autocast_dtype)


def ct2_engine(request: EngineRequest) -> RolloutEngine:
    """``model.engine = "ct2"``: a :class:`~hacrl_fed.rollout.ct2_engine.CT2RolloutEngine` (CTranslate2, float32
    by default, on the CPU; docs/engines.md), its converted model kept in ``work_dir``. ``model.engine_options``:
    ``compute_type``, ``threads``. Raises ``CT2UnavailableError`` (an ``ImportError``, one line) without ctranslate2
    or for an architecture its converter does not know; ``ValueError`` for bad options, a model off the CPU or
    ``behaviour_logprobs = "generation"``."""
    _check_ct2()
    from hacrl_fed.rollout.ct2_engine import CT2RolloutEngine, CT2Settings

    return CT2RolloutEngine(request.model, request.tokenizer, work_dir=request.work_dir,
                            settings=CT2Settings.from_options(request.options),
                            max_batch_sequences=request.max_batch_sequences,
                            logprob_chunk_tokens=request.logprob_chunk_tokens, stop_strings=request.stop_strings,
                            behaviour_logprobs=request.model_cfg.behaviour_logprobs,
                            autocast_dtype=request.autocast_dtype)


def _check_ct2() -> None:
    from hacrl_fed.rollout.ct2_engine import require_ct2

    require_ct2()


ct2_engine.check_installed = _check_ct2  # type: ignore[attr-defined]


def vllm_engine(request: EngineRequest) -> RolloutEngine:
    """``model.engine = "vllm"``: a colocated :class:`~hacrl_fed.rollout.vllm_engine.VLLMRolloutEngine` (imported
    only here) started from the model's Hugging Face directory or hub id, or — for a GGUF file or a packaged alias,
    which vLLM cannot load — from an export written to ``work_dir/vllm-model``; ``max_model_len`` bounds prompt +
    response. Raises ``VLLMUnavailableError`` (an ``ImportError``) when vllm is not importable."""
    _check_vllm()                                   # before anything is exported
    from hacrl_fed.rollout.vllm_engine import VLLMRolloutEngine, VLLMSettings

    cfg = request.model_cfg
    settings = VLLMSettings(gpu_memory_utilization=cfg.gpu_memory_utilization, enable_sleep_mode=cfg.enable_sleep_mode,
                            tensor_parallel_size=cfg.tensor_parallel_size,
                            dtype=VLLMSettings.for_model_dtype(cfg.dtype), max_model_len=request.max_model_len,
                            lora_rank=cfg.lora_rank, seed=request.seed, trust_remote_code=cfg.trust_remote_code)
    return VLLMRolloutEngine(request.model, request.tokenizer, settings=settings,
                             model_path=request.model_path("vllm-model"), work_dir=request.work_dir,
                             stop_strings=request.stop_strings, behaviour_logprobs=cfg.behaviour_logprobs,
                             autocast_dtype=request.autocast_dtype, max_batch_sequences=request.max_batch_sequences,
                             logprob_chunk_tokens=request.logprob_chunk_tokens)


def _check_vllm() -> None:
    from hacrl_fed.rollout.vllm_engine import require_vllm

    require_vllm()


vllm_engine.check_installed = _check_vllm  # type: ignore[attr-defined]


def auto_choice(device: str = "cpu", behaviour_logprobs: str = "auto") -> str:
    """The engine ``auto`` means here: ``ct2`` (float32, the training model's greedy tokens) when ctranslate2
    imports, the model runs on the CPU and ``behaviour_logprobs`` is not ``generation`` (``ct2``'s log-probs are
    always teacher-forced); else ``hf``.

    Why ``ct2``: on the task suite's held-out items both packaged models score the same under ``ct2`` float32 as
    under ``hf`` and the evaluation runs faster (docs/engines.md, "Which engine auto picks"). Cheap: imports
    ctranslate2 at most; the model's architecture is checked when the engine is built (:func:`auto_engine`)."""
    if device != "cpu" or behaviour_logprobs == "generation":
        return "hf"
    from hacrl_fed.rollout.ct2_engine import CT2UnavailableError, require_ct2

    try:
        require_ct2()
    except CT2UnavailableError:
        return "hf"
    return "ct2"


def resolve_engine(name: str, device: str = "cpu", behaviour_logprobs: str = "auto") -> str:
    """``name`` itself, or for ``auto`` the engine :func:`auto_choice` picks (what a run records)."""
    return auto_choice(device, behaviour_logprobs) if name == AUTO else name


def auto_engine(request: EngineRequest) -> RolloutEngine:
    """``model.engine = "auto"``: the ``ct2`` engine where :func:`auto_choice` picks it and its converter knows the
    model's architecture, otherwise ``hf`` (the choice is logged). ``model.engine_options`` go to ``ct2`` when it
    is chosen (an option ``ct2`` refuses raises ``ValueError`` as there); ``hf`` takes none."""
    cfg = request.model_cfg
    if auto_choice(cfg.device, cfg.behaviour_logprobs) == "ct2":
        from hacrl_fed.rollout.ct2_engine import CT2UnsupportedModelError

        try:
            engine = ct2_engine(request)
        except CT2UnsupportedModelError as err:
            log.warning("engine auto: hf (%s)", err)
        else:
            log.info("engine auto: ct2 (%s)", engine.settings.compute_type)
            return engine
    else:
        log.info("engine auto: hf (ctranslate2 not installed, or the model is not on the CPU)")
    return hf_engine(request)


def require_engine(name: str) -> None:
    """The engine ``name`` can run here: its factory resolves and its ``check_installed()`` (if any) passes.
    Raises ``ImportError`` (one line): ``VLLMUnavailableError`` for ``"vllm"`` without vllm, ``CT2UnavailableError`` for
    ``"ct2"`` without ctranslate2, or an unknown name /
    a factory that does not import. Nothing heavy is imported for ``"hf"``."""
    try:
        factory = ROLLOUT_ENGINES.get_callable(name)
    except ValueError as err:
        raise ImportError(str(err)) from None
    check = getattr(factory, "check_installed", None)
    if callable(check):
        check()


def _model_path(loaded, work_dir: str | Path):
    """``model_path(folder)`` of an :class:`EngineRequest` for a loaded model (exported once, when needed)."""
    done: dict[str, str] = {}

    def model_path(folder: str) -> str:
        src = loaded.source
        if src.gguf_file is None and src.alias is None:
            return src.path
        if folder not in done:
            from hacrl_fed.checkpoints.store import export_hf

            done[folder] = str(export_hf(loaded.model, loaded.tokenizer, Path(work_dir) / folder))
        return done[folder]

    return model_path


def build_engine(loaded, model_cfg, *, stop_strings: Sequence[str] = (), max_batch_sequences: int = 32,
                 logprob_chunk_tokens: int = 1024, work_dir: str | Path, max_model_len: int | None = None,
                 seed: int = 0) -> RolloutEngine:
    """The rollout engine ``model_cfg.engine`` names for a loaded model (:class:`~hacrl_fed.worker.models.LoadedModel`):
    its factory (:data:`~hacrl_fed.registries.ROLLOUT_ENGINES`) called with an :class:`EngineRequest`.

    Raises ``ImportError`` as :func:`require_engine` (before anything is built or exported), ``TypeError`` when the
    factory returns something without ``generate``.
    """
    require_engine(model_cfg.engine)
    factory = ROLLOUT_ENGINES.get_callable(model_cfg.engine)
    request = EngineRequest(model=loaded.model, tokenizer=loaded.tokenizer, model_cfg=model_cfg,
                            model_path=_model_path(loaded, work_dir), work_dir=Path(work_dir),
                            stop_strings=tuple(stop_strings), max_batch_sequences=max_batch_sequences,
                            logprob_chunk_tokens=logprob_chunk_tokens, max_model_len=max_model_len, seed=seed,
                            autocast_dtype=loaded.autocast_dtype)
    engine = factory(request)
    if not callable(getattr(engine, "generate", None)):
        raise TypeError(f"model.engine = {model_cfg.engine!r}: the factory returned a {type(engine).__name__}, "
                        f"not a rollout engine (no generate method)")
    return engine
