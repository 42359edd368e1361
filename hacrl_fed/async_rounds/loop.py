"""The coordinator's loop of an asynchronous run (``run.mode = "async"``, docs/async.md).

Every site generates and trains at its own pace; no site waits for another. Per site, as :func:`run_async` runs it::

    generate order: the newest plan the site has not answered (a new plan when it answered the newest)
    its batch     = validated (signature, run, step, ids, numbers, model_version < step and not above the step the
                    site reports for its weights: no batch is fresher than its weights), re-verified
                    (the coordinator's verdict wins), its accuracy appended to the agent's capability window,
                    kept in the pool (AsyncPool) with its model_version and arrival time
    train order   = its own batch + every peer batch it has not had that is not stale (the source trained
                    ≤ max_staleness times since, accepted ≤ max_row_age_s ago), the plans of those of other
                    steps, the capability table now, and the next plan (train + next generate in one reply)
    one metrics line per update: the site's own step count, the plan, rows trained per source, the staleness of
    every peer batch delivered and the rows dropped as stale

The run ends when every site that trains has made ``run.steps`` updates (``run.async_steps = "each"``: a site that
has stops; ``"slowest"``: the others keep training until the slowest has), or when every site left is done or has
missed its last two orders (a site that never answers does not hold the others; one that is offline is waited for,
each ``generate_timeout_s`` offline counting as a missed order). A site that drops out and comes
back (a restart, a new node) picks up where its weights are: its next batch's signed ``model_version`` and the
coordinator's record of its trained steps are reconciled as in sync mode. Orders go out one node at a time, each
in its own thread, through the same :class:`~hacrl_fed.coordinator.rounds.Transport` as sync rounds.

Capability (Eq. 9) is kept per agent as in sync mode, with one value per accepted batch in arrival order: each
agent's window holds the coordinator accuracy of its last K batches, whatever the other agents' pace, and the
table sent with a train order carries every agent's P̂ at that moment. ``capability_warmup_steps`` counts accepted
batches of any agent.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from hacrl_fed.algo.capability import CapabilityTracker
from hacrl_fed.async_rounds.pool import AsyncPool, Delivery, PooledBatch
from hacrl_fed.coordinator.phases import AgentVerification, build_round_plan, capability_table, reverify
from hacrl_fed.coordinator.rounds import (Identities, Node, Order, Reply, Setup, Transport, _commit, _eligible,
                                          _exchange, _flush_eval, _maybe_evaluate, _run_end, _wait_for_agents,
                                          restore, rollout_only, state_terms)
from hacrl_fed.coordinator.state import MAX_TRAINED_STEPS, CoordinatorState, MetricsLog, save_state
from hacrl_fed.coordinator.step_record import (TRAINED_STEP_METRIC, AgentStep, collect_batches, eval_record,
                                               eval_request, reconcile,
                                               refuse_replay_mismatches,
                                               train_outcome)
from hacrl_fed.protocol.site_reply import SiteReply
from hacrl_fed.protocol.validation import AcceptedBatch
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = ["MAX_MISSES", "run_async"]

log = logging.getLogger("hacrl_fed.coordinator")

MAX_MISSES = 2
"""Orders in a row a site may miss (timeout, error, rejected batch) before the run may end without it."""


@dataclass
class _Site:
    """One node's progress in an asynchronous run."""

    node: Node
    agent: str = ""
    """The verified signer of its batches ('' until the first is accepted)."""
    last_plan: int = 0
    """The newest plan step it was asked to answer."""
    held: tuple[AcceptedBatch, AgentVerification, bytes, AgentStep] | None = None
    """Its accepted batch waiting for its train order: batch, verification, serialized plan, step entry."""
    future: Future | None = None
    kind: str = ""
    sent_at: float = 0.0
    plan_b: bytes = b""
    next_plan_b: bytes = b""
    """The plan its pending train order asks it to generate for next ('' if none)."""
    delivery: Delivery | None = None
    notice: str = ""
    """What the site is told with its next order (why its last batch or update was not taken)."""
    misses: int = 0
    done: bool = False
    eval_due: int = 0
    """Set: a held-out evaluation after this many own updates is its next order."""
    offline_since: float | None = None
    """When the run's end was first checked with this node offline (None: online)."""
    unconfirmed: bool = False
    """Its last update was recorded as not trained and no later batch of its agent has been reconciled since."""


