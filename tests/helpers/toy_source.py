"""A toy task source (docs/extending.md, "A task source"): "What is a times b?" problems.

The whole extension is this module plus one registration line::

    DATA_SOURCES.register("toy_products", "toy_source:load")
"""

from __future__ import annotations

from hacrl_fed.data.problem import DataError, Problem


def load(cfg) -> tuple[list[Problem], list[Problem]]:
    """``(train, held_out)``: ``data.options.count`` products (default 12) of one-digit numbers, the first
    ``data.eval_size`` held out, each in the run's answer style."""
    count = cfg.options.get("count", 12)
    if not isinstance(count, int) or not 1 <= count <= 81:
        raise DataError(f"data.options.count must be an integer in 1..81, got {count!r}")
    problems = [Problem(f"toy-{a}x{b}", f"What is {a} times {b}?", str(a * b), cfg.answer_style, "toy")
                for a in range(1, 10) for b in range(1, 10)][:count]
    held = problems[:min(cfg.eval_size, count - 1)]
    return problems[len(held):], held
