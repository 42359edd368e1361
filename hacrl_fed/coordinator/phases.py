"""Pure pieces of the coordinator's step (ARCHITECTURE.md §2; hacpo-spec §2, §8.3 steps 1 and 4).

* :func:`build_round_plan` — the step's :class:`RoundPlan` (B prompts, G, sampling, deadline).
* :func:`reverify` — the coordinator's own verdict on every pooled rollout, with the same
  verifier the sites use, against its own reference answers. Its verdict wins: where it differs
  from the site's reward it becomes a :class:`RewardCorrection`; disagreements are counted per agent.
* :func:`capability_table` — P̂ per agent after this step's window update (Eq. 9), plus the
  corrections, as broadcast with the pool.

No I/O, no Flower: the step loop (:mod:`hacrl_fed.coordinator.rounds`) calls these.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hacrl_fed.config import SamplingConfig
from hacrl_fed.protocol.validation import AcceptedBatch
from hacrl_fed.protocol.episodes import EPISODE_STYLE, REPLAY_MISMATCH, verifier_columns, zeroed_unverified
from hacrl_fed.v1 import rollout_pb2 as pb

__all__ = [
    "AgentVerification",
    "ProblemLike",
    "build_round_plan",
    "capability_table",
    "reverify",
    "step_seed",
]

_VERDICT_CODES = {"correct": pb.CORRECT, "incorrect": pb.INCORRECT, "verifier_error": pb.VERIFIER_ERROR}
_REWARD_TOLERANCE = 1e-9


class ProblemLike(Protocol):
    """What a plan needs of a problem (``hacrl_fed.data.Problem``)."""

    id: str
    problem: str
    answer: str
    answer_style: str


VerifyFn = Callable[..., Sequence[Any]]
"""``verify(responses, references, styles, problems) -> [verdict]`` with ``.verdict`` in
{"correct", "incorrect", "verifier_error"} and ``.reward`` (``hacrl_fed.reward.Verifier.verify``)."""


MAX_TASK_CHARS = 64
"""A problem's ``source`` longer than this, or with characters outside letters, digits and ``_.:/-``, travels as no
task."""
_TASK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,%d}" % (MAX_TASK_CHARS - 1))


def _task(problem: ProblemLike) -> str:
    """The task label a plan carries: the problem's ``source`` (a ``reasoning_gym`` task label, ``arithmetic-l1``, a
    file's ``data_source`` column …) when it is a short plain label (:data:`MAX_TASK_CHARS`), else empty."""
    source = getattr(problem, "source", "") or ""
    return source if _TASK_RE.fullmatch(source) else ""


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of one step: 63 bits of SHA-256 over ``"seed:step"`` (uncorrelated across steps)."""
    digest = hashlib.sha256(f"{int(seed)}:{int(step)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def build_round_plan(*, run_id: str, step: int, problems: Sequence[ProblemLike], samples_per_prompt: int,
                     sampling: SamplingConfig, seed: int, deadline_unix_s: float) -> pb.RoundPlan:
    """The RoundPlan of ``step``: B = ``len(problems)`` prompts, G samples each.

    Raises ValueError for an empty or duplicate-id problem list, or G < 1.
    """
    ids = [p.id for p in problems]
    if not ids:
        raise ValueError("a round plan needs at least one problem")
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate problem ids in one step: {sorted({i for i in ids if ids.count(i) > 1})}")
    if samples_per_prompt < 1:
        raise ValueError(f"samples_per_prompt must be >= 1, got {samples_per_prompt}")
    return pb.RoundPlan(
        run_id=run_id,
        step=step,
        samples_per_prompt=samples_per_prompt,
        sampling=pb.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                   max_new_tokens=sampling.max_new_tokens, seed=step_seed(seed, step)),
        prompts=[prompt_item(p) for p in problems],
        deadline_unix_s=deadline_unix_s,
    )


def prompt_item(p: ProblemLike) -> pb.PromptItem:
    """The plan's item of one problem; a problem with an ``episode`` (``hacrl_fed.envs.EpisodeSpec``) is an episode
    prompt: its environment instance, style ``episode``, no text or reference answer (docs/multi-turn.md)."""
    episode = getattr(p, "episode", None)
    if episode is not None:
        return pb.PromptItem(prompt_id=p.id, answer_style=EPISODE_STYLE, task=_task(p), episode=episode.to_proto())
    return pb.PromptItem(prompt_id=p.id, text=p.problem, reference_answer=p.answer,
                         answer_style=p.answer_style or "boxed", task=_task(p))


@dataclass
class AgentVerification:
    """The coordinator's re-verification of one agent's batch."""

    rewards: list[float]
    """Coordinator rewards, in the batch's rollout order."""
    site_rewards: list[float]
    corrections: list[pb.RewardCorrection] = field(default_factory=list)
    """One per rollout whose site reward differs from the coordinator's."""
    verdict_mismatches: int = 0
    """Rollouts with equal reward but another verdict (e.g. verifier_error vs incorrect)."""
    verifier_errors: int = 0
    """Coordinator-side verifier errors (timeouts, crashes): reward 0."""
    verifier_timeouts: int = 0
    """Of those, items that still ran out of CPU time after the verifier's retry (reason ``timeout …``)."""
    task_accuracy: dict[str, float] = field(default_factory=dict)
    """Mean coordinator reward per task label of the plan's prompts (empty when the plan has no tasks)."""
    replay_mismatches: list[str] = field(default_factory=list)
    """``prompt_id#sample: reason`` of every episode whose replay disagrees with its trajectory (the batch is
    then refused as a whole, :func:`hacrl_fed.coordinator.step_record.refuse_replay_mismatches`)."""

    @property
    def accuracy(self) -> float:
        """P_t: mean coordinator reward over the agent's B·G rollouts (hacpo-spec §8.3 step 4)."""
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    @property
    def site_accuracy(self) -> float:
        """Mean reward the site claimed."""
        return sum(self.site_rewards) / len(self.site_rewards) if self.site_rewards else 0.0

    @property
    def disagreements(self) -> int:
        return len(self.corrections)


