"""Validation of delivered envelopes: every hostile case is rejected with its reason, honest ones pass."""

from __future__ import annotations

import pytest

from hacrl_fed.protocol.validation import BatchRejected, Reason, check_rollouts, validate_envelope
from hostile import HOSTILE, envelope_bytes, honest_batch

MAX_BYTES = 64 * 1024


def test_honest_batch_is_accepted_with_exact_bytes(federation, plan):
    p = plan(step=3)
    raw = envelope_bytes(honest_batch(p, "alice"), federation.keys["alice"].own)
    item = validate_envelope(raw, federation.roster, p, expected_agent="alice", max_bytes=MAX_BYTES)
    assert item.agent == "alice"
    assert item.envelope == raw
    assert len(item.batch.rollouts) == len(p.prompts) * p.samples_per_prompt


def test_unknown_expected_agent_accepts_any_roster_signer(federation, plan):
    p = plan()
    raw = envelope_bytes(honest_batch(p, "bob"), federation.keys["bob"].own)
    assert validate_envelope(raw, federation.roster, p, expected_agent=None, max_bytes=MAX_BYTES).agent == "bob"


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_envelope_is_rejected_with_its_reason(federation, plan, case):
    build, reason = HOSTILE[case]
    p = plan(step=4)
    raw = build(p, "mallory", federation.keys["mallory"], MAX_BYTES)
    with pytest.raises(BatchRejected) as info:
        validate_envelope(raw, federation.roster, p, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert info.value.reason is reason, str(info.value)
    assert str(info.value)  # a readable detail for the log
    assert info.value.rows > 0


def test_envelope_of_another_agent_delivered_by_a_node_is_rejected(federation, plan):
    p = plan()
    alice = envelope_bytes(honest_batch(p, "alice"), federation.keys["alice"].own)
    with pytest.raises(BatchRejected) as info:
        validate_envelope(alice, federation.roster, p, expected_agent="mallory", max_bytes=MAX_BYTES)
    assert info.value.reason is Reason.AGENT_MISMATCH


def test_size_is_checked_before_parsing(federation, plan):
    """Too many bytes are refused even when they are not a parseable envelope."""
    with pytest.raises(BatchRejected) as info:
        validate_envelope(b"\xff" * (MAX_BYTES + 10_000), federation.roster, plan(), expected_agent="alice",
                          max_bytes=MAX_BYTES)
    assert info.value.reason is Reason.TOO_LARGE


def test_logprob_rounding_within_tolerance_is_accepted(plan):
    p = plan()
    batch = honest_batch(p, "alice")
    batch.rollouts[0].behaviour_logprob_sum = 5e-6
    check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt, max_new_tokens=p.sampling.max_new_tokens)


def test_missing_detail_names_the_rows(plan):
    p = plan(b=2, g=3)
    batch = honest_batch(p, "alice")
    del batch.rollouts[4]
    with pytest.raises(BatchRejected, match=r"p1#1") as info:
        check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt, max_new_tokens=p.sampling.max_new_tokens)
    assert info.value.reason is Reason.MISSING_SAMPLE


def test_single_prompt_single_sample_plan(federation, plan):
    """Edge of the index checks: B = 1, G = 1."""
    p = plan(b=1, g=1)
    raw = envelope_bytes(honest_batch(p, "carol"), federation.keys["carol"].own)
    assert len(validate_envelope(raw, federation.roster, p, expected_agent="carol", max_bytes=MAX_BYTES).batch.rollouts) == 1


@pytest.mark.parametrize("eos, finish, ok", [
    (-2.0, "stop", True), (0.0, "stop", True), (5.0, "stop", False), (float("nan"), "stop", False),
    (float("-inf"), "stop", False), (-100.0, "stop", False),   # more negative than the sum that contains it
    (-2.0, "length", False),                                   # a LENGTH response has no EOS
])
def test_behaviour_eos_logprob_is_checked(plan, eos, finish, ok):
    """The batch content check (coordinator and learners alike) bounds the EOS log-prob field."""
    from hacrl_fed.v1 import rollout_pb2 as pb

    p = plan()
    batch = honest_batch(p, "alice")
    r = batch.rollouts[0]
    r.behaviour_logprob_sum, r.behaviour_token_count = -10.0, 5
    r.finish_reason = pb.STOP if finish == "stop" else pb.LENGTH
    r.behaviour_eos_logprob = eos
    if ok:
        check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt, max_new_tokens=p.sampling.max_new_tokens)
    else:
        with pytest.raises(BatchRejected) as info:
            check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt, max_new_tokens=p.sampling.max_new_tokens)
        assert info.value.reason is Reason.BAD_LOGPROB
