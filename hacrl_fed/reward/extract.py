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
from dataclasses import dataclass
from typing import Literal

AnswerStyle = Literal["boxed", "gsm8k"]
ANSWER_STYLES: tuple[str, ...] = ("boxed", "gsm8k")
TASK_STYLE_PREFIX = "task:"
"""``task:<name>``: the answer is the content of the last ``\\boxed{}`` alone, scored by the scorer of the
procedural task ``<name>`` (:mod:`hacrl_fed.reward.task_scorers`), for references that are not a number."""
_TASK_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")

__all__ = [
    "ANSWER_STYLES",
    "AnswerStyle",
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
    """Whether ``style`` is ``boxed``, ``gsm8k`` or a well-formed ``task:<name>``."""
    return style in ANSWER_STYLES or task_of_style(style) is not None


def check_style(style: str) -> None:
    """Raise ``ValueError`` unless ``style`` is ``boxed``, ``gsm8k`` or ``task:<name>`` (:func:`task_of_style`)."""
    if not is_answer_style(style):
        shown = style[:80] if isinstance(style, str) else type(style).__name__
        raise ValueError(f"unknown answer style {shown!r}; expected one of {', '.join(ANSWER_STYLES)} or task:<name>")
_MARKER_RE = re.compile(
    r"(?:final\s+answer|the\s+answer|\banswer)\s*(?:\*\*)?\s*(?:is\s*:?|:|=)[ \t*]*",
    re.IGNORECASE,
)
_SPACE_RE = re.compile(r"\s*")
_HASHES_RE = re.compile(r"####[ \t]*")
_NUMBER_RE = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# A sentence ends at '.', '!' or '?' followed by whitespace or the end (not a decimal point).
_SENTENCE_END_RE = re.compile(r"(?<!\\)[.!?](?=\s|$)|\n")
# Prose after a math answer: a word of 2+ letters not preceded by a backslash (LaTeX command),
# except the list connectors "and"/"or" that join multi-part answers ("1331 and 1728").
_PROSE_RE = re.compile(r"\s+(?=(?!(?:and|or)\b)[A-Za-z]{2,}\b)")
_OPENS_WITH_WORD_RE = re.compile(r"\s*(?:\*\*)?\s*[A-Za-z]{2,}\b")
_LEADING_WORD_RE = re.compile(r"\s*(?!(?:and|or)\b)[A-Za-z]{2,}\b")
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
_CORRECTION_WINDOW = 300  # a corrected value lies within this many characters of its cue
# After the new value: ", not 5" / "instead of 5" / "rather than 5" (the value it replaces).
_NEGATED_ALT_RE = re.compile(r"[\s,;(—–-]*(?:not|instead\s+of|rather\s+than)\b.*", re.IGNORECASE | re.DOTALL)
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


def _prose_start(seg: str) -> int | None:
    """Index of the first prose word of ``seg`` outside braces (``12 \\text{ apples} in all`` → at
    `` in``), 0 when ``seg`` opens with a word, ``None`` when it has no prose."""
    if _LEADING_WORD_RE.match(seg):
        return 0
    depth, pos = 0, 0
    for p in _PROSE_RE.finditer(seg):
        depth += _brace_depth_change(seg, pos, p.start())
        pos = p.start()
        if depth <= 0:
            return p.start()
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
    ans = ans.strip()
    changed = True
    while changed and ans:
        changed = False
        for left, right in _WRAPPERS:
            if ans.startswith(left) and ans.endswith(right) and len(ans) >= len(left) + len(right):
                ans = ans[len(left) : len(ans) - len(right)].strip()
                changed = True
        if ans.endswith((".", ",", ";", ":")):
            ans = ans[:-1].rstrip()
            changed = True
    return ans


def _clause(text: str, start: int, limit: int | None = None) -> tuple[str, int]:
    """``(answer, end)``: the math at ``start`` up to the end of its sentence (or line, or the
    first correction cue), prose words trimmed; ``end`` is where the kept text stops. The answer is
    empty when the clause opens with a word (``To answer: we add them``). ``limit`` bounds how far
    the sentence is looked for."""
    if _OPENS_WITH_WORD_RE.match(text, start):  # before the sentence scan: keeps many markers linear
        return "", start
    stop = len(text) if limit is None else min(len(text), start + limit)
    m = _SENTENCE_END_RE.search(text, start, stop)
    seg = text[start : m.start() if m else stop]
    seg = seg.replace("$", " ") if seg.count("$") % 2 else seg
    if _OPENS_WITH_WORD_RE.match(seg):
        return "", start
    cue = _CORRECTION_RE.search(seg)
    if cue:  # "5, no wait, it is 7": this clause's answer ends where the correction starts
        seg = re.sub(r"[\s(\[—–-]+$", "", seg[: cue.start()])
    p = _prose_start(seg)
    if p is not None:
        seg = seg[:p]
    seg = re.sub(r"\s+(?:and|or)\s*$", "", seg)
    return _unwrap(seg), start + len(seg)


def _after_marker(text: str) -> tuple[str, int] | None:
    """``(answer, end)`` after the last answer marker that is followed by one."""
    for marker in reversed(list(_MARKER_RE.finditer(text))):
        # "The answer is:\n\n$$13$$" — the answer may open the next non-empty line.
        start = _SPACE_RE.match(text, marker.end()).end()
        ans, end = _clause(text, start)
        if ans:
            return ans, end
    return None


def _after_last_equals(text: str) -> tuple[str, int] | None:
    """``(answer, end)``: the right-hand side of the last ``=``, if no digit follows it (``8 + 7 = 15``)."""
    equals = list(re.finditer(r"(?<![<>!=\\])=(?!=)", text))
    if not equals:
        return None
    ans, end = _clause(text, equals[-1].end())
    if not ans or re.search(r"\d", text[end:]):
        return None
    return ans, end


def _corrected_value(text: str, m: re.Match) -> str | None:
    """The new value a correction cue match introduces, or ``None`` if what follows the cue is not
    a restated answer (see :func:`find_corrections`)."""
    start = m.end()
    ans, end = _clause(text, start, _CORRECTION_WINDOW)
    if not ans or ans[0] in ",;:)]}":
        return None
    if ans.endswith((")", "]")) and ans.count("(") + ans.count("[") < ans.count(")") + ans.count("]"):
        ans = ans[:-1].rstrip()  # "(no, 6)": the bracket closes the aside, not the value
    stop = min(len(text), start + _CORRECTION_WINDOW)
    s_end = _SENTENCE_END_RE.search(text, end, stop)
    if s_end and s_end.group(0) == "?":
        return None  # "Wait, 7?" doubts, it does not state
    tail = _NEGATED_ALT_RE.sub("", text[end : s_end.start() if s_end else stop], count=1)
    tail = re.sub(r"\binstead\b", " ", tail, flags=re.IGNORECASE)
    words = _WORD_RE.findall(tail)
    restated = m.group("restate") is not None or m.group("mean") is not None
    if re.search(r"[\d=]", tail) or len(words) > (2 if restated else 1):
        return None
    if any(w.lower() in _NOT_A_UNIT for w in words):
        return None
    eq = re.fullmatch(r"((?:[\d\s.,+\-*/()^{}]|\\(?:times|cdot|div|frac))+)=\s*([^=]+)", ans)
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
    out = []
    for m in _CORRECTION_RE.finditer(text, start):
        value = _corrected_value(text, m)
        if value:
            out.append((m.start(), value))
    return out


def _stated(text: str, style: str) -> tuple[Extraction | None, int]:
    """The stated answer by the module table and the index where it ends (-1 without one)."""
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
    marker = _after_marker(text)
    if marker:
        return Extraction(marker[0], "marker"), marker[1]
    eq = _after_last_equals(text)
    if eq:
        return Extraction(eq[0], "equation"), eq[1]
    if style == "gsm8k":
        numbers = list(_NUMBER_RE.finditer(text))
        if numbers:
            return Extraction(numbers[-1].group(0), "final_number"), numbers[-1].end()
    return None, -1


def extract_final_answer(response: str, style: AnswerStyle = "boxed") -> Extraction | None:
    """The stated final answer of ``response`` under an answer style (see the module table).

    Text formatting around numbers is removed first (:func:`strip_formatting`); a self-correction
    after the stated answer replaces it (:func:`find_corrections`).

    Raises ``ValueError`` for an unknown style. Returns ``None`` when nothing is stated, which
    makes the response incorrect: an echo of the problem is not an answer.

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
    if task_of_style(style) is not None:  # a procedural task's answer: the last box, verbatim
        boxed = _last_boxed_span(response)[0]
        return Extraction(boxed, "boxed") if boxed and boxed.strip() else None
    text = strip_formatting(response)
    found, end = _stated(text, style)
    corrections = find_corrections(text, end) if found is not None else []
    if found is None and _BOXED_RE.search(text) is None:
        # "8 + 7 = 15. No wait, it is 16.": the answer stated before the first correction
        first = next(iter(find_corrections(text)), None)
        if first is not None:
            found, end = _stated(text[: first[0]], style)
            corrections = find_corrections(text, end) if found is not None else []
    if found is not None and corrections:
        return Extraction(corrections[-1][1], "correction")
    return found


def answer_end(response: str, style: AnswerStyle = "boxed") -> int | None:
    """Index in ``response`` just after its final stated answer (what :func:`extract_final_answer` finds),
    or ``None`` when nothing is stated. ``response[answer_end(response):]`` is the text after the answer
    (the learner-side answer-tail screen, :mod:`hacrl_fed.screens.rules`).

    Exact for a ``\\boxed`` answer and whenever the text after the answer holds no formatting command;
    otherwise the tail is measured on the text with formatting removed (:func:`strip_formatting`), so it may
    come out a few characters short. A self-correction ends the answer after its new value. Raises
    ``ValueError`` for an unknown style.

    >>> r = r"So 2 + 3 = 5, the answer is \\boxed{5}. Visit example.org!"
    >>> r[answer_end(r):]
    '. Visit example.org!'
    >>> answer_end("no answer here") is None
    True
    """
    found = extract_final_answer(response, style)
    if found is None:
        return None
    if found.source == "boxed":
        return _last_boxed_span(response)[1]
    text = strip_formatting(response)
    stated, end = _stated(text, style)
    if found.source == "correction":
        cue = find_corrections(text, max(end, 0))[-1][0]
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


def _fix_paren_command(text: str, command: str, n_args: int) -> str:
    """``\\sqrt(2)`` → ``\\sqrt{2}``; ``\\frac(1)(2)`` → ``\\frac{1}{2}`` (balanced parentheses)."""
    out = []
    i = 0
    pat = re.compile(re.escape(command) + r"\s*\(")
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
            depth, k = 0, j
            while k < len(text):
                depth += {"(": 1, ")": -1}.get(text[k], 0)
                if depth == 0:
                    break
                k += 1
            if depth:
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
    s = re.sub(r"[A-Za-z]+$", "", s) if re.search(r"\d[A-Za-z]+$", s) else s
    s = s[1:-1] if s.startswith("(") and s.endswith(")") and s.count("(") == 1 else s
    return any(r.match(s) for r in _LITERAL_RES)
