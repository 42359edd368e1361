"""The coordinator's step loop (ARCHITECTURE.md §2), written against a small :class:`Transport`.

One step, as :func:`run_coordinator` runs it::

    wait until ≥ min_agents roster agents are online
    plan      = B prompts from the seeded sampler, G, sampling, deadline
    replies   = generate orders to every online agent (those that already generated for this
                plan during the previous step's train phase are not asked again)
    accepted  = validate every envelope (signature, run, step, ids, numbers, sizes)
    verdicts  = re-verify every rollout with the coordinator's verifier (its verdict wins)
    table     = capability windows updated with this step's coordinator accuracy
    state saved (the step counts as done from here: no site is ever asked to train it twice)
    one exchange: train orders (pool = accepted envelopes + table + the NEXT step's plan) to every
                agent that delivered, plain generate orders for the next plan to everyone else
    metrics line, then the state (step, windows, sampler, metrics offset) saved atomically;
    one summary line on the log (status, accuracy and rows per agent, step time, overhead)

Pipelining the next step's generation into the train message (ARCHITECTURE §2) makes a step one
Flower round trip instead of two. Steps count from 1 (a worker's Health reports 0 for "none").

The Flower ServerApp supplies a Transport over ``Grid`` (:mod:`hacrl_fed.flower.server_app`);
tests supply an in-process one. Agents that time out, error or deliver a rejected batch are left
out of the step, with the reason in the log and the metrics; the step proceeds with at least
``min_agents`` valid batches, otherwise it is recorded as skipped.

Held-out evaluation replies are unsigned: they count for an agent only from its registered node or from
the node that delivered its last accepted batch (:class:`Identities`); others are ``unverified@<node>``.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hacrl_fed.algo.capability import CapabilityTracker
from hacrl_fed.config import RunConfig
from hacrl_fed.coordinator.intake import bounded_reply
from hacrl_fed.coordinator.phases import VerifyFn, build_round_plan, capability_table, reverify
from hacrl_fed.coordinator.scalars import TensorBoardLog
from hacrl_fed.coordinator.state import (MAX_TRAINED_STEPS, CoordinatorState, MetricsLog, load_state, restore_error,
                                         run_digest, save_state)
from hacrl_fed.coordinator.step_record import (AgentStep, collect_batches, eval_record, eval_request,
                                               interrupted_record, reconcile, refuse_replay_mismatches, step_notices,
                                               step_record,
                                               step_summary, train_outcome)
from hacrl_fed.protocol.site_reply import SiteReply
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = ["Identities", "Node", "Order", "Reply", "Setup", "Transport", "restore", "resume_settings", "run_coordinator"]

log = logging.getLogger("hacrl_fed.coordinator")

@dataclass(frozen=True)
class Node:
    """An online SuperNode: Flower node id and the name it was registered with ('' if none)."""

    node_id: int
    name: str = ""


@dataclass(frozen=True)
class Order:
    """One message to one node. ``kind``: ``generate`` (``plan``), ``train`` (``plan``, ``table``,
    ``envelopes``, ``checkpoint``, ``checkpoint_every``, optional ``next_plan``) or ``evaluate``
    (``request``). ``notice``: what the site is told about its previous order (why its batch was not
    pooled, why its step was skipped or its training recorded as failed), shown on its terminal."""

    node_id: int
    kind: str
    plan: bytes = b""
    table: bytes = b""
    envelopes: Mapping[str, bytes] = field(default_factory=dict)
    checkpoint: bool = False
    next_plan: bytes = b""
    request: bytes = b""
    checkpoint_every: int | None = None
    notice: str = ""
    peer_plans: tuple[bytes, ...] = ()
    """Train orders of asynchronous runs: the serialized plans of pooled peer batches of other steps."""


@dataclass
class Reply:
    """One node's answer to one order."""

    node_id: int
    site: SiteReply = field(default_factory=SiteReply)
    """What the site sent (its reported agent name is untrusted)."""
    error: str = ""
    """Non-empty when the node answered with an error or an unreadable reply."""
    timed_out: bool = False
    bytes_in: int = 0
    """Wire bytes of the reply content."""
    bytes_out: int = 0
    """Wire bytes of the order content sent to this node."""


