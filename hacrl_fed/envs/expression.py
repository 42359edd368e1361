"""A safe, bounded arithmetic evaluator: the calculator tool's engine.

An expression is parsed with :mod:`ast` (never ``eval``/``exec``) and only these nodes are evaluated: integer
and decimal literals, ``+ - * / // % **``, unary ``-`` and ``+``, parentheses. Everything else — names, calls,
attributes, strings, comparisons, ``^`` — is refused with a :class:`CalcError` saying what is not supported.
Bounds keep every evaluation small: at most :data:`MAX_EXPRESSION_CHARS` characters, exponents at most
:data:`MAX_EXPONENT` in magnitude, every intermediate value at most :data:`MAX_MAGNITUDE` in magnitude
(checked before a power is computed), so ``9**9**9`` or ``10**64**64`` fail at once.

Integers stay exact; ``/`` gives an integer when the division is exact and a float otherwise. Results are
written by :func:`format_value`: integers in full, floats with 12 significant digits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

__all__ = ["MAX_EXPONENT", "MAX_EXPRESSION_CHARS", "MAX_MAGNITUDE", "CalcError", "evaluate", "format_value"]

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**100
_MAX_DEPTH = 100

Number = int | float


class CalcError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message is meant for the agent."""


def _check(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalcError("the result is too large (more than 1e100 in magnitude)")
    return value


def _divide(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _floordiv(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("division by zero")
    return a // b


def _mod(a: Number, b: Number) -> Number:
    if b == 0:
        raise CalcError("modulo by zero")
    return a % b


def _power(a: Number, b: Number) -> Number:
    if abs(b) > MAX_EXPONENT:
        raise CalcError(f"the exponent {format_value(b)} is too large (at most {MAX_EXPONENT} in magnitude)")
    if a == 0 and b < 0:
        raise CalcError("division by zero (0 to a negative power)")
    if a < 0 and isinstance(b, float) and not b.is_integer():
        raise CalcError("a negative number to a fractional power is not a real number")
    if abs(a) > 1 and b > 0 and b * math.log10(abs(a)) > 100:
        raise CalcError("the result is too large (more than 1e100 in magnitude)")
    if isinstance(a, int) and isinstance(b, int) and b < 0:
        return _divide(1, a ** (-b))
    try:
        return a**b
    except (OverflowError, ZeroDivisionError) as err:
        raise CalcError(f"cannot compute the power: {err}") from None


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: _divide,
    ast.FloorDiv: _floordiv, ast.Mod: _mod, ast.Pow: _power,
}
_UNARY: dict[type, Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval(node: ast.AST, depth: int) -> Number:
    if depth > _MAX_DEPTH:
        raise CalcError("the expression is nested too deeply")
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, depth + 1), _eval(node.right, depth + 1)
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _check(_UNARY[type(node.op)](_eval(node.operand, depth + 1)))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalcError("'^' is not supported; write powers with **")
    what = type(getattr(node, "op", node)).__name__
    raise CalcError(f"unsupported element: {what} (only numbers, + - * / // % **, unary minus and parentheses)")


def evaluate(expression: str) -> Number:
    """The value of ``expression`` (an ``int`` or a finite ``float``, at most 1e100 in magnitude).

    Raises :class:`CalcError` for an expression longer than :data:`MAX_EXPRESSION_CHARS`, a syntax error, an
    unsupported element, a division by zero or a bound exceeded.

    >>> evaluate("(12 + 7) * 3 - 2**10 // 3")
    -284
    >>> evaluate("7 / 2")
    3.5
    """
    if not isinstance(expression, str):
        raise CalcError("the expression must be text")
    text = expression.strip()
    if not text:
        raise CalcError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError("syntax error") from None
    try:
        return _eval(tree.body, 0)
    except RecursionError:
        raise CalcError("the expression is nested too deeply") from None


def format_value(value: Number) -> str:
    """``value`` as the calculator writes it: integers in full, floats with 12 significant digits (an integral
    float without a fraction part).

    >>> format_value(10**20), format_value(1 / 3), format_value(2.0), format_value(1e-7)
    ('100000000000000000000', '0.333333333333', '2', '1e-07')
    """
    if isinstance(value, int):
        return str(value)
    text = format(value, ".12g")
    return "0" if text == "-0" else text
