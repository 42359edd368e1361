"""The key screen: words a peer carries into the learner, counted over the whole run and over every source.

Threat: an authenticated peer that has read :mod:`hacrl_fed.screens` and wants the learner to emit a fixed
*key* (a domain, a brand, an answer-format line such as ``Final: 27``) in correct answers. Every per-step,
per-source, n-gram test can be evaded: a key of ≤ 3 words has no 4-gram; a payload cut into short sentences
has none either; a lead-in that changes every row leaves no recurring n-gram around the key; two colluding
sites splitting the prompts, or one site putting the key in one prompt per step, never recur enough in one
source's step; and once the learner emits the key once, "phrases of the learner's own text" unlock it.

What the attacker cannot change is the key itself: to be learned it must be the same word in many rows, and
the learner does not write it on its own. The statistic (:class:`KeyLedger`) is therefore per **word**
(lower-cased ``\\w+`` run), pooled over **all** foreign sources (a coalition adds up) and decayed over the
**run** (a drip adds up), and compared with the learner's **own** rate of the same word (a ratio: a few
emissions do not unlock it: the pseudo-groups of ``own_prior_groups`` keep one emission among a few groups
a small rate). The own side is a peak, not the current rate, because a learner's style narrows as it trains
(the default pair's SmolLM2 took up the attacker's short oracle answers): its current rate of ``we`` or of
intermediate numbers falls while its peers keep writing them, and they would become keys. Units are prompt-groups: one step's rows for one prompt (all foreign sources
together on the foreign side, the learner's own samples on the own side); words of the prompt's text are
never counted nor cut for that prompt (a problem's own numbers and names are licensed). A word w with decayed
foreign count F(w) over N_F foreign groups and own count O(w) over N_O own groups is a key when

    F(w) ≥ min_prompts   and   F(w)/N_F ≥ min_rate   and   P(w) < own_ratio · F(w)/N_F

where P(w) is the learner's **peak** own rate over the run, max over steps of O(w) / (N_O + ``own_prior_groups``)
(:meth:`KeyLedger.is_key`; settings :class:`hacrl_fed.screen_config.KeyScreenConfig`). A key is cut out of
every foreign row: the whole whitespace-delimited token that holds it (``example-attack.org`` goes even if
only ``attack`` is a key), never inside the final answer (:func:`cut_keys`). The same ledger tells the phrase
screen which words are the learner's own (:meth:`KeyLedger.own_common`): a recurring phrase made only of them
(``so the answer is``) is an honest carrier phrase, not a payload.

Numbers are words like any other by default: a fixed ``27`` is what keeps ``Final: 27`` a key when the learner
writes "final" itself. The price is an honest peer's recurring small numbers (on the real pair ``6`` was cut
from 25 of Gemma's 96 rows); ``number_digits`` trades it back (module :mod:`hacrl_fed.screen_config`).

What it cannot stop: a payload made only of words the learner itself writes about as often as its peers (an
ordinary sentence: by counting it is honest style); a key below ``min_rate`` of the foreign groups (its share
of the gradient is then as small); the first ``min_prompts`` − 1 groups of a new key; a key spelled
differently in every row (then there is no fixed key to learn). An honest peer's house words that the learner
never writes are cut too (trained on the rest of the row): the price of the screen, measured by
``benchmarks/attack_poison.py``. Bounded: state ≤ ``max_words`` words per side; every text function is
linear in its input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from hacrl_fed.screen_config import KeyScreenConfig

__all__ = ["KeyLedger", "cut_keys", "words"]

_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"\S+")
_FLOOR = 1e-3
"""A decayed count below this is dropped (seen once, then not for ≈ 700 steps at decay 0.99)."""


def words(text: str, max_chars: int) -> set[str]:
    """The lower-cased ``\\w+`` words of ``text``, each cut to its first ``max_chars`` characters. Linear."""
    return {m.group(0)[:max_chars].lower() for m in _WORD.finditer(text)}


@dataclass
class KeyLedger:
    """Decayed per-word counts of prompt-groups, foreign (all sources pooled) and the learner's own (module
    docstring). ``foreign`` / ``own``: word → decayed count; ``foreign_groups`` / ``own_groups``: decayed number
    of groups observed (the rates' denominators); ``own_peak``: word → the learner's peak own rate P(w)."""

    foreign: dict[str, float] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)
    foreign_groups: float = 0.0
    own_groups: float = 0.0
    own_peak: dict[str, float] = field(default_factory=dict)

    def observe(self, foreign: Iterable[AbstractSet[str]], own: Iterable[AbstractSet[str]],
                cfg: KeyScreenConfig) -> None:
        """One step: decay every count by ``cfg.decay``, then add one per group to each word it holds.
        ``foreign`` / ``own``: the step's word sets, one per prompt-group (prompt words already removed)."""
        self.foreign_groups = _add(self.foreign, foreign, cfg) + self.foreign_groups * cfg.decay
        own = [set(g) for g in own]
        self.own_groups = _add(self.own, own, cfg) + self.own_groups * cfg.decay
        self._raise_peaks(set().union(*own), cfg)

    def _raise_peaks(self, seen: set[str], cfg: KeyScreenConfig) -> None:
        """P(w) ← max(P(w), O(w) / (N_O + own_prior_groups)) for the words of this step's own groups (the others'
        rates only fell); past ``max_words``, the highest peaks are kept."""
        denominator = self.own_groups + cfg.own_prior_groups
        for w in seen:
            rate = self.own.get(w, 0.0) / denominator
            if rate > self.own_peak.get(w, 0.0):
                self.own_peak[w] = rate
        if len(self.own_peak) > cfg.max_words:
            self.own_peak = _prune(self.own_peak, cfg.max_words)

    def rates(self, word: str) -> tuple[float, float]:
        """(foreign rate, peak own rate P) of ``word``, both in [0, 1]: the share of the decayed foreign groups that
        hold it, and the learner's peak share (module docstring)."""
        f = self.foreign.get(word, 0.0) / self.foreign_groups if self.foreign_groups > 0 else 0.0
        return f, self.own_peak.get(word, 0.0)

    def is_key(self, word: str, cfg: KeyScreenConfig) -> bool:
        """Whether ``word`` (as :func:`words` spells it) is a key now (module docstring's test)."""
        if word.isascii() and word.isdigit() and len(word) <= cfg.number_digits:
            return False
        f, o = self.rates(word)
        return self.foreign.get(word, 0.0) >= cfg.min_prompts - 1e-9 and f >= cfg.min_rate and o < cfg.own_ratio * f

    def own_common(self, word: str, cfg: KeyScreenConfig) -> bool:
        """Whether ``word`` is not peer-carried: the learner writes it at least ``own_ratio`` × as often as its
        peers, or no foreign group holds it outside its prompt (a word of the prompt, whatever the counts' size)."""
        f, o = self.rates(word)
        return f <= 0 or o >= cfg.own_ratio * f

    def state(self) -> dict[str, Any]:
        """JSON-able copy (words → counts rounded to 6 decimals)."""
        return {"foreign": {w: round(c, 6) for w, c in self.foreign.items()},
                "own": {w: round(c, 6) for w, c in self.own.items()},
                "own_peak": {w: round(c, 6) for w, c in self.own_peak.items()},
                "foreign_groups": self.foreign_groups, "own_groups": self.own_groups}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], cfg: KeyScreenConfig) -> KeyLedger:
        """The ledger :meth:`state` wrote. Raises ``ValueError`` for a word that is not a string of at most
        ``max_word_chars`` characters or a count that is not a finite number ≥ 0; keeps the ``max_words``
        highest counts per side."""
        def counts(raw: Any) -> dict[str, float]:
            out = {}
            for w, c in dict(raw).items():
                if not isinstance(w, str) or len(w) > cfg.max_word_chars:
                    raise ValueError(f"key ledger word {str(w)[:40]!r} is not a string of "
                                     f"<= {cfg.max_word_chars} chars")
                out[w] = _nonneg(c)
            return _prune(out, cfg.max_words)
        return cls(counts(state.get("foreign", {})), counts(state.get("own", {})),
                   _nonneg(state.get("foreign_groups", 0.0)), _nonneg(state.get("own_groups", 0.0)),
                   counts(state.get("own_peak", {})))