class Transport(Protocol):
    """How the loop reaches the agents."""

    def nodes(self) -> list[Node]:
        """Nodes online now."""
        ...

    def exchange(self, orders: Sequence[Order], timeout_s: float) -> dict[int, Reply]:
        """Send every order (TTL ``timeout_s``); return a Reply for every order's node, missing ones
        ``timed_out`` after ``timeout_s``. Never raises for a misbehaving node."""
        ...


@dataclass
class Identities:
    """Which node speaks for which agent, as this coordinator process verified it (held-out evaluation
    replies are unsigned: they count only from such a node)."""

    holders: dict[str, int] = field(default_factory=dict)
    """Agent → id of the node that delivered its last accepted batch (signed by the agent's roster key)."""
    held_eval: dict[str, Any] | None = None
    """An evaluation answered before any batch was verified here (unnamed nodes): its replies are attributed,
    and its metrics line written, once the next step's batches are (:func:`_flush_eval`)."""

    def verified(self, accepted: Sequence[Any], agents: Mapping[str, AgentStep]) -> None:
        for item in accepted:
            self.holders[item.agent] = agents[item.agent].node_id


class Sampler(Protocol):
    def next_batch(self) -> list[Any]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Setup:
    """Everything the loop needs besides the transport."""

    run: RunConfig
    roster: Mapping[str, Any]
    """Agent name → Ed25519 public key (the coordinator's own roster)."""
    verify: VerifyFn
    sampler: Sampler
    run_dir: Path
    held_out: Sequence[Any] = ()
    truncated_reward: str = "zero"
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    poll_s: float = 1.0

    @property
    def state_path(self) -> Path:
        return self.run_dir / "coordinator" / "state.json"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


def resume_settings(run: RunConfig) -> dict[str, Any]:
    """The run settings a resumed coordinator must share with the original (hashed into the state)."""
    return {"run_id": run.run_id, "prompts_per_step": run.prompts_per_step, "samples_per_prompt": run.samples_per_prompt,
            "data": run.data.model_dump(mode="json"), "seed": run.seed, "capability_window": run.capability_window,
            "capability_warmup_steps": run.capability_warmup_steps, "sampling": run.sampling.model_dump(mode="json")}


def state_terms(run: RunConfig) -> tuple[dict[str, Any], int | None]:
    """What a saved state must match to be this run's, in the run's mode: the settings hashed into it
    (:func:`resume_settings`, plus ``mode`` for an asynchronous run) and the bound on its ``step`` (``run.steps``
    in sync mode; none in async mode, where ``step`` counts plans and outnumbers every site's updates). The one
    source for the loops' restore and ``hacrl-fed server``'s pre-flight (:func:`check_saved_state`)."""
    if run.mode == "async":
        return resume_settings(run) | {"mode": "async"}, None
    return resume_settings(run), run.steps


def check_saved_state(run: RunConfig, run_dir: str | Path) -> None:
    """Raise StateError (one line naming the file) when ``run_dir``'s saved coordinator state cannot be resumed
    by ``run`` (:func:`state_terms`); nothing when there is none yet or it can."""
    settings, steps = state_terms(run)
    run_dir = Path(run_dir)
    load_state(run_dir / "coordinator" / "state.json", run_id=run.run_id, config_digest=run_digest(settings),
               steps=steps, root=run_dir)


def run_coordinator(setup: Setup, transport: Transport) -> CoordinatorState:
    """Run (or resume) the synchronous run until ``run.steps`` steps are done. Returns the final state. (With
    ``run.mode = "async"`` every site goes at its own pace: :func:`hacrl_fed.async_rounds.loop.run_async`;
    this function refuses such a run with ValueError.)

    Raises StateError (one line naming the file) when the saved state or the metrics log is unusable
    (:func:`~hacrl_fed.coordinator.state.load_state`, :class:`~hacrl_fed.coordinator.state.MetricsLog`), belongs to
    different run settings, or its sampler or capability state cannot be restored; agent failures never raise.
    """
    run = setup.run
    if run.mode != "sync":
        raise ValueError(f"run.mode = {run.mode!r}: run it with hacrl_fed.async_rounds.loop.run_async")
    settings, steps = state_terms(run)
    state, resumed, tracker, metrics = restore(setup, settings, steps=steps)
    board = metrics.mirror
    if state.pending is not None:
        log.warning("step %s was interrupted during its train phase: it counts as done, not as trained (each "
                    "site's next batch says whether it trained it)", state.pending.get("step"))
        record, state.pending = interrupted_record(state.pending), None
        _commit(setup, state, metrics, record)
    state.restarts += resumed
    _commit(setup, state, metrics, {"event": "resume" if resumed else "run_start", "run_id": run.run_id,
                                    "step": state.step, "steps": run.steps, "time": setup.clock(),
                                    "roster": sorted(setup.roster)})
    log.info("%s run %s after step %d of %d", "resuming" if resumed else "starting", run.run_id, state.step, run.steps)
    _wait_for_agents(setup, transport, want=len(setup.roster), patience_s=run.join_timeout_s)
    ids = Identities()
    _maybe_evaluate(setup, transport, state, metrics, ids)
    prefetched: dict[int, Reply] = {}
    notices: dict[int, str] = {}
    while state.step < run.steps:
        prefetched = _run_step(setup, transport, tracker, state, metrics, prefetched, notices, ids)
        _maybe_evaluate(setup, transport, state, metrics, ids)
    _flush_eval(setup, state, metrics, ids)
    _commit(setup, state, metrics, _run_end(state, metrics))
    if board is not None:
        board.close()
    log.info("run %s finished: %d steps in %.1f s", run.run_id, state.step, state.elapsed_s)
    return state


