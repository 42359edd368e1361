"""Final-answer extraction from a model response (pure string code, no sympy, linear time).

A response earns credit only for an answer it *states* (ARCHITECTURE §5: plain math-verify
credits a response that merely restates the problem, e.g. ``To calculate 9 + 4, we need to add
9 and 4`` parses as ``9+4`` = 13). Accepted forms, in priority order:

======================  ===========================================  ==========  ==========
source                  example                                      ``boxed``   ``gsm8k``
======================  ===========================================  ==========  ==========
``boxed``               ``\\boxed{13}``, ``\\boxed 13``, ``\\fbox{13}``   yes         yes
``hashes``              ``#### 13``                                  no          yes
``marker``              ``The answer is 13.``, ``**Answer:** $13$``  yes         yes
``equation``            ``9 + 4 = 13`` with no digit after it          yes         yes
``final_number``        the last number of the response              no          yes
======================  ===========================================  ==========  ==========

Only the *last* ``\\boxed`` counts; if it is unclosed (a truncated response) there is no answer.
Another registered style (:data:`hacrl_fed.registries.ANSWER_STYLES`, docs/extending.md) states its answer its
own way: its ``extract(response)`` finds it (source ``style``), and none of the rules below apply.
A ``task:<name>`` style (a procedural task whose reference is not a number, :func:`task_of_style`) takes
the content of the last box verbatim and nothing else: no markers, no formatting removal, no corrections.

Two rules apply on top of the table:

* **text formatting** — a number wrapped in a formatting command (``\\text{12}``,
  ``\\textbf{12}``, ``\\mathrm{ 12 }``, ``\\mathbf``, ``\\mbox``, ``\\emph``, nested ones, also
  inside ``\\boxed``) is the number: the command is removed, words after the number are kept as a
  unit (``\\text{12 apples}`` → ``12 \\text{apples}``). Formatting around an answer marker
  (``\\textbf{Final Answer:}``) is removed too. Formatting around words only (``\\text{ cm}``,
  ``\\text{(C)}``) is left for math-verify. See :func:`strip_formatting`.
* **self-correction** — a correction stated *after* the answer replaces it (source
  ``correction``): ``The answer is 5, no wait, it is 7.`` → ``7``; also after a ``\\boxed``
  answer. A correction is a cue (``wait``, ``no,``, ``sorry``, ``actually``, ``oops``, ``or
  rather``, ``I mean`` …), optionally ``it is`` / ``I mean`` / ``the answer is`` …, then the new
  value ending its sentence (a unit word or ``, not 5`` may follow). A number merely mentioned
  after a cue (``Wait, 7 apples were eaten``, ``No, 7 is wrong``) is not a correction, and a
  correction never counts before the answer it would correct. See :func:`find_corrections`.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hacrl_fed.registries import ANSWER_STYLES

AnswerStyle = str
"""A name of :data:`hacrl_fed.registries.ANSWER_STYLES` (``boxed``, ``gsm8k``, a registered style) or
``task:<name>``."""
BUILTIN_STYLES: tuple[str, ...] = ("boxed", "gsm8k")
"""The styles of the module table, read by this module's own rules."""
TASK_STYLE_PREFIX = "task:"
"""``task:<name>``: the answer is the content of the last ``\\boxed{}`` alone, scored by the scorer of the
procedural task ``<name>`` (:mod:`hacrl_fed.reward.task_scorers`), for references that are not a number."""
_TASK_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")

__all__ = [
    "BOXED",
    "BUILTIN_STYLES",
    "GSM8K",
    "AnswerStyle",
    "registered_style",
    "TASK_STYLE_PREFIX",
    "check_style",
    "is_answer_style",
    "task_of_style",
    "Extraction",
    "answer_end",
    "extract_final_answer",
    "find_corrections",
    "is_numeric_literal",
    "last_boxed",
    "max_nesting",
    "normalize_latex",
    "reference_answer",
    "strip_formatting",
]

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def task_of_style(style: str) -> str | None:
    """The task name of a ``task:<name>`` answer style (``name``: lower-case letters, digits and ``_``, at most
    64 characters, starting with a letter), else ``None``.

    >>> task_of_style("task:calendar_arithmetic"), task_of_style("boxed"), task_of_style("task:../x")
    ('calendar_arithmetic', None, None)
    """
    if not isinstance(style, str) or not style.startswith(TASK_STYLE_PREFIX):
        return None
    name = style[len(TASK_STYLE_PREFIX):]
    return name if _TASK_NAME_RE.fullmatch(name) else None


def is_answer_style(style: str) -> bool:
    """Whether ``style`` is a registered answer style (``boxed``, ``gsm8k`` …; never an import path) or a
    well-formed ``task:<name>``."""
    return style in BUILTIN_STYLES or task_of_style(style) is not None or style in ANSWER_STYLES


def check_style(style: str) -> None:
    """Raise ``ValueError`` unless ``style`` is a registered answer style or ``task:<name>``
    (:func:`task_of_style`)."""
    if not is_answer_style(style):
        shown = style[:80] if isinstance(style, str) else type(style).__name__
        raise ValueError(f"unknown answer style {shown!r}; registered: {', '.join(ANSWER_STYLES.names())} or "
                         f"task:<name>")


