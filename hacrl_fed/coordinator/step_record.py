"""Per-agent bookkeeping of one coordinator step and the metrics line it becomes.

:func:`collect_batches` turns the generate replies into accepted batches and per-agent outcomes
(every reply is accounted for: accepted, rejected with a reason, error, timeout). An agent is keyed
by its verified signer and keeps the node that delivered its batch (its train order goes there); a
claim of a name without a batch signed by its roster key is refused on its own (``name@node``), and a
name two nodes deliver verified batches for at one step is an error for both (``duplicate_agent``);
:func:`train_outcome` adds the train reply; :func:`step_record` writes the JSON-lines record.
Pure functions over protobuf messages and the reply dataclass; no I/O besides logging.

Metrics line of one step (``event = "step"``), per agent under ``agents.<name>``:
``status`` (trained | train_error | rejected | error | timeout), ``reason`` (a
:class:`~hacrl_fed.protocol.validation.Reason` value), ``detail``, ``rows_accepted``,
``rows_rejected``, ``accuracy`` (coordinator verdicts), ``site_accuracy`` (claimed),
``capability`` (P̂ after this step), ``task_accuracy`` and ``task_capability`` (per task label of the
plan's prompts: this step's mean reward and P̂(t); empty without tasks), ``reward_disagreements``, ``verdict_mismatches``,
``verifier_errors`` (``verifier_timeouts`` of them ran out of CPU time), ``bytes_in``/``bytes_out`` (wire bytes of replies/orders), ``generate_s`` and
``train_s`` (worker-reported), and the worker's raw ``generate``/``train`` metrics (bounded, as
everything read from a reply: :mod:`~hacrl_fed.coordinator.intake`). ``timing``
holds the coordinator's phases in seconds (``plan_s``, ``generate_s``, ``validate_s``,
``verify_s``, ``train_s``, ``step_s``), ``worker_s`` (the slowest site's time inside worker calls,
summed over the step's exchanges) and ``overhead_s`` = ``step_s`` − ``worker_s`` − ``verify_s``:
what the federation itself costs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from hacrl_fed.config import RunConfig
from hacrl_fed.coordinator.intake import bounded_metrics, bounded_text
from hacrl_fed.coordinator.phases import AgentVerification, prompt_item, step_seed
from hacrl_fed.protocol.keys import AGENT_NAME_PATTERN
from hacrl_fed.protocol.site_reply import ALREADY_TRAINED
from hacrl_fed.protocol.validation import AcceptedBatch, BatchRejected, Reason, validate_envelope
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb

__all__ = ["TRAINED_STEP_METRIC", "AgentStep", "claimed_agent", "collect_batches", "eval_record", "eval_request",
           "interrupted_record", "reconcile", "step_notices", "step_record", "step_summary", "train_outcome",
           "worker_seconds"]

log = logging.getLogger("hacrl_fed.coordinator")

_STATUS_OF = {Reason.TIMEOUT: "timeout", Reason.NODE_ERROR: "error"}
MAX_LISTED = 50
"""Entries of a site's list of refused peer batches kept in the metrics."""


@dataclass
class AgentStep:
    """What happened to one agent (one delivering node) during one step."""

    agent: str
    node_id: int
    status: str = "pending"
    reason: str = ""
    detail: str = ""
    rows_accepted: int = 0
    rows_rejected: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    fingerprint: str = ""
    generate: dict[str, float] = field(default_factory=dict)
    train: dict[str, float] = field(default_factory=dict)
    per_source: dict[str, dict[str, float]] = field(default_factory=dict)
    train_rejected: list[str] = field(default_factory=list)
    verification: AgentVerification | None = None
    reconciled: dict[str, list[int]] = field(default_factory=dict)
    """``rolled_back`` / ``trained_late``: steps :func:`reconcile` found the site's weights disagree on."""


def worker_seconds(metrics: Mapping[str, float]) -> float | None:
    """A worker's own time for a phase: ``time/total_s`` if reported, else the sum of ``time/*_s``."""
    if "time/total_s" in metrics:
        return float(metrics["time/total_s"])
    parts = [float(v) for k, v in metrics.items() if k.startswith("time/") and k.endswith("_s")]
    return sum(parts) if parts else None