def _add(counts: dict[str, float], groups: Iterable[AbstractSet[str]], cfg: KeyScreenConfig) -> float:
    """Decay ``counts`` in place, add one per group per word, prune; returns the number of groups."""
    for w in list(counts):
        counts[w] *= cfg.decay
    n = 0
    for group in groups:
        n += 1
        for w in group:
            counts[w] = counts.get(w, 0.0) + 1.0
    pruned = _prune(counts, cfg.max_words)
    if len(pruned) != len(counts):
        counts.clear()
        counts.update(pruned)
    return float(n)


def _prune(counts: dict[str, float], max_words: int) -> dict[str, float]:
    """``counts`` without counts below the floor, and past ``max_words`` only the highest."""
    kept = {w: c for w, c in counts.items() if c >= _FLOOR}
    if len(kept) > max_words:
        kept = dict(sorted(kept.items(), key=lambda kv: (-kv[1], kv[0]))[:max_words])
    return kept


def _nonneg(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"key ledger count {str(value)[:40]!r} is not a finite number >= 0")
    return float(value)


def cut_keys(text: str, keys: AbstractSet[str], max_chars: int, keep: tuple[int, int] | None = None,
             licensed: AbstractSet[str] = frozenset()) -> str:
    """``text`` without the whitespace-delimited tokens that hold a key word (a ``\\w+`` run whose lower-cased
    first ``max_chars`` characters are in ``keys`` and not in ``licensed``), each with the spaces before it (at
    the start of the text: after it);
    inside ``keep`` (a character range: the final answer) nothing is cut, and a token that overlaps it loses only
    its key words outside it. Returns ``text`` unchanged when no key occurs. Linear in ``len(text)``."""
    spans: list[tuple[int, int]] = []
    for tok in _TOKEN.finditer(text):
        hits = [m for m in _WORD.finditer(text, tok.start(), tok.end())
                if (w := m.group(0)[:max_chars].lower()) in keys and w not in licensed]
        if not hits:
            continue
        a, b = tok.start(), tok.end()
        if keep is None or b <= keep[0] or a >= keep[1]:
            while a > 0 and text[a - 1] in " \t":
                a -= 1
            while a == 0 and b < len(text) and text[b] in " \t":   # a cut at the start takes the spaces after
                b += 1
            spans.append((a, b))
            continue
        spans.extend((m.start(), m.end()) for m in hits if m.end() <= keep[0] or m.start() >= keep[1])
    if not spans:
        return text
    out, pos = [], 0
    for a, b in spans:   # in order, disjoint (tokens do not overlap)
        out.append(text[pos:max(a, pos)])
        pos = max(pos, b)
    out.append(text[pos:])
    return "".join(out)
