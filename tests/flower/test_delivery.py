"""FlowerTransport sends an order again when it was lost in delivery (issue 25 B), against a simulated SuperLink.

:class:`FakeLink` behaves as Flower 1.42 does where it matters (see FlowerTransport's docstring for the file
references): a message is handed out at most once (a copy lost on the way is gone), a node handles one message
at a time, oldest first, and a message not answered within its TTL gets Flower's synthetic MESSAGE_UNAVAILABLE
reply. Time is a fake clock: nothing here waits. ``tests/flower/test_delivery_relay.py`` shows the same over real
Flower processes and a relay that cuts the connection.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from flwr.app import Error, Message
from flwr.common.constant import ErrorCode
from flwr.supercore.task_identity import TaskIdentity

from hacrl_fed.coordinator.rounds import Order
from hacrl_fed.flower import records
from hacrl_fed.flower.server_app import FlowerTransport
from hacrl_fed.protocol.site_reply import SiteReply


@pytest.fixture(autouse=True)
def serverapp_identity():
    """Messages are built as inside a ServerApp process (Flower sets its run and node id there)."""
    saved = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += max(s, 0.01)


@dataclass
class Queued:
    mid: str
    msg: Message
    created: float


@dataclass
class FakeLink:
    """A SuperLink and its SuperNodes (module docstring). ``lose[node]``: how many order copies to that node are
    lost on their way; ``work_s``: how long a node takes for an order (a probe takes ``probe_s``)."""

    clock: Clock
    work_s: float = 5.0
    probe_s: float = 2.0
    lose: dict[int, int] = field(default_factory=dict)
    half_pushed: dict[int, int] = field(default_factory=dict)
    """How many replies of that node are lost on their way back: the SuperNode gave up pushing their objects, so
    Flower answers a pull with MESSAGE_UNAVAILABLE once the object-push session expired (180 s)."""
    sent: list[tuple[int, str]] = field(default_factory=list)
    """(node, message type) of every message pushed."""
    handled: list[tuple[int, str]] = field(default_factory=list)
    """(node, message type) of every message a node's ClientApp handled."""
    lost: list[tuple[int, str]] = field(default_factory=list)
    queue: dict[int, list[Queued]] = field(default_factory=dict)
    busy_until: dict[int, float] = field(default_factory=dict)
    replies: dict[str, tuple[float, Message]] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    pushed: dict[str, Queued] = field(default_factory=dict)

    def push_messages(self, msgs):
        ids = []
        for m in msgs:
            mid = f"m{len(self.pushed)}"
            m.metadata.__dict__["_message_id"] = mid
            node = m.metadata.dst_node_id
            self.sent.append((node, m.metadata.message_type))
            self.pushed[mid] = q = Queued(mid, m, self.clock())
            self.queue.setdefault(node, []).append(q)
            ids.append(mid)
        return ids

    def _expired(self, q: Queued, at: float) -> bool:
        return q.created + q.msg.metadata.ttl <= at

    def _run_nodes(self) -> None:
        for node, queue in self.queue.items():
            while queue and self.busy_until.get(node, 0.0) <= self.clock():
                q = queue.pop(0)
                start = max(self.busy_until.get(node, 0.0), q.created)
                kind = q.msg.metadata.message_type
                if self._expired(q, start):
                    continue  # the SuperLink no longer hands it out
                if kind != records.MSG_PROBE and self.lose.get(node, 0) > 0:
                    self.lose[node] -= 1
                    self.lost.append((node, kind))
                    continue  # pulled, marked delivered, cut on the way: the node never sees it
                self.handled.append((node, kind))
                done = start + (self.probe_s if kind == records.MSG_PROBE else self.work_s)
                self.busy_until[node] = done
                if kind != records.MSG_PROBE and self.half_pushed.get(node, 0) > 0:
                    self.half_pushed[node] -= 1
                    self.replies[q.mid] = (done + 180.0, Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason=(
                        "Reply message objects are unavailable.")), reply_to=q.msg))
                elif not self._expired(q, done):  # a reply after the TTL is refused by the SuperLink
                    self.replies[q.mid] = (done, self._answer(q.msg, node))

    @staticmethod
    def _answer(msg: Message, node: int) -> Message:
        if msg.metadata.message_type == records.MSG_PROBE:
            return Message(records.RecordDict(), reply_to=msg)
        site = SiteReply(agent=f"agent{node}", envelope=b"envelope", metrics={"courier/worker_s": 1.0})
        return Message(records.reply_content(site), reply_to=msg)

    def pull_messages(self, ids):
        self._run_nodes()
        out = []
        for mid in ids:
            if mid in self.answered:
                continue
            ready = self.replies.get(mid)
            if ready is not None and ready[0] <= self.clock():
                out.append(ready[1])
            elif ready is None and self._expired(self.pushed[mid], self.clock()):
                out.append(Message(Error(code=ErrorCode.MESSAGE_UNAVAILABLE, reason="expired"),
                                   reply_to=self.pushed[mid].msg))
            else:
                continue
            self.answered.add(mid)
        return out

    def orders_sent(self, node: int) -> int:
        return sum(n == node and t != records.MSG_PROBE for n, t in self.sent)


