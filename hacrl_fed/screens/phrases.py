"""The recurring-phrase screen (pure text functions, no I/O).

A trigger is learned only if it is the same text in many rows, and a payload the attacker wants its peers to
learn appears in its answers to *different* prompts, while honest reasoning tied to a problem (its numbers,
its wording) does not. A word n-gram (``ngram_words`` lower-cased ``\\w+`` words, within a sentence) that
occurs in one source's rows of at least max(``min_prompts``, ⌈``min_prompt_frac`` × the prompts it answered⌉)
distinct prompts of a step, and occurs neither in the step's prompt texts nor in the learner's own responses
of the step, is a *recurring phrase* (:func:`recurring_phrases`): it is cut out of every row of that source
that holds it, with the punctuation right after it, never inside the final answer (:func:`cut_phrases`), and
the row is trained on the rest (:class:`hacrl_fed.screens.SiteGuard` scales the source's behaviour log-prob to
the kept bytes, as for a cut tail). A cut row is trained, so a phrase cut does not flag the step for the
quarantine (an honest peer's house phrase would otherwise quarantine it).

Why recurrence and not likelihood: per-row and per-span learner likelihood cannot tell such a payload from
honest cross-family text (``benchmarks/calibrate_screens.py``: a model's own temperature-1 samples hold
runs as unlikely as the payload). An extension beyond arXiv 2511.09780, whose screens a "long but correct"
answer survived: a filler repeated across answers is a recurring phrase too. Settings:
:class:`hacrl_fed.screen_config.PhraseScreenConfig`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from hacrl_fed.screen_config import PhraseScreenConfig

__all__ = ["Phrase", "cut_phrases", "recurring_phrases", "word_ngrams"]

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
