"""Validation of the signed RolloutBatches the coordinator collects (ARCHITECTURE.md §2.3, §6).

Every envelope an agent delivers goes through :func:`validate_envelope` before anything else
touches it. The checks, in order, stop at the first failure and raise :class:`BatchRejected`
with a stable :class:`Reason` code (metrics key) and a one-line detail (log line):

1. size of the raw bytes ≤ ``max_bytes`` (before any parsing)          ``too_large``
2. key id listed in the coordinator's roster                            ``unknown_agent``
3. Ed25519 signature over the exact payload bytes                       ``bad_signature``
4. payload parses as a RolloutBatch (protobuf; invalid UTF-8 fails)     ``malformed``
5. signer == payload agent id == the agent this node speaks for         ``agent_mismatch``
6. run id, then step (a replay from an earlier step fails here)         ``wrong_run``, ``wrong_step``
7. content against the step's :class:`RoundPlan` (:func:`check_rollouts`): known prompt ids,
   sample indices 0..G-1 with no duplicate and none missing, finite reward in [0, 1], finite
   behaviour log-prob sum ≤ 0 (± :data:`LOGPROB_TOLERANCE`) over 1..``max_new_tokens`` tokens when present, a
   response text of at most :func:`max_response_chars` characters, a known verdict and finish reason,
   a model fingerprint of at most :data:`MAX_FINGERPRINT_CHARS` printable ASCII characters, a model version
   (when set) below the batch's step; an episode's rollout carries the plan's environment instance and well-formed,
   bounded turns (``bad_trajectory``, docs/multi-turn.md).
   The behaviour log-prob is optional (presence flag, :func:`has_behaviour_logprob`): a row that has it
   must carry a finite sum ≤ 0 over ≥ 1 token (and an EOS term only as described at :func:`eos_logprob_ok`);
   a row without it carries no EOS term and a token count of 0 (unknown) .. ``max_new_tokens``.

:func:`check_rollouts` is the one content check of a batch: the coordinator runs it here, and every
learner site runs it again on each peer batch of the pool it trains on
(:class:`hacrl_fed.worker.trainer.Trainer`), so a coordinator that pools a bad batch cannot make a
site train on it.

A batch is accepted or rejected as a whole: it is re-broadcast as the exact signed bytes, so a
partly bad batch cannot be trimmed, and HACPO's groups need every agent's G samples per prompt.
Steps 1–6 are :func:`hacrl_fed.protocol.envelope.open_envelope`. Pure functions, no I/O.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hacrl_fed.protocol.envelope import (
    AgentKeyMismatchError,
    BadSignatureError,
    EnvelopeError,
    MalformedPayloadError,
    PayloadTooLargeError,
    StaleStepError,
    UnknownKeyError,
    WrongRunError,
    open_envelope,
)
from hacrl_fed.v1.rollout_pb2 import EpisodeSpec, FinishReason, PromptItem, Role, RolloutBatch, RoundPlan, Verdict

__all__ = ["LOGPROB_TOLERANCE", "MAX_CHARS_PER_TOKEN", "MAX_FINGERPRINT_CHARS", "MAX_OBSERVATION_CHARS", "AcceptedBatch",
           "BatchRejected", "Reason", "check_rollouts", "has_behaviour_logprob", "max_response_chars", "plan_episodes",
           "validate_envelope"]


class Reason(enum.StrEnum):
    """Why a delivery was not pooled. The value is the metrics key (``reject_reasons``)."""

    TOO_LARGE = "too_large"
    UNKNOWN_AGENT = "unknown_agent"
    BAD_SIGNATURE = "bad_signature"
    MALFORMED = "malformed"
    AGENT_MISMATCH = "agent_mismatch"
    WRONG_RUN = "wrong_run"
    WRONG_STEP = "wrong_step"
    UNKNOWN_PROMPT = "unknown_prompt"
    BAD_SAMPLE_INDEX = "bad_sample_index"
    DUPLICATE_SAMPLE = "duplicate_sample"
    MISSING_SAMPLE = "missing_sample"
    BAD_REWARD = "bad_reward"
    BAD_LOGPROB = "bad_logprob"
    BAD_TOKEN_COUNT = "bad_token_count"
    TEXT_TOO_LONG = "text_too_long"
    """A response text longer than the plan's ``max_new_tokens`` tokens can decode to."""
    BAD_FINGERPRINT = "bad_fingerprint"
    """A model fingerprint that is too long or not printable ASCII."""
    BAD_VERSION = "bad_version"
    """A model version at or above the batch's step (weights cannot have trained the step they answer)."""
    BAD_TRAJECTORY = "bad_trajectory"
    """An episode's rollout whose environment instance differs from the plan's, whose turns are out of order, too
    many or too long, or a one-shot prompt's rollout with turns (docs/multi-turn.md)."""
    REPLAY_MISMATCH = "replay_mismatch"
    """An episode whose replay in the coordinator's copy of the environment disagrees with the trajectory."""
    BAD_VERDICT = "bad_verdict"
    BAD_FINISH_REASON = "bad_finish_reason"
    DUPLICATE_AGENT = "duplicate_agent"
    """A second delivery for an agent already accepted at this step (two nodes, one identity)."""
    NO_ENVELOPE = "no_envelope"
    """The reply carried no (or an unreadable) envelope record."""
    NODE_ERROR = "node_error"
    """The node answered with an error (worker failure, dropout detected by Flower)."""
    TIMEOUT = "timeout"
    """No reply before the phase deadline."""


