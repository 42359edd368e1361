"""Collecting a step's batches: every node's reply is accounted for (accepted, rejected with a reason,
error, timeout), and an agent's label comes from its verified signer, never from a claimed name."""

from __future__ import annotations

from hacrl_fed.coordinator.rounds import Node, Reply
from hacrl_fed.coordinator.step_record import collect_batches, eval_record
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.protocol.site_reply import SiteReply
from hostile import HOSTILE, envelope_bytes, honest_batch

MAX_BYTES = 64 * 1024


def test_collect_accounts_for_every_reply(federation, plan):
    """Accepted, rejected, error, timeout, duplicate identity and name mismatch — one entry per node; an
    agent two nodes deliver verified batches for is an error for both of them, a claim without the agent's
    signature is refused alone."""
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
    assert [a.agent for a in accepted] == ["alice"]
    status = {name: (a.status, a.reason) for name, a in agents.items()}
    assert status == {"alice": ("accepted", ""), "alice@7": ("rejected", "agent_mismatch"),
                      "bob@2": ("rejected", "duplicate_agent"), "bob@5": ("rejected", "duplicate_agent"),
                      "mallory": ("rejected", "bad_reward"), "carol": ("timeout", "timeout"),
                      "node-6": ("error", "node_error")}
    assert agents["bob@2"].rows_accepted == 0 and agents["bob@2"].rows_rejected == 6
    assert agents["alice"].bytes_in == 100 and "nodes 2, 5" in agents["bob@2"].detail
    assert agents["alice@7"].node_id == 7 and "'alice' is node 1" in agents["alice@7"].detail
    assert agents["mallory"].rows_rejected == 6
    del replies[5], replies[7]
    accepted, agents = collect_batches(nodes[:6], replies, federation.roster, p, max_bytes=MAX_BYTES, timeout_s=9)
    assert sorted(a.agent for a in accepted) == ["alice", "bob"]
    assert agents["alice"].status == agents["bob"].status == "accepted" and agents["alice"].rows_accepted == 6


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


def test_eval_results_are_filed_only_under_a_verified_identity():
    """A registered name, or the node that delivered the agent's last verified batch (``holders``); any other
    node that says it is alice is ``unverified@<node>``."""
    res = wpb.EvaluateResponse(metrics={"avg@1": 1.0}).SerializeToString()
    nodes = [Node(1, ""), Node(2, ""), Node(3, "bob"), Node(4, "")]
    replies = {n: Reply(n, SiteReply(agent=a, evaluation=res)) for n, a in ((1, "alice"), (2, "alice"), (3, "bob"),
                                                                            (4, "carol"))}
    record = eval_record(nodes, replies, run_id="r", step=0, prompts=1, holders={"alice": 2, "carol": 9})
    assert set(record["agents"]) == {"unverified@1", "alice", "bob", "unverified@4"}
    record = eval_record(nodes, replies, run_id="r", step=0, prompts=1)
    assert set(record["agents"]) == {"unverified@1", "unverified@2", "bob", "unverified@4"}
