"""Rollout engines: generate G responses per prompt and score them under the behaviour policy.

The worker talks to a :class:`RolloutEngine` (a Protocol), so a vLLM engine can replace the
Hugging Face one without touching the trainer or the service. :class:`HFRolloutEngine` runs
batched ``model.generate`` with a KV cache and **left** padding, in sub-batches that bound memory.

Behaviour log-probs (ARCHITECTURE §2 step 2, hacpo-spec §8.3 step 3) are log π(y_t | prompt, y_<t) of
the sampled tokens under the *untruncated* tempered softmax, log-softmax(logits / T) with T the sampling
temperature (1.0 for greedy) — the same quantity the trainer computes for the learner, so an own row's
importance ratio is 1 before the first update. Top-k / top-p truncate only what is sampled from, never this
value. The count includes the terminal EOS when the response stopped on it (the project's EOS convention:
"stop" rows keep their EOS on both sides). Two ways to get them (``behaviour_logprobs``):

* ``"generation"`` (what ``"auto"``, the default, picks for a model computing in float32): read from the
  generation pass itself. A logits processor placed before
  ``generate``'s temperature / top-k / top-p warpers sees each step's raw logits (final-logit softcapping
  included, as the model's forward applies it) and keeps the log-prob of the token sampled from them, plus
  that of the EOS a stop-string cut appends. No second forward.
* ``"teacher_forced"`` (what ``"auto"`` picks under bf16 / fp16, weights or autocast): every response
  re-scored in one more forward over prompt + response (right padding, exactly the layout the trainer uses)
  by :func:`hacrl_fed.update.logprobs.token_logprobs`.

Both compute the same function of the same weights; they differ only by floating-point rounding (the KV
cache's step-by-step attention against one full forward, left against right padding). Measured on
SmolLM2-135M-Instruct, 4 × 4 responses, 1013 sampled tokens (``benchmarks/bench_behaviour_logprobs.py``,
docs/benchmarks.md "Behaviour log-probs and mixed precision"):

* float32: |generation − teacher-forced| per token max 3.0e-5 nats, mean 8.0e-6; an own row's sequence
  ratio before the first update |log s| ≤ 1.2e-5 (GSPO clips at 3e-4); the teacher-forced pass equals the
  trainer's forward exactly. ``generate`` takes 0.68× the CPU time without the extra forward.
* bf16 autocast: the two passes round differently, per token max 0.27 nats, mean 0.033, |log s| up to
  0.026 — every own row would sit outside GSPO's clip window — while the teacher-forced pass still equals
  the trainer's forward exactly. Hence ``auto``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, Sequence

import torch
from torch import Tensor

from hacrl_fed.update.logprobs import token_logprobs
from hacrl_fed.tokenization.retokenize import clean_response_text, cut_at_stop_strings, decode_text, split_generated

__all__ = ["BEHAVIOUR_LOGPROBS", "GeneratedSample", "HFRolloutEngine", "RolloutEngine", "Sampling", "autocast_context",
           "checked_request", "complete_samples", "eos_token_ids", "stop_string_in_tail"]

FinishReason = Literal["stop", "length"]
BEHAVIOUR_LOGPROBS = ("auto", "generation", "teacher_forced")
"""Where behaviour log-probs come from (module docstring): the generation pass, one more forward, or ``auto``:
the generation pass when the model computes in float32, the extra forward under bf16 / fp16 (weights or autocast)."""


def autocast_context(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast(device.type, dtype)`` when ``dtype`` is set (mixed precision), else a no-op context.

    Raises ``ValueError`` for a dtype other than ``torch.bfloat16`` / ``torch.float16``.
    """
    if dtype is None:
        return contextlib.nullcontext()
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"autocast dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class Sampling:
    """Behaviour-policy sampling parameters (the paper's defaults: temperature 1, top-p 1, top-k off).

    ``temperature == 0`` means greedy decoding; log-probs then use temperature 1. ``logprobs = False``: the caller
    needs no behaviour log-probs (evaluation, :func:`hacrl_fed.play.evaluate.evaluate_items`); an engine that
    would get them from an extra teacher-forced pass (``ct2``, ``vllm``, ``hf`` under bf16) skips it and returns
    ``logprob_sum = 0`` and ``token_logprobs = ()``; the sampled tokens are the same either way.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    logprobs: bool = True

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @classmethod
    def of(cls, obj: Any) -> Sampling:
        """Build from anything with the four attributes (proto ``SamplingParams``, ``SamplingConfig``).

        Raises ``ValueError`` on out-of-range values.
        """
        if isinstance(obj, cls):
            return obj
        return cls(float(obj.temperature), float(obj.top_p), int(obj.top_k), int(obj.max_new_tokens))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """Temperature applied to logits when scoring (interfaces: greedy ⇒ 1.0)."""
        return 1.0 if self.greedy else self.temperature


@dataclass(frozen=True)
class GeneratedSample:
    """One response. ``response_ids`` include the terminal EOS iff ``finish_reason == "stop"``;
    ``text`` is the shared text (terminal EOS popped, special tokens stripped).

    ``logprob_sum`` = Σ_t log π_old(y_t | prompt, y_<t) in nats over the ``token_count`` =
    ``len(response_ids)`` response tokens, logits divided by the sampling temperature.
    """

    prompt_index: int
    sample_index: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    logprob_sum: float
    token_count: int
    token_logprobs: tuple[float, ...] = ()
    """Per-token behaviour log-probs of ``response_ids`` (same temperature); ``()`` when the engine has none."""

    @property
    def eos_logprob(self) -> float | None:
        """log π_old of the terminal EOS of a ``stop`` response (included in ``logprob_sum``), else None."""
        if self.finish_reason != "stop" or len(self.token_logprobs) != self.token_count or not self.token_logprobs:
            return None
        return self.token_logprobs[-1]


class RolloutEngine(Protocol):
    """What the worker needs from a generation backend (:class:`HFRolloutEngine`, or
    :class:`~hacrl_fed.rollout.vllm_engine.VLLMRolloutEngine` on a GPU site)."""

    name: str
    """``"hf"`` or ``"vllm"`` (``model.engine``; the worker's Health reports it)."""
    max_batch_sequences: int

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: Any,
                 seed: int) -> list[GeneratedSample]:
        """``n`` responses per prompt, ordered prompt-major (prompt 0 samples 0..n-1, prompt 1 …)."""
        ...

    def prepare_update(self) -> None:
        """Called before the training model's weights change (an engine may free memory for the update)."""
        ...

    def weights_updated(self) -> None:
        """Called after they changed (an update, a checkpoint loaded): the next generation uses the new weights."""
        ...