_ENVELOPE_REASONS: tuple[tuple[type[EnvelopeError], Reason], ...] = (
    (PayloadTooLargeError, Reason.TOO_LARGE),
    (UnknownKeyError, Reason.UNKNOWN_AGENT),
    (BadSignatureError, Reason.BAD_SIGNATURE),
    (MalformedPayloadError, Reason.MALFORMED),
    (AgentKeyMismatchError, Reason.AGENT_MISMATCH),
    (WrongRunError, Reason.WRONG_RUN),
    (StaleStepError, Reason.WRONG_STEP),
)
_VERDICTS = frozenset({Verdict.CORRECT, Verdict.INCORRECT, Verdict.VERIFIER_ERROR})
_FINISH_REASONS = frozenset({FinishReason.STOP, FinishReason.LENGTH})
_MAX_EXAMPLES = 3
LOGPROB_TOLERANCE = 1e-4
"""A behaviour log-prob sum may exceed 0 by float rounding up to this much (nats); the sites use the same."""
MAX_CHARS_PER_TOKEN = 128
"""Characters one generated token may decode to, at most (the longest tokens of the SmolLM2 and Gemma-3
vocabularies decode to 81 and 31 characters)."""
MAX_FINGERPRINT_CHARS = 128
"""Characters of a batch's ``model_fingerprint`` (``sha256:`` + 64 hex digits is 71)."""


def max_response_chars(max_new_tokens: int) -> int:
    """Longest response text (characters) ``max_new_tokens`` generated tokens can decode to."""
    return MAX_CHARS_PER_TOKEN * max(1, int(max_new_tokens))


class BatchRejected(Exception):
    """A delivery was rejected. ``reason`` is the metrics code, ``str(self)`` the log detail.

    ``rows`` is the number of rollouts in the rejected batch when it could be parsed, else the
    number the plan asked for (B·G).
    """

    def __init__(self, reason: Reason, detail: str, *, rows: int = 0) -> None:
        super().__init__(detail)
        self.reason = reason
        self.rows = rows


@dataclass(frozen=True)
class AcceptedBatch:
    """A batch that passed every check; ``envelope`` are the exact bytes to re-broadcast."""

    agent: str
    batch: RolloutBatch
    envelope: bytes


def _examples(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_EXAMPLES])
    return shown + (f" (+{len(items) - _MAX_EXAMPLES} more)" if len(items) > _MAX_EXAMPLES else "")