def restore(setup: Setup, settings: dict[str, Any], *,
            steps: int | None) -> tuple[CoordinatorState, bool, CapabilityTracker, MetricsLog]:
    """The run's saved state (a new one when there is none), whether it was resumed, the capability tracker and the
    prompt sampler restored from it, and the metrics log (with its TensorBoard copy when ``run.report_to`` asks).

    ``settings`` are hashed into the state (:func:`resume_settings`; a state of other settings is refused);
    ``steps`` bounds the saved step (None: no bound). Raises StateError (one line naming the file)."""
    run = setup.run
    digest = run_digest(settings)
    state = load_state(setup.state_path, run_id=run.run_id, config_digest=digest, steps=steps, root=setup.run_dir)
    resumed = state is not None
    state = state or CoordinatorState(run_id=run.run_id, config_digest=digest)
    tracker = CapabilityTracker(run.capability_window, warmup_steps=run.capability_warmup_steps)
    for part, owner in (("capability", tracker), ("sampler", setup.sampler)):
        if getattr(state, part):
            try:
                owner.load_state_dict(getattr(state, part))
            except (ValueError, TypeError, KeyError, AttributeError) as err:
                raise restore_error(setup.state_path, part, err) from None
    metrics = MetricsLog(setup.metrics_path, offset=state.metrics_offset, root=setup.run_dir)
    metrics.mirror = TensorBoardLog(setup.run_dir / "tensorboard") if "tensorboard" in run.report_to else None
    return state, resumed, tracker, metrics


def _commit(setup: Setup, state: CoordinatorState, metrics: MetricsLog, record: dict[str, Any]) -> None:
    """Append one metrics line, then save the state that points past it (crash-consistent order)."""
    state.metrics_offset = metrics.append(record)
    save_state(setup.state_path, state)


def _eligible(setup: Setup, transport: Transport) -> list[Node]:
    """Online nodes, minus those registered under a name that is not in the roster."""
    nodes = []
    for node in transport.nodes():
        if node.name and node.name not in setup.roster:
            log.warning("node %d is registered as %r, which is not in the roster: ignored", node.node_id, node.name)
            continue
        nodes.append(node)
    return sorted(nodes, key=lambda n: (n.name, n.node_id))


def _wait_for_agents(setup: Setup, transport: Transport, *, want: int, patience_s: float) -> list[Node]:
    """Poll until ``want`` eligible nodes are online, or ``patience_s`` passed with ≥ ``min_agents``.

    Below ``min_agents`` it keeps waiting (logging every 30 s): agents may come back.
    """
    start = last_log = setup.clock()
    while True:
        nodes = _eligible(setup, transport)
        waited = setup.clock() - start
        if len(nodes) >= want or (len(nodes) >= setup.run.min_agents and waited >= patience_s):
            return nodes
        if setup.clock() - last_log >= 30.0:
            log.info("waiting for agents: %d online, want %d (min_agents %d), %.0f s so far",
                     len(nodes), want, setup.run.min_agents, waited)
            last_log = setup.clock()
        setup.sleep(setup.poll_s)


