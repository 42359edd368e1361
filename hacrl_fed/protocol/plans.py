"""Asynchronous pools (``run.mode = "async"``, docs/async.md): the plans one learner's pool may answer.

An asynchronous train order carries the learner's own ``plan`` and ``peer_plans``: the plans of pooled peer
batches of other steps. :func:`check_peer_plans` checks them; :func:`catalogue` merges their prompts with the
own plan's into one :class:`Catalogue` (a prompt id names one problem: a peer plan that gives one other
content is refused as a whole); :func:`pool_problem` says why one opened peer batch may not join the pool.
Pure functions over the generated protobufs, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hacrl_fed.protocol.validation import BatchRejected, check_rollouts, plan_episodes
from hacrl_fed.v1.rollout_pb2 import EpisodeSpec, PromptItem, RolloutBatch, RoundPlan

__all__ = ["MAX_PEER_PLANS", "Catalogue", "PlanError", "PlanRows", "async_metrics", "catalogue", "check_peer_plans",
           "pool_problem"]

MAX_PEER_PLANS = 64
"""Peer plans one train order may carry (the ClientApp reads no more, :mod:`hacrl_fed.flower.records`)."""


class PlanError(ValueError):
    """A malformed peer plan (the whole train order is refused)."""


@dataclass(frozen=True)
class PlanRows:
    """What a batch answering one plan must hold (the arguments of :func:`check_rollouts`)."""

    prompt_ids: frozenset[str]
    samples_per_prompt: int
    """G: rollouts per prompt."""
    max_new_tokens: int | None
    """The plan's generation cap (None: no length bound)."""
    episodes: Mapping[str, EpisodeSpec] = field(default_factory=dict)
    """Prompt id → environment instance of the plan's episode prompts (:func:`plan_episodes`)."""


@dataclass
class Catalogue:
    """The prompts one train order's rows answer: the own plan's plus the peer plans' not refused."""

    prompts: dict[str, PromptItem]
    """Prompt id → problem (the own plan's first)."""
    prompt_ids: dict[str, tuple[int, ...]]
    """Prompt id → the learner's rendering of it (token ids), for every prompt of ``prompts``."""
    plans: dict[int, PlanRows]
    """Step → what a batch of that step must hold: the own step and every peer plan's."""
    conflicts: dict[int, str] = field(default_factory=dict)
    """Peer plan step → why its batches are refused (a prompt id with other content)."""


def check_peer_plans(plan: RoundPlan, peer_plans: Sequence[RoundPlan], *,
                     max_samples_per_prompt: int | None = None, max_new_tokens: int | None = None) -> None:
    """At most :data:`MAX_PEER_PLANS`; each of ``plan``'s run, of a step other than ``plan.step`` and every other
    peer plan's, with ≥ 1 prompt, 1 ≤ G ≤ ``max_samples_per_prompt``, a generation cap ≤ ``max_new_tokens`` (None:
    unbounded) and non-empty prompt ids unique within it. Raises :class:`PlanError` naming the first bad plan."""
    if len(peer_plans) > MAX_PEER_PLANS:
        raise PlanError(f"the train order carries {len(peer_plans)} peer plans, at most {MAX_PEER_PLANS}")
    steps: set[int] = set()
    for i, p in enumerate(peer_plans):
        what = f"peer plan {i} (step {p.step})"
        if p.run_id != plan.run_id:
            raise PlanError(f"{what} is for run {p.run_id[:64]!r}, the train order for run {plan.run_id!r}")
        if p.step == plan.step:
            raise PlanError(f"{what} has the train order's own step: the own step's plan is `plan`")
        if p.step in steps:
            raise PlanError(f"{what}: two peer plans for one step")
        steps.add(p.step)
        if not p.prompts or p.samples_per_prompt < 1:
            raise PlanError(f"{what} needs at least one prompt and samples_per_prompt >= 1, has {len(p.prompts)} "
                            f"prompt(s) and samples_per_prompt {p.samples_per_prompt}")
        if (max_samples_per_prompt is not None and p.samples_per_prompt > max_samples_per_prompt
                or max_new_tokens is not None and p.sampling.max_new_tokens > max_new_tokens):
            raise PlanError(f"{what}: samples_per_prompt must be <= {max_samples_per_prompt} and max_new_tokens "
                            f"<= {max_new_tokens}")
        ids = [q.prompt_id for q in p.prompts]
        if not all(ids) or len(set(ids)) != len(ids):
            raise PlanError(f"{what}: prompt ids must be non-empty and unique within the plan")


