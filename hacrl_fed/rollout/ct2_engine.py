"""``model.engine = "ct2"``: rollouts from a CTranslate2 copy of the training model, float32 by default
(docs/engines.md).

:class:`CT2RolloutEngine` generates with a ``ctranslate2.Generator`` (a C++ decoder built for inference: its own
KV cache, float32 or int8 weights) on the CPU, and takes everything else from the ``hf``
engine: the request checks, the EOS convention, the stop-string cut and the sample assembly
(:func:`~hacrl_fed.rollout.engine.checked_request`, :func:`~hacrl_fed.tokenization.retokenize.split_generated`,
:func:`~hacrl_fed.tokenization.retokenize.cut_at_stop_strings`, :func:`~hacrl_fed.rollout.engine.complete_samples`).

* **Weights**: converted from the training model lazily, at the first ``generate`` and at the first ``generate`` after
  :meth:`~CT2RolloutEngine.weights_updated` (a version counter). Conversion reads a *copy* of the model (a ``peft``
  model is merged into its copy first): ctranslate2's converter deletes the attention and MLP modules of what it
  converts. Its ``gc.collect()`` after every layer (a SmolLM2-135M int8 conversion: 11.2 s with it, 2.2 s without)
  is switched off for the conversion. The converted model is written to ``work_dir/ct2-model-<version>`` through
  a temporary directory renamed into place, and the previous version's directory is removed. Each refresh logs
  its seconds: int8, 1.2–2.2 s for SmolLM2-135M and 4.4–6.1 s for Gemma-3-270M on a loaded 2-core machine
  (docs/engines.md).
* **Converter fixes** (ctranslate2 4.8.5 with ``transformers`` 5): a tokenizer without a BOS token gets the EOS
  token as the model's ``bos_token`` (the model cannot load a null one); Gemma 3's RoPE bases are read from
  ``config.rope_parameters`` (the converter reads ``config.rope_theta``, which ``transformers`` 5 no longer sets,
  and falls back to 1e6 / 1e4) and its query scale ``query_pre_attn_scalar ** -0.5`` is written into every layer
  (the converter assumes ``head_dim ** -0.5``; both are 256 for Gemma-3-270M, not for the tiny test model). Gemma 3
  with a RoPE scaling other than ``default`` or a final-logit soft-cap is refused (the converter ignores both).
* **Sampling**: greedy is ``sampling_topk = 1``; otherwise ctranslate2's sampler with the plan's temperature,
  top-k (0 = the full distribution) and top-p. Every EOS id ends a row (kept, as in the project's EOS convention);
  stop strings are checked on each new token of a running row (a callback that ends the row) and cut as the ``hf``
  engine cuts them. **Same seed, same samples**: ctranslate2's random generator is per thread and seeded once,
  when the thread first samples, from the process-wide seed (``ctranslate2.set_random_seed``); a sampled call
  therefore sets the seed derived from its ``seed`` argument and loads a fresh ``Generator`` (a new decoding
  thread; 0.1–0.7 s for the packaged models in int8), so its draws depend only on the seed and the request (the
  seed is process-wide: two engines sampling at the same time in one process would share it). Greedy calls reuse
  the loaded one.
* **Behaviour log-probs: always teacher-forced by the training model** (the ``hf`` engine's
  :meth:`~hacrl_fed.rollout.engine.HFRolloutEngine.score`, the trainer's layout, under the model's autocast
  dtype), never ctranslate2's own: the engine's weights are int8 (or another ``compute_type``), not the training
  policy. Measured (``benchmarks/bench_ct2.py``, 16 prompts × 64 new tokens, ctranslate2's log-prob of each
  generated token against the training model's teacher-forced one): int8, per token mean |Δ| 0.17 nats (SmolLM2-135M,
  greedy; 0.30 at T = 1) and 0.068 (Gemma-3-270M; 0.21), max 1.9–3.1; an own row's GSPO |log s| = |ΣΔ| / tokens
  would be 0.014–0.11 (median) before any update, 45–370× the clip window of 3e-4. float32: mean |Δ| ≤ 2.8e-5, max
  1.5e-4, |log s| ≤ 4.9e-5. ``model.behaviour_logprobs = "generation"`` is therefore refused.

``model.engine_options``: ``compute_type`` (``"float32"`` by default; one of
``ctranslate2.get_supported_compute_types("cpu")``, e.g. ``float32``, ``int8``, ``int8_float32``), ``threads``
(ctranslate2's ``intra_threads``; default ``torch.get_num_threads()`` when the engine is built). The engine runs on
the CPU only (``model.device = "cpu"``). ctranslate2 is imported only when the engine is built
(``pip install 'hacrl-fed[fast]'``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import torch

from hacrl_fed.rollout.engine import (FinishReason, GeneratedSample, HFRolloutEngine, Sampling, checked_request,
                                      complete_samples, stop_string_in_tail)
from hacrl_fed.tokenization.retokenize import cut_at_stop_strings, split_generated

__all__ = ["CT2RolloutEngine", "CT2Settings", "CT2UnavailableError", "CT2UnsupportedModelError", "FixedVocabTokenizer",
           "convert_to_ct2", "cpu_compute_types", "require_ct2", "seed_of"]

log = logging.getLogger(__name__)

INSTALL = "pip install 'hacrl-fed[fast]' (ctranslate2>=4.5,<5)"
MODEL_DIR_PREFIX = "ct2-model-"
"""``work_dir/ct2-model-<version>``: the converted model of a weights version."""


class CT2UnavailableError(ImportError):
    """ctranslate2 is not importable here, or its converter does not know the model's architecture (one line)."""