def _plan(setup: Setup, state: CoordinatorState, step: int, deadline_s: float) -> pb.RoundPlan:
    """The plan of ``step``: the one already sent out with the previous train phase, or a new one."""
    if state.next_plan:
        plan = pb.RoundPlan.FromString(base64.b64decode(state.next_plan))
        if plan.step == step:
            plan.deadline_unix_s = setup.clock() + deadline_s  # not signed by anyone: safe to refresh
            return plan
    run = setup.run
    return build_round_plan(run_id=run.run_id, step=step, problems=setup.sampler.next_batch(),
                            samples_per_prompt=run.samples_per_prompt, sampling=run.sampling, seed=run.seed,
                            deadline_unix_s=setup.clock() + deadline_s)


def _exchange(transport: Transport, orders: Sequence[Order], timeout_s: float) -> dict[int, Reply]:
    """``transport.exchange`` with every reply bounded (:func:`~hacrl_fed.coordinator.intake.bounded_reply`)
    and a timed-out reply for every order the transport did not answer."""
    if not orders:
        return {}
    got = transport.exchange(orders, timeout_s)
    out: dict[int, Reply] = {}
    for order in orders:
        reply = got.get(order.node_id)
        out[order.node_id] = bounded_reply(reply) if isinstance(reply, Reply) else Reply(order.node_id, timed_out=True)
    return out


def _worker_s(replies: Mapping[int, Reply], timeout_s: float) -> float:
    """Time of the slowest site inside its worker calls during one exchange (each claim clipped to the
    exchange's timeout)."""
    return max((min(max(0.0, r.site.metrics.get("courier/worker_s", 0.0)), timeout_s) for r in replies.values()),
               default=0.0)


def _run_step(setup: Setup, transport: Transport, tracker: CapabilityTracker, state: CoordinatorState,
              metrics: MetricsLog, prefetched: Mapping[int, Reply], notices: dict[int, str],
              ids: Identities) -> dict[int, Reply]:
    """One step (module docstring). Returns the generate replies already received for the next step.

    ``notices`` (node id → text) holds what each site is to be told with its next order; it is updated.
    ``ids`` learns which node delivered each accepted batch (and writes an evaluation held for that)."""
    run, clock = setup.run, setup.clock
    t_start = clock()
    nodes = _wait_for_agents(setup, transport, want=run.min_agents, patience_s=0.0)
    plan = _plan(setup, state, state.step + 1, run.generate_timeout_s)
    plan_b = plan.SerializeToString(deterministic=True)
    ready = {n.node_id: prefetched[n.node_id] for n in nodes if n.node_id in prefetched}
    asked = [Order(n.node_id, "generate", plan=plan_b, notice=notices.pop(n.node_id, ""))
             for n in nodes if n.node_id not in ready]
    t_plan = clock()
    fresh = _exchange(transport, asked, run.generate_timeout_s)
    t_gen = clock()
    accepted, agents = collect_batches(nodes, ready | fresh, setup.roster, plan, max_bytes=run.max_batch_bytes,
                                       timeout_s=run.generate_timeout_s)
    ids.verified(accepted, agents)
    _flush_eval(setup, state, metrics, ids)  # before this step changes the state: it is the previous step's
    t_val = clock()
    verdicts = reverify(setup.verify, accepted, plan, truncated_reward=setup.truncated_reward)
    accepted = refuse_replay_mismatches(accepted, agents, verdicts, plan.step)
    verdicts = {item.agent: verdicts[item.agent] for item in accepted}
    for agent, v in verdicts.items():
        agents[agent].verification = v
    t_ver = clock()
    trained = len(accepted) >= run.min_agents
    for entry in agents.values():
        reconcile(entry, state.trained_steps.setdefault(entry.agent, []), plan.step)
    notices.update(step_notices(plan, agents, trained=trained, min_agents=run.min_agents))
    next_b = b""
    if trained:
        tracker.update({a: v.accuracy for a, v in verdicts.items()}, {a: v.task_accuracy for a, v in verdicts.items()})
        if plan.step < run.steps:
            nxt = _plan(setup, state, plan.step + 1, run.train_timeout_s + run.generate_timeout_s)
            next_b = nxt.SerializeToString(deterministic=True)
    else:
        log.warning("step %d skipped: %d valid batch(es), min_agents is %d", plan.step, len(accepted), run.min_agents)
    timing = {"plan_s": t_plan - t_start, "generate_s": t_gen - t_plan, "validate_s": t_val - t_gen,
              "verify_s": t_ver - t_val, "train_s": 0.0, "step_s": t_ver - t_start,
              "worker_s": _worker_s(fresh, run.generate_timeout_s)}
    state.step, state.sampler, state.capability = plan.step, setup.sampler.state_dict(), tracker.state_dict()
    state.next_plan = base64.b64encode(next_b).decode("ascii")
    state.pending = step_record(plan, agents, tracker, timing, trained=trained, time_s=clock())
    save_state(setup.state_path, state)  # from here on the step counts as done, even if we crash
    upcoming: dict[int, Reply] = {}
    if trained:
        upcoming, work = _train(setup, transport, tracker, plan, plan_b, accepted, agents, verdicts, nodes, next_b,
                                notices)
        timing["worker_s"] += work
        for entry in agents.values():
            if entry.status == "trained":
                state.trained_steps.setdefault(entry.agent, []).append(plan.step)
                del state.trained_steps[entry.agent][:-MAX_TRAINED_STEPS]
        notices.update(step_notices(plan, agents, trained=True, min_agents=run.min_agents, after_train=True))
    timing |= {"train_s": clock() - t_ver, "step_s": clock() - t_start}
    _totals(state, agents)
    state.elapsed_s += clock() - t_start
    state.pending = None
    record = step_record(plan, agents, tracker, timing, trained=trained, time_s=clock())
    _commit(setup, state, metrics, record)
    log.info("%s", step_summary(record, run.steps))
    return upcoming


