"""Validation of delivered envelopes: every hostile case is rejected with its reason, honest ones pass."""

from __future__ import annotations

import pytest

from hacrl_fed.coordinator.rounds import Node, Reply
from hacrl_fed.coordinator.step_record import collect_batches
from hacrl_fed.protocol.site_reply import SiteReply
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
    check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt)


def test_missing_detail_names_the_rows(plan):
    p = plan(b=2, g=3)
    batch = honest_batch(p, "alice")
    del batch.rollouts[4]
    with pytest.raises(BatchRejected, match=r"p1#1") as info:
        check_rollouts(batch, [q.prompt_id for q in p.prompts], p.samples_per_prompt)
    assert info.value.reason is Reason.MISSING_SAMPLE


def test_collect_accounts_for_every_reply(federation, plan):
    """Accepted, rejected, error, timeout, duplicate identity and name mismatch — one entry per node."""
    p = plan()
    good = {a: envelope_bytes(honest_batch(p, a), federation.keys[a].own) for a in ("alice", "bob")}
    nodes = [Node(1, "alice"), Node(2, "bob"), Node(3, "mallory"), Node(4, "carol"), Node(5, ""), Node(6, ""),
             Node(7, "")]
    bad, _ = HOSTILE["nan_reward"]
    def delivered(agent, envelope):
        return SiteReply(agent=agent, envelope=envelope)

    replies = {
        1: Reply(1, delivered("alice", good["alice"]), bytes_in=100, bytes_out=50),
        2: Reply(2, delivered("bob", good["bob"])),
        3: Reply(3, delivered("mallory", bad(p, "mallory", federation.keys["mallory"], MAX_BYTES))),
        4: Reply(4, timed_out=True),
        5: Reply(5, delivered("bob", good["bob"])),  # a second node delivering bob's batch
        6: Reply(6, error="error 1001: worker down"),
        7: Reply(7, delivered("alice", good["bob"])),  # says alice, signed by bob
    }
    accepted, agents = collect_batches(nodes, replies, federation.roster, p, max_bytes=MAX_BYTES, timeout_s=9)
    assert sorted(a.agent for a in accepted) == ["alice", "bob"]
    status = {name: (a.status, a.reason) for name, a in agents.items()}
    assert status["alice"] == ("accepted", "")
    assert status["bob"] == ("accepted", "")
    assert status["mallory"] == ("rejected", "bad_reward")
    assert status["carol"] == ("timeout", "timeout")
    assert status["bob@5"] == ("rejected", "duplicate_agent")
    assert status["node-6"] == ("error", "node_error")
    assert status["alice@7"] == ("rejected", "agent_mismatch")
    assert agents["alice"].rows_accepted == 6 and agents["alice"].bytes_in == 100
    assert agents["mallory"].rows_rejected == 6


def test_single_prompt_single_sample_plan(federation, plan):
    """Edge of the index checks: B = 1, G = 1."""
    p = plan(b=1, g=1)
    raw = envelope_bytes(honest_batch(p, "carol"), federation.keys["carol"].own)
    assert len(validate_envelope(raw, federation.roster, p, expected_agent="carol", max_bytes=MAX_BYTES).batch.rollouts) == 1


def test_registered_name_must_match_reported_name(federation, plan):
    p = plan()
    raw = envelope_bytes(honest_batch(p, "alice"), federation.keys["alice"].own)
    _, agents = collect_batches([Node(1, "alice")], {1: Reply(1, SiteReply(agent="bob", envelope=raw))}, federation.roster, p,
                                max_bytes=MAX_BYTES, timeout_s=1)
    assert agents["alice"].reason == "agent_mismatch"


def test_reported_names_that_are_not_agent_names_are_not_used_as_labels(federation, plan):
    p = plan()
    replies = {9: Reply(9, SiteReply(agent="x" * 500, envelope=b"junk"))}
    _, agents = collect_batches([Node(9, "")], replies, federation.roster, p, max_bytes=MAX_BYTES, timeout_s=1)
    assert list(agents) == ["node-9"] and agents["node-9"].reason == "malformed"