def has_behaviour_logprob(r) -> bool:
    """The rollout carries its behaviour log-prob sum (the wire's presence flag: ``HasField``, never a value).

    Rows without one come from a source that cannot know it (an API endpoint without log-probs,
    docs/cross-vendor.md); learners train on them by ``AlgoConfig.missing_behaviour_logprob``.
    """
    return r.HasField("behaviour_logprob_sum")


def eos_logprob_ok(r) -> bool:
    """A set ``behaviour_eos_logprob`` is finite, ≤ 0, part of the sum (sum ≤ it) and belongs to a STOP response."""
    e = r.behaviour_eos_logprob
    return (math.isfinite(e) and e <= LOGPROB_TOLERANCE and r.finish_reason == FinishReason.STOP
            and r.behaviour_logprob_sum <= e + LOGPROB_TOLERANCE)


MAX_OBSERVATION_CHARS = 4096
"""Characters of one environment turn of an episode (the environments cut longer observations, hacrl_fed.envs)."""


def _turns_problem(r, spec: EpisodeSpec | None, max_new_tokens: int | None) -> str:
    """Why one rollout's episode fields do not fit its prompt, or "": a one-shot prompt's rollout has no episode and
    no turns; an episode's carries the plan's instance, an empty response text, turns ENV, AGENT, ENV, … with
    1..max_turns AGENT turns (the last AGENT turn may be followed by one final ENV turn), ENV turns of at most
    :data:`MAX_OBSERVATION_CHARS` characters without agent fields, AGENT turns of at most
    :func:`max_response_chars` characters with a known finish reason, an EOS log-prob only on a STOPped turn of a
    row with a behaviour sum (finite, ≤ 0, their total not below the sum), at most max_turns × ``max_new_tokens``
    behaviour tokens, and no rollout-level EOS term."""
    if spec is None:
        return "turns or an episode for a one-shot prompt" if r.turns or r.HasField("episode") else ""
    if r.episode.SerializeToString(deterministic=True) != spec.SerializeToString(deterministic=True):
        return "its episode is not the plan's environment instance"
    if r.response_text or r.HasField("behaviour_eos_logprob"):
        return "an episode's response_text and behaviour_eos_logprob must be empty (turns carry them)"
    n = len(r.turns)
    if not 2 <= n <= 2 * spec.max_turns + 1:
        return f"{n} turns (2..{2 * spec.max_turns + 1} for max_turns {spec.max_turns})"
    eos_total, has_sum = 0.0, has_behaviour_logprob(r)
    for i, t in enumerate(r.turns):
        want = Role.ENV if i % 2 == 0 else Role.AGENT
        if t.role != want:
            return f"turn {i} is {Role.Name(t.role) if t.role in Role.values() else t.role}, expected {Role.Name(want)}"
        if want == Role.ENV:
            if len(t.text) > MAX_OBSERVATION_CHARS or t.finish_reason or t.HasField("behaviour_eos_logprob"):
                return f"environment turn {i}: over {MAX_OBSERVATION_CHARS} characters or with agent fields"
            continue
        if max_new_tokens is not None and len(t.text) > max_response_chars(max_new_tokens):
            return f"agent turn {i}: {len(t.text)} characters"
        if t.finish_reason not in _FINISH_REASONS:
            return f"agent turn {i}: finish reason {t.finish_reason}"
        if t.HasField("behaviour_eos_logprob"):
            e = t.behaviour_eos_logprob
            if not (has_sum and t.finish_reason == FinishReason.STOP and math.isfinite(e) and e <= LOGPROB_TOLERANCE):
                return f"agent turn {i}: an EOS log-prob {e!r} on a turn that did not stop or of a row without a sum"
            eos_total += e
    if has_sum and r.behaviour_logprob_sum > eos_total + LOGPROB_TOLERANCE:
        return "the behaviour sum is above the sum of the turns' EOS log-probs it includes"
    if max_new_tokens is not None and r.behaviour_token_count > spec.max_turns * max_new_tokens:
        return f"{r.behaviour_token_count} behaviour tokens over {spec.max_turns} turns of {max_new_tokens}"
    last_agent = r.turns[n - 1] if n % 2 == 0 else r.turns[n - 2]
    if r.finish_reason != last_agent.finish_reason:
        return "the rollout's finish reason is not its last agent turn's"
    return ""


