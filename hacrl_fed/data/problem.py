"""The unit of training data: one problem with its reference final answer, or one episode of an environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DataError", "Problem"]


class DataError(ValueError):
    """A data file or dataset is missing or has a bad row; the message names the file and line/row."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One math problem.

    Attributes:
        id: unique within its dataset; the ``prompt_id`` on the wire.
        problem: the problem text shown to the model (rendered by ``hacrl_fed.data.prompts``).
        answer: reference final answer (LaTeX where the source uses it), as the verifier expects it.
        answer_style: verifier style, ``boxed`` or ``gsm8k`` (see ``hacrl_fed.reward.extract``).
        source: origin label (``arithmetic-l1``, ``gsm8k``, a verl ``data_source`` …), may be empty.
        episode: a multi-turn environment instance (``hacrl_fed.envs.EpisodeSpec``; docs/multi-turn.md): the
            problem is an episode (``problem`` and ``answer`` empty, ``answer_style`` ``episode``); None otherwise.
    """

    id: str
    problem: str
    answer: str
    answer_style: str = "boxed"
    source: str = ""
    episode: Any = None