class CT2UnsupportedModelError(CT2UnavailableError, ValueError):
    """ctranslate2's converter does not know the model's architecture: an ``ImportError`` (the engine cannot run
    here) and a ``ValueError`` (what ``hacrl-fed eval`` reports in one line once the model has loaded)."""


def require_ct2(config: Any = None) -> None:
    """Check that the ``ct2`` engine can run: ctranslate2 imports and, given a ``transformers`` model ``config``,
    its converter has a loader for that config class (``LlamaConfig``, ``Gemma3TextConfig``, …).

    Raises :class:`CT2UnavailableError` (an ``ImportError``, one line) otherwise: :class:`CT2UnsupportedModelError` for
    the config class.
    """
    try:
        import ctranslate2
        from ctranslate2.converters import transformers as converter
    except ImportError as err:
        raise CT2UnavailableError(f"model.engine = 'ct2' needs ctranslate2, which does not import here "
                                  f"({type(err).__name__}: {' '.join(str(err).split())}); {INSTALL}") from None
    if config is None:
        return
    known = getattr(converter, "_MODEL_LOADERS", {})
    name = type(config).__name__
    if name not in known:
        raise CT2UnsupportedModelError(f"model.engine = 'ct2': ctranslate2 {ctranslate2.__version__} cannot convert "
                                       f"a {name} model (it converts {', '.join(sorted(known))}); use engine 'hf' or "
                                       f"'loop'")