def registered_style(style: str) -> Any:
    """The entry of a registered answer style other than ``boxed`` / ``gsm8k`` / ``task:<name>`` (its ``extract``,
    and ``check`` / ``answer_end`` where it has them), else ``None``. Raises ``ValueError`` for an unknown style or
    an entry that does not import."""
    if style in BUILTIN_STYLES or task_of_style(style) is not None:
        return None
    check_style(style)
    return ANSWER_STYLES.get(style)


def _style_extract(entry: Any, style: str, response: str) -> str | None:
    """The answer a registered style's ``extract`` (or the entry itself, a function) states. Raises ``TypeError``
    for a result that is neither a string nor None."""
    found = getattr(entry, "extract", entry)(response)
    if found is not None and not isinstance(found, str):
        raise TypeError(f"answer style {style!r}: extract returned a {type(found).__name__}, not a string or None")
    return found


class _Builtin:
    """The registry entry of ``boxed`` / ``gsm8k`` (this module's rules, through the same interface)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def extract(self, response: str) -> str | None:
        found = extract_final_answer(response, self.name)
        return None if found is None else found.answer

    def answer_end(self, response: str) -> int | None:
        return answer_end(response, self.name)


BOXED, GSM8K = _Builtin("boxed"), _Builtin("gsm8k")


# Linear time: every pattern that sees response text is written so that a failed match attempt never
# backtracks over a run it already consumed (possessive ``*+``/``++``; a lookbehind that starts a run only at
# its first character), and the scans that many clauses share are done once per text (:class:`_Doc`).
_MARKER_RE = re.compile(
    r"(?:final\s+answer|the\s+answer|\banswer)\s*+(?:\*\*)?+\s*+(?:is\s*:?|:|=)[ \t*]*",
    re.IGNORECASE,
)
_SPACE_RE = re.compile(r"\s*")
_HASHES_RE = re.compile(r"####[ \t]*")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# A sentence ends at '.', '!' or '?' followed by whitespace or the end (not a decimal point).
_SENTENCE_END_RE = re.compile(r"(?<!\\)[.!?](?=\s|$)|\n")
# Prose after a math answer: a word of 2+ letters not preceded by a backslash (LaTeX command),
# except the list connectors "and"/"or" that join multi-part answers ("1331 and 1728").
# A match starts only at the first whitespace of a run (all of a run's positions see the same next word).
_PROSE_RE = re.compile(r"(?<!\s)\s++(?=(?!(?:and|or)\b)[A-Za-z]{2,}\b)")
_OPENS_WITH_WORD_RE = re.compile(r"\s*+(?:\*\*)?+\s*+[A-Za-z]{2,}\b")
_LEADING_WORD_RE = re.compile(r"\s*+(?!(?:and|or)\b)[A-Za-z]{2,}\b")
_CONNECTORS = ("and", "or")
_OPEN_CHARS = "([—–-"
"""Besides whitespace, what is dropped before a correction cue (``5 (no, 6)``: ``5``)."""
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"), ("**", "**"))

# Text-formatting commands whose argument is shown as is (\text{12} is 12); \textcolor{red}{12} too.
_FORMAT_CMD_RE = re.compile(
    r"\\(?:text(?:bf|it|rm|sf|tt|up|sl|sc|md|normal)?|math(?:rm|bf|it|sf|tt|normal|bfit)|mbox|hbox|emph"
    r"|boldsymbol|bm|pmb|underline|textcolor\s*\{[^{}]*\})\s*\{"
)
_BRACE_OR_ESCAPE_RE = re.compile(r"[\\{}]")
_LATEX_SPACE_RE = re.compile(r"\\[,;: ]|~|\\q?quad(?![A-Za-z])")
_MAX_FORMAT_DEPTH = 16  # deeper formatting is left as is (keeps strip_formatting linear)
_MAX_FORMAT_CHARS = 200  # a formatted answer is short; longer formatted text is left as is

# Self-correction: a cue, optionally a restating phrase, then the new value (see find_corrections).
_CUE = (r"(?:no\s+wait|wait|oops|sorry|actually|correction|scratch\s+that|or\s+rather|make\s+that|nope"
        r"|i\s+made\s+an?\s+(?:mistake|error)|my\s+(?:mistake|bad)|i\s+was\s+wrong"
        r"|that(?:['’]s|\s+is|\s+was)\s+(?:wrong|incorrect)|let\s+me\s+correct\s+(?:that|myself)"
        r"|no(?=\s*[,.;:!]))")
_RESTATE = (r"(?:i\s+mean(?:t)?|it\s+is|it['’]s|that['’]s|that\s+is|it\s+(?:should|must)\s+be|should\s+be"
            r"|it\s+was|make\s+(?:it|that)|the\s+(?:correct\s+|right\s+|real\s+|actual\s+|final\s+)?"
            r"(?:answer|result|total)\s+(?:is|should\s+be|was))")
_CORRECTION_RE = re.compile(
    rf"(?<![A-Za-z'’])(?:{_CUE}(?![A-Za-z'’])[\s,.;:!\-–—]*)+(?P<restate>{_RESTATE}(?![A-Za-z'’])\s*:?[ \t]*)?"
    rf"|(?<![A-Za-z'’])(?P<mean>i\s+mean(?:t)?)(?![A-Za-z'’])[\s,:]*",
    re.IGNORECASE,
)
# Where a correction starts: _CORRECTION_RE matches at a position exactly when one of these does (the rest of
# it is optional); without the lookbehind, for the first position of a clause (nothing before it).
_CUE_START_RE = re.compile(rf"(?<![A-Za-z'’])(?:{_CUE}|i\s+mean(?:t)?)(?![A-Za-z'’])", re.IGNORECASE)
_CUE_HEAD_RE = re.compile(rf"(?:{_CUE}|i\s+mean(?:t)?)(?![A-Za-z'’])", re.IGNORECASE)
_CORRECTION_WINDOW = 300  # a corrected value lies within this many characters of its cue
# After the new value: ", not 5" / "instead of 5" / "rather than 5" (the value it replaces): the tail is cut
# where this first matches (a match starts at the first character of a run of the leading class).
_NEGATED_ALT_RE = re.compile(r"(?<![\s,;(—–-])[\s,;(—–-]*+(?:not|instead\s+of|rather\s+than)\b", re.IGNORECASE)
_INSTEAD_RE = re.compile(r"\binstead\b", re.IGNORECASE)
_DIGIT_OR_EQUALS_RE = re.compile(r"[\d=]")
_RESTATED_EQUATION_RE = re.compile(r"((?:[\d\s.,+\-*/()^{}]|\\(?:times|cdot|div|frac))+)=([^=]+)")
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z'’]*")
# Words that turn "<cue> 7 <word>" into a statement about 7 rather than a new answer.
_NOT_A_UNIT = frozenset(
    "is isn't isn’t was wasn't wasn’t are aren't aren’t were weren't be been being not no never wrong incorrect "
    "false mistaken invalid impossible right correct seems seem looks look would could might can cannot can't "
    "does doesn't doesn’t did didn't didn’t do will won't has have had times plus minus over divided multiplied "
    "less more fewer too also so then because since but if".split()
)


@dataclass(frozen=True)
class Extraction:
    """A stated final answer: the answer text and where it came from (``boxed``, ``hashes``,
    ``marker``, ``equation``, ``final_number``, or ``correction`` when a self-correction after
    one of these replaced it)."""

    answer: str
    source: str


def _match_brace(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``start`` (escaped ``\\{ \\}`` ignored); -1 if unclosed."""
    depth = 0
    i = start
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _last_boxed_span(text: str) -> tuple[str | None, int]:
    """``(content, end)`` of the last box (``end``: index after it); ``(None, -1)`` without a box
    or when the last one is unclosed."""
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None, -1
    i = matches[-1].end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_brace(text, i)
        return (None, -1) if end < 0 else (text[i + 1 : end].strip(), end + 1)
    m = re.compile(r"[^\s$]+").match(text, i)
    return (m.group(0).rstrip(".,;"), m.end()) if m else (None, -1)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed X`` in ``text``.

    Nested braces are matched; ``None`` when there is no box or the last one is unclosed.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and finally \\boxed{\\frac{3}{4}}.")
    '\\\\frac{3}{4}'
    >>> last_boxed(r"\\boxed 5") , last_boxed(r"\\fbox{7}"), last_boxed(r"\\boxed{1")
    ('5', '7', None)
    """
    return _last_boxed_span(text)[0]


def _brace_depth_change(text: str, start: int, end: int) -> int:
    """``{`` minus ``}`` in ``text[start:end]``, escaped ``\\{``/``\\}`` not counted."""
    return (text.count("{", start, end) - text.count("\\{", start, end)
            - text.count("}", start, end) + text.count("\\}", start, end))


def _prose_start(seg: str, lo: int = 0, hi: int | None = None) -> int | None:
    """Index of the first prose word of ``seg[lo:hi]`` outside braces (``12 \\text{ apples} in all`` → at
    `` in``), 0 when it opens with a word, ``None`` when it has no prose; relative to ``lo``, as if the slice
    were a string of its own (``seg`` is not copied). Scans no further than the index it returns."""
    hi = len(seg) if hi is None else hi
    if _LEADING_WORD_RE.match(seg, lo, hi):
        return 0   # (also any whitespace run at lo that _PROSE_RE's lookbehind would skip: it sees seg[lo - 1])
    depth, pos = 0, lo
    for p in _PROSE_RE.finditer(seg, lo, hi):
        depth += _brace_depth_change(seg, pos, p.start())
        pos = p.start()
        if depth <= 0:
            return p.start() - lo
    return None


def _format_group(head: str, content: str) -> str:
    """The replacement of one formatting group ``head + content + "}"`` (see :func:`strip_formatting`)."""
    inner = _LATEX_SPACE_RE.sub(" ", content).strip()
    if len(inner) <= _MAX_FORMAT_CHARS:
        cut = _prose_start(inner)
        lead, words = (inner, "") if cut is None else (inner[:cut].strip(), inner[cut:].strip())
        if re.search(r"\d", lead):
            return lead + (" \\text{" + words + "}" if words else "")
        if _MARKER_RE.search(inner) or _CORRECTION_RE.search(inner):
            return content
    return head + content + "}"


def strip_formatting(text: str) -> str:
    """Remove text-formatting commands around numbers and answer markers (linear time).

    ``\\text``, ``\\textbf`` and the other ``\\text..`` fonts, ``\\mathrm``/``\\mathbf`` and the other
    ``\\math..`` fonts (not ``\\mathbb``/``\\mathcal``), ``\\mbox``, ``\\hbox``, ``\\emph``, ``\\bm``,
    ``\\boldsymbol``, ``\\pmb``, ``\\underline`` and ``\\textcolor{c}{..}``, nested to any depth up
    to 16. A group whose content starts with math containing a digit becomes that math, any words
    after it kept as ``\\text{words}``; a group containing an answer marker or a correction cue
    becomes its content; any other group (words only, ``\\mathbf{v}``) and an unclosed one stay as
    they are.

    >>> strip_formatting(r"\\boxed{\\textbf{\\text{ 12 }}} and \\text{12 apples} or \\text{ cm}")
    '\\\\boxed{12} and 12 \\\\text{apples} or \\\\text{ cm}'
    >>> strip_formatting(r"\\textbf{Final Answer:} $\\mathbf{-3.5}$")
    'Final Answer: $-3.5$'
    """
    if "\\" not in text:
        return text
    # frames: [parts, head, open plain braces]; frames[0] is the text outside any formatting group
    frames: list[list] = [[[], "", 0]]
    i, n = 0, len(text)
    while i < n:
        top = frames[-1]
        m = _BRACE_OR_ESCAPE_RE.search(text, i)
        if m is None:
            top[0].append(text[i:])
            break
        j = m.start()
        top[0].append(text[i:j])
        c = text[j]
        if c == "\\":
            f = _FORMAT_CMD_RE.match(text, j) if len(frames) <= _MAX_FORMAT_DEPTH else None
            if f:
                frames.append([[], f.group(0), 0])
                i = f.end()
            else:
                top[0].append(text[j : j + 2])
                i = j + 2
            continue
        i = j + 1
        if c == "{":
            top[2] += 1
            top[0].append(c)
        elif top[2] > 0 or len(frames) == 1:
            top[2] = max(0, top[2] - 1)
            top[0].append(c)
        else:
            frames.pop()
            frames[-1][0].append(_format_group(top[1], "".join(top[0])))
    while len(frames) > 1:  # unclosed groups stay as written
        top = frames.pop()
        frames[-1][0].append(top[1] + "".join(top[0]))
    return "".join(frames[0][0])


def _unwrap(ans: str) -> str:
    """``ans`` without the wrappers around it (``$..$``, ``\\[..\\]``, ``**..**`` …, repeatedly) and without
    trailing ``.,;:``. Works on indices (no copy per layer): linear however many layers there are."""
    lo, hi = 0, len(ans)
    while lo < hi and ans[lo].isspace():
        lo += 1
    while hi > lo and ans[hi - 1].isspace():
        hi -= 1
    changed = True
    while changed and lo < hi:
        changed = False
        for left, right in _WRAPPERS:
            if (hi - lo >= len(left) + len(right) and ans.startswith(left, lo, hi)
                    and ans.endswith(right, lo, hi)):
                lo, hi = lo + len(left), hi - len(right)
                while lo < hi and ans[lo].isspace():
                    lo += 1
                while hi > lo and ans[hi - 1].isspace():
                    hi -= 1
                changed = True
        if ans.endswith((".", ",", ";", ":"), lo, hi):
            # the whole run of them and whitespace at once: no wrapper ends with one, so none can apply before
            hi -= 1
            while hi > lo and (ans[hi - 1] in ".,;:" or ans[hi - 1].isspace()):
                hi -= 1
            changed = True
    return ans[lo:hi]


def _rstrip_open(seg: str, hi: int, lo: int = 0) -> int:
    """``hi`` moved back over whitespace and ``( [ — – -`` (what ends ``seg[lo:hi]`` before a correction cue)."""
    while hi > lo and (seg[hi - 1].isspace() or seg[hi - 1] in _OPEN_CHARS):
        hi -= 1
    return hi


def _drop_connector(seg: str) -> str:
    """``seg`` without a trailing ``and``/``or`` and the whitespace around it (``1331 and`` → ``1331``); only
    one, and only a whole word after whitespace (what ``re.sub(r"\\s+(?:and|or)\\s*$", "", seg)`` does)."""
    body = seg.rstrip()
    for word in _CONNECTORS:
        if body.endswith(word) and len(body) > len(word) and body[-len(word) - 1].isspace():
            return body[: -len(word)].rstrip()
    return seg


class _Doc:
    """One text under extraction and the scans its clauses share, each made once, when first needed: where its
    sentences end, where its ``$`` are, each sentence's correction cues, and the answers and corrections
    already found. With them a clause costs about the length of its answer, not the rest of its sentence, so
    many markers in one sentence (``The answer is , The answer is , …``) stay linear."""

    __slots__ = ("text", "_ends", "_dollars", "_sentences", "_stated", "_corrections")

    def __init__(self, text: str) -> None:
        self.text = text
        self._ends: list[int] | None = None
        self._dollars: list[int] | None = None
        self._sentences: dict[tuple[int, bool], tuple[str, list[int] | None]] = {}
        self._stated: dict[str, tuple[Extraction | None, int]] = {}
        self._corrections: dict[int, list[tuple[int, str]]] = {}

    def _sentence_ends(self) -> list[int]:
        if self._ends is None:
            self._ends = [m.start() for m in _SENTENCE_END_RE.finditer(self.text)]
        return self._ends

    def sentence_end(self, start: int, stop: int) -> int | None:
        """Where ``_SENTENCE_END_RE.search(text, start, stop)`` matches (``None``: nowhere), from the text's
        sentence ends: they are the window's too, except that a ``.``/``!``/``?`` just before ``stop`` ends the
        window's sentence whatever follows it."""
        ends, text = self._sentence_ends(), self.text
        i = bisect_left(ends, start)
        if i < len(ends) and ends[i] < stop - 1:
            return ends[i]
        q = stop - 1
        if q >= start and (text[q] == "\n" or (text[q] in ".!?" and not (q > 0 and text[q - 1] == "\\"))):
            return q
        return None

    def dollars(self, start: int, end: int) -> int:
        """``text[start:end].count("$")``."""
        if self._dollars is None:
            self._dollars = [m.start() for m in re.finditer(r"\$", self.text)]
        return bisect_left(self._dollars, end) - bisect_left(self._dollars, start)

    def sentence(self, start: int, blank_dollars: bool) -> tuple[str, int]:
        """``(S, o)``: ``S`` is the text from the start of the sentence holding ``start`` to its end (its ``$``
        blanked when ``blank_dollars``), ``S[o:]`` the clause at ``start``."""
        ends = self._sentence_ends()
        i = bisect_left(ends, start)
        begin = ends[i - 1] + 1 if i > 0 else 0
        key = (begin, blank_dollars)
        if key not in self._sentences:
            end = ends[i] if i < len(ends) else len(self.text)
            sentence = self.text[begin:end]
            self._sentences[key] = (sentence.replace("$", " ") if blank_dollars else sentence, None)
        return self._sentences[key][0], start - begin

    def first_cue(self, start: int, blank_dollars: bool) -> int | None:
        """Where the first correction cue of the clause at ``start`` starts, relative to ``start`` (what
        ``_CORRECTION_RE.search(clause)`` finds, the clause a string of its own), or ``None``."""
        sentence, o = self.sentence(start, blank_dollars)
        if _CUE_HEAD_RE.match(sentence, o):
            return 0
        key = (start - o, blank_dollars)
        cues = self._sentences[key][1]
        if cues is None:   # every position of the sentence where a cue starts (each tried once: linear)
            cues, q = [], 0
            while (m := _CUE_START_RE.search(sentence, q)) is not None:
                cues.append(m.start())
                q = m.start() + 1
            self._sentences[key] = (sentence, cues)
        i = bisect_left(cues, o + 1)
        return cues[i] - o if i < len(cues) else None

    def stated(self, style: str) -> tuple[Extraction | None, int]:
        if style not in self._stated:
            self._stated[style] = _stated(self, style)
        return self._stated[style]

    def corrections(self, start: int = 0) -> list[tuple[int, str]]:
        if start not in self._corrections:
            self._corrections[start] = list(self._iter_corrections(start))
        return self._corrections[start]

    def first_correction(self) -> tuple[int, str] | None:
        if 0 in self._corrections:
            return next(iter(self._corrections[0]), None)
        return next(self._iter_corrections(0), None)

    def _iter_corrections(self, start: int):
        for m in _CORRECTION_RE.finditer(self.text, start):
            value = _corrected_value(self, m)
            if value:
                yield m.start(), value


def _clause(doc: _Doc, start: int, limit: int | None = None) -> tuple[str, int]:
    """``(answer, end)``: the math at ``start`` up to the end of its sentence (or line, or the
    first correction cue), prose words trimmed; ``end`` is where the kept text stops. The answer is
    empty when the clause opens with a word (``To answer: we add them``). ``limit`` bounds how far
    the sentence is looked for.

    The clause is ``text[start:]`` up to its sentence end, its ``$`` blanked when it holds an odd number of
    them. Without ``limit`` it is read in place in its sentence (:meth:`_Doc.sentence`), its first cue looked
    up (:meth:`_Doc.first_cue`): the cost is the length of the answer, not of the rest of the sentence."""
    text = doc.text
    if _OPENS_WITH_WORD_RE.match(text, start):  # before the sentence scan: keeps many markers linear
        return "", start
    stop = len(text) if limit is None else min(len(text), start + limit)
    s_end = doc.sentence_end(start, stop)
    end = stop if s_end is None else s_end
    blank = doc.dollars(start, end) % 2 == 1
    if limit is None:
        seg, lo = doc.sentence(start, blank)
        hi = lo + (end - start)
        cue = doc.first_cue(start, blank)
    else:   # a short window: a copy of it
        seg, lo = text[start:end], 0
        seg = seg.replace("$", " ") if blank else seg
        hi = len(seg)
        found = _CORRECTION_RE.search(seg)
        cue = found.start() if found else None
    if _OPENS_WITH_WORD_RE.match(seg, lo, hi):
        return "", start
    if cue is not None:  # "5, no wait, it is 7": this clause's answer ends where the correction starts
        hi = lo + cue
        p = _prose_start(seg, lo, hi)
        # a prose word before the cue ends the answer where it would have on the clause cut at the cue
        hi = lo + p if p is not None else _rstrip_open(seg, hi, lo)
    else:
        p = _prose_start(seg, lo, hi)
        if p is not None:
            hi = lo + p
    kept = _drop_connector(seg[lo:hi])
    return _unwrap(kept), start + len(kept)


def _after_marker(doc: _Doc) -> tuple[str, int] | None:
    """``(answer, end)`` after the last answer marker that is followed by one."""
    text = doc.text
    for marker in reversed(list(_MARKER_RE.finditer(text))):
        # "The answer is:\n\n$$13$$" — the answer may open the next non-empty line.
        start = _SPACE_RE.match(text, marker.end()).end()
        ans, end = _clause(doc, start)
        if ans:
            return ans, end
    return None


def _after_last_equals(doc: _Doc) -> tuple[str, int] | None:
    """``(answer, end)``: the right-hand side of the last ``=``, if no digit follows it (``8 + 7 = 15``)."""
    text = doc.text
    equals = list(re.finditer(r"(?<![<>!=\\])=(?!=)", text))
    if not equals:
        return None
    ans, end = _clause(doc, equals[-1].end())
    if not ans or re.search(r"\d", text[end:]):
        return None
    return ans, end


def _corrected_value(doc: _Doc, m: re.Match) -> str | None:
    """The new value a correction cue match introduces, or ``None`` if what follows the cue is not
    a restated answer (see :func:`find_corrections`)."""
    text = doc.text
    start = m.end()
    ans, end = _clause(doc, start, _CORRECTION_WINDOW)
    if not ans or ans[0] in ",;:)]}":
        return None
    if ans.endswith((")", "]")) and ans.count("(") + ans.count("[") < ans.count(")") + ans.count("]"):
        ans = ans[:-1].rstrip()  # "(no, 6)": the bracket closes the aside, not the value
    stop = min(len(text), start + _CORRECTION_WINDOW)
    s_end = doc.sentence_end(end, stop)
    if s_end is not None and text[s_end] == "?":
        return None  # "Wait, 7?" doubts, it does not state
    tail = text[end : stop if s_end is None else s_end]
    # The tail up to a rejected alternative (", not 5"), "instead" dropped: no digit, at most one unit word.
    # A digit before any alternative settles it, whatever follows (no scan of the rest).
    digit = _DIGIT_OR_EQUALS_RE.search(tail)
    alt = _NEGATED_ALT_RE.search(tail, 0, len(tail) if digit is None else digit.start() + 1)
    if digit is not None and alt is None:
        return None
    tail = _INSTEAD_RE.sub(" ", tail if alt is None else tail[: alt.start()])
    restated = m.group("restate") is not None or m.group("mean") is not None
    most = 2 if restated else 1
    words = []
    for w in _WORD_RE.finditer(tail):
        words.append(w.group(0))
        if len(words) > most:
            return None
    if any(w.lower() in _NOT_A_UNIT for w in words):
        return None
    eq = _RESTATED_EQUATION_RE.fullmatch(ans)
    if eq and re.search(r"\d", eq.group(1)):  # "Actually, 5 + 2 = 7." restates 7
        ans = eq.group(2).strip()
    return ans or None


def find_corrections(text: str, start: int = 0) -> list[tuple[int, str]]:
    """Self-corrections in ``text[start:]``: ``(cue position, new value)`` in text order.

    A correction is a cue (``no wait``, ``wait``, ``no,``, ``sorry``, ``oops``, ``actually``,
    ``correction``, ``scratch that``, ``or rather``, ``make that``, ``nope``, ``I made a mistake``,
    ``my mistake``, ``I was wrong``, ``that's wrong``, ``let me correct that``, stacked as in
    ``wait, no, sorry``), then optionally a restating phrase (``it is``, ``it's``, ``that's``, ``I
    mean``, ``it should be``, ``the correct answer is`` …), or ``I mean`` alone, then the value.
    The value must end its sentence, and not with ``?``: after it at most one unit word (two after
    a restating phrase), no digit, no verb or negation (``7 is wrong``, ``7 apples were eaten``),
    optionally ``instead`` or a rejected alternative (``, not 5``). ``Actually, 5 + 2 = 7``
    restates ``7``.

    >>> find_corrections("The answer is 5, no wait, it is 7. Wait, 7 apples were eaten.")
    [(17, '7')]
    """
    return list(_Doc(text).corrections(start))


def _stated(doc: _Doc, style: str) -> tuple[Extraction | None, int]:
    """The stated answer by the module table and the index where it ends (-1 without one)."""
    text = doc.text
    boxed, end = _last_boxed_span(text)
    if boxed is not None:
        return (Extraction(boxed, "boxed"), end) if boxed else (None, -1)
    if _BOXED_RE.search(text):
        return None, -1  # the last box is unclosed: the answer was cut off
    if style == "gsm8k":
        hashes = list(_HASHES_RE.finditer(text))
        if hashes:
            start = hashes[-1].end()
            line = text[start:].split("\n", 1)[0]
            cue = _CORRECTION_RE.search(line)
            line = line[: cue.start()] if cue else line
            ans = _unwrap(line.replace("$", " ").strip())
            if ans:
                return Extraction(ans, "hashes"), start + len(line)
    marker = _after_marker(doc)
    if marker:
        return Extraction(marker[0], "marker"), marker[1]
    eq = _after_last_equals(doc)
    if eq:
        return Extraction(eq[0], "equation"), eq[1]
    if style == "gsm8k":
        numbers = list(_NUMBER_RE.finditer(text))
        if numbers:
            return Extraction(numbers[-1].group(0), "final_number"), numbers[-1].end()
    return None, -1


@lru_cache(maxsize=4)
def _extract(response: str, style: str) -> tuple[Extraction | None, _Doc | None]:
    """:func:`extract_final_answer` (``style`` already checked) and the :class:`_Doc` of the formatting-free text
    it read (``None`` for a ``task:<name>`` style), whose scans :func:`answer_end` reuses. The last few are kept:
    a learner's screens ask for the answer and the answer end of one row several times."""
    if task_of_style(style) is not None:  # a procedural task's answer: the last box, verbatim
        boxed = _last_boxed_span(response)[0]
        return (Extraction(boxed, "boxed") if boxed and boxed.strip() else None), None
    entry = registered_style(style)
    if entry is not None:  # a registered style states its answer its own way
        found = _style_extract(entry, style, response)
        return (Extraction(found, "style") if found and found.strip() else None), None
    doc = _Doc(strip_formatting(response))
    found, end = doc.stated(style)
    corrections = doc.corrections(end) if found is not None else []
    if found is None and _BOXED_RE.search(doc.text) is None:
        # "8 + 7 = 15. No wait, it is 16.": the answer stated before the first correction
        first = doc.first_correction()
        if first is not None:
            found, end = _Doc(doc.text[: first[0]]).stated(style)
            corrections = doc.corrections(end) if found is not None else []
    if found is not None and corrections:
        return Extraction(corrections[-1][1], "correction"), doc
    return found, doc


def extract_final_answer(response: str, style: AnswerStyle = "boxed") -> Extraction | None:
    """The stated final answer of ``response`` under an answer style (see the module table).

    Text formatting around numbers is removed first (:func:`strip_formatting`); a self-correction
    after the stated answer replaces it (:func:`find_corrections`).

    Raises ``ValueError`` for an unknown style. Returns ``None`` when nothing is stated, which
    makes the response incorrect: an echo of the problem is not an answer.

    Linear time in the length of ``response``: a learner runs it in-process, with no time bound, on every
    peer row (``tests/reward/test_extract_cpu_bound.py`` times crafted rows at the length cap).

    >>> extract_final_answer("To calculate 9 + 4, we need to add 9 and 4.") is None
    True
    >>> extract_final_answer("8 + 7 = 15")
    Extraction(answer='15', source='equation')
    >>> extract_final_answer("The answer is $15$.").answer
    '15'
    >>> extract_final_answer("She earns 9 * 2 = 18 dollars.\\n#### 18", "gsm8k")
    Extraction(answer='18', source='hashes')
    >>> extract_final_answer(r"\\boxed{\\textbf{12}}"), extract_final_answer("The answer is 5, no wait, 7.")
    (Extraction(answer='12', source='boxed'), Extraction(answer='7', source='correction'))
    """
    check_style(style)
    return _extract(response, style)[0]


def answer_end(response: str, style: AnswerStyle = "boxed") -> int | None:
    """Index in ``response`` just after its final stated answer (what :func:`extract_final_answer` finds),
    or ``None`` when nothing is stated. ``response[answer_end(response):]`` is the text after the answer
    (the learner-side answer-tail screen, :mod:`hacrl_fed.screens.rules`).

    Exact for a ``\\boxed`` answer and whenever the text after the answer holds no formatting command;
    otherwise the tail is measured on the text with formatting removed (:func:`strip_formatting`), so it may
    come out a few characters short. A self-correction ends the answer after its new value. Raises
    ``ValueError`` for an unknown style. Linear time, as :func:`extract_final_answer` (whose scans it reuses).

    >>> r = r"So 2 + 3 = 5, the answer is \\boxed{5}. Visit example.org!"
    >>> r[answer_end(r):]
    '. Visit example.org!'
    >>> answer_end("no answer here") is None
    True
    """
    check_style(style)
    found, doc = _extract(response, style)
    if found is None:
        return None
    if found.source == "style":  # a registered style: its own answer_end, else where its answer last occurs
        own = getattr(registered_style(style), "answer_end", None)
        at = response.rfind(found.answer)
        return own(response) if callable(own) else (at + len(found.answer) if at >= 0 else len(response))
    if found.source == "boxed" or doc is None:
        return _last_boxed_span(response)[1]
    text = doc.text
    stated, end = doc.stated(style)
    if found.source == "correction":
        cue = doc.corrections(max(end, 0))[-1][0]
        at = text.find(found.answer, cue)
        end = at + len(found.answer) if at >= 0 else end
    if end < 0:
        return None
    tail = text[end:]
    return len(response) - len(tail) if len(tail) <= len(response) else len(response)


def reference_answer(reference: str) -> str:
    """The final answer inside a reference: the last ``\\boxed{}`` of a worked solution (TRL's
    ``solution`` column), the text after ``####`` (raw GSM8K), else the stripped string.

    >>> reference_answer("She has 3 + 4 = 7 apples.\\n#### 7"), reference_answer(r"so $\\boxed{12}$")
    ('7', '12')
    """
    boxed = last_boxed(reference)
    if boxed:
        return boxed
    if "####" in reference:
        return reference.rsplit("####", 1)[1].strip().replace(",", "")
    return reference.strip()


def _paren_partners(text: str) -> dict[int, int]:
    """Index of each ``(`` of ``text`` → index of the ``)`` that closes it (an unclosed one is left out)."""
    partners, stack = {}, []
    for m in re.finditer(r"[()]", text):
        if m.group(0) == "(":
            stack.append(m.start())
        elif stack:
            partners[stack.pop()] = m.start()
    return partners


def _fix_paren_command(text: str, command: str, n_args: int) -> str:
    """``\\sqrt(2)`` → ``\\sqrt{2}``; ``\\frac(1)(2)`` → ``\\frac{1}{2}`` (balanced parentheses; the
    partners are found in one pass, so many unclosed ``\\sqrt(`` stay linear)."""
    if command not in text:
        return text
    out = []
    i = 0
    pat = re.compile(re.escape(command) + r"\s*\(")
    partners = _paren_partners(text)
    while True:
        m = pat.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : m.start()] + command)
        j = m.end() - 1
        for _ in range(n_args):
            if j >= len(text) or text[j] != "(":
                break
            k = partners.get(j)
            if k is None:
                break  # unbalanced: leave the rest as is
            out.append("{" + text[j + 1 : k] + "}")
            j = k + 1
        i = j


