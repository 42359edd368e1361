"""Answer comparison with math-verify, hardened against its known false positives.

:func:`check_answer` is the whole per-item decision. It has **no timeout** of its own (math-verify's
signal-based timeouts only work in a process's main thread, so they are disabled here); run it
through :class:`hacrl_fed.reward.Verifier`, which executes it in worker processes that are killed
when they exceed the deadline. Call it directly only on trusted input (doctests, debugging).

Fixes over plain ``math_verify.parse``/``verify`` (each a *kind* of false positive):

* **stated answers only** — the answer is extracted first (:mod:`hacrl_fed.reward.extract`); a
  response that echoes the problem has no answer, and for a numeric reference the answer must be a
  written-out number, not an unevaluated expression (``9 + 4`` for 13).
* **restated problem** — with the problem text given, an answer that is a piece of the problem
  containing an operator (``(x+2)(x+3)`` for "Expand (x+2)(x+3)") is incorrect.
* **equations** — both sides are parsed as ``\\boxed{...}`` so ``3x-y+13=0`` stays an equation
  (raw strings collapse to the last side, ``0``).
* **tiny values** — math-verify compares numbers after rounding to 6 decimals / chopping, so
  ``1/2004!`` equals ``1/2006!``. A private copy of ``math_verify.grader`` gets a numeric comparator
  that is exact for exact numbers and relative (``REL_TOL``) when a float is involved.
* **malformed LaTeX** — ``\\sqrt(2)`` / ``\\frac(a)(b)`` are repaired; unbalanced braces or
  absurd nesting in the reference are ``verifier_error``, never correct.
* **pathological sizes** — a parsed expression whose exact value would need more than :data:`MAX_DIGITS`
  digits (a power tower, ``(10!)^{(10!)^{(10!)}}``, a huge factorial, an exponent chain) is cut before the
  symbolic comparison, which would spend the verifier's whole CPU limit on it (:func:`exact_size`: a bound read
  off the unevaluated tree, linear in its size): ``verifier_error`` ``reference_too_large`` for a reference,
  ``incorrect`` ``answer_too_large`` for an answer.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import re
import threading
from types import ModuleType

from hacrl_fed.reward.extract import (
    extract_final_answer,
    is_numeric_literal,
    max_nesting,
    normalize_latex,
    reference_answer,
    registered_style,
    task_of_style,
)
from hacrl_fed.reward.task_scorers import check_task_answer
from hacrl_fed.protocol.episodes import EPISODE_STYLE
from hacrl_fed.reward.episode_check import check_episode
from hacrl_fed.reward.verdict import Verdict

__all__ = ["MAX_ANSWER_CHARS", "MAX_DIGITS", "MAX_NESTING", "REL_TOL", "check_answer", "exact_size", "strict_grader",
           "warm_up"]

REL_TOL = 1e-6
"""Relative tolerance when a float takes part (``0.333333`` = 1/3; ``1234568.0`` ≠ 1234567)."""
EXACT_REL_TOL = 1e-20
"""Exact numbers are compared at 50 significant digits; equal up to this relative difference."""
MAX_NESTING = 50
"""Deeper ``{([`` nesting is refused before parsing (``verifier_error``)."""
MAX_ANSWER_CHARS = 2000
"""Longer answers/references are refused before parsing (``verifier_error``)."""
MAX_DIGITS = 100_000
"""Largest exact size (decimal digits of numerators, denominators and exponents, :func:`exact_size`) compared
symbolically; 20000! (77 338 digits) still is, ``2^{10!}`` (≈ 10⁶ digits) is not."""

_GRADER: ModuleType | None = None
_GRADER_LOCK = threading.Lock()


def _strict_numeric_eq(grader: ModuleType):
    """Build the replacement for ``grader.sympy_numeric_eq`` (same signature)."""
    import sympy
    from sympy import Float, Integer, Number
    from sympy.matrices import MatrixBase
    from sympy.matrices.expressions import MatrixExpr

    doit, pct_val, atomic = grader.safe_sympy_doit, grader.get_pct_val, grader.is_atomic_or_pct_atomic

    def close(x, y, tol: float) -> bool:
        try:
            xv, yv = sympy.N(x, 50), sympy.N(y, 50)
            if not (xv.is_number and yv.is_number) or xv.has(sympy.nan, sympy.zoo) or yv.has(sympy.nan):
                return False
            exact = x - y  # exact numbers: sympy combines terms, so 2004! + 2 - (2004! + 1) is the Integer 1
            if exact.is_Rational:
                return exact == 0 or (tol > EXACT_REL_TOL and bool(abs(exact) <= tol * max(abs(xv), abs(yv))))
            diff = abs(sympy.N(exact, 50))  # evalf of the difference raises precision where terms cancel
            if diff == 0:
                return True
            return bool(diff <= tol * max(abs(xv), abs(yv)) * (1 + 1e-9))
        except (TypeError, ValueError, ArithmeticError):
            return False

    def values(x):
        pct = pct_val(x)
        return [doit(x)] + ([pct] if pct is not None else [])

    def numeric_eq(a, b, float_rounding: int, numeric_precision: int) -> bool:
        if isinstance(a, (MatrixBase, MatrixExpr)) and isinstance(b, (MatrixBase, MatrixExpr)):
            a, b = doit(a), doit(b)
            if isinstance(a, MatrixBase) and isinstance(b, MatrixBase) and a.shape == b.shape:
                pairs = zip(a.flat(), b.flat(), strict=True)
                return all(numeric_eq(x, y, float_rounding, numeric_precision) for x, y in pairs)
            return False
        if atomic(a, Number) or atomic(b, Number):
            if atomic(a, Float) or atomic(b, Float):
                for x in values(a):
                    for y in values(b):
                        ints = [v for v in (x, y) if isinstance(v, Integer)]
                        flts = [v for v in (x, y) if isinstance(v, Float)]
                        if ints and flts and flts[0] - int(flts[0]) == 0:
                            if ints[0] == int(flts[0]):  # 13 vs 13.0: exact, never 1234567 vs 1234568.0
                                return True
                        elif close(x, y, REL_TOL):
                            return True
                return False
            if atomic(a, Integer) and atomic(b, Integer):
                return pct_val(a, a) == pct_val(b, b)
            return doit(a) == doit(b)
        try:
            if a.is_number and b.is_number:
                return close(a, b, REL_TOL if (a.has(Float) or b.has(Float)) else EXACT_REL_TOL)
            return (a - b).evalf(n=numeric_precision) == 0  # no chop: x + 1e-30 ≠ x
        except Exception:  # noqa: BLE001 - sympy raises many types on odd inputs
            return False

    return numeric_eq


def strict_grader() -> ModuleType:
    """A private copy of ``math_verify.grader`` whose numeric comparator is :data:`REL_TOL`-relative
    and exact for exact numbers. The installed ``math_verify`` module is left untouched."""
    global _GRADER
    with _GRADER_LOCK:
        if _GRADER is None:
            spec = importlib.util.find_spec("math_verify.grader")
            if spec is None or spec.loader is None:
                raise ImportError("math-verify is required for answer verification: pip install 'math-verify>=0.8'")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            mod.sympy_numeric_eq = _strict_numeric_eq(mod)
            mod.TIMEOUT_WARNING_SHOWN = True
            _GRADER = mod
    return _GRADER


def _parse(text: str):
    from math_verify import parse

    return parse("\\boxed{" + text + "}", parsing_timeout=None)


def warm_up() -> None:
    """Import and exercise math-verify/sympy once (a worker's start-up, so the first item's
    deadline is not spent on imports). Silences math-verify's "timeout disabled" warning."""
    import math_verify.parser as mv_parser

    mv_parser.TIMEOUT_WARNING_SHOWN = True
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    strict_grader().verify(_parse("\\frac{1}{2}"), _parse("0.5"), timeout_seconds=None)


def _balanced(text: str) -> bool:
    depth = 0
    skip = False
    for c in text:
        if skip:
            skip = False
        elif c == "\\":
            skip = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _squash(text: str) -> str:
    text = text.lower().replace("\\left", "").replace("\\right", "").replace("\\dfrac", "\\frac")
    text = re.sub(r"\\times|\\cdot|×|·", "*", text)
    return re.sub(r"[\s$]+|\\[,;!]", "", text)


def _restates_problem(answer: str, reference: str, problem: str) -> bool:
    a, p = _squash(answer), _squash(problem)
    return (
        len(a) >= 3
        and re.search(r"[-+*/^()]|\\[a-z]", a) is not None
        and a in p
        and _squash(reference) not in p
    )


def exact_size(expr, depth: int = 0) -> float:
    """An upper bound on the decimal digits an exact evaluation of the unevaluated sympy ``expr`` needs (its
    integers, numerators, denominators and powers together); ``inf`` beyond :data:`MAX_DIGITS` or nested more
    than 4 × :data:`MAX_NESTING`. A symbol counts 1 digit, a power ``b^e`` with an integer-valued exponent
    |e| × size(b) (a sum of k terms with symbols: the C(|e|+k−1, k−1) monomials of its expansion × size(b)), a
    factorial n! log₁₀ n! (Stirling), any other node the sum of its arguments. Linear in the tree."""
    import sympy

    inf = math.inf
    if depth > 4 * MAX_NESTING:
        return inf
    if isinstance(expr, sympy.Integer):
        return max(1.0, math.log10(abs(int(expr)) + 1))
    if isinstance(expr, sympy.Rational):
        return exact_size(sympy.Integer(expr.p)) + exact_size(sympy.Integer(expr.q))
    if isinstance(expr, sympy.Float):
        return 20.0 + abs(expr._mpf_[2]) * 0.30103 if expr._mpf_[1] else 1.0
    if isinstance(expr, sympy.factorial):
        n = _value_bound(expr.args[0], depth)
        return inf if n > 10**7 else max(1.0, math.lgamma(n + 1) / math.log(10))
    if isinstance(expr, sympy.Pow):
        base, power = expr.args
        size_base = exact_size(base, depth + 1)
        if base in (sympy.S.Zero, sympy.S.One, sympy.S.NegativeOne):
            return size_base + exact_size(power, depth + 1)
        if isinstance(power, sympy.Rational) and not isinstance(power, sympy.Integer):   # a root: as the base
            return size_base * max(1, abs(power.p)) + exact_size(power, depth + 1)
        times = _value_bound(power, depth)
        if isinstance(base, sympy.Add) and base.free_symbols and times < 10**6:   # a polynomial's expansion:
            times = math.comb(int(times) + len(base.args) - 1, len(base.args) - 1)  # its monomials
        return inf if times * size_base > MAX_DIGITS else times * size_base
    total = sum(exact_size(a, depth + 1) for a in getattr(expr, "args", ()) if isinstance(a, sympy.Basic)) or 1.0
    return inf if total > MAX_DIGITS else total


def _value_bound(expr, depth: int) -> float:
    """An upper bound on |value| of ``expr`` (10 ^ its :func:`exact_size`; the exact value for an integer)."""
    import sympy

    if isinstance(expr, sympy.Integer):
        return float(abs(int(expr))) if abs(int(expr)) < 10**300 else math.inf
    size = exact_size(expr, depth + 1)
    return math.inf if size > 300 else 10.0 ** size


def _too_large(parsed) -> bool:
    """Whether any sympy expression of a math-verify parse result is beyond :data:`MAX_DIGITS`."""
    import sympy

    return any(isinstance(e, sympy.Basic) and exact_size(e) > MAX_DIGITS for e in parsed)


def _too_complex(text: str) -> bool:
    return len(text) > MAX_ANSWER_CHARS or max_nesting(text) > MAX_NESTING


def check_answer(response: str, reference: str, style: str = "boxed", problem: str | None = None) -> Verdict:
    """Verify one response against one reference answer (reference first, as math-verify wants).

    Args:
        response: the model's response text.
        reference: the reference final answer (or a worked solution with ``\\boxed{}``/``####``).
        style: ``boxed`` (a stated answer is required) or ``gsm8k`` (also ``####`` and the final
            number), see :mod:`hacrl_fed.reward.extract`; ``task:<name>``: the last box scored by that
            procedural task's scorer (:func:`hacrl_fed.reward.task_scorers.check_task_answer`); another registered
            style: its ``extract``, then its own ``check(answer, reference, problem)`` if it has one, else the
            comparison below.
        problem: the problem text, enabling the restated-problem check.
        (style ``episode``: ``response`` is a trajectory and ``reference`` an environment instance, replayed by
        :func:`hacrl_fed.reward.episode_check.check_episode`.)

    Returns a :class:`Verdict`; raises ``ValueError`` only for an unknown style. No timeout: see
    the module docstring.

    >>> check_answer("To calculate 9 + 4, we need to add 9 and 4.", "13").reason
    'no_final_answer'
    >>> check_answer("8 + 7 = 15", "15").verdict
    'correct'
    >>> check_answer(r"\\boxed{\\frac{1}{2006!}}", r"\\frac{1}{2004!}").verdict
    'incorrect'
    """
    if style == EPISODE_STYLE:  # a multi-turn episode, verified by replay (hacrl_fed.reward.episode_check)
        return check_episode(response, reference)
    task = task_of_style(style)
    if task is not None:  # a procedural task's own scorer (hacrl_fed.reward.task_scorers)
        found = extract_final_answer(response, style)
        return check_task_answer(None if found is None else found.answer, reference, task, problem)
    own_check = getattr(registered_style(style), "check", None)
    if callable(own_check):  # a registered style with its own checker (docs/extending.md)
        found = extract_final_answer(response, style)
        verdict = own_check(None if found is None else found.answer, reference, problem)
        return verdict if isinstance(verdict, Verdict) else Verdict.error("checker_returned_no_verdict")
    ref = normalize_latex(reference_answer(reference))
    if not ref:
        return Verdict.error("reference_empty")
    if _too_complex(ref):
        return Verdict.error("reference_too_complex")
    if not _balanced(ref):
        return Verdict.error("reference_malformed")
    gold = _parse(ref)
    if not gold:
        return Verdict.error("reference_unparseable")
    if _too_large(gold):
        return Verdict.error("reference_too_large")
    found = extract_final_answer(response, style)  # type: ignore[arg-type]
    if found is None:
        return Verdict.incorrect("no_final_answer")
    ans = normalize_latex(found.answer)
    if _too_complex(ans):
        return Verdict.error("answer_too_complex", ans[:200])
    if not _balanced(ans):
        return Verdict.incorrect("answer_malformed", ans)
    if is_numeric_literal(ref) and not is_numeric_literal(ans):
        return Verdict.incorrect("unevaluated_expression", ans)
    if problem and _restates_problem(ans, ref, problem):
        return Verdict.incorrect("restates_problem", ans)
    pred = _parse(ans)
    if not pred:
        return Verdict.incorrect("answer_unparseable", ans)
    if _too_large(pred):
        return Verdict.incorrect("answer_too_large", ans)
    if strict_grader().verify(gold, pred, timeout_seconds=None):
        return Verdict.correct("match", ans)
    return Verdict.incorrect("mismatch", ans)
