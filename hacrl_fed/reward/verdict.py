"""The verifier's tri-state verdict (wire enum ``hacrl_fed.v1.Verdict``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VerdictKind = Literal["correct", "incorrect", "verifier_error"]

#: Verdict kind → name of the ``hacrl_fed.v1.Verdict`` enum value
#: (``rollout_pb2.Verdict.Value(VERDICT_PROTO_NAMES[v.verdict])``).
VERDICT_PROTO_NAMES: dict[str, str] = {
    "correct": "CORRECT",
    "incorrect": "INCORRECT",
    "verifier_error": "VERIFIER_ERROR",
}

__all__ = ["VERDICT_PROTO_NAMES", "Verdict", "VerdictKind"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of verifying one response against one reference answer.

    Attributes:
        verdict: ``correct`` (reward 1), ``incorrect`` (reward 0) or ``verifier_error``
            (reward 0, counted separately: timeout, crash, unparseable or hostile reference).
        reward: 1.0 for ``correct``, else 0.0.
        reason: short machine-readable cause, e.g. ``match``, ``mismatch``, ``no_final_answer``,
            ``unevaluated_expression``, ``restates_problem``, ``reference_unparseable``, ``timeout``.
        extracted: the stated final answer the verdict was based on (``None`` if none was found).
    """

    verdict: VerdictKind
    reward: float
    reason: str
    extracted: str | None = None

    @classmethod
    def correct(cls, reason: str = "match", extracted: str | None = None) -> Verdict:
        return cls("correct", 1.0, reason, extracted)

    @classmethod
    def incorrect(cls, reason: str, extracted: str | None = None) -> Verdict:
        return cls("incorrect", 0.0, reason, extracted)

    @classmethod
    def error(cls, reason: str, extracted: str | None = None) -> Verdict:
        return cls("verifier_error", 0.0, reason, extracted)

    @property
    def is_error(self) -> bool:
        return self.verdict == "verifier_error"
