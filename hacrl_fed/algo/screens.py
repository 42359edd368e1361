"""Learner-side screens against poisoned peer rollouts: settings, statistics and decisions (pure, no I/O).

A peer that is authenticated and whose answers verify can still share text that carries a payload (a
trigger phrase, a URL, an instruction, a style) that the learner then learns to produce ("Hail to the
Thief", arXiv 2511.09780). The screens decide *which foreign rows a learner trains on*; they never change
the HACPO math of the rows that are trained (a screened-out row gets weight 0: no gradient, and it still
counts in the mini-batch mean as a zero, like a row clamped out of the cross window). Three screens and
one bookkeeping rule, each a section of :class:`ScreenConfig` (``agent.screens`` in TOML):

* **likelihood** (:func:`likelihood_decision`): the statistic is the learner's log-likelihood per byte of
  a row's content, ℓ = Σ_content log π_k(y) / B (nats per UTF-8 byte; content = the response without its
  terminal EOS; the log-probs are the ones the update computes anyway, no extra forward pass). A foreign
  row is screened out when ℓ is a low outlier against **its source's** recent accepted rows — robust z =
  (ℓ − median) / max(1.4826 · MAD, ``min_scale``) < −``z_threshold`` once the source's window holds
  ``warmup_rows`` rows — **and** lies below the median of the learner's own recent rows; or, whatever the
  source's history, when it lies more than ``own_margin`` nats per byte below the learner's own median.
  Only rows with a reward are screened (``rewarded_only``) and only rows of at least ``min_bytes``.
  Rows of another model family sit far from the learner's own rows by nature (README "Cross-family
  collaboration"): comparing each source with its own history, and the learner's own rows only with a
  wide margin, keeps honest cross-family rows.
* **phrase** (:func:`recurring_phrases`, :func:`cut_phrases`): a trigger is learned only if it is the same
  text in many rows, and a payload the attacker wants its peers to learn appears in its answers to *different*
  prompts, while honest reasoning tied to a problem (its numbers, its wording) does not. A word n-gram
  (``ngram_words`` lower-cased ``\\w+`` words) that occurs in one source's rows of at least
  max(``min_prompts``, ⌈``min_prompt_frac`` × the prompts it answered⌉) distinct prompts of a step, and
  occurs neither in the step's prompt texts nor in the learner's own responses of the step, is a *recurring
  phrase*: it is cut out of every row of that source that holds it (with the punctuation right after it),
  and the row is trained on the rest, the source's behaviour log-prob scaled to the kept bytes as for a cut
  tail. A cut row is trained, so a phrase cut does not flag the step for the quarantine (an honest peer's
  house phrase would otherwise quarantine it). Per-row likelihood statistics cannot tell such a payload from
  honest cross-family text (:func:`span_surprise`); its recurrence can. An extension beyond arXiv
  2511.09780 (whose screens a "long but correct" answer survived: a filler repeated across answers is a
  recurring phrase too).
* **answer tail** (:func:`tail_decision`): text after the final stated answer
  (:func:`hacrl_fed.reward.extract.answer_tail`) longer than ``budget_bytes`` is cut there (``policy =
  "cut"``, after the answer's closing punctuation) or the row is rejected (``"reject"``); a response longer than ``max_length_factor`` × the
  median length of the other sources' responses to the same prompt (and longer than ``min_length_bytes``)
  is rejected ("long but correct").
* **quarantine** (:func:`quarantine_step`): a source more than ``flag_frac`` of whose rewarded rows of a
  step were screened (cut or left out), or whose reward claims the site's own verifier contradicts, has a
  *flagged* step; ``downweight_after`` flagged steps among the last ``memory`` multiply its rows' advantages
  by ``downweight``, ``quarantine_after`` leave all its rows out; ``release_after_clean`` clean steps in a
  row (text screens and reward claims only: a quarantined source's rows are not scored) or the operator
  (``screens.release``) lift it.
* **re-verification** (``reverify``): the site re-verifies every foreign row against the plan's reference
  answers with its own verifier; its verdict is what it trains on, whatever the coordinator said.

Every knob is a documented field below; ``enabled = false`` turns one screen off. Sources: robust z-score
with the median absolute deviation and the 3.5 cut-off of Iglewicz & Hoaglin (1993); the learner
log-probability screen and the long-answer attack of arXiv 2511.09780.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "LikelihoodDecision",
    "LikelihoodScreenConfig",
    "PhraseScreenConfig",
    "QuarantineConfig",
    "ScreenConfig",
    "SourceStanding",
    "TailDecision",
    "TailScreenConfig",
    "cut_phrases",
    "likelihood_decision",
    "per_byte_loglik",
    "quarantine_step",
    "recurring_phrases",
    "release",
    "robust_center_scale",
    "robust_z",
    "span_surprise",
    "step_flagged",
    "tail_decision",
    "word_ngrams",
]

MAD_TO_SIGMA = 1.4826
"""1 / Φ⁻¹(3/4): 1.4826 · MAD estimates σ for normal data."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LikelihoodScreenConfig(_Strict):
    """Likelihood screen (module docstring). Units: nats per UTF-8 byte of content."""

    enabled: bool = True
    z_threshold: Annotated[float, Field(gt=0)] = 3.5
    """A row with robust z below −z_threshold against its source's window is an outlier (Iglewicz–Hoaglin 3.5)."""
    window: Annotated[int, Field(ge=2)] = 64
    """Accepted rows per source (and own rows) kept for the median and MAD (the most recent ones)."""
    warmup_rows: Annotated[int, Field(ge=2)] = 16
    """Rows a source's window needs before the source-relative test applies (before: only ``own_margin``)."""
    min_scale: Annotated[float, Field(gt=0)] = 0.05
    """Floor of the robust scale 1.4826·MAD (nats/byte): a very tight window does not flag small deviations."""
    own_margin: Annotated[float, Field(gt=0)] | None = 2.5
    """A foreign row more than this many nats per byte below the median of the learner's own rows is screened
    whatever its source's history (None: off). Measured on the default pair's initial policies (32 rows each
    way): the learner's own median −0.47 (SmolLM2) / −0.57 (Gemma-3); the other family's honest rows median
    −0.85 / −0.67, lowest rewarded one −2.45 (Gemma's text under SmolLM2: 1.98 below; 1.5 would cut it)."""
    rewarded_only: bool = True
    """Screen only rows with a reward > 0: a payload is learned through positive advantages, and the short,
    unanswered rows whose per-byte value is noisiest are then never screened (every row still joins its
    source's window)."""
    min_bytes: Annotated[int, Field(ge=1)] = 16
    """Rows with less content than this are neither screened nor part of a window (per-byte values of a few
    bytes are noise)."""


