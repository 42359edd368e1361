"""Scorers of procedural tasks (``reasoning-gym``) for answers that are not a number.

A ``task:<name>`` answer style (:func:`hacrl_fed.reward.extract.task_of_style`) means: the answer is the
content of the response's last ``\\boxed{}``, and it is scored by the ``score_answer`` of the
``reasoning-gym`` dataset ``<name>`` against the reference, with the entry ``{"question": problem,
"answer": reference, "metadata": {}}``. Only the reference and the problem travel in a round plan, so only
tasks whose scorer needs no metadata can be used this way; :func:`hacrl_fed.data.tasks.load_task_problems`
checks that for every configured task before a run starts.

The reward is binary, as the rest of the verifier's: correct when the task's score is 1 (reasoning-gym's
default scorer gives partial credit ``len(reference) / len(answer)`` to an answer that merely contains the
reference, e.g. ``Friday, I think``; that is incorrect here). Numbers go to math-verify instead
(:func:`hacrl_fed.data.tasks.answer_style_for`).

Runs inside the verifier's killable process pool like every check (:class:`hacrl_fed.reward.Verifier`): a
scorer that loops on hostile text is killed at the CPU limit. ``reasoning_gym`` is imported on first use
(≈ 1.5 CPU-s), once per verifier process.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from hacrl_fed.reward.verdict import Verdict

__all__ = ["MAX_TASK_ANSWER_CHARS", "check_task_answer", "task_scorer"]

MAX_TASK_ANSWER_CHARS = 2000
"""Longer boxed answers or references are not scored (``verifier_error`` for a reference, ``incorrect`` for an
answer): a scorer's CPU time then stays small."""

_WRAPPER = re.compile(r"^\\(?:text|mathrm|textbf|mathbf|texttt)\{(.*)\}$", re.DOTALL)


@lru_cache(maxsize=None)
def task_scorer(task: str) -> Any | None:
    """The reasoning-gym dataset object whose ``score_answer`` scores ``task`` (one per process), or ``None``
    when no dataset of that name exists. Raises ``ImportError`` when ``reasoning_gym`` is not installed."""
    from reasoning_gym.factory import DATASETS, create_dataset

    if task not in DATASETS:
        return None
    return create_dataset(task, seed=0, size=1)


def _unwrap(answer: str) -> str:
    """``\\text{Friday}`` → ``Friday``: one outer text-formatting command around the whole box is removed."""
    m = _WRAPPER.match(answer.strip())
    return (m.group(1) if m else answer).strip()


def check_task_answer(answer: str | None, reference: str, task: str, problem: str | None = None) -> Verdict:
    """Verdict of one extracted ``answer`` (the last box's content, ``None`` when there is none) for ``task``.

    ``verifier_error`` for an unknown task, a reference that is empty or too long, or a scorer that raises;
    ``incorrect`` for no answer, an over-long answer or a score below 1; ``correct`` for a score of 1.
    """
    if not reference.strip() or len(reference) > MAX_TASK_ANSWER_CHARS:
        return Verdict.error("reference_empty" if not reference.strip() else "reference_too_complex")
    if answer is None:
        return Verdict.incorrect("no_final_answer")
    if len(answer) > MAX_TASK_ANSWER_CHARS:
        return Verdict.incorrect("answer_too_long", answer[:200])
    try:
        scorer = task_scorer(task)
    except ImportError:
        return Verdict.error("task_scorer_unavailable")
    if scorer is None:
        return Verdict.error("unknown_task")
    stated = _unwrap(answer)
    entry = {"question": problem or "", "answer": reference.strip(), "metadata": {}}
    try:
        score = float(scorer.score_answer(stated, entry))
    except Exception:  # noqa: BLE001 - a third-party scorer may raise anything; the item is an error, not a crash
        return Verdict.error("task_scorer_failed", stated[:200])
    return Verdict.correct("match", stated) if score >= 1.0 else Verdict.incorrect("mismatch", stated)