def checked_request(prompt_token_ids: Sequence[Sequence[int]], n: int,
                    sampling: Any) -> tuple[Sampling, list[tuple[int, ...]]]:
    """(sampling parameters, prompts as int tuples) of a ``generate`` call. Raises ``ValueError`` for ``n < 1``, an
    empty prompt or invalid sampling parameters."""
    sp = Sampling.of(sampling)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    prompts = [tuple(int(t) for t in p) for p in prompt_token_ids]
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    return sp, prompts


ScoreFn = Callable[[Sequence[Sequence[int]], Sequence[Sequence[int]], float], list[tuple[float, int, tuple[float, ...]]]]
"""``score(prompts, responses, temperature)``: teacher-forced (Σ, count, per-token log-probs), :meth:`HFRolloutEngine.score`."""


def complete_samples(score: ScoreFn | None, tokenizer, eos_ids: Sequence[int], prompts: Sequence[tuple[int, ...]],
                     rows: Sequence[tuple[int, int, Sequence[int], FinishReason, Sequence[float] | None]],
                     temperature: float) -> list[GeneratedSample]:
    """The :class:`GeneratedSample` of each ``(prompt index, sample index, response ids, finish, per-token
    behaviour log-probs or None)`` row, in order: rows without log-probs are re-scored in one ``score`` call
    (teacher-forced, ``temperature``) — or, with ``score = None`` (the caller asked for none, ``Sampling.logprobs``),
    left without (``()``, Σ 0) —, the shared text is decoded (terminal EOS popped), Σ is taken in float64."""
    per_token = [None if lps is None else tuple(lps) for *_, lps in rows]
    if score is None:
        per_token = [lps if lps is not None else () for lps in per_token]
    todo = [i for i, lps in enumerate(per_token) if lps is None]
    if todo:
        scored = score([prompts[rows[i][0]] for i in todo], [rows[i][2] for i in todo], temperature)
        for i, (_, _, lps) in zip(todo, scored, strict=True):
            per_token[i] = tuple(lps)
    out = []
    for (pi, si, ids, finish, _), lps in zip(rows, per_token):
        text = clean_response_text(tokenizer, ids, eos_ids=eos_ids)
        total = float(torch.tensor(lps, dtype=torch.float64).sum()) if lps else 0.0
        out.append(GeneratedSample(pi, si, prompts[pi], tuple(ids), text, finish, total, len(ids), lps))
    return out


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the tokenizer's EOS plus the generation config's EOS id(s)."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    cfg_eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    for tid in ([tokenizer.eos_token_id] + (cfg_eos if isinstance(cfg_eos, list) else [cfg_eos])):
        if tid is not None and int(tid) not in ids:
            ids.append(int(tid))
    if not ids:
        raise ValueError("the tokenizer and the generation config define no EOS token")
    return ids