def claimed_agent(node: Any, reply: Any) -> str:
    """The agent a node speaks for: its registration name, else the well-formed agent name it reported in
    a reply, else ``''`` (a claim only: the envelope's signature decides)."""
    if node.name:
        return str(node.name)
    reported = getattr(getattr(reply, "site", None), "agent", "") if reply is not None else ""
    return reported if isinstance(reported, str) and re.fullmatch(AGENT_NAME_PATTERN, reported) else ""


def refuse_replay_mismatches(accepted: Sequence[AcceptedBatch], agents: Mapping[str, AgentStep],
                             verifications: Mapping[str, Any], step: int) -> list[AcceptedBatch]:
    """The accepted batches without those holding an episode whose replay disagrees with its trajectory
    (``verifications[agent].replay_mismatches``, :func:`hacrl_fed.coordinator.phases.reverify`): such a batch is
    refused as a whole, its entry set to ``rejected`` / ``replay_mismatch`` with the episodes named (logged, and
    told to the site with its next order like any refusal)."""
    kept = []
    for item in accepted:
        found = getattr(verifications.get(item.agent), "replay_mismatches", None)
        if not found:
            kept.append(item)
            continue
        entry = agents[item.agent]
        entry.status, entry.reason = "rejected", Reason.REPLAY_MISMATCH.value
        entry.detail = bounded_text(f"{len(found)} episode(s) do not replay: {'; '.join(found[:3])}")
        entry.rows_rejected += entry.rows_accepted
        entry.rows_accepted, entry.fingerprint = 0, ""
        log.warning("step %d: %s (node %d) %s: %s", step, item.agent, entry.node_id, entry.reason, entry.detail)
    return kept


def collect_batches(nodes: Sequence[Any], replies: Mapping[int, Any], roster: Mapping[str, Any],
                    plan: pb.RoundPlan, *, max_bytes: int,
                    timeout_s: float) -> tuple[list[AcceptedBatch], dict[str, AgentStep]]:
    """Validate every node's generate reply. Returns the accepted batches and one entry per node.

    The expected signer of a node's envelope is the agent it claims (:func:`claimed_agent`); an
    accepted entry is keyed by its verified signer and keeps the delivering node's id, so the agent's
    train order goes to that node and no other. Among nodes claiming one name, the one whose batch is
    accepted (signed by that name's roster key, every check passed) holds the name; each other claim is
    refused on its own (its reason logged and told back, keyed ``name@node``), so a node claiming a name
    it cannot sign for never blocks the real agent. Two nodes delivering accepted batches for one name
    at one step (a copied key, a misconfiguration) are an error for both (``duplicate_agent``, logged):
    neither batch is pooled. A node without a reply counts as timed out.
    """
    owed = len(plan.prompts) * plan.samples_per_prompt
    found: list[tuple[AgentStep, AcceptedBatch | None]] = []
    for node in nodes:
        reply = replies.get(node.node_id)
        site = reply.site if reply is not None else None
        claim = claimed_agent(node, reply) if reply is not None and not reply.timed_out else str(node.name or "")
        entry = AgentStep(claim or f"node-{node.node_id}", node.node_id, bytes_in=getattr(reply, "bytes_in", 0),
                          bytes_out=getattr(reply, "bytes_out", 0), generate=dict(site.metrics) if site else {})
        item = None
        try:
            if reply is None or reply.timed_out:
                raise BatchRejected(Reason.TIMEOUT, f"no reply within {timeout_s:g} s", rows=owed)
            if reply.error or site.envelope is None:
                raise BatchRejected(Reason.NODE_ERROR, reply.error or "reply without an envelope", rows=owed)
            if node.name and site.agent and site.agent != node.name:
                raise BatchRejected(Reason.AGENT_MISMATCH, f"node registered as {node.name!r} reports agent "
                                    f"{site.agent!r}", rows=owed)
            item = validate_envelope(site.envelope, roster, plan, expected_agent=claim or None, max_bytes=max_bytes)
        except BatchRejected as rej:
            entry.status, entry.reason = _STATUS_OF.get(rej.reason, "rejected"), rej.reason.value
            entry.detail, entry.rows_rejected = str(rej), rej.rows
            log.warning("step %d: %s (node %d) %s: %s", plan.step, entry.agent, node.node_id, rej.reason.value, rej)
        else:
            entry.agent = item.agent  # the verified signer (an unnamed node that reported nothing included)
            entry.status, entry.rows_accepted = "accepted", len(item.batch.rollouts)
            entry.fingerprint = item.batch.model_fingerprint
        found.append((entry, item))
    by_name: dict[str, list[tuple[AgentStep, AcceptedBatch | None]]] = {}
    for entry, item in found:
        by_name.setdefault(entry.agent, []).append((entry, item))
    accepted: list[AcceptedBatch] = []
    agents: dict[str, AgentStep] = {}
    for name, group in by_name.items():
        verified = [(e, i) for e, i in group if i is not None]
        if len(group) == 1 or len(verified) == 1:
            _hold_name(name, group, verified, agents, accepted, plan.step)
            continue
        for entry, _ in group:  # several claims and no verified batch: each keeps its own reason
            entry.agent = f"{name}@{entry.node_id}"
            agents[entry.agent] = entry
        if len(verified) < 2:
            continue
        holders = ", ".join(str(e.node_id) for e, _ in verified)
        for entry, _ in verified:
            entry.rows_rejected += entry.rows_accepted
            entry.status, entry.reason, entry.rows_accepted, entry.fingerprint = (
                "rejected", Reason.DUPLICATE_AGENT.value, 0, "")
            entry.detail = (f"agent {name!r} is delivered with a batch signed by its roster key by nodes {holders} at "
                            "this step; none of them is pooled")
        log.warning("step %d: agent %r is delivered with a verified batch by nodes %s: %s for all of them", plan.step,
                    name, holders, Reason.DUPLICATE_AGENT.value)
    return accepted, agents