def _row_problem(r, samples_per_prompt: int, max_new_tokens: int | None,
                 episode: bool = False) -> Reason | None:
    """The first problem of one rollout's numbers, lengths and enums, or None (``episode``: the row answers an
    episode, whose lengths and EOS terms :func:`_turns_problem` checks)."""
    if r.sample_index >= samples_per_prompt:
        return Reason.BAD_SAMPLE_INDEX
    if not (math.isfinite(r.reward) and 0.0 <= r.reward <= 1.0):
        return Reason.BAD_REWARD
    if has_behaviour_logprob(r):
        if not (math.isfinite(r.behaviour_logprob_sum) and r.behaviour_logprob_sum <= LOGPROB_TOLERANCE):
            return Reason.BAD_LOGPROB
        if r.HasField("behaviour_eos_logprob") and not eos_logprob_ok(r):
            return Reason.BAD_LOGPROB
        if r.behaviour_token_count < 1:
            return Reason.BAD_TOKEN_COUNT
    elif r.HasField("behaviour_eos_logprob"):   # an EOS term is part of a sum the row does not have
        return Reason.BAD_LOGPROB
    if not episode and max_new_tokens is not None and r.behaviour_token_count > max_new_tokens:
        return Reason.BAD_TOKEN_COUNT
    if not episode and max_new_tokens is not None and len(r.response_text) > max_response_chars(max_new_tokens):
        return Reason.TEXT_TOO_LONG
    if r.verdict not in _VERDICTS:
        return Reason.BAD_VERDICT
    if r.finish_reason not in _FINISH_REASONS:
        return Reason.BAD_FINISH_REASON
    return None


def check_rollouts(batch: RolloutBatch, prompt_ids: Collection[str], samples_per_prompt: int, *,
                   max_new_tokens: int | None, episodes: Mapping[str, EpisodeSpec] | None = None) -> None:
    """Check a parsed batch's rollouts against the step's plan (step 7 of the module docstring).

    Expects exactly G = ``samples_per_prompt`` rollouts for every one of ``prompt_ids`` (the plan's
    prompts), with sample indices 0..G-1, each with 1..``max_new_tokens`` behaviour tokens and a text
    of at most :func:`max_response_chars` (``max_new_tokens``) characters (None: no length bound; the
    coordinator and the learners always pass the plan's). ``episodes``: prompt id → the plan's environment
    instance of every episode prompt; their rollouts are checked as trajectories (:func:`_turns_problem`,
    ``bad_trajectory``), every other rollout must have no turns. Raises :class:`BatchRejected` with the first
    failing check's reason; the detail names up to three offending rows as ``prompt_id#sample_index``.
    """
    episodes = episodes or {}
    rows = len(batch.rollouts)
    g = samples_per_prompt
    fingerprint = batch.model_fingerprint
    if len(fingerprint) > MAX_FINGERPRINT_CHARS or not (fingerprint.isascii() and fingerprint.isprintable()):
        raise BatchRejected(Reason.BAD_FINGERPRINT, f"model_fingerprint of {len(fingerprint)} characters "
                            f"(at most {MAX_FINGERPRINT_CHARS} printable ASCII)", rows=rows)
    if batch.HasField("model_version") and batch.model_version >= batch.step:
        raise BatchRejected(Reason.BAD_VERSION, f"model_version {batch.model_version} is not below the batch's "
                            f"step {batch.step}", rows=rows)
    known = set(prompt_ids)
    unknown = [repr(r.prompt_id[:40]) for r in batch.rollouts if r.prompt_id not in known]
    if unknown:
        raise BatchRejected(Reason.UNKNOWN_PROMPT, f"rollouts for prompt ids not in the plan: {_examples(unknown)}",
                            rows=rows)
    bad: dict[Reason, list[str]] = {}
    trajectories = [f"{r.prompt_id}#{r.sample_index}: {why}" for r in batch.rollouts
                    if (why := _turns_problem(r, episodes.get(r.prompt_id), max_new_tokens))]
    if trajectories:
        raise BatchRejected(Reason.BAD_TRAJECTORY, f"{len(trajectories)} invalid trajectory(ies): "
                            f"{_examples(trajectories)}", rows=rows)
    for r in batch.rollouts:
        problem = _row_problem(r, g, max_new_tokens, r.prompt_id in episodes)
        if problem is not None:
            bad.setdefault(problem, []).append(
                f"{r.prompt_id}#{r.sample_index} (reward={r.reward!r}, "
                f"logprob_sum={r.behaviour_logprob_sum if has_behaviour_logprob(r) else None!r}, "
                f"tokens={r.behaviour_token_count}, chars={len(r.response_text)}, verdict={r.verdict}, "
                f"finish={r.finish_reason})")
    for reason in (Reason.BAD_SAMPLE_INDEX, Reason.BAD_REWARD, Reason.BAD_LOGPROB, Reason.BAD_TOKEN_COUNT,
                   Reason.TEXT_TOO_LONG, Reason.BAD_VERDICT, Reason.BAD_FINISH_REASON):
        if reason in bad:
            raise BatchRejected(reason, f"{len(bad[reason])} invalid rollout(s): {_examples(bad[reason])}", rows=rows)
    counts = Counter((r.prompt_id, r.sample_index) for r in batch.rollouts)
    dupes = sorted(f"{p}#{i}" for (p, i), n in counts.items() if n > 1)
    if dupes:
        raise BatchRejected(Reason.DUPLICATE_SAMPLE, f"sample indices delivered twice: {_examples(dupes)}", rows=rows)
    missing = sorted(f"{p}#{i}" for p in known for i in range(g) if (p, i) not in counts)
    if missing:
        raise BatchRejected(Reason.MISSING_SAMPLE,
                            f"{len(missing)} of {len(known) * g} rollouts missing: {_examples(missing)}",
                            rows=rows)