def _conflicts(own: Mapping[str, PromptItem], own_step: int, peer_plans: Sequence[RoundPlan]) -> dict[int, str]:
    """Peer plan step → why it is refused: a prompt id it shares with the own plan but with other content (text,
    reference answer, answer style, task), or one that peer plans give different contents (all of them are
    refused: none is known right)."""
    seen: dict[str, dict[bytes, list[int]]] = {}
    for p in peer_plans:
        for q in p.prompts:
            seen.setdefault(q.prompt_id, {}).setdefault(q.SerializeToString(deterministic=True), []).append(p.step)
    out: dict[int, str] = {}
    for pid, contents in seen.items():
        if pid in own:
            mine = own[pid].SerializeToString(deterministic=True)
            bad = [s for content, ss in contents.items() if content != mine for s in ss]
            whom = f"the own plan (step {own_step})"
        else:
            bad = [s for ss in contents.values() for s in ss] if len(contents) > 1 else []
            whom = "another peer plan"
        for s in bad:
            out.setdefault(s, f"step {s}'s plan gives prompt {pid[:64]!r} another text, reference answer, answer "
                              f"style or task than {whom}")
    return out


def catalogue(own: Any, peer_plans: Sequence[RoundPlan] = (),
              peer_prompt_ids: Mapping[str, Sequence[int]] | None = None) -> Catalogue:
    """The order's :class:`Catalogue`. ``own``: the learner's own rollouts of the order's step
    (``hacrl_fed.worker.trainer.StepRollouts``: ``step``, ``prompts``, learner renderings ``prompt_ids``,
    ``samples_per_prompt``, ``max_new_tokens``); ``peer_prompt_ids``: the learner's rendering of every peer plan
    prompt id the own plan lacks. Raises ``ValueError`` when one a peer plan not refused needs is missing."""
    rows = PlanRows(frozenset(own.prompt_ids), own.samples_per_prompt, own.max_new_tokens,
                    plan_episodes(own.prompts.values()))
    cat = Catalogue(prompts=dict(own.prompts), prompt_ids={k: tuple(v) for k, v in own.prompt_ids.items()},
                    plans={own.step: rows}, conflicts=_conflicts(own.prompts, own.step, peer_plans))
    for p in peer_plans:
        cat.plans[p.step] = PlanRows(frozenset(q.prompt_id for q in p.prompts), p.samples_per_prompt,
                                     p.sampling.max_new_tokens or None, plan_episodes(p.prompts))
        if p.step in cat.conflicts:
            continue
        for q in p.prompts:
            if q.prompt_id in cat.prompt_ids:
                continue
            if peer_prompt_ids is None or q.prompt_id not in peer_prompt_ids:
                raise ValueError(f"no learner rendering of peer plan prompt {q.prompt_id!r} (step {p.step})")
            cat.prompts[q.prompt_id] = q
            cat.prompt_ids[q.prompt_id] = tuple(peer_prompt_ids[q.prompt_id])
    return cat


def pool_problem(batch: RolloutBatch, cat: Catalogue, pooled_steps: Collection[int],
                 pooled_keys: Collection[tuple[str, int]]) -> str:
    """Why an opened batch (of a step in ``cat.plans``) may not join the pool, "" when it may: its plan refused
    (``inconsistent_plan``), a batch of its agent for its step already pooled (``pooled_steps``), the content
    checks against its plan (:func:`check_rollouts`), or (``duplicate_sample``) rollouts whose (prompt id, sample
    index) its agent's pooled batches already hold (``pooled_keys``): the same problem in two plans."""
    if batch.step in cat.conflicts:
        return f"inconsistent_plan: {cat.conflicts[batch.step]}; batch left out"
    if batch.step in pooled_steps:
        return "duplicate batch for this step"
    plan = cat.plans[batch.step]
    try:
        check_rollouts(batch, plan.prompt_ids, plan.samples_per_prompt, max_new_tokens=plan.max_new_tokens,
                       episodes=plan.episodes)
    except BatchRejected as err:
        return f"{err.reason.value}: {err}"
    again = sorted({f"{r.prompt_id}#{r.sample_index}" for r in batch.rollouts
                    if (r.prompt_id, r.sample_index) in pooled_keys})
    if again:
        return (f"duplicate_sample: {len(again)} rollout(s) already pooled from {batch.agent_id} for another step's "
                f"plan (the same problem in two plans): {', '.join(again[:3])}"
                + (f" (+{len(again) - 3} more)" if len(again) > 3 else ""))
    return ""


def async_metrics(rows: Sequence[Any], origin: Mapping[tuple[str, str, int], int], own_step: int) -> dict[str, float]:
    """A learner's asynchronous step in numbers: ``async/peer_plans`` (peer plans with rows in the update),
    ``async/peer_plan_rows`` (foreign rows of peer-plan batches in the update) and ``async/no_own_groups`` (prompt
    groups of the update without an own row). ``rows``: ``TrainingRow``-like (``source_agent``, ``prompt_id``,
    ``sample_index``, ``is_own``); ``origin``: (source agent, prompt id, sample index) → step of every pooled
    foreign rollout."""
    peer = [s for r in rows if not r.is_own
            if (s := origin[(r.source_agent, r.prompt_id, int(r.sample_index))]) != own_step]
    groups: dict[str, bool] = {}
    for r in rows:
        groups[r.prompt_id] = groups.get(r.prompt_id, False) or bool(r.is_own)
    return {"async/peer_plans": float(len(set(peer))), "async/peer_plan_rows": float(len(peer)),
            "async/no_own_groups": float(sum(not has_own for has_own in groups.values()))}