class PhraseScreenConfig(_Strict):
    """Recurring-phrase screen (module docstring). Units: words, prompts."""

    enabled: bool = True
    ngram_words: Annotated[int, Field(ge=2, le=16)] = 4
    """n: words in a phrase (lower-cased ``\\w+`` runs; punctuation and spacing ignored)."""
    min_prompts: Annotated[int, Field(ge=2)] = 2
    """A phrase must occur in a source's rows of at least this many distinct prompts of the step …"""
    min_prompt_frac: Annotated[float, Field(gt=0, le=1)] = 0.75
    """… and of at least this share of the prompts the source answered in the step (rounded up)."""


class TailScreenConfig(_Strict):
    """Answer-tail and length screen (module docstring). Units: UTF-8 bytes."""

    enabled: bool = True
    policy: Literal["cut", "reject"] = "cut"
    """``cut``: train on the text up to the end of the final answer and its closing punctuation, the source's
    behaviour log-prob scaled to the kept share of the bytes; ``reject``: leave the row out."""
    budget_bytes: Annotated[int, Field(ge=0)] = 32
    """Text allowed after the final stated answer (closing punctuation, a short sentence). A cut keeps only the
    answer's closing punctuation: the budget bounds what passes untouched, never a kept piece of a longer tail."""
    max_length_factor: Annotated[float, Field(gt=1)] | None = 4.0
    """A response longer than this × the median length of the other sources' responses to the same prompt is
    rejected (None: no length screen)."""
    min_length_bytes: Annotated[int, Field(ge=0)] = 256
    """The length screen never rejects a response of at most this many bytes."""


