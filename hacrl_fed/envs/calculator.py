"""``calculator``: a reasoning-gym problem solved with a calculator tool, a multi-turn tool-use task.

Configuration: ``{"task": <reasoning-gym generator>, "task_config": {<its arguments>}}``. The problem is item 0
of ``reasoning_gym.create_dataset(task, seed=spec.seed, size=1, **task_config)`` — the generators of the
single-turn task suites (:mod:`hacrl_fed.data.tasks`).

The agent's turn, one message at a time:

* ``<calc>EXPRESSION</calc>`` — the first such call of the message is evaluated
  (:mod:`hacrl_fed.envs.expression`: numbers, ``+ - * / // % **``, unary minus, parentheses, at most 200
  characters) and answered ``<result>VALUE</result>`` or ``<error>WHY</error>``; the episode goes on;
* a final answer in ``\\boxed{...}`` — ends the episode (it wins over a calculator call in the same message):
  the content of the last box is scored by the generator's own scorer (``dataset.score_answer`` with the whole
  item, metadata included: the environment re-creates it from the seed), reward 1.0 for a score of 1, else 0.0;
* anything else — a short reminder of the two forms; the episode goes on.

Deterministic: the problem depends on the task, its config and the seed only; the calculator and the verifier
are pure functions of the text.
"""

from __future__ import annotations

import re
from typing import Any

from hacrl_fed.envs.base import EnvStep, EpisodeSpec
from hacrl_fed.envs.expression import CalcError, evaluate, format_value
from hacrl_fed.envs.params import check_keys, object_param, str_param

__all__ = ["ENV_ID", "INSTRUCTION", "REMINDER", "CalculatorEnv", "make_calculator"]

ENV_ID = "calculator"
INSTRUCTION = (
    "You can use a calculator. To use it, write <calc>EXPRESSION</calc>, for example <calc>(12 + 7) * 3</calc> "
    "(numbers, + - * / // % ** and parentheses; one calculation per message). It answers <result>VALUE</result> "
    "or <error>REASON</error>.\n"
    "When you know the answer, give it as \\boxed{ANSWER}; that ends the task."
)
"""Appended to the question in the first observation."""
REMINDER = "Write <calc>EXPRESSION</calc> to use the calculator, or give your final answer as \\boxed{ANSWER}."
"""The answer to a message with neither a calculator call nor a final answer."""

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_OPEN, _CLOSE = "<calc>", "</calc>"


MAX_ANSWER_CHARS = 200
"""A final answer (the last box's content) longer than this scores 0 unread."""


def _problem(task: str, task_config: dict[str, Any], seed: int) -> tuple[dict[str, Any], Any]:
    """(item 0, its dataset) of ``task`` with ``task_config`` and ``seed``. Raises :class:`ValueError`."""
    from reasoning_gym.factory import DATASETS, create_dataset

    if task not in DATASETS:
        near = sorted(n for n in DATASETS if n[:3] == task[:3])
        similar = f" (similar: {', '.join(near)})" if near else ""
        raise ValueError(f"reasoning-gym has no generator {task!r}{similar}")
    try:
        dataset = create_dataset(task, seed=seed, size=1, **task_config)
        return dataset[0], dataset
    except (TypeError, ValueError, AssertionError, KeyError, IndexError) as err:
        raise ValueError(f"bad task_config for {task!r}: {type(err).__name__}: {' '.join(str(err).split())[:300]}"
                         ) from None


def last_boxed(message: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) of ``message`` with balanced braces, None when
    there is none or it is not closed. Linear time."""
    found = None
    for m in _BOXED.finditer(message):
        i = m.end()
        while i < len(message) and message[i] == " ":
            i += 1
        if i >= len(message) or message[i] != "{":
            continue
        depth, j = 0, i
        while j < len(message):
            depth += {"{": 1, "}": -1}.get(message[j], 0)
            if depth == 0:
                found = message[i + 1:j]
                break
            j += 1
    return found


def _calc_call(message: str) -> tuple[str | None, bool]:
    """``(expression, several)``: the first ``<calc>…</calc>`` of ``message`` (``None`` when there is none or
    it is unclosed) and whether another call follows it. Linear time."""
    start = message.find(_OPEN)
    if start < 0:
        return None, False
    end = message.find(_CLOSE, start + len(_OPEN))
    if end < 0:
        return None, False
    return message[start + len(_OPEN):end], message.find(_OPEN, end) >= 0


class CalculatorEnv:
    """One calculator episode on a reasoning-gym problem (see the module docstring).

    Args:
        task: a reasoning-gym generator name.
        task_config: its arguments (a JSON object).
        seed: the generator seed of the problem.

    Raises :class:`ValueError` for an unknown generator or arguments it refuses.
    """

    def __init__(self, task: str, task_config: dict[str, Any], seed: int) -> None:
        self.item, self.dataset = _problem(task, task_config, seed)
        self.question = str(self.item["question"]).strip()
        self.reference = str(self.item["answer"]).strip()
        if not self.question or not self.reference:
            raise ValueError(f"{task!r} item of seed {seed} has an empty question or answer")
        self._done = False

    def reset(self) -> str:
        """The question followed by :data:`INSTRUCTION`."""
        self._done = False
        return f"{self.question}\n\n{INSTRUCTION}"

    def step(self, message: str) -> EnvStep:
        """Answer one agent message (see the module docstring). Raises :class:`RuntimeError` after the end."""
        if self._done:
            raise RuntimeError("the episode is over")
        if _BOXED.search(message):
            self._done = True
            answer = last_boxed(message)
            correct = answer is not None and len(answer) <= MAX_ANSWER_CHARS and self._score(answer.strip()) == 1.0
            return EnvStep(f"Final answer received: {'correct' if correct else 'incorrect'}.", True,
                           1.0 if correct else 0.0)
        expression, several = _calc_call(message)
        if expression is None:
            return EnvStep(REMINDER, False, 0.0)
        try:
            text = f"<result>{format_value(evaluate(expression))}</result>"
        except CalcError as err:
            text = f"<error>{err}</error>"
        if several:
            text += "\n(Only the first <calc> of a message is evaluated.)"
        return EnvStep(text, False, 0.0)


    def _score(self, answer: str) -> float:
        """The generator's own score of ``answer`` (0.0 when the scorer fails on it)."""
        try:
            return float(self.dataset.score_answer(answer, self.item))
        except Exception:  # noqa: BLE001 - a scorer that chokes on a hostile answer scores it 0
            return 0.0


def make_calculator(spec: EpisodeSpec) -> CalculatorEnv:
    """The calculator episode of ``spec`` (config keys ``task``, ``task_config``). Raises :class:`ValueError`."""
    check_keys(spec.config, ("task", "task_config"))
    return CalculatorEnv(str_param(spec.config, "task", 64), object_param(spec.config, "task_config"), spec.seed)