class HFRolloutEngine:
    """Batched Hugging Face ``generate`` (KV cache, left padding) + behaviour log-probs of the sampled tokens.

    Args:
        model: causal LM (optionally ``peft``-wrapped) on its device.
        tokenizer: its tokenizer (pad id needed; pad may equal EOS).
        max_batch_sequences: sequences per ``generate`` call (memory bound).
        logprob_batch_tokens: padded tokens per scoring forward pass.
        logprob_chunk_tokens: LM-head chunk of :func:`token_logprobs`.
        stop_strings: strings that end a response (e.g. the plain template's next ``Question:``). A row
            stops generating once its text contains one; the response is cut before it and ends with EOS
            (finish reason ``stop``, :func:`~hacrl_fed.tokenization.retokenize.cut_at_stop_strings`).
        behaviour_logprobs: ``"generation"`` (read from the sampling pass), ``"teacher_forced"`` (one more
            forward per response) or ``"auto"`` (default: ``generation`` for float32 weights without autocast,
            else ``teacher_forced``); see the module docstring. The attribute of the same name holds the pass
            used. A row whose ids are not a prefix of what was sampled (never the case today) is re-scored
            teacher-forced whatever the mode.
        autocast_dtype: ``torch.bfloat16`` (or ``float16``) runs generation and scoring under ``torch.autocast``
            (mixed precision, weights kept in their dtype); None (default) runs in the weights' dtype.

    Raises ``ValueError`` for a size < 1, an unknown ``behaviour_logprobs`` or a bad ``autocast_dtype``.
    """

    name = "hf"

    def __init__(self, model, tokenizer, *, max_batch_sequences: int = 32, logprob_batch_tokens: int = 8192,
                 logprob_chunk_tokens: int = 1024, stop_strings: Sequence[str] = (),
                 behaviour_logprobs: str = "auto", autocast_dtype: torch.dtype | None = None) -> None:
        if max_batch_sequences < 1 or logprob_batch_tokens < 1:
            raise ValueError("max_batch_sequences and logprob_batch_tokens must be >= 1")
        if behaviour_logprobs not in BEHAVIOUR_LOGPROBS:
            raise ValueError(f"behaviour_logprobs must be one of {', '.join(BEHAVIOUR_LOGPROBS)}, "
                             f"got {behaviour_logprobs!r}")
        autocast_context(torch.device("cpu"), autocast_dtype)   # validates the dtype
        if behaviour_logprobs == "auto":
            float32 = autocast_dtype is None and next(model.parameters()).dtype == torch.float32
            behaviour_logprobs = "generation" if float32 else "teacher_forced"
        self.behaviour_logprobs = behaviour_logprobs
        self.autocast_dtype = autocast_dtype
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_sequences = max_batch_sequences
        self.logprob_batch_tokens = logprob_batch_tokens
        self.logprob_chunk_tokens = logprob_chunk_tokens
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.eos_ids = eos_token_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prepare_update(self) -> None:
        """Nothing to do: generation runs on the training model itself."""

    def weights_updated(self) -> None:
        """Nothing to do: generation runs on the training model itself."""

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: Any,
                 seed: int) -> list[GeneratedSample]:
        """Generate ``n`` responses for every prompt and score them; see :class:`RolloutEngine`.

        Deterministic for a seed (the global torch RNG is forked, so callers' RNG state is untouched).
        Raises ``ValueError`` for an empty prompt or ``n < 1``, or invalid sampling parameters.
        """
        sp, prompts = checked_request(prompt_token_ids, n, sampling)
        rows = [(pi, si) for pi in range(len(prompts)) for si in range(n)]
        responses: list[tuple[tuple[int, ...], FinishReason, tuple[float, ...] | None]] = []
        was_training = self.model.training
        self.model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with (torch.random.fork_rng(devices=devices), torch.no_grad(),
                  autocast_context(self.device, self.autocast_dtype)):
                torch.manual_seed(seed)
                for start in range(0, len(rows), self.max_batch_sequences):
                    chunk = rows[start:start + self.max_batch_sequences]
                    responses.extend(self._generate_batch([prompts[pi] for pi, _ in chunk], sp))
                return complete_samples(self.score if sp.logprobs else None, self.tokenizer, self.eos_ids, prompts,
                                        [(pi, si, resp, finish, lps)
                                         for (pi, si), (resp, finish, lps) in zip(rows, responses, strict=True)],
                                        sp.logprob_temperature)
        finally:
            self.model.train(was_training)

    def _generate_batch(self, prompts: list[tuple[int, ...]],
                        sp: Sampling) -> list[tuple[tuple[int, ...], FinishReason, tuple[float, ...] | None]]:
        """One left-padded ``generate`` call; cut each row at its first EOS or stop string.

        Returns (response ids, finish reason, per-token behaviour log-probs or None to re-score) per row.
        """
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[b, width - len(p):] = 1
        warpers = {} if sp.greedy else {"temperature": sp.temperature, "top_p": sp.top_p, "top_k": sp.top_k,
                                        "typical_p": 1.0, "min_p": None}
        gen_cfg = GenerationConfig(
            do_sample=not sp.greedy, repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
            max_new_tokens=sp.max_new_tokens, min_new_tokens=0, eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id, use_cache=True, **warpers,
        )
        criteria = (StoppingCriteriaList([_StopOnStrings(self.tokenizer, self.stop_strings, width)])
                    if self.stop_strings else None)
        # no repetition penalty, n-gram ban or minimum length above: nothing alters the logits before the capture
        capture = (_SampledTokenLogprobs(sp.logprob_temperature, self.eos_ids[0], width)
                   if self.behaviour_logprobs == "generation" else None)
        out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                  generation_config=gen_cfg, stopping_criteria=criteria,
                                  logits_processor=LogitsProcessorList([capture]) if capture else None)
        generated = out[:, width:]
        sampled, eos_lp = capture.result(generated) if capture else (None, None)
        result: list[tuple[tuple[int, ...], FinishReason, tuple[float, ...] | None]] = []
        for b, row in enumerate(generated.tolist()):
            ids, finish = split_generated(row, self.eos_ids, sp.max_new_tokens)
            if self.stop_strings:
                ids, finish = cut_at_stop_strings(self.tokenizer, ids, finish, self.stop_strings, self.eos_ids[0])
            lps = (_row_logprobs(row, ids, sampled[b].tolist(), eos_lp[b].tolist(), self.eos_ids[0])
                   if capture else None)
            result.append((tuple(ids), finish, lps))  # type: ignore[arg-type]
        return result

    def score(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
              temperature: float = 1.0) -> list[tuple[float, int, tuple[float, ...]]]:
        """(Σ log-prob, token count, per-token log-probs) of each response given its prompt, teacher-forced.

        Rows are right-padded prompt+response batches of at most ``logprob_batch_tokens`` padded
        tokens; log-probs come from :func:`token_logprobs` with ``temperature``, the LM head only over the
        response positions. Gradients are off; the model is in eval mode meanwhile (its mode is restored); runs
        under the engine's autocast dtype, if any.
        """
        lengths = [len(p) + len(r) for p, r in zip(prompts, responses)]
        out: list[tuple[float, int, tuple[float, ...]]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            start = 0
            while start < len(lengths):
                end, width = start, 0
                while end < len(lengths) and (end == start or max(width, lengths[end]) * (end + 1 - start)
                                              <= self.logprob_batch_tokens):
                    width = max(width, lengths[end])
                    end += 1
                out.extend(self._score_batch(prompts[start:end], responses[start:end], width, temperature))
                start = end
        finally:
            self.model.train(was_training)
        return out

    def _score_batch(self, prompts, responses, width: int,
                     temperature: float) -> list[tuple[float, int, tuple[float, ...]]]:
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        scored = torch.zeros((len(prompts), width), dtype=torch.bool)
        for b, (p, r) in enumerate(zip(prompts, responses)):
            seq = list(p) + list(r)
            ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[b, :len(seq)] = 1
            scored[b, len(p):len(seq)] = True
        with torch.no_grad(), autocast_context(self.device, self.autocast_dtype):
            lp = token_logprobs(self.model, ids.to(self.device), mask.to(self.device), temperature=temperature,
                                chunk_tokens=self.logprob_chunk_tokens, score_mask=scored.to(self.device)).cpu()
        out = []
        for b, (p, r) in enumerate(zip(prompts, responses)):
            tok = lp[b, len(p):len(p) + len(r)].double()
            out.append((float(tok.sum()), len(r), tuple(tok.tolist())))
        return out


class _SampledTokenLogprobs:
    """``generate`` logits processor recording log-softmax(logits / T) of each sampled token and of ``eos_id``.

    Called once per generated position with the ids so far and that step's logits [B, V] (float32, after the
    model's own softcapping, before ``generate``'s temperature / top-k / top-p warpers, which come after the
    processors a caller passes). It returns the logits unchanged. The token sampled at step t is only known at
    step t + 1 (the last column of ``input_ids``), so one step's log-softmax [B, V] is kept until then.
    """

    def __init__(self, temperature: float, eos_id: int, prompt_width: int) -> None:
        self.inv_temperature = 1.0 / temperature
        self.eos_id = int(eos_id)
        self.prompt_width = prompt_width
        self._last: Tensor | None = None
        self._sampled: list[Tensor] = []
        self._eos: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        if input_ids.shape[1] - self.prompt_width != len(self._eos):
            raise RuntimeError("behaviour log-prob capture called out of step with generation")
        if self._last is not None:
            self._sampled.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))
        z = scores.float()
        logp = torch.log_softmax(z * self.inv_temperature if self.inv_temperature != 1.0 else z, dim=-1)
        self._eos.append(logp[:, self.eos_id].clone())   # a copy: a view would keep every step's [B, V] alive
        self._last = logp
        return scores

    def result(self, generated: Tensor) -> tuple[Tensor, Tensor]:
        """([B, S] log-prob of ``generated[:, t]``, [B, S] log-prob of EOS at step t), float32 on the CPU.

        ``generated`` [B, S] are the new tokens ``generate`` returned. Raises ``RuntimeError`` if the capture
        did not see every step.
        """
        steps = generated.shape[1]
        if self._last is not None and len(self._sampled) == steps - 1:
            self._sampled.append(self._last.gather(1, generated[:, steps - 1:]).squeeze(1))
        self._last = None
        if len(self._sampled) != steps or len(self._eos) != steps:
            raise RuntimeError(f"behaviour log-prob capture saw {len(self._eos)} of {steps} generation steps")
        if not steps:
            empty = torch.zeros((generated.shape[0], 0))
            return empty, empty
        return torch.stack(self._sampled, 1).cpu(), torch.stack(self._eos, 1).cpu()