def transport(link: FakeLink, **kw) -> FlowerTransport:
    return FlowerTransport(link, poll_s=0.5, probe_after_s=10.0, probe_ttl_s=60.0, clock=link.clock,
                           sleep=link.clock.sleep, pull_threads=False, **kw)


def generate(node: int, plan) -> Order:
    return Order(node, "generate", plan=plan().SerializeToString())


def test_an_order_lost_in_delivery_is_sent_again_and_answered(plan, caplog):
    link = FakeLink(Clock(), lose={1: 1})
    start = link.clock()
    replies = transport(link).exchange([generate(1, plan), generate(2, plan)], timeout_s=300.0)
    for node in (1, 2):
        assert not replies[node].timed_out and not replies[node].error, replies[node]
        assert replies[node].site.envelope == b"envelope"
    assert link.lost == [(1, records.MSG_GENERATE)]
    assert link.orders_sent(1) == 2 and link.orders_sent(2) == 1          # only the lost one went again
    assert link.handled.count((1, records.MSG_GENERATE)) == 1             # and the site did the work once
    assert link.clock() - start < 30.0                                    # a retry (probe after 10 s), not 300 s
    assert "generate order to node 1 got no reply but the node answered a later probe" in caplog.text
    assert "sending it again (copy 2)" in caplog.text


def test_a_reply_lost_on_its_way_back_costs_a_retry_not_the_180_s_flower_holds_it(plan):
    link = FakeLink(Clock(), half_pushed={1: 1})
    start = link.clock()
    replies = transport(link).exchange([generate(1, plan), generate(2, plan)], timeout_s=600.0)
    assert not replies[1].timed_out and not replies[1].error and replies[1].site.envelope == b"envelope"
    assert link.orders_sent(1) == 2 and link.orders_sent(2) == 1
    assert link.handled.count((1, records.MSG_GENERATE)) == 2            # the site generated again
    assert link.clock() - start < 60.0


def test_a_lost_train_order_goes_again_with_the_same_content(plan):
    link = FakeLink(Clock(), lose={1: 1})
    p = plan().SerializeToString()
    order = Order(1, "train", plan=p, table=b"table", envelopes={"agent1": b"e1", "agent2": b"e2"}, next_plan=p)
    replies = transport(link).exchange([order], timeout_s=300.0)
    assert not replies[1].timed_out and not replies[1].error
    first, second = (q.msg for q in link.pushed.values() if q.msg.metadata.message_type == records.MSG_TRAIN)
    assert first.content.object_id == second.content.object_id          # same pool: de-duplicated by Flower
    assert second.metadata.ttl < first.metadata.ttl                      # the copy keeps the phase's deadline


def test_a_slow_order_is_probed_but_never_sent_twice(plan):
    link = FakeLink(Clock(), work_s=200.0)
    replies = transport(link).exchange([generate(1, plan)], timeout_s=300.0)
    assert not replies[1].timed_out and not replies[1].error
    assert link.orders_sent(1) == 1 and not link.lost
    probes = sum(t == records.MSG_PROBE for _, t in link.sent)
    assert probes >= 3                                                    # expired unpulled while the node worked
    assert link.handled[0] == (1, records.MSG_GENERATE)                   # none reached the busy node; at most
    assert link.handled[1:] in ([], [(1, records.MSG_PROBE)])             # the last one, once the order is done


def test_an_order_lost_every_time_fails_early_naming_the_cause(plan):
    link = FakeLink(Clock(), lose={1: 100})
    start = link.clock()
    replies = transport(link, max_resends=3).exchange([generate(1, plan)], timeout_s=3000.0)
    assert not replies[1].timed_out
    assert replies[1].error == ("the generate order to node 1 got no reply 4 times although the node answered later "
                                "probes (order or reply lost on a cut connection)")
    assert link.orders_sent(1) == 4 and link.clock() - start < 300.0


def test_a_node_that_never_answers_times_out_without_copies(plan):
    link = FakeLink(Clock(), work_s=10_000.0)
    replies = transport(link).exchange([generate(1, plan)], timeout_s=120.0)
    assert replies[1].timed_out and link.orders_sent(1) == 1


def test_a_superlink_failure_while_pulling_still_raises(plan):
    """As before the pulls moved to threads: the ServerApp fails on a SuperLink error instead of waiting it out."""

    class Broken(FakeLink):
        def pull_messages(self, ids):
            raise RuntimeError("the run was stopped")

    link = Broken(Clock())

    def sleep(s: float) -> None:  # the pull thread gets real time to run; the transport's clock stays fake
        time.sleep(0.01)
        link.clock.sleep(s)

    t = FlowerTransport(link, clock=link.clock, sleep=sleep)  # threaded pulls, as in production
    with pytest.raises(RuntimeError, match="the run was stopped"):
        t.exchange([generate(1, plan)], timeout_s=10_000.0)
