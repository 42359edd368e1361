"""A toy answer style (docs/extending.md, "An answer style"): the answer follows the last ``=>``.

The whole extension is this module plus one registration line::

    ANSWER_STYLES.register("arrow", "toy_style:extract")
"""

from __future__ import annotations


def extract(response: str) -> str | None:
    """The text after the last ``=>`` up to the end of its line, or None when there is none."""
    head, arrow, tail = response.rpartition("=>")
    if not arrow:
        return None
    return tail.split("\n", 1)[0].strip() or None