def _row_logprobs(generated: Sequence[int], ids: Sequence[int], sampled: Sequence[float], eos: Sequence[float],
                  eos_id: int) -> tuple[float, ...] | None:
    """Per-token log-probs of response ``ids`` from one row's capture; None when ``ids`` is no sampled prefix.

    ``ids`` is a prefix of the ``generated`` row (cut at its first EOS), or — after a stop-string cut — a
    shorter prefix plus ``eos_id``, whose log-prob at that position the capture recorded too.
    """
    out: list[float] = []
    for t, tok in enumerate(ids):
        if t < len(generated) and tok == generated[t]:
            out.append(sampled[t])
        elif t == len(ids) - 1 and tok == eos_id and t < len(eos):
            out.append(eos[t])
        else:
            return None
    return tuple(out)


class _StopOnStrings:
    """``generate`` stopping criterion: a row is done once the text of its last tokens contains a stop string.

    Only the tail is decoded (enough tokens for the longest stop string, each token being at least one
    character or a special token), so a step costs O(batch) short decodes.
    """

    def __init__(self, tokenizer, stop_strings: Sequence[str], prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        self.prompt_width = prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for b, row in enumerate(input_ids[:, self.prompt_width:].tolist()):
            done[b] = stop_string_in_tail(self.tokenizer, row, self.stop_strings)
        return done


def stop_string_in_tail(tokenizer, row: Sequence[int], stop_strings: Sequence[str]) -> bool:
    """Whether the text of the last tokens of ``row`` (response ids so far) contains one of ``stop_strings``
    (non-empty). Only the tail is decoded: longest stop string + 4 tokens, each token being at least one character
    or a special token, so a check costs one short decode. The rule of every engine's stop-string check."""
    window = max(len(s) for s in stop_strings) + 4
    tail = decode_text(tokenizer, row[-window:])
    return any(s in tail for s in stop_strings)