def _hold_name(name: str, group: list[tuple[AgentStep, AcceptedBatch | None]],
               verified: list[tuple[AgentStep, AcceptedBatch | None]], agents: dict[str, AgentStep],
               accepted: list[AcceptedBatch], step: int) -> None:
    """File a name's only claim, or its one verified delivery among several claims, under the name; every other
    claim of it under ``name@node`` with its own reason (already logged), noting who holds the name."""
    holder, item = verified[0] if verified else group[0]
    agents[name] = holder
    if item is not None:
        accepted.append(item)
    for entry, _ in group:
        if entry is holder:
            continue
        entry.agent = f"{name}@{entry.node_id}"
        entry.detail = bounded_text(f"{entry.detail}; agent {name!r} is node {holder.node_id}, whose batch is "
                                    f"signed by its roster key", 500)
        agents[entry.agent] = entry
        log.warning("step %d: node %d claims agent %r without a batch signed by its roster key (%s); node %d "
                    "delivered %r's verified batch", step, entry.node_id, name, entry.reason, holder.node_id, name)


def train_outcome(entry: AgentStep, reply: Any, plan: pb.RoundPlan, pool: Collection[str] = ()) -> None:
    """Record one participant's train reply (TrainReport) in ``entry``; logs failures.

    Only the report's sources that were in the pool (``pool``: the agents whose batches were sent; empty:
    any) are kept, with bounded metrics (:mod:`~hacrl_fed.coordinator.intake`); the refused-batch lines
    are bounded to :data:`MAX_LISTED` printable lines.
    """
    entry.bytes_in += reply.bytes_in
    entry.bytes_out += reply.bytes_out
    problem = "timeout" if reply.timed_out else reply.error
    report = None
    if not problem:
        try:
            report = pb.TrainReport.FromString(reply.site.report or b"")
        except DecodeError:
            problem = "unreadable TrainReport"
    if report is not None and (report.run_id != plan.run_id or report.step != plan.step
                               or report.agent_id != entry.agent):
        problem = (f"TrainReport for run {bounded_text(report.run_id, 80)!r} step {report.step} agent "
                   f"{bounded_text(report.agent_id, 80)!r}, expected {plan.run_id!r} step {plan.step} "
                   f"agent {entry.agent!r}")
    if problem and not reply.timed_out and ALREADY_TRAINED in problem:   # its weights hold the step: trained
        entry.status, entry.reason, entry.detail = "trained", "already_trained", bounded_text(problem)
        log.info("step %d: %s had already trained it (a re-sent order): counted as trained", plan.step, entry.agent)
        return
    if problem:
        entry.status, entry.reason, entry.detail = "train_error", "train_timeout" if reply.timed_out else "train_error", problem
        log.warning("step %d: %s train failed: %s", plan.step, entry.agent, problem)
        return
    entry.status = "trained"
    entry.train = dict(reply.site.metrics)
    known = set(pool)
    sources = [s for s in report.per_source if (not known or s.source_agent in known)
               and re.fullmatch(AGENT_NAME_PATTERN, s.source_agent)]
    entry.per_source = {s.source_agent: bounded_metrics(dict(s.metrics)) for s in sources[:MAX_LISTED]}
    entry.train_rejected = [bounded_text(line) for line in report.rejected[:MAX_LISTED]]
    for line in entry.train_rejected:
        log.warning("step %d: %s refused a peer batch: %s", plan.step, entry.agent, line)
    if reply.site.checkpoint_error:
        entry.detail = f"checkpoint failed: {reply.site.checkpoint_error}"
        log.warning("step %d: %s trained, but its checkpoint failed: %s", plan.step, entry.agent,
                    reply.site.checkpoint_error)
    if reply.site.generate_error:
        log.warning("step %d: %s could not generate for the next step: %s", plan.step, entry.agent,
                    reply.site.generate_error)