@dataclass
class _Run:
    """Everything the loop shares between sites."""

    setup: Setup
    transport: Transport
    state: CoordinatorState
    metrics: MetricsLog
    tracker: CapabilityTracker
    pool: AsyncPool
    ids: Identities = field(default_factory=Identities)
    sites: dict[int, _Site] = field(default_factory=dict)
    accuracy: dict[str, float] = field(default_factory=dict)
    """Agent → coordinator accuracy of its last accepted batch."""
    newest: pb.RoundPlan | None = None
    eval_request: bytes = b""
    """The serialized held-out EvaluateRequest ('' without held-out problems)."""
    evaluated: dict[str, int] = field(default_factory=dict)
    """Agent → its update count at its last held-out evaluation."""
    stopping: bool = False
    """``async_steps = "slowest"``: every site made ``run.steps`` updates; no new orders go out."""

    @property
    def updates(self) -> dict[str, int]:
        """Agent → updates recorded in this run (its trained steps, as the coordinator recorded them)."""
        return {a: len(v) for a, v in self.state.trained_steps.items()}

    def learners(self) -> set[str]:
        """Roster agents that train (every one but the rollout-only ones)."""
        return {a for a in self.setup.roster if not rollout_only(self.setup.roster, a)}


def run_async(setup: Setup, transport: Transport) -> CoordinatorState:
    """Run (or resume) an asynchronous run until every training site made ``run.steps`` updates (module docstring).

    Raises StateError as :func:`~hacrl_fed.coordinator.rounds.run_coordinator`; agent failures never raise.
    """
    run = setup.run
    # plans outnumber run.steps when sites skip to the newest: the saved step has no bound (state_terms)
    settings, steps = state_terms(run)
    state, resumed, tracker, metrics = restore(setup, settings, steps=steps)
    ctx = _Run(setup, transport, state, metrics, tracker, AsyncPool(run.max_staleness, run.max_row_age_s),
               eval_request=eval_request(setup.held_out, run) if setup.held_out else b"")
    state.restarts += resumed
    _commit(setup, state, metrics, {"event": "resume" if resumed else "run_start", "run_id": run.run_id,
                                    "mode": "async", "step": state.step, "steps": run.steps, "time": setup.clock(),
                                    "roster": sorted(setup.roster), "max_staleness": run.max_staleness,
                                    "max_row_age_s": run.max_row_age_s})
    log.info("%s asynchronous run %s: every site makes %d updates at its own pace (max_staleness %d)",
             "resuming" if resumed else "starting", run.run_id, run.steps, run.max_staleness)
    _wait_for_agents(setup, transport, want=len(setup.roster), patience_s=run.join_timeout_s)
    if state.step == 0 and state.last_eval_step < 0:
        _maybe_evaluate(setup, transport, state, metrics, ctx.ids)   # before any plan: every site at once
    t0 = setup.clock()
    with ThreadPoolExecutor(max_workers=max(4, 2 * len(setup.roster)), thread_name_prefix="async-order") as pool:
        while not _finished(ctx):
            _dispatch(ctx, pool)
            busy = [s.future for s in ctx.sites.values() if s.future is not None]
            if busy:
                wait(busy, timeout=setup.poll_s, return_when=FIRST_COMPLETED)
            else:
                setup.sleep(setup.poll_s)
            for site in list(ctx.sites.values()):
                if site.future is not None and site.future.done():
                    _settle(ctx, site)
    state.elapsed_s += setup.clock() - t0
    _flush_eval(setup, state, metrics, ctx.ids)   # a site that never delivered a batch stays unverified@<node>
    _final_eval(ctx)
    short = _ended_short(ctx)
    for agent, why in short.items():
        log.warning("%s ended short: %d of %d updates (%s)%s", agent, why["updates"], run.steps, why["why"],
                    "; its last update's record is unconfirmed" if why["last_unconfirmed"] else "")
    _commit(setup, state, metrics, _run_end(state, metrics) | {"mode": "async", "updates": ctx.updates,
                                                                 "pool_evicted": ctx.pool.evicted,
                                                                 "ended_short": short})
    if metrics.mirror is not None:
        metrics.mirror.close()
    log.info("asynchronous run %s finished: updates per agent %s", run.run_id, ctx.updates)
    return state