class QuarantineConfig(_Strict):
    """Per-source down-weighting and quarantine (module docstring). Counts are training steps."""

    enabled: bool = True
    flag_frac: Annotated[float, Field(ge=0, lt=1)] = 0.5
    """A step is flagged for a source when more than this share of its rewarded rows (reward > 0: the rows a
    payload is learned from) were screened (cut or left out) …"""
    flag_min_rows: Annotated[int, Field(ge=1)] = 2
    """… and at least this many of them."""
    reward_disagreements: Annotated[int, Field(ge=1)] = 1
    """… or when at least this many of its reward claims contradict the site's own verifier."""
    memory: Annotated[int, Field(ge=1)] = 5
    """Flagged steps are counted over the source's last ``memory`` steps."""
    downweight_after: Annotated[int, Field(ge=1)] = 1
    """Flagged steps (within ``memory``) after which the source's rows are down-weighted."""
    quarantine_after: Annotated[int, Field(ge=1)] = 3
    """Flagged steps (within ``memory``) after which the source is quarantined (no row trained)."""
    downweight: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Advantage multiplier of a down-weighted source's rows."""
    release_after_clean: Annotated[int, Field(ge=0)] = 5
    """Consecutive clean steps after which a quarantined source is trusted again (0: only the operator)."""


class ScreenConfig(_Strict):
    """``agent.screens``: what a learner site checks in its peers' rows before training on them."""

    enabled: bool = True
    """Master switch: false trains on every validated foreign row, with the coordinator's rewards."""
    reverify: bool = True
    """Re-verify every foreign row with the site's own verifier; its verdict is the reward trained on."""
    likelihood: LikelihoodScreenConfig = Field(default_factory=LikelihoodScreenConfig)
    phrase: PhraseScreenConfig = Field(default_factory=PhraseScreenConfig)
    tail: TailScreenConfig = Field(default_factory=TailScreenConfig)
    quarantine: QuarantineConfig = Field(default_factory=QuarantineConfig)
    release: list[str] = Field(default_factory=list)
    """Operator: sources released from quarantine when the worker starts (after a resume restores it)."""

    @classmethod
    def off(cls) -> ScreenConfig:
        """Every screen and the re-verification off (the behaviour before the screens existed)."""
        return cls(enabled=False, reverify=False)


# ----------------------------------------------------------------------------- statistics


def per_byte_loglik(logprob_sum: float, content_bytes: int) -> float:
    """ℓ = Σ log π / B: nats per UTF-8 byte of content (B floored at 1). Pure arithmetic."""
    return float(logprob_sum) / max(1, int(content_bytes))


def span_surprise(token_logprobs: Sequence[float], span_tokens: int) -> float:
    """σ_k: the mean log-prob (nats per token) of the least likely run of ``span_tokens`` consecutive tokens.

    σ_k = min_i (1/k) Σ_{t=i}^{i+k−1} log π(y_t) over a row's content tokens (the learner's tokens of the
    response without its terminal EOS); a row of fewer than k tokens is one span (its mean). Returns NaN for
    no tokens and for a non-finite log-prob; ``span_tokens`` < 1: ``ValueError``. O(n), pure arithmetic.

    A candidate statistic for a payload inside fluent text (it barely moves the row's mean ℓ), measured and
    *not* used as a screen: on the default pair a learner's own temperature-1 rows hold runs as unlikely as
    the benchmark's payload (SmolLM2: payload rows σ_8 1.7 nats/token below its own median, honest Gemma-3
    rows 1.5 at the median and 3.7 at the 95th percentile; ``benchmarks/results/screen-calibration``), so
    no margin screens the payload without screening more honest cross-family rows. The phrase screen
    (:func:`recurring_phrases`) uses what does separate them: the payload recurs across prompts.
    """
    if span_tokens < 1:
        raise ValueError(f"span_tokens must be >= 1, got {span_tokens}")
    values = [float(v) for v in token_logprobs]
    if not values or not all(math.isfinite(v) for v in values):
        return math.nan
    k = min(span_tokens, len(values))
    window = sum(values[:k])
    low = window
    for t in range(k, len(values)):
        window += values[t] - values[t - k]
        low = min(low, window)
    return low / k


