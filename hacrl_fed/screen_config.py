"""Learner-side screens against poisoned peer rollouts: their settings (the decisions are :mod:`hacrl_fed.screens`).

A peer that is authenticated and whose answers verify can still share text that carries a payload (a
trigger phrase, a URL, an instruction, a style) that the learner then learns to produce ("Hail to the
Thief", arXiv 2511.09780). The screens decide *which foreign rows a learner trains on*; they never change
the HACPO math of the rows that are trained (a screened-out row gets weight 0: no gradient, and it still
counts in the mini-batch mean as a zero, like a row clamped out of the cross window). Three screens and
one bookkeeping rule, each a section of :class:`ScreenConfig` (``agent.screens`` in TOML):

* **likelihood** (:func:`hacrl_fed.screens.rules.likelihood_decision`): the statistic is the learner's log-likelihood per byte of
  a row's content, ℓ = Σ_content log π_k(y) / B (nats per UTF-8 byte; content = the response without its
  terminal EOS; the log-probs are the ones the update computes anyway, no extra forward pass). A foreign
  row is screened out when ℓ is a low outlier against **its source's** recent accepted rows — robust z =
  (ℓ − median) / max(1.4826 · MAD, ``min_scale``) < −``z_threshold`` once the source's window holds
  ``warmup_rows`` rows — **and** lies below the median of the learner's own recent rows; or, whatever the
  source's history, when it lies more than ``own_margin`` nats per byte below the learner's own median.
  Only rows with a reward are screened (``rewarded_only``) and only rows of at least ``min_bytes``.
  Rows of another model family sit far from the learner's own rows by nature (docs/benchmarks.md "Cross-family
  collaboration"): comparing each source with its own history, and the learner's own rows only with a
  wide margin, keeps honest cross-family rows.
* **phrase** (:mod:`hacrl_fed.screens.phrases`): a word n-gram that recurs across one source's answers to
  different prompts of a step, and occurs neither in the prompts nor in the learner's own responses, is cut
  out of that source's rows (a payload recurs; honest reasoning is tied to its problem).
* **key** (:mod:`hacrl_fed.screens.keys`): against a peer that has read these screens. A word the peers'
  rows carry much more often than the learner itself writes it, counted over the whole run (decayed) and
  over **all** sources together, is a *key* and is cut out of every foreign row that holds it (never inside
  the final answer, never a word of the row's prompt). A short key (a domain, ``Final: 27``), a key behind a
  lead-in that changes every row, a payload cut into short sentences, a key split between colluding sites
  or dripped into one prompt per step are all the same statistic: the word's share of foreign prompt-groups
  against its share of the learner's own. The learner emitting a key a few times does not unlock it (a
  ratio, not "ever seen"). The phrase screen then never cuts a phrase every word of which the learner
  writes as often as its peers (``so the answer is``: honest carrier phrases).
* **answer tail** (:func:`hacrl_fed.screens.rules.tail_decision`): text after the final stated answer
  (:func:`hacrl_fed.reward.extract.answer_end`) longer than ``budget_bytes`` is cut there (``policy =
  "cut"``, after the answer's closing punctuation) or the row is rejected (``"reject"``); a response longer than ``max_length_factor`` × the
  median length of **the learner's own** responses to the same prompt (and longer than ``min_length_bytes``)
  is rejected ("long but correct"). Only the learner's own lengths count, so no peer, nor any coalition, can
  move the bar another peer is judged by (:func:`hacrl_fed.screens.rules.length_reference`).
* **quarantine** (:func:`hacrl_fed.screens.rules.quarantine_step`): a source more than ``flag_frac`` of whose rewarded rows of a
  step were screened (cut or left out), or whose reward claims the site's own verifier contradicts, has a
  *flagged* step; ``downweight_after`` flagged steps among the last ``memory`` multiply its rows' advantages
  by ``downweight``, ``quarantine_after`` leave all its rows out; ``release_after_clean`` clean steps in a
  row (text screens and reward claims only: a quarantined source's rows are not scored) or the operator
  (``screens.release``) lift it. A released source is on probation: each quarantine doubles the clean steps
  the next release needs, and one flagged step quarantines a source that was quarantined before.
* **re-verification** (``reverify``): the site re-verifies every foreign row against the plan's reference
  answers with its own verifier; its verdict is what it trains on, whatever the coordinator said.

Every knob is a documented field below; ``enabled = false`` turns one screen off. Sources: robust z-score
with the median absolute deviation and the 3.5 cut-off of Iglewicz & Hoaglin (1993); the learner
log-probability screen and the long-answer attack of arXiv 2511.09780.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "KeyScreenConfig",
    "LikelihoodScreenConfig",
    "PhraseScreenConfig",
    "QuarantineConfig",
    "ScreenConfig",
    "TailScreenConfig",
]

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


class KeyScreenConfig(_Strict):
    """Key screen (module docstring, :mod:`hacrl_fed.screens.keys`). Units: prompt-groups (one step's rows for
    one prompt), steps.

    A word w (lower-cased ``\\w+`` run, at most ``max_word_chars`` characters counted) is a key when, with
    F(w) / N_F its decayed count / share of the foreign prompt-groups holding it outside the prompt's own words
    (all sources pooled) and O(w) / N_O the same over the learner's own responses:
    F(w) ≥ ``min_prompts`` and F(w)/N_F ≥ ``min_rate`` and P(w) < ``own_ratio`` × F(w)/N_F, with P(w) the
    learner's peak own rate over the run (``own_prior_groups``).
    Defaults: a key the attacker puts in one of four prompts per step (rate 0.25) is a key from its third
    prompt-group on; a word the learner writes in at least a quarter as many prompts as its peers never is.
    """

    enabled: bool = True
    min_prompts: Annotated[float, Field(gt=0)] = 2.5
    """Decayed foreign prompt-groups holding the word before it can be a key: 2.5 is the third group (three in
    a row count 1 + 0.99 + 0.98 = 2.97), so the first two pass (the bounded exposure to a new key)."""
    min_rate: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Least share of the foreign prompt-groups holding the word (below: too rare to be learned as a key)."""
    own_ratio: Annotated[float, Field(gt=0, le=1)] = 0.25
    """The word is the learner's own when its own rate is at least this × its foreign rate."""
    own_prior_groups: Annotated[float, Field(ge=0)] = 4.0
    """Pseudo-groups added to the learner's own denominator for its peak rate P(w) = max over steps of
    O(w) / (N_O + this): one emission among the first 4 groups is a peak of 0.125, not 0.25 (the ratchet), and a
    word in all 4 is 0.5."""
    number_digits: Annotated[int, Field(ge=0)] = 0
    """A word of ASCII digits only, at most this long, is never a key (0: every number can be, the default). 3
    spares an honest peer's intermediate results (on the real pair ``6`` alone was cut from 25 of Gemma's 96
    rows) but lets a fixed answer-format line of the learner's own words and a small number through
    (``Final: 27`` where the learner writes "final" itself: 20 of mallory's 96 rows kept it)."""
    decay: Annotated[float, Field(gt=0, le=1)] = 0.99
    """Per-step multiplier of every count (memory ≈ 1 / (1 − decay) = 100 steps; 1: no decay)."""
    max_words: Annotated[int, Field(ge=16)] = 50_000
    """Words the ledger keeps per side (the lowest counts are dropped past it): bounded state and CPU."""
    max_word_chars: Annotated[int, Field(ge=8)] = 64
    """A longer word is counted by its first this many characters."""


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
    """A response longer than this × the median length of the learner's own responses to the same prompt is
    rejected (None: no length screen). The learner's own lengths only: a peer cannot move the reference."""
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
    key: KeyScreenConfig = Field(default_factory=KeyScreenConfig)
    tail: TailScreenConfig = Field(default_factory=TailScreenConfig)
    quarantine: QuarantineConfig = Field(default_factory=QuarantineConfig)
    release: list[str] = Field(default_factory=list)
    """Operator: sources released from quarantine when the worker starts (after a resume restores it)."""

    @classmethod
    def off(cls) -> ScreenConfig:
        """Every screen and the re-verification off (the behaviour before the screens existed)."""
        return cls(enabled=False, reverify=False)