def normalize_latex(text: str) -> str:
    """Light, meaning-preserving repairs before parsing: ``\\sqrt(x)`` / ``\\frac(a)(b)`` with
    parentheses become braces, ``\\dfrac``/``\\tfrac`` become ``\\frac``, unicode minus becomes ``-``,
    formatting around numbers is removed (:func:`strip_formatting`: ``\\textbf{12}`` → ``12``).

    >>> normalize_latex(r"4\\sqrt(2) + \\dfrac(1)(3)"), normalize_latex(r"\\mathrm{12}")
    ('4\\\\sqrt{2} + \\\\frac{1}{3}', '12')
    """
    text = strip_formatting(text)
    text = text.replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _fix_paren_command(text, "\\sqrt", 1)
    return _fix_paren_command(text, "\\frac", 2)


def max_nesting(text: str) -> int:
    """Deepest nesting of ``{}``, ``()`` and ``[]`` (a guard against pathological inputs)."""
    depth = best = 0
    for c in text:
        if c in "{([":
            depth += 1
            best = max(best, depth)
        elif c in "})]":
            depth = max(0, depth - 1)
    return best


_UNIT_RE = re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{[^{}]*\}")
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_LITERAL_RES = (
    re.compile(rf"^{_NUM}$"),
    re.compile(rf"^{_NUM}/{_NUM}$"),
    re.compile(r"^[+-]?\\frac\{[+-]?\d+\}\{[+-]?\d+\}$"),
    re.compile(r"^[+-]?\\frac\d\d$"),
    re.compile(rf"^(?:{_NUM}(?:\\times|\\cdot|\*))?10\^(?:\{{[+-]?\d+\}}|\d)$"),
)