def reverify(verify: VerifyFn, accepted: Sequence[AcceptedBatch], plan: pb.RoundPlan, *,
             truncated_reward: str = "zero") -> dict[str, AgentVerification]:
    """Re-verify every rollout of every accepted batch in one verifier call.

    Args:
        verify: the verifier (``Verifier.verify``); called once with all responses that need it.
        accepted: validated batches (their prompt ids are known to be in ``plan``).
        plan: the step's plan; its reference answers and answer styles are the coordinator's own.
        truncated_reward: ``zero``: a response with finish reason LENGTH gets reward 0 (verdict
            incorrect) without verification; ``verify``: verified like any other
            (``VerifierConfig.truncated_reward``).

    Returns agent → :class:`AgentVerification`. Raises ValueError if the verifier returns the
    wrong number of verdicts or an unknown verdict kind.
    """
    if truncated_reward not in ("zero", "verify"):
        raise ValueError(f"truncated_reward must be 'zero' or 'verify', got {truncated_reward!r}")
    prompts = {p.prompt_id: p for p in plan.prompts}
    todo: list[tuple[str, int]] = []
    results: dict[str, list[tuple[float, int]]] = {}
    timeouts: dict[str, int] = {}
    mismatches: dict[str, list[str]] = {}
    for item in accepted:
        rows = results.setdefault(item.agent, [])
        for i, r in enumerate(item.batch.rollouts):
            if zeroed_unverified(r, truncated_reward == "zero"):
                rows.append((0.0, pb.INCORRECT))
            else:
                rows.append((math.nan, pb.VERDICT_UNSPECIFIED))
                todo.append((item.agent, i))
    by_agent = {item.agent: item.batch for item in accepted}
    if todo:
        verdicts = list(_by_source(verify, verifier_columns(prompts, [by_agent[a].rollouts[i] for a, i in todo]),
                                   [a for a, _ in todo]))
        if len(verdicts) != len(todo):
            raise ValueError(f"verifier returned {len(verdicts)} verdicts for {len(todo)} responses")
        for (agent, i), v in zip(todo, verdicts):
            if v.verdict not in _VERDICT_CODES:
                raise ValueError(f"verifier returned unknown verdict {v.verdict!r}")
            results[agent][i] = (float(v.reward), _VERDICT_CODES[v.verdict])
            reason = str(getattr(v, "reason", ""))
            timeouts[agent] = timeouts.get(agent, 0) + reason.startswith("timeout")
            if reason.startswith(REPLAY_MISMATCH):
                r = by_agent[agent].rollouts[i]
                mismatches.setdefault(agent, []).append(f"{r.prompt_id}#{r.sample_index}: {reason}")
    out = {agent: _compare(agent, by_agent[agent], rows) for agent, rows in results.items()}
    for agent, found in mismatches.items():
        out[agent].replay_mismatches = found
    for agent, n in timeouts.items():
        out[agent].verifier_timeouts = n
    for agent, v in out.items():
        v.task_accuracy = _task_means(by_agent[agent], v.rewards, prompts)
    return out