def plan_episodes(prompts: Iterable[PromptItem]) -> dict[str, EpisodeSpec]:
    """Prompt id → environment instance of every episode prompt among a plan's ``prompts`` (empty for a one-shot
    plan)."""
    return {p.prompt_id: p.episode for p in prompts if p.HasField("episode")}


def validate_envelope(
    raw: bytes,
    roster: Mapping[str, Ed25519PublicKey],
    plan: RoundPlan,
    *,
    expected_agent: str | None,
    max_bytes: int,
) -> AcceptedBatch:
    """Run every check of the module docstring on one delivered envelope.

    Args:
        raw: serialized ``SignedEnvelope`` exactly as received.
        roster: the coordinator's own agent → Ed25519 public key mapping (out of band).
        plan: the step's RoundPlan (run id, step, prompts, G).
        expected_agent: the agent the delivering node speaks for (registration name or the
            name it reported), or None when unknown; the signer must match it.
        max_bytes: cap of the RolloutBatch payload (``RunConfig.max_batch_bytes``).

    Returns the accepted batch. Raises :class:`BatchRejected`; never anything else for bad bytes.
    """
    owed = len(plan.prompts) * plan.samples_per_prompt
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise BatchRejected(Reason.NO_ENVELOPE, f"expected envelope bytes, got {type(raw).__name__}", rows=owed)
    try:
        batch = open_envelope(bytes(raw), roster, run_id=plan.run_id, step=plan.step,
                              agent_id=expected_agent, max_bytes=max_bytes)
    except EnvelopeError as err:
        reason = next((code for cls, code in _ENVELOPE_REASONS if isinstance(err, cls)), Reason.MALFORMED)
        raise BatchRejected(reason, str(err), rows=owed) from None
    check_rollouts(batch, [p.prompt_id for p in plan.prompts], plan.samples_per_prompt,
                   max_new_tokens=plan.sampling.max_new_tokens or None, episodes=plan_episodes(plan.prompts))
    return AcceptedBatch(agent=batch.agent_id, batch=batch, envelope=bytes(raw))