def _finished(ctx: _Run) -> bool:
    """No order is in flight, some site is done, and every training site is done or has missed its last
    :data:`MAX_MISSES` orders. A site offline now (unreachable, restarting) is waited for, bounded: each
    ``run.generate_timeout_s`` it stays offline counts as one more missed order (:func:`_missed`)."""
    if any(s.future is not None for s in ctx.sites.values()) or not any(s.done for s in ctx.sites.values()):
        return False
    now = ctx.setup.clock()
    online = {n.node_id for n in _eligible(ctx.setup, ctx.transport)}
    for s in ctx.sites.values():
        s.offline_since = None if s.node.node_id in online else (s.offline_since or now)
    trainers = [s for s in ctx.sites.values() if not (s.agent and rollout_only(ctx.setup.roster, s.agent))]
    return all((s.done and not s.eval_due) or _missed(ctx, s, now) >= MAX_MISSES for s in trainers)


def _missed(ctx: _Run, site: _Site, now: float) -> int:
    """Orders ``site`` missed in a row: those it was sent, plus one per ``run.generate_timeout_s`` it has been
    offline (the orders it would have missed)."""
    offline = 0 if site.offline_since is None else int((now - site.offline_since) / ctx.setup.run.generate_timeout_s)
    return site.misses + offline


def _online_trainers(ctx: _Run) -> list[_Site]:
    """The sites online now that train: every one but rollout-only agents (a site whose agent is not known yet,
    no batch of it accepted, counts: it is a site still to come)."""
    online = {n.node_id for n in _eligible(ctx.setup, ctx.transport)}
    return [s for s in ctx.sites.values() if s.node.node_id in online
            and not (s.agent and rollout_only(ctx.setup.roster, s.agent))]


def _dispatch(ctx: _Run, pool: ThreadPoolExecutor) -> None:
    """Send the next order to every eligible node that has none in flight and is not done."""
    online = {n.node_id: n for n in _eligible(ctx.setup, ctx.transport)}
    for nid, node in online.items():
        site = ctx.sites.setdefault(nid, _Site(node))
        site.node = node
        if site.future is not None:
            continue
        if site.eval_due:   # in this site's own thread, like its other orders: the others go on meanwhile
            site.kind, site.sent_at = "evaluate", ctx.setup.clock()
            site.future = pool.submit(_exchange, ctx.transport, [Order(nid, "evaluate", request=ctx.eval_request)],
                                      ctx.setup.run.generate_timeout_s)
            continue
        if site.done:
            continue
        if site.misses >= MAX_MISSES and any(s.done for s in ctx.sites.values()):
            continue  # the others are finishing: a site that keeps missing does not hold the run
        order, timeout = _next_order(ctx, site)
        order = dataclasses.replace(order, notice=site.notice)
        site.kind, site.sent_at, site.plan_b, site.next_plan_b = order.kind, ctx.setup.clock(), order.plan, order.next_plan
        site.notice = ""
        site.future = pool.submit(_exchange, ctx.transport, [order], timeout)