def _by_source(verify: VerifyFn, columns, sources: list[str]):
    """``verify(*columns)``, with each row's agent as ``sources`` when the verifier bounds a source's CPU per
    call (``hacrl_fed.reward.Verifier.source_budget_s``: a source past it has its remaining rows refused as
    ``verifier_error``, reason ``source_budget``)."""
    if hasattr(getattr(verify, "__self__", None), "source_budget_s"):
        return verify(*columns, sources=sources)
    return verify(*columns)


def _task_means(batch: pb.RolloutBatch, rewards: Sequence[float], prompts: Mapping[str, pb.PromptItem]) -> dict[str, float]:
    """Mean reward per task label over the batch's rollouts (prompts without a task are left out)."""
    sums: dict[str, list[float]] = {}
    for r, reward in zip(batch.rollouts, rewards, strict=True):
        task = prompts[r.prompt_id].task
        if task:
            sums.setdefault(task, []).append(reward)
    return {t: sum(v) / len(v) for t, v in sorted(sums.items())}


def _compare(agent: str, batch: pb.RolloutBatch, rows: list[tuple[float, int]]) -> AgentVerification:
    out = AgentVerification(rewards=[r for r, _ in rows], site_rewards=[r.reward for r in batch.rollouts])
    for r, (reward, verdict) in zip(batch.rollouts, rows):
        out.verifier_errors += verdict == pb.VERIFIER_ERROR
        if abs(r.reward - reward) > _REWARD_TOLERANCE:
            out.corrections.append(pb.RewardCorrection(agent_id=agent, prompt_id=r.prompt_id,
                                                       sample_index=r.sample_index, reward=reward, verdict=verdict))
        elif r.verdict != verdict:
            out.verdict_mismatches += 1
    return out


def capability_table(tracker: Any, plan: pb.RoundPlan, accuracy: dict[str, float],
                     corrections: Sequence[pb.RewardCorrection]) -> pb.CapabilityTable:
    """The CapabilityTable broadcast with step ``plan.step``'s pool.

    ``tracker`` is a :class:`hacrl_fed.algo.capability.CapabilityTracker` already updated with this
    step's ``accuracy`` (agent → P_t); the table lists exactly those agents with P̂ (Eq. 9), their
    window (oldest first), P_t and P̂(t) per task (the ``capability_scope = "task"`` extension, empty without
    tasks). ``warmup`` is true while the tracker forces ratios to 1.
    """
    history = tracker.state_dict()["history"]
    table = pb.CapabilityTable(run_id=plan.run_id, step=plan.step, corrections=list(corrections),
                               warmup=tracker.steps <= tracker.warmup_steps)
    for agent in sorted(accuracy):
        table.agents.add(agent_id=agent, capability=tracker.capability(agent), window=history[agent],
                         step_accuracy=accuracy[agent], task_capability=tracker.task_capabilities(agent))
    return table
