"""What a registered rollout engine's factory receives and must return (``model.engine``, docs/extending.md).

A rollout engine is registered in :data:`hacrl_fed.registries.ROLLOUT_ENGINES` as a factory::

    def make_engine(request: EngineRequest) -> RolloutEngine

called once when a site's worker starts (and by ``hacrl-fed eval``), after the training model has loaded. The
returned object implements :class:`~hacrl_fed.rollout.engine.RolloutEngine`: ``name`` (for logs; the worker's Health
reports the configured ``model.engine``, which ``hacrl-fed client --worker-address`` compares), ``max_batch_sequences``,
``generate(prompt_token_ids, n, sampling, seed) -> list[GeneratedSample]`` (``n`` responses per prompt,
prompt-major, each with its behaviour log-probs under the current weights at the sampling temperature),
``prepare_update()`` and ``weights_updated()`` (the training model's weights are about to change / have changed:
the next ``generate`` must sample from the new weights). The built-in factories are
:func:`hacrl_fed.worker.engines.hf_engine` and :func:`hacrl_fed.worker.engines.vllm_engine`.

A factory may carry ``check_installed()`` (a function attribute or a static method): it raises ``ImportError``
with one line when the engine cannot run in this environment, and the pre-flight calls it before any model
loads. Engine-specific settings come from ``model.engine_options`` (:attr:`EngineRequest.options`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hacrl_fed.rollout.engine import RolloutEngine

__all__ = ["EngineFactory", "EngineRequest"]


@dataclass(frozen=True)
class EngineRequest:
    """Everything a rollout engine's factory gets (module docstring)."""

    model: Any
    """The training model (a ``transformers`` causal LM, possibly ``peft``-wrapped) on its device, in training
    dtype. An engine that generates with other weights (its own copy) must re-sync them in ``weights_updated()``."""
    tokenizer: Any
    """Its tokenizer (pad id set)."""
    model_cfg: Any
    """The site's ``[agent.model]`` section (:class:`hacrl_fed.config.ModelConfig`): ``engine``, ``device``,
    ``dtype``, ``behaviour_logprobs``, ``lora_rank``, ``engine_options`` …"""
    model_path: Callable[[str], str]
    """``model_path(folder)``: a Hugging Face directory or hub id holding the model's weights: where the model was
    loaded from, or — for a GGUF file or a packaged alias — an export of the loaded model written once to
    ``work_dir/folder``."""
    work_dir: Path
    """A directory the engine may write to (exports, compiled kernels)."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a response (cut before them; the response then ends with EOS)."""
    max_batch_sequences: int = 32
    """Sequences per generation call at most (memory bound)."""
    logprob_chunk_tokens: int = 1024
    """LM-head chunk for teacher-forced log-probs (:func:`hacrl_fed.update.logprobs.token_logprobs`)."""
    max_model_len: int | None = None
    """Prompt + response tokens at most, when known."""
    seed: int = 0
    """The run's seed (an engine's own random state)."""
    autocast_dtype: Any = None
    """``torch.bfloat16`` when forwards run under autocast (``model.autocast``), else ``None``."""

    @property
    def options(self) -> dict[str, Any]:
        """``model.engine_options``: the engine's own settings (a JSON object, checked by the engine)."""
        return dict(getattr(self.model_cfg, "engine_options", None) or {})


class EngineFactory(Protocol):
    """``factory(request) -> RolloutEngine``: what :data:`hacrl_fed.registries.ROLLOUT_ENGINES` holds."""

    def __call__(self, request: EngineRequest) -> RolloutEngine:
        ...