@dataclass(frozen=True)
class CT2Settings:
    """The ``ct2`` engine's ``model.engine_options`` (module docstring)."""

    compute_type: str = "float32"
    """ctranslate2 compute type of the converted weights and of the decoding. ``float32`` (the default) gives the
    training model's greedy tokens; ``int8`` (int8 weights and matrix products, the activations quantized on the
    fly) generates 2–3× faster but samples another policy: SmolLM2-135M's greedy held-out accuracy on the task
    suite fell from 32.8 to 9.4 % under it (``benchmarks/results/engine-agreement-int8``), so it is opt-in and
    never for evaluation."""
    threads: int = 1
    """ctranslate2's ``intra_threads`` (OpenMP threads of one generation)."""

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> CT2Settings:
        """Settings from ``model.engine_options``; ``threads`` defaults to ``torch.get_num_threads()``.

        Raises ``ValueError`` for an unknown key, a ``compute_type`` ctranslate2 does not support on this CPU, or
        ``threads`` that is not an integer ≥ 1; :class:`CT2UnavailableError` without ctranslate2.
        """
        unknown = sorted(set(options) - {"compute_type", "threads"})
        if unknown:
            raise ValueError(f"model.engine_options: unknown key(s) {', '.join(unknown)} for engine 'ct2' "
                             f"(it takes compute_type, threads)")
        compute_type = options.get("compute_type", cls.compute_type)
        threads = options.get("threads", torch.get_num_threads())
        supported = cpu_compute_types()
        if compute_type not in supported:
            raise ValueError(f"model.engine_options.compute_type = {compute_type!r} is not a compute type "
                             f"ctranslate2 supports on this CPU; choose one of {', '.join(sorted(supported))}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"model.engine_options.threads must be an integer >= 1, got {threads!r}")
        return cls(compute_type=compute_type, threads=threads)


def cpu_compute_types() -> set[str]:
    """The compute types ctranslate2 supports on this machine's CPU (``int8``, ``int8_float32``, ``float32``, …).
    Raises :class:`CT2UnavailableError` without ctranslate2."""
    require_ct2()
    import ctranslate2

    return set(ctranslate2.get_supported_compute_types("cpu"))


def seed_of(seed: int) -> int:
    """The 32-bit ctranslate2 seed of a ``generate`` call's ``seed`` (any integer): the first 4 bytes of SHA-256."""
    return int.from_bytes(hashlib.sha256(f"hacrl-fed/ct2/{int(seed)}".encode()).digest()[:4], "little")


# ---------------------------------------------------------------------------------------------- conversion


def convert_to_ct2(model, tokenizer, out_dir: str | Path, *, quantization: str) -> Path:
    """Write the CTranslate2 model of a copy of ``model`` (``peft``: merged into the copy) to ``out_dir``.

    ``model`` itself is left untouched (the converter takes modules out of what it converts). ``quantization`` is
    ctranslate2's weight type (``int8``, ``float32``, …). ``out_dir`` is created or replaced. Returns ``out_dir``.
    Raises :class:`CT2UnsupportedModelError` for an architecture ctranslate2 cannot convert, ``ValueError`` for a
    Gemma 3 feature the converter ignores (module docstring).
    """
    from ctranslate2.converters import transformers as converter

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    require_ct2(base.config)
    _check_convertible(base.config)
    out_dir = Path(out_dir)
    with torch.no_grad():
        clone = copy.deepcopy(model)
        if hasattr(clone, "merge_and_unload"):
            clone = clone.merge_and_unload()
        _set_gemma3_rope(clone.config)
        with tempfile.TemporaryDirectory(prefix=".ct2-config-", dir=out_dir.parent) as config_dir:
            clone.config.save_pretrained(config_dir)        # the converter reads the config class from a directory
            conv = _converter_class()(clone, tokenizer, config_dir)
            with mock.patch.object(converter, "gc", types.SimpleNamespace(collect=lambda *_: 0)):
                conv.convert(str(out_dir), quantization=quantization, force=True)
    return out_dir


def _converter_class():
    """A ``TransformersConverter`` converting an in-memory model and tokenizer, with the module docstring's fixes."""
    from ctranslate2.converters.transformers import TransformersConverter

    class InMemoryConverter(TransformersConverter):
        def __init__(self, model, tokenizer, config_dir: str) -> None:
            super().__init__(config_dir)
            self._model, self._tokenizer = model, tokenizer

        def load_model(self, *args, **kwargs):
            return self._model

        def load_tokenizer(self, *args, **kwargs):
            return self._tokenizer

        def _load(self):
            spec = super()._load()
            _fix_spec(spec, self._model.config)
            return spec

    return InMemoryConverter


def _check_convertible(config) -> None:
    """Refuse (``ValueError``) a Gemma 3 whose RoPE scaling or final-logit soft-cap the converter would drop."""
    text = getattr(config, "text_config", config)
    if type(config).__name__ not in ("Gemma3TextConfig", "Gemma3Config"):
        return
    rope = getattr(text, "rope_parameters", None) or {}
    types_ = {p.get("rope_type", "default") for p in rope.values() if isinstance(p, dict)}
    if types_ - {"default"}:
        raise ValueError(f"model.engine = 'ct2': ctranslate2's Gemma 3 converter ignores RoPE scaling "
                         f"({', '.join(sorted(types_ - {'default'}))}); use engine 'hf' or 'loop'")
    if getattr(text, "final_logit_softcapping", None):
        raise ValueError("model.engine = 'ct2': ctranslate2's Gemma 3 converter ignores final_logit_softcapping; "
                         "use engine 'hf' or 'loop'")


def _set_gemma3_rope(config) -> None:
    """Gemma 3 under ``transformers`` 5: the RoPE bases the converter reads, from ``rope_parameters`` (on the copy)."""
    text = getattr(config, "text_config", config)
    rope = getattr(text, "rope_parameters", None) or {}
    if "full_attention" in rope and "sliding_attention" in rope:
        text.rope_theta = rope["full_attention"]["rope_theta"]
        text.rope_local_base_freq = rope["sliding_attention"]["rope_theta"]


def _fix_spec(spec, config) -> None:
    """The converted spec's null BOS token and Gemma 3's query scale and norm epsilon (module docstring)."""
    import numpy as np

    if spec.config.bos_token is None:
        spec.config.bos_token = spec.config.eos_token
    text = getattr(config, "text_config", config)
    scalar = getattr(text, "query_pre_attn_scalar", None)
    if scalar:
        for layer in spec.decoder.layer:
            layer.self_attention.queries_scale = np.float32(float(scalar) ** -0.5)
    if getattr(spec.config, "layer_norm_epsilon", 0) is None and getattr(text, "rms_norm_eps", None):
        spec.config.layer_norm_epsilon = float(text.rms_norm_eps)


class FixedVocabTokenizer:
    """A tokenizer whose ``get_vocab()`` is read once: the converter and the vocabulary check call it at every
    refresh (262 144 entries for Gemma 3: ≈ 0.7 s a call), and a tokenizer's vocabulary never changes. Every other
    attribute is the tokenizer's."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._vocab = dict(tokenizer.get_vocab())

    def get_vocab(self) -> dict[str, int]:
        return self._vocab

    def __getattr__(self, name: str):
        return getattr(self._tokenizer, name)


def _vocabulary(model_dir: Path, tokenizer) -> list[str]:
    """The converted model's token strings by id, checked against the tokenizer (each of its tokens at its id, no
    string twice). Raises ``ValueError`` when they disagree (prompts given as strings would map to other ids)."""
    vocab = json.loads((model_dir / "vocabulary.json").read_text(encoding="utf-8"))
    if len(set(vocab)) != len(vocab):
        raise ValueError("model.engine = 'ct2': the converted vocabulary holds a token string twice")
    wrong = [tok for tok, i in tokenizer.get_vocab().items() if i < len(vocab) and vocab[i] != tok]
    if wrong:
        raise ValueError(f"model.engine = 'ct2': the converted vocabulary puts {len(wrong)} of the tokenizer's "
                         f"tokens at other ids (e.g. {wrong[0]!r}); the tokenizer's ids are not contiguous")
    return vocab


# ---------------------------------------------------------------------------------------------- the engine


class _StopStrings:
    """``generate_batch`` callback: a row ends once the text of its last tokens contains a stop string (the ``hf``
    engine's rule: the tail of longest-stop-string + 4 tokens is decoded)."""

    def __init__(self, tokenizer, stop_strings: Sequence[str], rows: int, eos_ids: Sequence[int]) -> None:
        self.tokenizer, self.stop_strings = tokenizer, tuple(stop_strings)
        self.rows: list[list[int]] = [[] for _ in range(rows)]
        self.eos = set(eos_ids)

    def __call__(self, step) -> bool:
        row = self.rows[step.batch_id]
        row.append(int(step.token_id))
        if row[-1] in self.eos:
            return False
        return stop_string_in_tail(self.tokenizer, row, self.stop_strings)


class CT2RolloutEngine:
    """Rollouts from a CTranslate2 copy of the training model, refreshed after every update (module docstring).

    Args:
        model: the training model (``transformers`` causal LM, possibly ``peft``-wrapped) on the CPU.
        tokenizer: its tokenizer.
        work_dir: where the converted model of the current weights version lives (``ct2-model-<version>``).
        settings: :class:`CT2Settings` (compute type, threads).
        max_batch_sequences: sequences per ``generate_batch`` call and per teacher-forced scoring batch bound.
        logprob_chunk_tokens: LM-head chunk of the teacher-forced scoring.
        stop_strings: strings that end a response (cut before them; the response then ends with EOS).
        behaviour_logprobs: ``auto`` or ``teacher_forced`` (the same here: the training model re-scores every
            response); ``generation`` is refused.
        autocast_dtype: the training model's autocast dtype (the scoring runs under it).

    Raises :class:`CT2UnavailableError` without ctranslate2 or for an architecture its converter does not know;
    ``ValueError`` for a model not on the CPU, ``behaviour_logprobs = "generation"`` or a size < 1.
    """

    name = "ct2"

    def __init__(self, model, tokenizer, *, work_dir: str | Path, settings: CT2Settings = CT2Settings(),
                 max_batch_sequences: int = 32, logprob_chunk_tokens: int = 1024, stop_strings: Sequence[str] = (),
                 behaviour_logprobs: str = "auto", autocast_dtype: torch.dtype | None = None) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        require_ct2(base.config)
        if behaviour_logprobs not in ("auto", "teacher_forced"):
            raise ValueError(f"model.engine = 'ct2' re-scores every response with the training model (its own "
                             f"{settings.compute_type} log-probs are not the training policy's): behaviour_logprobs "
                             f"must be 'auto' or 'teacher_forced', got {behaviour_logprobs!r}")
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"model.engine = 'ct2' runs on the CPU: model.device must be 'cpu', got {device}")
        self.scorer = HFRolloutEngine(model, tokenizer, max_batch_sequences=max_batch_sequences,
                                      logprob_chunk_tokens=logprob_chunk_tokens, stop_strings=stop_strings,
                                      behaviour_logprobs="teacher_forced", autocast_dtype=autocast_dtype)
        self.behaviour_logprobs = "teacher_forced"
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.work_dir = Path(work_dir)
        self.max_batch_sequences = max_batch_sequences
        self.stop_strings = self.scorer.stop_strings
        self.eos_ids = self.scorer.eos_ids
        self.version = 1
        """Version of the training model's weights: +1 at every :meth:`weights_updated`."""
        self.converted = 0
        """Version the loaded ctranslate2 model was converted from (0: none yet)."""
        self.refresh_seconds: list[float] = []
        """Wall seconds of each refresh (conversion + load), in order."""
        self.model_dir: Path | None = None
        self._generator: Any = None
        self._vocab: list[str] = []
        self._fixed_vocab = FixedVocabTokenizer(tokenizer)

    # ------------------------------------------------------------------ RolloutEngine

    def prepare_update(self) -> None:
        """Nothing to do: the converted copy is refreshed lazily after the update."""

    def weights_updated(self) -> None:
        """The training model's weights changed: the next ``generate`` converts them first."""
        self.version += 1

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: Any,
                 seed: int) -> list[GeneratedSample]:
        """``n`` responses per prompt, prompt-major; see :class:`~hacrl_fed.rollout.engine.RolloutEngine`.

        Converts the current weights first when needed. Behaviour log-probs are the training model's, teacher-forced
        at the sampling temperature (1 for greedy). Deterministic for a seed. Raises ``ValueError`` for an empty
        prompt, ``n < 1``, bad sampling parameters or a token id outside the model's vocabulary.
        """
        sp, prompts = checked_request(prompt_token_ids, n, sampling)
        self.refresh()
        if any(t < 0 or t >= len(self._vocab) for p in prompts for t in p):
            raise ValueError(f"a prompt token id lies outside the model's vocabulary of {len(self._vocab)}")
        generator = self._generator if sp.greedy else self._seeded_generator(seed)
        rows = [(pi, si) for pi in range(len(prompts)) for si in range(n)]
        done: list[tuple[int, int, list[int], FinishReason, None]] = []
        for start in range(0, len(rows), self.max_batch_sequences):
            chunk = rows[start:start + self.max_batch_sequences]
            for (pi, si), (ids, finish) in zip(chunk, self._generate_batch(generator, [prompts[pi] for pi, _ in chunk],
                                                                           sp), strict=True):
                done.append((pi, si, ids, finish, None))
        return complete_samples(self.scorer.score if sp.logprobs else None, self.tokenizer, self.eos_ids, prompts, done,
                                sp.logprob_temperature)

    def score(self, prompts, responses, temperature: float = 1.0):
        """Teacher-forced (Σ log-prob, count, per-token) under the training model (:meth:`HFRolloutEngine.score`)."""
        return self.scorer.score(prompts, responses, temperature)

    # ------------------------------------------------------------------ weights

    def refresh(self) -> None:
        """Convert and load the current weights unless the loaded model already is of :attr:`version`.

        Writes ``work_dir/ct2-model-<version>`` (a temporary directory renamed into place), loads it, then removes the
        previous version's directory; logs and records (:attr:`refresh_seconds`) the wall seconds.
        """
        if self.converted == self.version:
            return
        import ctranslate2

        t0 = time.perf_counter()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        final = self.work_dir / f"{MODEL_DIR_PREFIX}{self.version}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_PREFIX}", dir=self.work_dir))
        try:
            convert_to_ct2(self.model, self._fixed_vocab, tmp / "model", quantization=self.settings.compute_type)
            vocab = self._vocab or _vocabulary(tmp / "model", self._fixed_vocab)   # the same at every version
            if final.exists():                          # left by an earlier process of this site
                shutil.rmtree(final)
            os.replace(tmp / "model", final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        convert_s = time.perf_counter() - t0
        generator = ctranslate2.Generator(str(final), device="cpu", compute_type=self.settings.compute_type,
                                          intra_threads=self.settings.threads)
        old, self.model_dir, self._generator, self._vocab = self.model_dir, final, generator, vocab
        if old is not None and old != final:
            shutil.rmtree(old, ignore_errors=True)
        self.converted = self.version
        self.refresh_seconds.append(time.perf_counter() - t0)
        log.info("ct2: weights version %d converted (%s) in %.2f s, loaded in %.2f s", self.version,
                 self.settings.compute_type, convert_s, self.refresh_seconds[-1] - convert_s)

    def _seeded_generator(self, seed: int):
        """A fresh ``Generator`` of the loaded model whose decoding thread samples from ``seed_of(seed)``."""
        import ctranslate2

        ctranslate2.set_random_seed(seed_of(seed))
        return ctranslate2.Generator(str(self.model_dir), device="cpu", compute_type=self.settings.compute_type,
                                     intra_threads=self.settings.threads)

    # ------------------------------------------------------------------ decoding

    def _generate_batch(self, generator, prompts: list[tuple[int, ...]],
                        sp: Sampling) -> list[tuple[list[int], FinishReason]]:
        """One ``generate_batch`` call; each row cut at its first EOS or stop string (response ids, finish reason)."""
        callback = (_StopStrings(self.tokenizer, self.stop_strings, len(prompts), self.eos_ids)
                    if self.stop_strings else None)
        results = generator.generate_batch(
            [[self._vocab[t] for t in p] for p in prompts], max_length=sp.max_new_tokens, min_length=0,
            include_prompt_in_result=False, end_token=list(self.eos_ids), return_end_token=True,
            sampling_topk=1 if sp.greedy else min(sp.top_k, len(self._vocab)), sampling_topp=1.0 if sp.greedy else sp.top_p,
            sampling_temperature=1.0 if sp.greedy else sp.temperature, callback=callback)
        out: list[tuple[list[int], FinishReason]] = []
        for res in results:
            ids, finish = split_generated(res.sequences_ids[0], self.eos_ids, sp.max_new_tokens)
            if self.stop_strings:
                ids, finish = cut_at_stop_strings(self.tokenizer, ids, finish, self.stop_strings, self.eos_ids[0])
            out.append((ids, finish))  # type: ignore[arg-type]
        return out
