"""Built-in, seeded arithmetic word problems (the default dataset: no data files needed).

Levels (integer, non-negative answers only):

1. one operation on single digits: ``Calculate 9 + 4.`` (all 230 such problems exist);
2. one operation on two-digit numbers: ``Calculate 47 + 38.``, ``Calculate 84 / 7.``;
3. two operations with precedence or parentheses: ``Calculate 12 + 7 * 3.``;
4. one- or two-step word problems: ``Tom has 12 apples. He buys 7 more. How many …``;
5. three-step word problems with larger numbers (shopping change, packing, buses, savings).

Problems are identified by their *math* (template and numbers, not the names or items in the
text), so two problems never differ only in wording; ids are a hash of that key, identical for
every seed. Everything is deterministic per ``(difficulty, seed)``.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterator

from hacrl_fed.data.problem import Problem

__all__ = ["LEVELS", "generate", "iter_problems", "level_one_problems", "reword"]

LEVELS = (1, 2, 3, 4, 5)
_MAX_DUPLICATE_RUN = 2000  # consecutive repeats after which a level counts as exhausted

_NAMES = [("Tom", "he"), ("Sara", "she"), ("Liam", "he"), ("Mia", "she"), ("Noah", "he"), ("Emma", "she"),
          ("Omar", "he"), ("Lena", "she"), ("Ravi", "he"), ("Ana", "she"), ("Kenji", "he"), ("Zoe", "she")]
_ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "books", "cards", "shells", "stamps", "eggs"]

Draw = tuple[str, tuple[int, ...], str, int]  # (template, numbers, text, answer)


def _problem(level: int, template: str, numbers: tuple[int, ...], text: str, answer: int) -> Problem:
    key = f"{level}|{template}|{','.join(map(str, numbers))}"
    pid = f"arith-l{level}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    return Problem(id=pid, problem=text, answer=str(answer), answer_style="boxed", source=f"arithmetic-l{level}")


def level_one_problems() -> list[Problem]:
    """Every level-1 problem, in a fixed order: a ∘ b with a, b ∈ 1..9, non-negative exact results."""
    out = []
    for a in range(1, 10):
        for b in range(1, 10):
            out.append(_problem(1, "+", (a, b), f"Calculate {a} + {b}.", a + b))
            out.append(_problem(1, "*", (a, b), f"Calculate {a} * {b}.", a * b))
            if a >= b:
                out.append(_problem(1, "-", (a, b), f"Calculate {a} - {b}.", a - b))
            if a % b == 0:
                out.append(_problem(1, "/", (a, b), f"Calculate {a} / {b}.", a // b))
    return out


def _level2(rng: random.Random) -> Draw:
    op = rng.choice("+-*/")
    if op == "+":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return op, (a, b), f"Calculate {a} + {b}.", a + b
    if op == "-":
        a, b = sorted((rng.randint(10, 99), rng.randint(10, 99)), reverse=True)
        return op, (a, b), f"Calculate {a} - {b}.", a - b
    if op == "*":
        a, b = rng.randint(10, 99), rng.randint(2, 9)
        return op, (a, b), f"Calculate {a} * {b}.", a * b
    q, b = rng.randint(10, 99), rng.randint(2, 9)
    return op, (q * b, b), f"Calculate {q * b} / {b}.", q


_LEVEL3_FORMS: list[tuple[str, Callable[[int, int, int], int]]] = [
    ("{a} + {b} * {c}", lambda a, b, c: a + b * c),
    ("{a} * {b} - {c}", lambda a, b, c: a * b - c),
    ("({a} + {b}) * {c}", lambda a, b, c: (a + b) * c),
    ("{a} * ({b} - {c})", lambda a, b, c: a * (b - c)),
    ("{a} - {b} + {c}", lambda a, b, c: a - b + c),
    ("{a} + {b} - {c}", lambda a, b, c: a + b - c),
    ("{a} * {b} + {c}", lambda a, b, c: a * b + c),
]


def _level3(rng: random.Random) -> Draw:
    while True:
        form, fn = rng.choice(_LEVEL3_FORMS)
        a, b, c = rng.randint(2, 20), rng.randint(2, 20), rng.randint(2, 20)
        value = fn(a, b, c)
        if value >= 0:
            return form, (a, b, c), "Calculate " + form.format(a=a, b=b, c=c) + ".", value


def _level4(rng: random.Random) -> Draw:
    (name, he), item = rng.choice(_NAMES), rng.choice(_ITEMS)
    He = he.capitalize()
    kind = rng.choice(["add", "sub", "mul", "div", "two_step"])
    if kind == "add":
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        text = f"{name} has {a} {item}. {He} buys {b} more. How many {item} does {name} have now?"
        return kind, (a, b), text, a + b
    if kind == "sub":
        a = rng.randint(5, 50)
        b = rng.randint(1, a - 1)
        text = f"{name} has {a} {item}. {He} gives {b} to a friend. How many {item} does {name} have left?"
        return kind, (a, b), text, a - b
    if kind == "mul":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return kind, (a, b), f"A box holds {a} {item}. How many {item} are in {b} boxes?", a * b
    if kind == "div":
        q, b = rng.randint(2, 12), rng.randint(2, 9)
        text = f"{name} shares {q * b} {item} equally among {b} friends. How many {item} does each friend get?"
        return kind, (q * b, b), text, q
    a, b, c = rng.randint(2, 30), rng.randint(2, 6), rng.randint(2, 10)
    text = (f"{name} has {a} {item}. {He} buys {b} bags with {c} {item} in each bag. "
            f"How many {item} does {name} have now?")
    return kind, (a, b, c), text, a + b * c


def _level5(rng: random.Random) -> Draw:
    name, he = rng.choice(_NAMES)
    kind = rng.choice(["change", "eggs", "bus", "savings", "garden"])
    if kind == "change":
        p, q, a, b = rng.randint(2, 9), rng.randint(3, 15), rng.randint(2, 9), rng.randint(2, 9)
        cost = p * a + q * b
        bill = 50 if cost < 50 else 100 if cost < 100 else 200
        text = (f"A shop sells pens for ${p} each and notebooks for ${q} each. {name} buys {a} pens and {b} "
                f"notebooks and pays with a ${bill} bill. How much change does {he} get, in dollars?")
        return kind, (p, q, a, b, bill), text, bill - cost
    if kind == "eggs":
        k, boxes, price = rng.choice([6, 10, 12]), rng.randint(5, 30), rng.randint(2, 6)
        spend = rng.randint(1, boxes * price - 1)
        text = (f"A farmer collects {k * boxes} eggs. He packs them into boxes of {k} and sells each box for "
                f"${price}. He spends ${spend} on feed. How many dollars does he have left?")
        return kind, (k, boxes, price, spend), text, boxes * price - spend
    if kind == "bus":
        a = rng.randint(20, 80)
        b = rng.randint(1, a)
        c = rng.randint(0, 40)
        d = rng.randint(0, a - b + c)
        text = (f"A bus has {a} passengers. At the first stop {b} people get off and {c} get on. "
                f"At the second stop {d} people get off. How many passengers are on the bus now?")
        return kind, (a, b, c, d), text, a - b + c - d
    if kind == "savings":
        a, w = rng.randint(5, 40), rng.randint(3, 12)
        b = rng.randint(1, a * w)
        text = (f"{name} saves ${a} each week for {w} weeks, then spends ${b} on a gift. "
                f"How many dollars does {he} have left?")
        return kind, (a, w, b), text, a * w - b
    r, c, k = rng.randint(2, 12), rng.randint(3, 15), rng.randint(1, 6)
    d = rng.randint(0, (r + k) * c)
    text = (f"A garden has {r} rows with {c} plants in each row. {name} adds {k} more rows of the same size, "
            f"then removes {d} plants. How many plants are in the garden now?")
    return kind, (r, c, k, d), text, (r + k) * c - d


_SAMPLERS: dict[int, Callable[[random.Random], Draw]] = {2: _level2, 3: _level3, 4: _level4, 5: _level5}


def _check_level(difficulty: int) -> None:
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty must be one of {LEVELS}, got {difficulty!r}")


def iter_problems(difficulty: int, seed: int | str = 0) -> Iterator[Problem]:
    """Distinct problems of one level in a seeded order, until the level is exhausted.

    Level 1 is a seeded permutation of :func:`level_one_problems`; higher levels are sampled and
    deduplicated by their math key (the iterator ends after a long run of repeats).
    Raises ``ValueError`` for an unknown level.
    """
    _check_level(difficulty)
    rng = random.Random(f"hacrl-arith:{difficulty}:{seed}")
    if difficulty == 1:
        pool = level_one_problems()
        rng.shuffle(pool)
        yield from pool
        return
    seen: set[str] = set()
    repeats = 0
    draw = _SAMPLERS[difficulty]
    while repeats < _MAX_DUPLICATE_RUN:
        template, numbers, text, answer = draw(rng)
        p = _problem(difficulty, template, numbers, text, answer)
        if p.id in seen:
            repeats += 1
            continue
        repeats = 0
        seen.add(p.id)
        yield p


def generate(n: int, difficulty: int = 1, seed: int | str = 0) -> list[Problem]:
    """``n`` distinct arithmetic problems of one level, deterministic per ``(difficulty, seed)``.

    Raises ``ValueError`` for ``n < 0``, an unknown level, or more problems than the level has
    (level 1 has 230).

    >>> [p.problem for p in generate(2, difficulty=1, seed=0)] == [p.problem for p in generate(2, 1, 0)]
    True
    >>> generate(1, difficulty=4, seed=3)[0].answer.isdigit()
    True
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    out = []
    for p in iter_problems(difficulty, seed):
        if len(out) == n:
            break
        out.append(p)
    if len(out) < n:
        raise ValueError(f"arithmetic level {difficulty} has only {len(out)} distinct problems, {n} requested")
    return out


_WORDINGS = {
    "+": "What is the sum of {a} and {b}?",
    "-": "What do you get when you subtract {b} from {a}?",
    "*": "What is the product of {a} and {b}?",
    "/": "What is {a} divided by {b}?",
}
_CALCULATE = re.compile(r"^Calculate (\d+) ([-+*/]) (\d+)\.$")


def reword(problem: Problem) -> Problem:
    """The same one-operation problem in other words (``Calculate 7 + 5.`` → ``What is the sum of 7 and 5?``).

    An evaluation set of another wording: accuracy on it counts arithmetic, not the training prompt's
    format. Same answer, id ``<id>-words``, source ``<source>-words``. Raises ``ValueError`` for a problem
    that is not of the form ``Calculate a ∘ b.`` (levels 1–2).
    """
    m = _CALCULATE.match(problem.problem)
    if m is None:
        raise ValueError(f"problem {problem.id!r} is not a one-operation 'Calculate a op b.' problem")
    a, op, b = m.groups()
    return Problem(id=f"{problem.id}-words", problem=_WORDINGS[op].format(a=a, b=b), answer=problem.answer,
                   answer_style=problem.answer_style, source=f"{problem.source}-words")