def _next_order(ctx: _Run, site: _Site) -> tuple[Order, float]:
    run = ctx.setup.run
    if site.held is None:
        plan = _plan_for(ctx, site, run.generate_timeout_s)
        return Order(site.node.node_id, "generate", plan=plan), run.generate_timeout_s
    item, verification, plan_b, _ = site.held
    learner = item.agent
    if rollout_only(ctx.setup.roster, learner):  # pooled and counted, never trained
        site.held = None
        return _next_order(ctx, site)
    site.delivery = ctx.pool.take(learner, trained=ctx.state.trained_steps, now=ctx.setup.clock(),
                                  learners=ctx.learners() | {learner})
    plan = pb.RoundPlan.FromString(plan_b)
    sources = {b.agent for b in site.delivery.batches}
    accuracy = {a: ctx.accuracy[a] for a in sources | {learner} if a in ctx.accuracy}
    corrections = list(verification.corrections)
    for b in site.delivery.batches:
        corrections += [pb.RewardCorrection.FromString(c) for c in b.corrections]
    table = capability_table(ctx.tracker, plan, accuracy, corrections).SerializeToString(deterministic=True)
    envelopes = {f"{learner}@{plan.step}": item.envelope} | {b.key: b.envelope for b in site.delivery.batches}
    by_step = {b.step: b.plan for b in site.delivery.batches if b.step != plan.step}
    peer_plans = [by_step[step] for step in sorted(by_step)]
    own_updates = len(ctx.state.trained_steps.get(learner, [])) + 1   # this update's own count
    last = run.async_steps == "each" and own_updates >= run.steps
    next_b = b"" if last else _plan_for(ctx, site, run.train_timeout_s + run.generate_timeout_s)
    checkpoint = run.checkpoint_every > 0 and (own_updates % run.checkpoint_every == 0 or last)
    order = Order(site.node.node_id, "train", plan=plan_b, table=table, envelopes=envelopes, checkpoint=checkpoint,
                  next_plan=next_b, checkpoint_every=run.checkpoint_every, peer_plans=tuple(peer_plans))
    return order, run.train_timeout_s + (run.generate_timeout_s if next_b else 0.0)


def _plan_for(ctx: _Run, site: _Site, deadline_s: float) -> bytes:
    """The newest plan ``site`` has not been asked to answer; a new plan when it has (the sampler's next batch).
    Its deadline (not signed by anyone) is this order's: ``deadline_s`` from now."""
    run, state = ctx.setup.run, ctx.state
    if ctx.newest is None or ctx.newest.step <= site.last_plan:
        state.step += 1
        ctx.newest = build_round_plan(run_id=run.run_id, step=state.step, problems=ctx.setup.sampler.next_batch(),
                                      samples_per_prompt=run.samples_per_prompt, sampling=run.sampling,
                                      seed=run.seed, deadline_unix_s=0.0)
        state.sampler = ctx.setup.sampler.state_dict()
        save_state(ctx.setup.state_path, state)
    site.last_plan = ctx.newest.step
    plan = pb.RoundPlan()
    plan.CopyFrom(ctx.newest)
    plan.deadline_unix_s = ctx.setup.clock() + deadline_s
    return plan.SerializeToString(deterministic=True)


def _settle(ctx: _Run, site: _Site) -> None:
    """Handle the reply of ``site``'s finished order."""
    future, site.future = site.future, None
    try:
        reply = future.result()[site.node.node_id]
    except Exception as err:  # noqa: BLE001 - a transport failure costs this order, never the run
        reply = Reply(site.node.node_id, error=f"transport: {type(err).__name__}: {err}")
    if site.kind == "generate":
        _take_batch(ctx, site, reply, site.plan_b)
    elif site.kind == "evaluate":
        _record_eval(ctx, site, site.eval_due, {site.node.node_id: reply}, ctx.setup.clock() - site.sent_at)
        site.eval_due = 0
    else:
        _trained(ctx, site, reply)


