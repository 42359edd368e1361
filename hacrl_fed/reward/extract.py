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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

AnswerStyle = Literal["boxed", "gsm8k"]
ANSWER_STYLES: tuple[str, ...] = ("boxed", "gsm8k")

__all__ = [
    "ANSWER_STYLES",
    "AnswerStyle",
    "Extraction",
    "extract_final_answer",
    "is_numeric_literal",
    "last_boxed",
    "max_nesting",
    "normalize_latex",
    "reference_answer",
]

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
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
_WRAPPERS = (("$$", "$$"), ("$", "$"), ("\\[", "\\]"), ("\\(", "\\)"), ("**", "**"))


@dataclass(frozen=True)
class Extraction:
    """A stated final answer: the answer text and where it came from (``boxed``, ``hashes``,
    ``marker``, ``equation`` or ``final_number``)."""

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


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed X`` in ``text``.

    Nested braces are matched; ``None`` when there is no box or the last one is unclosed.

    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and finally \\boxed{\\frac{3}{4}}.")
    '\\\\frac{3}{4}'
    >>> last_boxed(r"\\boxed 5") , last_boxed(r"\\fbox{7}"), last_boxed(r"\\boxed{1")
    ('5', '7', None)
    """
    matches = list(_BOXED_RE.finditer(text))
    if not matches:
        return None
    i = matches[-1].end()
    while i < len(text) and text[i] in " \t":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_brace(text, i)
        return None if end < 0 else text[i + 1 : end].strip()
    m = re.match(r"[^\s$]+", text[i:])
    return m.group(0).rstrip(".,;") if m else None


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


def _clause(text: str, start: int) -> tuple[str, int]:
    """``(answer, end)``: the math at ``start`` up to the end of its sentence (or line), prose
    words trimmed; ``end`` is where the kept text stops. The answer is empty when the clause opens
    with a word (``To answer: we add them``)."""
    m = _SENTENCE_END_RE.search(text, start)
    seg = text[start : m.start() if m else len(text)]
    seg = seg.replace("$", " ") if seg.count("$") % 2 else seg
    if re.match(r"\s*(?:\*\*)?\s*[A-Za-z]{2,}\b", seg):
        return "", start
    p = _PROSE_RE.search(seg)
    if p:
        seg = seg[: p.start()]
    seg = re.sub(r"\s+(?:and|or)\s*$", "", seg)
    return _unwrap(seg), start + len(seg)


def _after_marker(text: str) -> str | None:
    """The answer after the last answer marker that is followed by one."""
    for marker in reversed(list(_MARKER_RE.finditer(text))):
        # "The answer is:\n\n$$13$$" — the answer may open the next non-empty line.
        start = _SPACE_RE.match(text, marker.end()).end()
        ans, _ = _clause(text, start)
        if ans:
            return ans
    return None


def _after_last_equals(text: str) -> str | None:
    """The right-hand side of the last ``=``, if no digit follows it (``8 + 7 = 15``)."""
    equals = list(re.finditer(r"(?<![<>!=\\])=(?!=)", text))
    if not equals:
        return None
    ans, end = _clause(text, equals[-1].end())
    if not ans or re.search(r"\d", text[end:]):
        return None
    return ans


def extract_final_answer(response: str, style: AnswerStyle = "boxed") -> Extraction | None:
    """The stated final answer of ``response`` under an answer style (see the module table).

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
    """
    if style not in ANSWER_STYLES:
        raise ValueError(f"unknown answer style {style!r}; expected one of {', '.join(ANSWER_STYLES)}")
    boxed = last_boxed(response)
    if boxed is not None:
        return Extraction(boxed, "boxed") if boxed else None
    if _BOXED_RE.search(response):
        return None  # the last box is unclosed: the answer was cut off
    if style == "gsm8k":
        hashes = list(_HASHES_RE.finditer(response))
        if hashes:
            line = response[hashes[-1].end() :].split("\n", 1)[0]
            ans = _unwrap(line.replace("$", " ").strip())
            if ans:
                return Extraction(ans, "hashes")
    marker = _after_marker(response)
    if marker:
        return Extraction(marker, "marker")
    eq = _after_last_equals(response)
    if eq:
        return Extraction(eq, "equation")
    if style == "gsm8k":
        numbers = _NUMBER_RE.findall(response)
        if numbers:
            return Extraction(numbers[-1], "final_number")
    return None


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
    parentheses become braces, ``\\dfrac``/``\\tfrac`` become ``\\frac``, unicode minus becomes ``-``.

    >>> normalize_latex(r"4\\sqrt(2) + \\dfrac(1)(3)")
    '4\\\\sqrt{2} + \\\\frac{1}{3}'
    """
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