def _train(setup: Setup, transport: Transport, tracker: CapabilityTracker, plan: pb.RoundPlan, plan_b: bytes,
           accepted: Sequence[Any], agents: Mapping[str, AgentStep], verdicts: Mapping[str, Any],
           nodes: Sequence[Node], next_b: bytes, notices: dict[int, str]) -> tuple[dict[int, Reply], float]:
    """Broadcast the pool and the CapabilityTable to every agent that delivered (with the next plan),
    except rollout-only agents (roster ``role``), and the next plan alone to every other online
    node. Returns the next step's generate replies
    and the slowest site's worker time."""
    run = setup.run
    accuracy = {a: v.accuracy for a, v in verdicts.items()}
    corrections = [c for v in verdicts.values() for c in v.corrections]
    table = capability_table(tracker, plan, accuracy, corrections).SerializeToString(deterministic=True)
    pool = {item.agent: item.envelope for item in accepted}
    # a rollout-only site (roster role, docs/cross-vendor.md) is pooled and counted, never sent a train order
    contributors = {a for a in pool if rollout_only(setup.roster, a)}
    for agent in contributors:
        agents[agent].status = "contributed"
    ids = {item.agent: agents[item.agent].node_id for item in accepted if item.agent not in contributors}
    checkpoint = run.checkpoint_every > 0 and plan.step % run.checkpoint_every == 0
    orders = [Order(nid, "train", plan=plan_b, table=table, envelopes=pool, checkpoint=checkpoint, next_plan=next_b,
                    checkpoint_every=run.checkpoint_every, notice=notices.pop(nid, "")) for nid in ids.values()]
    if next_b:
        orders += [Order(n.node_id, "generate", plan=next_b, notice=notices.pop(n.node_id, ""))
                   for n in nodes if n.node_id not in ids.values()]
    timeout = run.train_timeout_s + (run.generate_timeout_s if next_b else 0.0)
    replies = _exchange(transport, orders, timeout)
    for agent, node_id in ids.items():
        train_outcome(agents[agent], replies[node_id], plan, pool=pool)
    upcoming: dict[int, Reply] = {}
    for nid, reply in replies.items():
        site = reply.site
        if nid in ids.values() and site.envelope is not None:  # train + next generate in one reply
            upcoming[nid] = Reply(nid, site=SiteReply(agent=site.agent, envelope=site.envelope,
                                                      metrics=site.generate_metrics))
        elif nid not in ids.values():
            upcoming[nid] = reply
    return upcoming, _worker_s(replies, timeout)


def rollout_only(roster: Mapping[str, Any], agent: str) -> bool:
    """The coordinator's roster lists ``agent`` with ``role = "rollout_only"`` (a plain mapping: no one is)."""
    check = getattr(roster, "rollout_only", None)
    return bool(check(agent)) if callable(check) else False