_WORD = re.compile(r"\w+")
_AFTER = re.compile(r"[^\w\s]*")
_SENTENCE_END = re.compile(r"[.!?]\s")
Phrase = tuple[str, ...]


def word_ngrams(text: str, n: int) -> dict[Phrase, list[tuple[int, int]]]:
    """Lower-cased word n-grams of ``text`` (words = ``\\w+`` runs; an n-gram never spans two sentences) → the
    character span (start of the first word, end of the last) of each occurrence, in order. ``n`` < 1:
    ``ValueError``."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    out: dict[Phrase, list[tuple[int, int]]] = {}
    for words in _sentences(text):
        for i in range(len(words) - n + 1):
            out.setdefault(tuple(w for w, _, _ in words[i:i + n]), []).append((words[i][1], words[i + n - 1][2]))
    return out


def _sentences(text: str) -> list[list[tuple[str, int, int]]]:
    """The words of ``text`` (lower-cased, with their spans) grouped by sentence: a sentence ends at a line
    break or at ``.``/``!``/``?`` followed by whitespace (so ``www.example.org`` is one sentence)."""
    out: list[list[tuple[str, int, int]]] = [[]]
    prev_end = 0
    for m in _WORD.finditer(text):
        gap = text[prev_end:m.start()]
        if out[-1] and ("\n" in gap or _SENTENCE_END.search(gap)):
            out.append([])
        out[-1].append((m.group(0).lower(), m.start(), m.end()))
        prev_end = m.end()
    return out


def recurring_phrases(texts_by_prompt: Mapping[str, Sequence[str]], excluded: AbstractSet[Phrase],
                      cfg: PhraseScreenConfig) -> set[Phrase]:
    """The recurring phrases of one source in one step (module docstring).

    Args:
        texts_by_prompt: prompt id → the source's response texts to it.
        excluded: phrases that are never recurring (the step's prompt texts' and the learner's own n-grams).
        cfg: the phrase screen's settings.
    Returns the n-grams found in rows of at least max(``min_prompts``, ⌈``min_prompt_frac`` × prompts⌉)
    distinct prompts, minus ``excluded``; empty when disabled.
    """
    if not cfg.enabled:
        return set()
    need = max(cfg.min_prompts, math.ceil(cfg.min_prompt_frac * len(texts_by_prompt) - 1e-9))
    seen: dict[Phrase, int] = {}
    for texts in texts_by_prompt.values():
        for gram in {g for t in texts for g in word_ngrams(t, cfg.ngram_words)}:
            seen[gram] = seen.get(gram, 0) + 1
    return {g for g, k in seen.items() if k >= need and g not in excluded}


def cut_phrases(text: str, phrases: AbstractSet[Phrase], n: int, keep: tuple[int, int] | None = None) -> str:
    """``text`` without any occurrence of ``phrases`` (n-grams of ``n`` words): the union of their character
    spans, each extended over the punctuation right after it and the spaces right before it, is removed,
    except inside ``keep`` (a character range, e.g. the final answer, that is never cut). Returns ``text``
    unchanged when none occurs."""
    spans: list[tuple[int, int]] = []
    for gram, found in word_ngrams(text, n).items():
        if gram not in phrases:
            continue
        for word_start, b in found:
            b = _AFTER.match(text, b).end()
            a = word_start
            while a > 0 and text[a - 1] in " \t":
                a -= 1
            if keep is None or b <= keep[0] or a >= keep[1]:
                spans.append((a, b))
                continue
            if word_start < keep[0]:   # up to the kept answer, which keeps the space before it
                spans.append((word_start, keep[0]))
            if b > keep[1]:
                spans.append((keep[1], b))
    if not spans:
        return text
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    out, pos = [], 0
    for a, b in merged:
        out.append(text[pos:a])
        pos = b
    out.append(text[pos:])
    return "".join(out)


def robust_center_scale(values: Sequence[float], min_scale: float) -> tuple[float, float]:
    """(median, max(1.4826 · MAD, ``min_scale``)) of ``values``. Raises ``ValueError`` when empty."""
    if not values:
        raise ValueError("robust_center_scale needs at least one value")
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med, max(MAD_TO_SIGMA * mad, min_scale)


def robust_z(value: float, values: Sequence[float], min_scale: float) -> float:
    """Robust z-score of ``value`` against ``values``: (x − median) / max(1.4826·MAD, ``min_scale``)."""
    med, scale = robust_center_scale(values, min_scale)
    return (value - med) / scale


@dataclass(frozen=True)
class LikelihoodDecision:
    """Outcome of :func:`likelihood_decision`; ``reason`` is empty when the row is kept."""

    keep: bool
    value: float
    """ℓ of the row, nats per byte."""
    z_source: float | None
    """Robust z against the source's window (None during its warm-up)."""
    gap_own: float | None
    """Median of the learner's own window minus ℓ, nats per byte (None without own rows)."""
    reason: str = ""


def likelihood_decision(value: float, source_window: Sequence[float], own_window: Sequence[float],
                        cfg: LikelihoodScreenConfig) -> LikelihoodDecision:
    """Keep or screen one foreign row by its learner log-likelihood per byte ``value`` (module docstring).

    ``source_window``: ℓ of the source's recent accepted rows; ``own_window``: ℓ of the learner's own recent
    rows (both nats per byte, any order). A non-finite ``value`` is screened. With ``cfg.enabled`` false
    every row is kept.
    """
    own_med = statistics.median(own_window) if own_window else None
    gap = None if own_med is None else own_med - value
    z = (robust_z(value, source_window, cfg.min_scale)
         if len(source_window) >= cfg.warmup_rows and math.isfinite(value) else None)
    if not cfg.enabled:
        return LikelihoodDecision(True, value, z, gap)
    if not math.isfinite(value):
        return LikelihoodDecision(False, value, z, gap, "likelihood: not a finite log-likelihood")
    if cfg.own_margin is not None and gap is not None and gap > cfg.own_margin:
        return LikelihoodDecision(False, value, z, gap, f"likelihood: {value:.3f} nats/byte is {gap:.3f} below the "
                                  f"learner's own median (margin {cfg.own_margin})")
    if z is not None and z < -cfg.z_threshold and (gap is None or gap > 0):
        return LikelihoodDecision(False, value, z, gap, f"likelihood: robust z {z:.2f} < -{cfg.z_threshold} against "
                                  f"the source's last {len(source_window)} rows ({value:.3f} nats/byte)")
    return LikelihoodDecision(True, value, z, gap)


@dataclass(frozen=True)
class TailDecision:
    """Outcome of :func:`tail_decision`: ``action`` ``keep`` | ``cut`` | ``reject``; ``keep_bytes`` is the
    prefix to keep when cutting (bytes of the response)."""

    action: Literal["keep", "cut", "reject"]
    reason: str = ""
    keep_bytes: int | None = None
    screen: Literal["", "tail", "length"] = ""


def tail_decision(response_bytes: int, answer_end_bytes: int | None, reference_bytes: float | None,
                  cfg: TailScreenConfig, closing_bytes: int = 0) -> TailDecision:
    """Keep, cut or reject one foreign response by its answer tail and its length (module docstring).

    Args:
        response_bytes: UTF-8 bytes of the response (content, leading whitespace excluded).
        answer_end_bytes: bytes of the response up to the end of its final stated answer (None: no stated
            answer — the tail screen does not apply; such a row earns no reward).
        reference_bytes: the length the plan needs: the median bytes of the other sources' responses to the
            same prompt (None: unknown — no length screen).
        cfg: the tail screen's settings.
        closing_bytes: bytes of closing punctuation right after the answer (``.``, ``$.``, ``)``) that a cut keeps.
    """
    if not cfg.enabled:
        return TailDecision("keep")
    if (cfg.max_length_factor is not None and reference_bytes is not None
            and response_bytes > max(cfg.min_length_bytes, cfg.max_length_factor * reference_bytes)):
        return TailDecision("reject", f"length: {response_bytes} bytes > {cfg.max_length_factor:g} × {reference_bytes:.0f} "
                            "(median of the other sources' responses to this prompt)", screen="length")
    if answer_end_bytes is not None:
        tail = response_bytes - answer_end_bytes
        if tail > cfg.budget_bytes:
            reason = f"tail: {tail} bytes after the final answer > budget {cfg.budget_bytes}"
            if cfg.policy == "cut":
                return TailDecision("cut", reason + "; cut after the answer",
                                    keep_bytes=answer_end_bytes + min(closing_bytes, tail), screen="tail")
            return TailDecision("reject", reason, screen="tail")
    return TailDecision("keep")


# ----------------------------------------------------------------------------- quarantine


@dataclass(frozen=True)
class SourceStanding:
    """A learner's view of one source: ``status`` ``trusted`` | ``downweighted`` | ``quarantined``, its last
    ``memory`` step flags (oldest first), the clean steps in a row, and the step of the last change."""

    status: Literal["trusted", "downweighted", "quarantined"] = "trusted"
    flags: tuple[bool, ...] = ()
    clean_run: int = 0
    since_step: int = 0
    reason: str = ""
    """Why the last change happened (log and report)."""
    history: tuple[str, ...] = field(default=())
    """Every change as ``"step N: status (reason)"``, oldest first (at most 32 kept)."""

    def weight(self, cfg: QuarantineConfig) -> float:
        """Multiplier of the source's rows' advantages: 1, ``cfg.downweight`` or 0 (quarantined)."""
        if not cfg.enabled or self.status == "trusted":
            return 1.0
        return 0.0 if self.status == "quarantined" else float(cfg.downweight)


def step_flagged(rewarded: int, screened: int, reward_disagreements: int, cfg: QuarantineConfig) -> tuple[bool, str]:
    """(flagged, reason) of one step of one source: of its ``rewarded`` rows (reward > 0), ``screened`` were
    screened — more than ``flag_frac`` of them and at least ``flag_min_rows`` — or at least
    ``reward_disagreements`` of its reward claims were contradicted by the site's verifier."""
    if reward_disagreements >= cfg.reward_disagreements:
        return True, f"{reward_disagreements} reward claim(s) contradicted by this site's verifier"
    if rewarded and screened >= cfg.flag_min_rows and screened / rewarded > cfg.flag_frac:
        return True, f"{screened} of its {rewarded} rewarded rows screened (> {cfg.flag_frac:g})"
    return False, ""


def _moved(standing: SourceStanding, status: str, step: int, reason: str) -> SourceStanding:
    history = (*standing.history, f"step {step}: {status} ({reason})")[-32:]
    return replace(standing, status=status, since_step=step, reason=reason, history=history)


def quarantine_step(standing: SourceStanding, flagged: bool, reason: str, step: int,
                    cfg: QuarantineConfig) -> SourceStanding:
    """The source's standing after one more step (``flagged`` with ``reason``, at ``step``).

    trusted / down-weighted: ``quarantine_after`` flags among the last ``memory`` steps ⇒ quarantined,
    ``downweight_after`` ⇒ down-weighted, none ⇒ trusted. Quarantined: stays until ``release_after_clean``
    clean steps in a row (then trusted with a clean memory; 0 ⇒ only :func:`release`). Disabled: unchanged.
    """
    if not cfg.enabled:
        return standing
    flags = (*standing.flags, bool(flagged))[-cfg.memory:]
    clean_run = 0 if flagged else standing.clean_run + 1
    out = replace(standing, flags=flags, clean_run=clean_run)
    n = sum(flags)
    if standing.status == "quarantined":
        if cfg.release_after_clean and clean_run >= cfg.release_after_clean:
            return replace(_moved(out, "trusted", step, f"{clean_run} clean steps"), flags=(), clean_run=0)
        return out
    if n >= cfg.quarantine_after:
        return _moved(out, "quarantined", step, f"{n} flagged steps of the last {len(flags)}: {reason}")
    if n >= cfg.downweight_after and standing.status != "downweighted":
        return _moved(out, "downweighted", step, f"{n} flagged step(s) of the last {len(flags)}: {reason}")
    if n == 0 and standing.status == "downweighted":
        return _moved(out, "trusted", step, f"no flagged step in the last {len(flags)}")
    return out


def release(standing: SourceStanding, step: int, reason: str = "released by the operator") -> SourceStanding:
    """Trusted again with a clean memory (the operator's knob, ``screens.release``)."""
    if standing.status == "trusted" and not standing.flags:
        return standing
    return replace(_moved(standing, "trusted", step, reason), flags=(), clean_run=0)
