"""Verifiable rewards: final-answer extraction + math-verify in a killable process pool, tri-state.

Public API: :class:`Verifier` (``verify(responses, references, styles)`` → :class:`VerdictList` of
:class:`Verdict`, with the call's ``timeouts``/``retried`` counts; per-item limit in CPU seconds),
:func:`check_answer` (one item, in-process, no timeout), :func:`extract_final_answer`,
:class:`AccuracyReward` / :data:`accuracy_reward` (TRL reward-function API).
"""

from hacrl_fed.reward.compare import check_answer
from hacrl_fed.registries import ANSWER_STYLES
from hacrl_fed.reward.extract import Extraction, extract_final_answer, reference_answer
from hacrl_fed.reward.verdict import VERDICT_PROTO_NAMES, Verdict
from hacrl_fed.reward.verifier import AccuracyReward, VerdictList, Verifier, accuracy_reward

__all__ = [
    "ANSWER_STYLES",
    "VERDICT_PROTO_NAMES",
    "AccuracyReward",
    "Extraction",
    "Verdict",
    "VerdictList",
    "Verifier",
    "accuracy_reward",
    "check_answer",
    "extract_final_answer",
    "reference_answer",
]