def _totals(state: CoordinatorState, agents: Mapping[str, AgentStep]) -> None:
    for name, a in agents.items():
        v = a.verification
        reasons = {f"reason/{a.reason}": 1.0} if a.reason else {}
        lost, late = len(a.reconciled.get("rolled_back", [])), len(a.reconciled.get("trained_late", []))
        if lost or late:
            reasons |= {"steps_rolled_back": float(lost), "steps_trained_late": float(late)}
        state.add_totals(name, steps_trained=float(a.status == "trained") + late - lost, rows_accepted=a.rows_accepted,
                         rows_rejected=a.rows_rejected, reward_disagreements=v.disagreements if v else 0,
                         bytes_in=a.bytes_in, bytes_out=a.bytes_out, **reasons)


def _maybe_evaluate(setup: Setup, transport: Transport, state: CoordinatorState, metrics: MetricsLog,
                    ids: Identities) -> None:
    """Held-out evaluation before the first step, after the last, and every ``eval_every`` steps.

    Replies count for an agent only from the node holding its verified identity (:func:`eval_record`); when
    unnamed nodes answer before this process verified any batch (the evaluation before the first step, or
    right after a restart), the record waits for the next step's batches (:attr:`Identities.held_eval`).
    Rollout-only sites are not asked (they have no weights to evaluate, docs/cross-vendor.md), as far as this
    process knows a node's agent: by the name it was registered with, or by the batches verified here."""
    run, s = setup.run, state.step
    due = s == 0 or s == run.steps or (run.eval_every > 0 and s % run.eval_every == 0)
    if not setup.held_out or not due or state.last_eval_step == s:
        return
    nodes = [n for n in _eligible(setup, transport) if not _holds_rollout_only(setup, ids, n)]
    t0 = setup.clock()
    request = eval_request(setup.held_out, run)
    replies = _exchange(transport, [Order(n.node_id, "evaluate", request=request) for n in nodes],
                        run.generate_timeout_s)
    tasks = {p.id: p.source for p in setup.held_out if p.source}
    ids.held_eval = {"step": s, "nodes": nodes, "replies": replies, "time": setup.clock(),
                     "eval_s": setup.clock() - t0, "tasks": tasks if len(set(tasks.values())) > 1 else None}
    if ids.holders or all(n.name for n in nodes) or s >= run.steps:
        _flush_eval(setup, state, metrics, ids)
    else:
        log.info("eval after step %d: recorded once the next step's batches show which node is which agent", s)


def _holds_rollout_only(setup: Setup, ids: Identities, node: Node) -> bool:
    """``node`` speaks for a rollout-only agent: its registered name, or the agent whose batch it delivered."""
    agents = {node.name} if node.name else {a for a, nid in ids.holders.items() if nid == node.node_id}
    return any(rollout_only(setup.roster, a) for a in agents)


def _flush_eval(setup: Setup, state: CoordinatorState, metrics: MetricsLog, ids: Identities) -> None:
    """Write the held evaluation's metrics line (if any), attributed with the identities verified so far."""
    held, ids.held_eval = ids.held_eval, None
    if held is None:
        return
    record = eval_record(held["nodes"], held["replies"], run_id=setup.run.run_id, step=held["step"],
                         prompts=len(setup.held_out), tasks=held["tasks"], holders=ids.holders)
    state.last_eval_step = held["step"]
    _commit(setup, state, metrics, record | {"time": held["time"], "eval_s": held["eval_s"]})


def _seconds(record: Mapping[str, Any], key: str) -> float | None:
    """``record["timing"][key]`` when it is a finite number of seconds, else None."""
    timing = record.get("timing")
    value = timing.get(key) if isinstance(timing, dict) else None
    ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf")
    return float(value) if ok else None


def _run_end(state: CoordinatorState, metrics: MetricsLog) -> dict[str, Any]:
    """The ``run_end`` record, from the state and the step records of the metrics log (records without usable
    timings count as skipped or untimed, never crash the run's end)."""
    steps = [r for r in metrics.read() if r.get("event") == "step"]
    step_s = [x for x in (_seconds(r, "step_s") for r in steps) if x is not None]
    overhead = [x for x in (_seconds(r, "overhead_s") for r in steps) if x is not None]
    return {"event": "run_end", "run_id": state.run_id, "steps": state.step, "elapsed_s": state.elapsed_s,
            "restarts": state.restarts, "mean_step_s": sum(step_s) / len(step_s) if step_s else None,
            "mean_overhead_s": sum(overhead) / len(overhead) if overhead else None,
            "overhead_frac": sum(overhead) / sum(step_s) if overhead and sum(step_s) > 0 else None,
            "skipped_steps": sum(r.get("trained") is not True for r in steps), "totals": state.totals}