def _take_batch(ctx: _Run, site: _Site, reply: Reply, plan_b: bytes) -> None:
    """Validate and re-verify one generate reply; an accepted batch goes to the pool and waits for its train
    order (``site.held``)."""
    run = ctx.setup.run
    plan = pb.RoundPlan.FromString(plan_b)
    accepted, agents = collect_batches([site.node], {site.node.node_id: reply}, ctx.setup.roster, plan,
                                       max_bytes=run.max_batch_bytes, timeout_s=run.generate_timeout_s)
    entry = next(iter(agents.values()))
    item = accepted[0] if accepted else None
    if item is not None and not item.batch.HasField("model_version"):
        item, entry.status, entry.reason = None, "rejected", "no_model_version"
        entry.detail = "batch without model_version: the site's hacrl-fed predates asynchronous rounds"
    if item is not None and int(item.batch.model_version) > _weights_step(ctx, entry):
        entry.detail = (f"signed model_version {int(item.batch.model_version)} is above the step its weights hold "
                        f"({_weights_step(ctx, entry)}): a batch cannot be fresher than the weights that made it")
        item, entry.status, entry.reason = None, "rejected", "model_version_ahead"
    holder = next((s for s in ctx.sites.values() if s is not site and s.agent == entry.agent and s.agent), None)
    if item is not None and holder is not None and holder.node.node_id in {n.node_id for n in
                                                                             _eligible(ctx.setup, ctx.transport)}:
        item, entry.status, entry.reason = None, "rejected", "duplicate_agent"
        entry.detail = f"agent {entry.agent!r} is already node {holder.node.node_id}"
    verification = None
    if item is not None:   # an episode that does not replay refuses the batch (docs/multi-turn.md)
        verification = reverify(ctx.setup.verify, [item], plan, truncated_reward=ctx.setup.truncated_reward)[item.agent]
        if not refuse_replay_mismatches([item], {item.agent: entry}, {item.agent: verification}, plan.step):
            item = None
    if item is None:
        site.misses += 1
        site.notice = f"your batch for plan {plan.step} was not pooled: {entry.reason}: {entry.detail}"[:500]
        log.warning("plan %d: %s (node %d) not pooled: %s %s", plan.step, entry.agent, site.node.node_id,
                    entry.reason, entry.detail)
        _commit(ctx.setup, ctx.state, ctx.metrics, _batch_record(ctx, plan, entry, None, ctx.setup.clock()))
        return
    if holder is not None:
        holder.agent, holder.held = "", None   # the agent moved to this node (a restart)
    site.agent, site.misses, site.unconfirmed = item.agent, 0, False
    ctx.ids.verified([item], {item.agent: entry})
    _flush_eval_once_known(ctx)
    reconcile(entry, ctx.state.trained_steps.setdefault(item.agent, []), plan.step)
    lost, late = len(entry.reconciled.get("rolled_back", [])), len(entry.reconciled.get("trained_late", []))
    if lost or late:   # every total the operator sees says what the weights hold (as sync mode's _totals)
        ctx.state.add_totals(item.agent, steps_trained=float(late - lost), steps_rolled_back=float(lost),
                             steps_trained_late=float(late))
    entry.verification = verification
    ctx.tracker.update({item.agent: verification.accuracy}, {item.agent: verification.task_accuracy})
    ctx.accuracy[item.agent] = verification.accuracy
    ctx.state.capability = ctx.tracker.state_dict()
    now = ctx.setup.clock()
    canonical = pb.RoundPlan()
    canonical.CopyFrom(plan)
    canonical.deadline_unix_s = 0.0   # each order's copy has its own deadline: one plan, one copy in peer_plans
    ctx.pool.add(PooledBatch(item.agent, plan.step, int(item.batch.model_version), now, item.envelope,
                             canonical.SerializeToString(deterministic=True),
                             len(item.batch.rollouts),
                             tuple(c.SerializeToString() for c in verification.corrections)))
    site.held = (item, verification, plan_b, entry)
    if _site_done(ctx, site.agent):
        site.done, site.held = True, None
    _commit(ctx.setup, ctx.state, ctx.metrics, _batch_record(ctx, plan, entry, item, now))


def _weights_step(ctx: _Run, entry: AgentStep) -> int:
    """The newest step the agent's weights can hold: the step it reports with the batch (``state/trained_step``),
    else the newest the coordinator recorded as trained there (0 before any)."""
    reported = entry.generate.get(TRAINED_STEP_METRIC)
    if reported is not None and float(reported).is_integer() and 0 <= reported <= ctx.state.step:
        return int(reported)
    return max(ctx.state.trained_steps.get(entry.agent, []), default=0)