TRAINED_STEP_METRIC = "state/trained_step"
"""Generate metric of a site: the last step its weights hold (0: none), as its worker reports it."""


def reconcile(entry: AgentStep, trained: list[int], step: int) -> dict[str, list[int]]:
    """Make the coordinator's record of an agent's trained steps agree with its weights.

    ``trained`` (ascending; updated in place) are the steps the coordinator recorded as trained at this
    agent; the site's generate metric :data:`TRAINED_STEP_METRIC` (read only from a node that delivered
    the agent's verified batch, at ``step``) says which step its weights hold. Recorded steps after it
    were lost to a roll-back (a restart from an older checkpoint); a held step the record lacks was
    trained when the coordinator no longer waited (a late reply, an interrupted train phase). Both are
    logged and stored in ``entry.reconciled``; returns it (empty: they agree, or nothing to compare).
    """
    reported = entry.generate.get(TRAINED_STEP_METRIC)
    if entry.status != "accepted" or reported is None or not float(reported).is_integer() or not 0 <= reported < step:
        return entry.reconciled
    held = int(reported)
    lost = [s for s in trained if s > held]
    trained[:] = [s for s in trained if s <= held]
    late = [held] if held > 0 and held not in trained else []
    trained.extend(late)
    if lost:
        entry.reconciled["rolled_back"] = lost
        log.warning("step %d: %s holds the weights of step %d: %d trained step(s) lost to a roll-back (%s)", step,
                    entry.agent, held, len(lost), ", ".join(map(str, lost[:10])) + (" …" if len(lost) > 10 else ""))
    if late:
        entry.reconciled["trained_late"] = late
        log.warning("step %d: %s trained step %d, which was recorded as not trained there; counted now", step,
                    entry.agent, held)
    return entry.reconciled


def step_notices(plan: pb.RoundPlan, agents: Mapping[str, AgentStep], *, trained: bool, min_agents: int,
                 after_train: bool = False) -> dict[int, str]:
    """What each node is told with its next order (node id → one line, at most 400 characters): why its
    batch was not pooled, why the step was skipped, or (``after_train``) why its training was recorded as
    failed. Nodes with nothing to be told are left out."""
    out: dict[int, str] = {}
    pooled = sum(a.status in ("accepted", "trained", "train_error", "contributed") for a in agents.values())
    for a in agents.values():
        if after_train:
            text = f"your training was recorded as failed: {a.detail}" if a.status == "train_error" else ""
        elif a.status in ("rejected", "error"):
            text = f"your batch was not pooled ({a.reason}): {a.detail}"
        elif a.status == "timeout":
            text = f"no batch from you arrived in time ({a.detail})"
        elif a.status == "accepted" and not trained:
            text = f"step skipped: {pooled} valid batch(es), the coordinator needs {min_agents}"
        else:
            text = ""
        if text:
            out[a.node_id] = bounded_text(f"step {plan.step}: {text}", 400)
    return out


