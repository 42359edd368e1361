"""Honest and hostile RolloutBatch envelopes, for the validation tests and the attacker test worker.

:func:`honest_batch` answers a RoundPlan correctly-shaped (every prompt × G samples). Each entry of
:data:`HOSTILE` builds one kind of bad delivery for agent ``agent`` (the attacker's own roster
name) and names the rejection reason the coordinator must give.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hacrl_fed.protocol.envelope import sign_batch, sign_payload
from hacrl_fed.protocol.validation import Reason
from hacrl_fed.v1 import rollout_pb2 as pb


def honest_batch(plan: pb.RoundPlan, agent: str, *, correct_every: int = 2, text: str | None = None) -> pb.RolloutBatch:
    """B·G rollouts; every ``correct_every``-th sample states the reference answer in ``\\boxed{}``."""
    batch = pb.RolloutBatch(run_id=plan.run_id, step=plan.step, agent_id=agent, model_fingerprint=f"fake:{agent}",
                            sampling=plan.sampling)
    for p in plan.prompts:
        for i in range(plan.samples_per_prompt):
            right = correct_every > 0 and i % correct_every == 0
            answer = p.reference_answer if right else f"{p.reference_answer}1"
            batch.rollouts.add(prompt_id=p.prompt_id, sample_index=i,
                               response_text=text if text is not None else f"The answer is \\boxed{{{answer}}}.",
                               reward=1.0 if right else 0.0, verdict=pb.CORRECT if right else pb.INCORRECT,
                               behaviour_logprob_sum=-3.5 - i, behaviour_token_count=7 + i, finish_reason=pb.STOP)
    return batch


def envelope_bytes(batch: pb.RolloutBatch, key: Ed25519PrivateKey, key_id: str | None = None) -> bytes:
    env = sign_batch(batch, key, batch.agent_id if key_id is None else key_id)
    return env.SerializeToString()


def _signed(payload: bytes, key: Ed25519PrivateKey, key_id: str) -> bytes:
    return pb.SignedEnvelope(payload=payload, signature=sign_payload(payload, key), key_id=key_id).SerializeToString()


@dataclass(frozen=True)
class Keys:
    """The attacker's own roster key and a key that is in no roster."""

    own: Ed25519PrivateKey
    stranger: Ed25519PrivateKey


Builder = Callable[[pb.RoundPlan, str, Keys, int], bytes]


def _tampered(plan, agent, keys, max_bytes):
    env = pb.SignedEnvelope.FromString(envelope_bytes(honest_batch(plan, agent), keys.own))
    env.payload = env.payload.replace(b"The answer", b"The_answer", 1)
    return env.SerializeToString()


def _foreign_key(plan, agent, keys, max_bytes):
    return envelope_bytes(honest_batch(plan, agent), keys.stranger, agent)


def _unknown_agent(plan, agent, keys, max_bytes):
    return envelope_bytes(honest_batch(plan, "eve"), keys.stranger, "eve")


def _impersonation(plan, agent, keys, max_bytes):
    return _signed(honest_batch(plan, "alice").SerializeToString(), keys.own, agent)


def _replay(plan, agent, keys, max_bytes):
    old = pb.RoundPlan()
    old.CopyFrom(plan)
    old.step = plan.step - 1
    return envelope_bytes(honest_batch(old, agent), keys.own)


def _wrong_run(plan, agent, keys, max_bytes):
    other = pb.RoundPlan()
    other.CopyFrom(plan)
    other.run_id = plan.run_id + "-other"
    return envelope_bytes(honest_batch(other, agent), keys.own)