def _trained(ctx: _Run, site: _Site, reply: Reply) -> None:
    """Record one train reply (and take the next batch it carries)."""
    run = ctx.setup.run
    item, _, plan_b, entry = site.held
    site.held = None
    plan = pb.RoundPlan.FromString(plan_b)
    delivery = site.delivery or Delivery()
    train_outcome(entry, reply, plan, pool={b.agent for b in delivery.batches} | {item.agent})
    site.unconfirmed = entry.status != "trained"
    if entry.status != "trained":
        site.misses += 1
        site.notice = f"your update of plan {plan.step} is recorded as not trained: {entry.detail}"[:500]
    else:
        site.misses = 0
        steps = ctx.state.trained_steps.setdefault(item.agent, [])
        steps.append(plan.step)
        del steps[:-MAX_TRAINED_STEPS]
    ctx.state.add_totals(item.agent, steps_trained=float(entry.status == "trained"),
                         rows_accepted=entry.rows_accepted, peer_rows_delivered=float(delivery.rows),
                         peer_rows_dropped=float(delivery.dropped_rows))
    record = _update_record(ctx, site, plan, entry, delivery, reply)
    _commit(ctx.setup, ctx.state, ctx.metrics, record)
    own = len(ctx.state.trained_steps.get(item.agent, []))
    log.info("%s update %d/%d (plan %d): %s, %d peer rows (staleness %s), %d dropped as stale", item.agent, own,
             run.steps, plan.step, entry.status, delivery.rows, dict(sorted(Counter(delivery.staleness).items())),
             delivery.dropped_rows)
    if entry.status == "trained" and (own == run.steps or (run.eval_every and own % run.eval_every == 0)):
        site.eval_due = own if ctx.setup.held_out else 0
    if run.async_steps == "slowest" and not ctx.stopping:
        ctx.stopping = all((s.agent and (ctx.updates.get(s.agent, 0) >= run.steps
                                         or _rolled_back(ctx, s.agent))) or s.misses >= MAX_MISSES
                           for s in _online_trainers(ctx))
        if ctx.stopping:
            log.info("every site made %d updates: the run stops after the orders in flight", run.steps)
            for s in ctx.sites.values():
                s.done = True
    if _site_done(ctx, item.agent):
        site.done = True
        return
    if reply.site.envelope is not None and site.next_plan_b:
        nxt = Reply(site.node.node_id, site=SiteReply(agent=reply.site.agent, envelope=reply.site.envelope,
                                                        metrics=reply.site.generate_metrics))
        _take_batch(ctx, site, nxt, site.next_plan_b)


def _flush_eval_once_known(ctx: _Run) -> None:
    """Write the evaluation before training once every node that answered it is named or has delivered a verified
    batch (sites verify one by one here, not a step at a time: flushed at the first, the others' replies would be
    filed as ``unverified@<node>``); the run's end flushes it whatever is known."""
    held = ctx.ids.held_eval
    known = set(ctx.ids.holders.values())
    if held is not None and all(n.name or n.node_id in known for n in held["nodes"]):
        _flush_eval(ctx.setup, ctx.state, ctx.metrics, ctx.ids)


def _record_eval(ctx: _Run, site: _Site, own: int, replies: dict[int, Reply], eval_s: float) -> None:
    """The metrics line of one site's held-out evaluation after its ``own``-th update."""
    setup = ctx.setup
    tasks = {p.id: p.source for p in setup.held_out if p.source}
    record = eval_record([site.node], replies, run_id=setup.run.run_id, step=own, prompts=len(setup.held_out),
                         tasks=tasks if len(set(tasks.values())) > 1 else None, holders=ctx.ids.holders)
    _commit(setup, ctx.state, ctx.metrics, record | {"time": setup.clock(), "eval_s": eval_s, "mode": "async",
                                                     "agent": site.agent})
    ctx.evaluated[site.agent] = own


def _site_done(ctx: _Run, agent: str) -> bool:
    """``agent`` needs no more orders: ``each`` — it made ``run.steps`` updates, or lost that many to roll-backs
    (:func:`_rolled_back`); ``slowest`` — every site has."""
    if ctx.setup.run.async_steps == "slowest":
        return ctx.stopping
    return bool(agent) and (ctx.updates.get(agent, 0) >= ctx.setup.run.steps or _rolled_back(ctx, agent))


def _rolled_back(ctx: _Run, agent: str) -> bool:
    """``agent``'s weights lost ``run.steps`` of its recorded updates in this run (roll-backs, recorded in its
    totals as ``steps_rolled_back``): a site whose weights do not keep its updates (a restart loop, a worker that
    reports step 0 after every update) gets no more orders, so it cannot keep the run going forever."""
    return ctx.state.totals.get(agent, {}).get("steps_rolled_back", 0) >= ctx.setup.run.steps