def is_numeric_literal(text: str) -> bool:
    """Whether ``text`` is a single written-out number (integer, decimal, fraction, scientific),
    allowing units, ``$``, ``%``, degrees, thousands separators and ``x =`` in front.

    An unevaluated expression (``9+4``, ``3\\times 4``, ``\\sqrt{169}``) is not a literal.

    >>> [is_numeric_literal(s) for s in ["13", "-1,000.5", r"\\frac{1}{2}", r"\\$18", "x = 4", "9+4"]]
    [True, True, True, True, True, False]
    """
    s = _UNIT_RE.sub("", text)
    s = re.sub(r"\\[,!;: ]|\\left|\\right|\\\$|\$|\\%|%|\^\{?\\circ\}?|\{,\}|\s+", "", s)
    s = s.replace("\u2212", "-").replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"^[A-Za-z]\w*=", "", s)
    s = re.sub(r"(?<=\d),(?=\d{3}(?:\D|$))", "", s)
    s = re.sub(r"(?<![A-Za-z])[A-Za-z]++$", "", s) if re.search(r"\d[A-Za-z]++$", s) else s
    s = s[1:-1] if s.startswith("(") and s.endswith(")") and s.count("(") == 1 else s
    return any(r.match(s) for r in _LITERAL_RES)
