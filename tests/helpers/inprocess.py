"""An in-process Transport for the coordinator loop: orders and replies go through the same Flower
records (:mod:`hacrl_fed.flower.records`) as over a SuperLink; sites are Python objects."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from hacrl_fed.coordinator.rounds import Node, Reply
from hacrl_fed.flower import records
from hacrl_fed.flower.server_app import _content
from hacrl_fed.protocol.plans import check_peer_plans
from hacrl_fed.protocol.site_reply import SiteReply
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hostile import HOSTILE, envelope_bytes, honest_batch


@dataclass
class FakeSite:
    """A site that answers honestly; ``lie`` claims reward 1 for every sample."""

    name: str
    keys: object
    lie: bool = False
    online: bool = True
    silent: bool = False
    """Online but never answers (the reply misses the deadline)."""
    trained: list[tuple[int, list[str], bytes]] = field(default_factory=list)
    """(step, agents in the pool, capability table bytes) of every train order."""
    generated: list[int] = field(default_factory=list)
    checkpoints: int = 0
    notices: list[str] = field(default_factory=list)
    """Every notice the coordinator sent with an order."""
    weights_step: int = 0
    """The last step this site's weights hold (reported as ``state/trained_step`` with every batch)."""
    checkpoint_error: str = ""
    """Set: every checkpoint this site is asked for fails with it (the update is still applied)."""
    delay_s: float = 0.0
    """Seconds every generate and train of this site takes (a slow site of an asynchronous run)."""
    eval_delay_s: float = 0.0
    """Seconds every held-out evaluation of this site takes."""
    peer_plans: list[list[int]] = field(default_factory=list)
    """The peer plan steps of every train order (asynchronous runs)."""

    def generate(self, plan: pb.RoundPlan) -> bytes:
        time.sleep(self.delay_s)
        self.generated.append(plan.step)
        batch = honest_batch(plan, self.name)
        batch.model_version = self.weights_step
        if self.lie:
            for r in batch.rollouts:
                r.reward, r.verdict = 1.0, pb.CORRECT
        return envelope_bytes(batch, self.keys.own)

    def train(self, order: records.TrainOrder) -> SiteReply:
        time.sleep(self.delay_s)
        plan = pb.RoundPlan.FromString(order.plan)
        self.trained.append((plan.step, sorted(order.envelopes), order.table))
        peers = [pb.RoundPlan.FromString(p) for p in order.peer_plans]
        check_peer_plans(plan, peers)      # as a real worker does (distinct steps, one run, …): PlanError otherwise
        self.peer_plans.append([p.step for p in peers])
        self.weights_step = plan.step
        self.checkpoints += order.checkpoint and not self.checkpoint_error
        report = pb.TrainReport(run_id=plan.run_id, step=plan.step, agent_id=self.name, metrics={"loss": 0.5})
        reply = SiteReply(agent=self.name, report=report.SerializeToString(), metrics={"courier/worker_s": 0.01},
                          checkpoint_error=self.checkpoint_error if order.checkpoint else "")
        if order.next_plan:
            reply.envelope = self.generate(pb.RoundPlan.FromString(order.next_plan))
            reply.generate_metrics = self.generate_metrics()
        return reply

    def generate_metrics(self) -> dict[str, float]:
        return {"courier/worker_s": 0.02, "state/trained_step": float(self.weights_step)}


@dataclass
class HostileSite(FakeSite):
    """Delivers the hostile envelope ``cases[(step - 1) % len(cases)]`` at every step."""

    cases: tuple[str, ...] = ()
    max_bytes: int = 64 * 1024

    def generate(self, plan: pb.RoundPlan) -> bytes:
        self.generated.append(plan.step)
        build, _ = HOSTILE[self.cases[(plan.step - 1) % len(self.cases)]]
        return build(plan, self.name, self.keys, self.max_bytes)


class InProcessTransport:
    """Every order is packed into Flower records, the site unpacks it, and the reply goes back the same way."""

    def __init__(self, sites: list[FakeSite], *, named: bool = True) -> None:
        self.sites = {i + 1: s for i, s in enumerate(sites)}
        self.named = named
        self.fail_train_at: int | None = None
        self.fail_after_train_at: int | None = None
        """Step whose train orders are all served, then the coordinator "dies" before it reads the replies."""
        self.exchanges: list[list[tuple[str, str]]] = []
        """(kind, site) of the orders of every exchange."""

    def nodes(self) -> list[Node]:
        return [Node(i, s.name if self.named else "") for i, s in self.sites.items() if s.online]

    def exchange(self, orders, timeout_s: float) -> dict[int, Reply]:
        self.exchanges.append([(o.kind, self.sites[o.node_id].name) for o in orders])
        out = {}
        for o in orders:
            site, content = self.sites[o.node_id], _content(o)
            if o.kind == "train" and self.fail_train_at == pb.RoundPlan.FromString(o.plan).step:
                raise KeyboardInterrupt("coordinator killed during the train phase")
            if site.silent:
                out[o.node_id] = Reply(o.node_id, timed_out=True)
                continue
            reply = self._serve(site, o.kind, content)
            packed = records.reply_content(reply)
            out[o.node_id] = Reply(o.node_id, site=records.read_reply(packed), bytes_in=records.content_bytes(packed),
                                   bytes_out=records.content_bytes(content))
        if any(o.kind == "train" and self.fail_after_train_at == pb.RoundPlan.FromString(o.plan).step for o in orders):
            raise KeyboardInterrupt("coordinator killed after the sites trained")
        return out

    @staticmethod
    def _serve(site: FakeSite, kind: str, content) -> SiteReply:
        if kind in ("generate", "train") and records.read_notice(content):
            site.notices.append(records.read_notice(content))
        if kind == "generate":
            plan = pb.RoundPlan.FromString(records.read_generate_order(content))
            return SiteReply(agent=site.name, envelope=site.generate(plan), metrics=site.generate_metrics())
        if kind == "train":
            return site.train(records.read_train_order(content))
        time.sleep(site.eval_delay_s)
        req = wpb.EvaluateRequest.FromString(records.read_eval_order(content))
        res = wpb.EvaluateResponse(metrics={"avg@1": 0.25, "problems": float(len(req.prompts))})
        return SiteReply(agent=site.name, evaluation=res.SerializeToString())