def _ended_short(ctx: _Run) -> dict[str, dict[str, Any]]:
    """The training sites that end the run with fewer than ``run.steps`` updates: their updates, why (``roll-backs``
    or ``missed orders``), their roll-backs, and whether their last update's record is unconfirmed (recorded as
    not trained, and no later batch of theirs said what their weights hold)."""
    out = {}
    for site in ctx.sites.values():
        agent = site.agent
        if not agent or agent not in ctx.learners() or ctx.updates.get(agent, 0) >= ctx.setup.run.steps:
            continue
        out[agent] = {"updates": ctx.updates.get(agent, 0), "why": "roll-backs" if _rolled_back(ctx, agent)
                      else "missed orders", "misses": _missed(ctx, site, ctx.setup.clock()),
                      "rolled_back": int(ctx.state.totals.get(agent, {}).get("steps_rolled_back", 0)),
                      "last_unconfirmed": site.unconfirmed}
    return out


def _final_eval(ctx: _Run) -> None:
    """Evaluate every site not yet evaluated at its final update count (``async_steps = "slowest"``: the faster
    sites' last updates came after their ``run.steps``-th)."""
    todo = [s for s in ctx.sites.values() if ctx.setup.held_out and s.agent and s.agent in ctx.learners()
            and ctx.updates.get(s.agent, 0) and ctx.evaluated.get(s.agent) != ctx.updates.get(s.agent, 0)]
    t0 = ctx.setup.clock()
    orders = [Order(s.node.node_id, "evaluate", request=ctx.eval_request) for s in todo]
    replies = _exchange(ctx.transport, orders, ctx.setup.run.generate_timeout_s)   # all at once
    for s in todo:
        _record_eval(ctx, s, ctx.updates[s.agent], {s.node.node_id: replies[s.node.node_id]}, ctx.setup.clock() - t0)
    ctx.state.last_eval_step = max(ctx.updates.values(), default=0)


def _batch_record(ctx: _Run, plan: pb.RoundPlan, entry: AgentStep, item: AcceptedBatch | None,
                  now: float) -> dict[str, Any]:
    """The metrics line of one delivered batch (accepted or not)."""
    v = entry.verification
    return {"event": "batch", "mode": "async", "run_id": plan.run_id, "plan": plan.step, "time": now,
            "agent": entry.agent, "node_id": entry.node_id, "status": entry.status, "reason": entry.reason,
            "detail": entry.detail, "model_version": int(item.batch.model_version) if item is not None else None,
            "rows": entry.rows_accepted, "accuracy": v.accuracy if v else None,
            "task_accuracy": dict(v.task_accuracy) if v else {},
            "capability": ctx.tracker.capability(entry.agent) if entry.agent in ctx.tracker.agents else None,
            "reward_disagreements": v.disagreements if v else 0,
            "rolled_back_steps": entry.reconciled.get("rolled_back", []),
            "late_trained_steps": entry.reconciled.get("trained_late", [])}


def _update_record(ctx: _Run, site: _Site, plan: pb.RoundPlan, entry: AgentStep, delivery: Delivery,
                   reply: Reply) -> dict[str, Any]:
    """The metrics line of one site's update: its own step count, the plan, the peer rows and their staleness."""
    now = ctx.setup.clock()
    by_source: dict[str, int] = {}
    for b in delivery.batches:
        by_source[b.agent] = by_source.get(b.agent, 0) + b.rows
    hist = Counter()
    for b, lag in zip(delivery.batches, delivery.staleness):
        hist[str(lag)] += b.rows
    dropped: dict[str, dict[str, int]] = {}
    for (src, why), rows in delivery.dropped.items():
        dropped.setdefault(src, {})[why] = rows
    return {"event": "update", "mode": "async", "run_id": plan.run_id, "agent": entry.agent,
            "own_step": ctx.updates.get(entry.agent, 0), "plan": plan.step, "time": now,
            "status": entry.status, "reason": entry.reason, "detail": entry.detail,
            "peer_rows": by_source, "peer_plans": sorted({b.step for b in delivery.batches if b.step != plan.step}),
            "staleness_rows": dict(sorted(hist.items(), key=lambda kv: int(kv[0]))), "dropped_rows": dropped,
            "order_s": now - site.sent_at, "train": entry.train, "per_source": entry.per_source,
            "train_rejected": entry.train_rejected, "bytes_in": reply.bytes_in, "bytes_out": reply.bytes_out}