def _oversized(plan, agent, keys, max_bytes):
    return envelope_bytes(honest_batch(plan, agent, text="x" * (max_bytes // max(1, len(plan.prompts)))), keys.own)


def _rows(mutate: Callable[[pb.RolloutBatch], None]) -> Builder:
    def build(plan, agent, keys, max_bytes):
        batch = honest_batch(plan, agent)
        mutate(batch)
        return envelope_bytes(batch, keys.own)

    return build


def _set(field: str, value) -> Callable[[pb.RolloutBatch], None]:
    return lambda b: setattr(b.rollouts[-1], field, value)


def _non_utf8(plan, agent, keys, max_bytes):
    batch = honest_batch(plan, agent)
    batch.rollouts[0].response_text = "MARKMARK"
    payload = batch.SerializeToString().replace(b"MARKMARK", b"\xff\xfe\xfd\xfc\xc3\x28\xa0\xa1", 1)
    return _signed(payload, keys.own, agent)


def _eos_without_sum(b: pb.RolloutBatch) -> None:
    """A row that says it has no behaviour log-prob but carries the EOS term of one."""
    b.rollouts[-1].ClearField("behaviour_logprob_sum")
    b.rollouts[-1].behaviour_eos_logprob = -1.0


def _no_sum_too_many_tokens(b: pb.RolloutBatch) -> None:
    b.rollouts[-1].ClearField("behaviour_logprob_sum")
    b.rollouts[-1].behaviour_token_count = 1_000_000


def _duplicate(b: pb.RolloutBatch) -> None:
    b.rollouts[-1].sample_index = b.rollouts[-2].sample_index if len(b.rollouts) > 1 else 0
    if len(b.rollouts) == 1:
        b.rollouts.add().CopyFrom(b.rollouts[0])


def _missing(b: pb.RolloutBatch) -> None:
    del b.rollouts[-1]


def _version_of_its_own_step(b: pb.RolloutBatch) -> None:
    """Weights that claim to have trained the step they answer."""
    b.model_version = b.step


HOSTILE: dict[str, tuple[Builder, Reason]] = {
    "tampered": (_tampered, Reason.BAD_SIGNATURE),
    "foreign_key": (_foreign_key, Reason.BAD_SIGNATURE),
    "unknown_agent": (_unknown_agent, Reason.UNKNOWN_AGENT),
    "impersonation": (_impersonation, Reason.AGENT_MISMATCH),
    "replay": (_replay, Reason.WRONG_STEP),
    "wrong_run": (_wrong_run, Reason.WRONG_RUN),
    "oversized": (_oversized, Reason.TOO_LARGE),
    "nan_reward": (_rows(_set("reward", math.nan)), Reason.BAD_REWARD),
    "reward_above_one": (_rows(_set("reward", 1.5)), Reason.BAD_REWARD),
    "negative_reward": (_rows(_set("reward", -0.5)), Reason.BAD_REWARD),
    "inf_logprob": (_rows(_set("behaviour_logprob_sum", -math.inf)), Reason.BAD_LOGPROB),
    "positive_logprob": (_rows(_set("behaviour_logprob_sum", 2.0)), Reason.BAD_LOGPROB),
    "zero_tokens": (_rows(_set("behaviour_token_count", 0)), Reason.BAD_TOKEN_COUNT),
    "nan_logprob_claimed": (_rows(_set("behaviour_logprob_sum", math.nan)), Reason.BAD_LOGPROB),
    "eos_term_without_a_sum": (_rows(_eos_without_sum), Reason.BAD_LOGPROB),
    "no_sum_token_count_over_the_plan": (_rows(_no_sum_too_many_tokens), Reason.BAD_TOKEN_COUNT),
    "no_verdict": (_rows(_set("verdict", pb.VERDICT_UNSPECIFIED)), Reason.BAD_VERDICT),
    "no_finish_reason": (_rows(_set("finish_reason", pb.FINISH_REASON_UNSPECIFIED)), Reason.BAD_FINISH_REASON),
    "non_utf8": (_non_utf8, Reason.MALFORMED),
    "unknown_prompt": (_rows(_set("prompt_id", "not-in-the-plan")), Reason.UNKNOWN_PROMPT),
    "sample_index_out_of_range": (_rows(_set("sample_index", 10_000)), Reason.BAD_SAMPLE_INDEX),
    "duplicate_sample": (_rows(_duplicate), Reason.DUPLICATE_SAMPLE),
    "missing_samples": (_rows(_missing), Reason.MISSING_SAMPLE),
    "version_not_below_step": (_rows(_version_of_its_own_step), Reason.BAD_VERSION),
    "garbage": (lambda plan, agent, keys, max_bytes: b"\x0a\xff\xff\xff\xff\x0fnot a protobuf", Reason.MALFORMED),
}
"""name → (builder(plan, attacker name, keys, max_bytes) → envelope bytes, expected reason)."""