def interrupted_record(pending: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics line of a step whose train phase a coordinator crash interrupted: not trained (no
    site's training was recorded), each participant ``interrupted``; sites that did train it are found
    and counted at their next batch (:func:`reconcile`)."""
    record = dict(pending, interrupted=True, trained=False)
    record["agents"] = {name: dict(a, status="interrupted", reason="train_phase_interrupted")
                        if a.get("status") == "accepted" else a for name, a in pending.get("agents", {}).items()}
    return record


def _agent_record(a: AgentStep, tracker: Any) -> dict[str, Any]:
    v = a.verification
    known = a.agent in tracker.agents
    return {
        "node_id": a.node_id, "status": a.status, "reason": a.reason, "detail": a.detail,
        "rows_accepted": a.rows_accepted, "rows_rejected": a.rows_rejected,
        "accuracy": v.accuracy if v else None, "site_accuracy": v.site_accuracy if v else None,
        "capability": tracker.capability(a.agent) if known else None,
        "task_accuracy": dict(v.task_accuracy) if v else {},
        "task_capability": tracker.task_capabilities(a.agent) if known else {},
        "reward_disagreements": v.disagreements if v else 0, "verdict_mismatches": v.verdict_mismatches if v else 0,
        "verifier_errors": v.verifier_errors if v else 0,
        "verifier_timeouts": v.verifier_timeouts if v else 0, "bytes_in": a.bytes_in, "bytes_out": a.bytes_out,
        "generate_s": worker_seconds(a.generate), "train_s": worker_seconds(a.train),
        "model_fingerprint": a.fingerprint, "generate": a.generate, "train": a.train, "per_source": a.per_source,
        "train_rejected": a.train_rejected, "rolled_back_steps": a.reconciled.get("rolled_back", []),
        "late_trained_steps": a.reconciled.get("trained_late", []),
    }


def step_record(plan: pb.RoundPlan, agents: Mapping[str, AgentStep], tracker: Any, timing: dict[str, float], *,
                trained: bool, time_s: float) -> dict[str, Any]:
    """The metrics line of one step (module docstring), with ``timing.overhead_s`` filled in."""
    per_agent = {name: _agent_record(a, tracker) for name, a in sorted(agents.items())}
    gen = [r["generate_s"] for r in per_agent.values() if r["generate_s"] is not None and r["status"] != "rejected"]
    trn = [r["train_s"] for r in per_agent.values() if r["train_s"] is not None and r["status"] == "trained"]
    timing = dict(timing, worker_generate_s=max(gen, default=None), worker_train_s=max(trn, default=None))
    # federation overhead: step time spent neither in the slowest site's worker calls nor re-verifying
    timing["overhead_s"] = max(0.0, timing["step_s"] - timing.get("worker_s", 0.0) - timing["verify_s"])
    return {
        "event": "step", "run_id": plan.run_id, "step": plan.step, "time": time_s, "trained": trained,
        "participants": sorted(n for n, a in agents.items()
                               if a.status in ("trained", "train_error", "accepted", "contributed")),
        "prompt_ids": [p.prompt_id for p in plan.prompts],
        "sampling": {"temperature": plan.sampling.temperature, "top_p": plan.sampling.top_p,
                     "top_k": plan.sampling.top_k, "max_new_tokens": plan.sampling.max_new_tokens,
                     "seed": plan.sampling.seed, "samples_per_prompt": plan.samples_per_prompt},
        "agents": per_agent, "timing": timing,
    }


def step_summary(record: Mapping[str, Any], steps: int) -> str:
    """One line for the coordinator's terminal from a :func:`step_record` line: the step's outcome,
    per agent its status (with the reason when it was left out), coordinator accuracy and rows
    accepted/rejected, then the step time and the federation overhead (seconds)."""
    agents = []
    for name, a in record["agents"].items():
        status = a["status"] + (f" ({a['reason']})" if a.get("reason") and a["status"] != "trained" else "")
        acc = f" acc {a['accuracy']:.3f}" if a.get("accuracy") is not None else ""
        agents.append(f"{name} {status}{acc} rows {a['rows_accepted']}/{a['rows_rejected']}")
    timing = record["timing"]
    outcome = "trained" if record["trained"] else "skipped"
    return (f"step {record['step']}/{steps} {outcome}: {'; '.join(agents) or 'no agents'} | "
            f"step {timing['step_s']:.1f} s, overhead {timing.get('overhead_s', 0.0):.1f} s"
            + (" (interrupted)" if record.get("interrupted") else ""))


def eval_request(held_out: Sequence[Any], run: RunConfig) -> bytes:
    """Serialized EvaluateRequest: greedy (temperature 0, one sample) on the held-out problems, for this run
    (a site whose model belongs to another run refuses it)."""
    req = wpb.EvaluateRequest(
        prompts=[prompt_item(p) for p in held_out],
        samples=1,
        sampling=pb.SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=run.sampling.max_new_tokens,
                                   seed=step_seed(run.seed, -1)),
        run_id=run.run_id,
    )
    return req.SerializeToString(deterministic=True)


def task_scores(results: Sequence[Any], tasks: Mapping[str, str]) -> dict[str, float]:
    """``task/<label>/accuracy`` (mean share of correct responses) per task of ``tasks`` (prompt id → label) from
    an ``EvaluateResponse``'s per-problem results; results for prompts outside ``tasks``, repeated prompt ids and
    counts out of range are ignored."""
    seen: set[str] = set()
    sums: dict[str, list[float]] = {}
    for r in results:
        task = tasks.get(r.prompt_id)
        if not task or r.prompt_id in seen or not 0 <= r.correct <= r.total or r.total < 1:
            continue
        seen.add(r.prompt_id)
        sums.setdefault(task, []).append(r.correct / r.total)
    return {f"task/{t}/accuracy": sum(v) / len(v) for t, v in sorted(sums.items())}


def eval_record(nodes: Sequence[Any], replies: Mapping[int, Any], *, run_id: str, step: int,
                prompts: int, tasks: Mapping[str, str] | None = None,
                holders: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The metrics line of one held-out evaluation: per agent the worker's bounded metrics or the error; with
    ``tasks`` (prompt id → task label of the held-out problems, when there is more than one task) also
    ``task/<label>/accuracy`` per task.

    A reply is filed under an agent's name only from the node that holds the agent's verified identity: the
    name the node is registered with (SuperNode authentication), or the name it reports when it is the node
    that delivered that agent's last accepted, signature-verified batch (``holders``: agent → node id). Every
    other node's reply is filed under ``unverified@<node id>`` (a claimed roster name is logged, never used);
    two nodes under one name are told apart as ``name@node``."""
    holders = holders or {}
    labels = []
    for node in nodes:
        claim = claimed_agent(node, replies.get(node.node_id))
        if node.name or (claim and holders.get(claim) == node.node_id):
            labels.append(claim)
            continue
        labels.append(f"unverified@{node.node_id}")
        if claim:
            held = holders.get(claim)
            log.warning("eval after step %d: node %d says it is %r, but %s: recorded as %s", step, node.node_id,
                        claim, f"{claim}'s last verified batch came from node {held}" if held is not None else
                        f"no batch signed by {claim}'s roster key came from it yet", labels[-1])
    agents: dict[str, Any] = {}
    for node, label in zip(nodes, labels):
        reply = replies.get(node.node_id)
        name = label if labels.count(label) == 1 else f"{label}@{node.node_id}"
        if reply is None or reply.error or reply.timed_out or reply.site.evaluation is None:
            agents[name] = {"error": bounded_text(getattr(reply, "error", "")) or "timeout"}
            continue
        try:
            res = wpb.EvaluateResponse.FromString(reply.site.evaluation)
        except DecodeError:
            agents[name] = {"error": "unreadable EvaluateResponse"}
            continue
        agents[name] = bounded_metrics(dict(res.metrics)) | (task_scores(res.results, tasks) if tasks else {})
        log.info("eval %s: %s %s", "before training" if step == 0 else f"after step {step}", name,
                 " ".join(f"{k}={v:.3f}" for k, v in sorted(agents[name].items())))
    return {"event": "eval", "run_id": run_id, "step": step, "prompts": prompts, "agents": agents}
