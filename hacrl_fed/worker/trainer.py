"""The learner's training step (ARCHITECTURE §2 step 4; hacpo-spec §8.3 step 6).

:meth:`Trainer.train_step` reads as the step itself::

    own rollouts of the step (kept in memory since Generate, with their token ids)
      → open peers' envelopes against the site's own roster and run the coordinator's content checks
        on them (reject with a reason, never train on them)
      → apply the coordinator's reward corrections, then the site's own re-verification of every foreign
        row (its verdict is what it trains on) and its text screens (``SiteGuard``, :mod:`hacrl_fed.screens`)
      → training rows: own ids as generated, foreign text re-tokenized (prompt re-rendered)
      → capability ratios r_{j→k} from the coordinator's CapabilityTable (clipped, warm-up ⇒ 1)
      → advantages (Eqs. 6–7) → HACPO update (mini-batches, AdamW; the likelihood screen gates foreign
        rows inside it) → TrainReport

Isolated recipes (``algo.share_rollouts = False``: GSPO, GRPO, GSPO×2) train on own rows only.

Asynchronous orders (docs/async.md) add ``peer_plans``: pooled peer batches may answer them; every phase reads the
merged prompt catalogue (:mod:`hacrl_fed.protocol.plans`); groups without own rows take the ``plain_mean`` baseline.
"""

from __future__ import annotations

import gc
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hacrl_fed.algo.advantages import row_advantages
from hacrl_fed.algo.capability import RatioKey, capability_ratio, row_ratio, task_ratios
from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.loop import hacpo_update, make_optimizer
from hacrl_fed.config import OptimConfig
from hacrl_fed.protocol.envelope import DEFAULT_MAX_BATCH_BYTES, EnvelopeError, open_envelope
from hacrl_fed.protocol.keys import AGENT_NAME_PATTERN
from hacrl_fed.protocol.plans import Catalogue, async_metrics, catalogue, check_peer_plans, pool_problem
from hacrl_fed.reward.functions import WeightedRewards, weighted_rewards
from hacrl_fed.screens import SiteGuard
from hacrl_fed.tokenization.retokenize import drift_stats
from hacrl_fed.tokenization.episodes import EpisodeTemplate
from hacrl_fed.tokenization.views import TrainingRow
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.rollout.engine import GeneratedSample
from hacrl_fed.play.kinds import KINDS, rollout_kind, rollouts_kind, sample_kind, split_by_kind
from hacrl_fed.worker.errors import PreconditionError

__all__ = ["MAX_ENVELOPES", "StepRollouts", "Trainer", "process_rss_bytes", "reward_terms"]

MAX_ENVELOPES = 256
"""Envelopes of one train request that are opened; the rest are refused unopened."""
RowKey = tuple[str, str, int]   # (source agent, prompt id, sample index): one rollout of the step's pool


def _listed_once(table: pb.CapabilityTable) -> list[pb.AgentCapability]:
    """The table's entries of agents it lists exactly once (an agent listed twice has no usable capability)."""
    counts = Counter(a.agent_id for a in table.agents)
    return [a for a in table.agents if counts[a.agent_id] == 1]


@dataclass
class StepRollouts:
    """The learner's own rollouts of one step, as Generate produced and signed them."""

    run_id: str
    step: int
    prompt_ids: dict[str, tuple[int, ...]]
    """Learner rendering of every prompt of the plan (also used for foreign rows)."""
    samples: dict[tuple[str, int], GeneratedSample]
    """Generated ids per (prompt_id, sample_index)."""
    payload: bytes
    """Exact serialized own RolloutBatch that was signed."""
    temperature: float
    """Temperature of the behaviour log-probs (1.0 for greedy)."""
    samples_per_prompt: int
    """The plan's G: every peer batch must hold G samples of every prompt (the learner's own may hold more)."""
    batch: pb.RolloutBatch = field(default_factory=pb.RolloutBatch)
    max_new_tokens: int | None = None
    """The plan's generation cap: a peer rollout may count at most this many behaviour tokens and hold at most
    ``validation.max_response_chars`` of it in text (None: no length bound)."""
    prompts: dict[str, pb.PromptItem] = field(default_factory=dict)
    """The plan's prompts by id (problem text, reference answer, style: the columns of the reward functions)."""


def _step_note(step: int, own_step: int) -> str:
    """`` (step N)`` after an agent name in a rejection line when its batch answers a peer plan, else ""."""
    return "" if step == own_step else f" (step {step})"


def reward_terms(cfg) -> WeightedRewards | None:
    """The training reward of agent config ``cfg`` (``reward_funcs``), None for the verified accuracy alone.
    Raises ``ValueError`` (one line) for a function that cannot be loaded."""
    return weighted_rewards(cfg.reward_funcs)


def process_rss_bytes() -> float:
    """Resident set size of this process in bytes (psutil)."""
    import psutil

    return float(psutil.Process().memory_info().rss)


class Trainer:
    """One site's learner: optimizer, the step's own rollouts, and the HACPO training step.

    Args:
        agent: this site's agent id (learner k).
        model, tokenizer: the policy being trained (parameters updated in place).
        algo, optim: algorithm and optimizer settings.
        max_response_tokens: learner-side response cap (own and foreign rows).
        roster: agent id → Ed25519 public key, received out of band.
        ref_model: frozen reference for the KL term (required when ``algo.kl_coef > 0``).
        max_batch_bytes: size cap of one peer RolloutBatch.
        gradient_checkpointing: the model was loaded with activation checkpointing (needs train mode).
        response_separator: the learner template's prompt/response boundary for re-encoded foreign text
            (:func:`hacrl_fed.data.prompts.response_separator`); None keeps peers' text as shared.
        guard: the site's screens of foreign rows (:class:`hacrl_fed.screens.SiteGuard`); None trains on every
            validated foreign row with the coordinator's rewards.
        rewards: the weighted training reward (:func:`reward_terms`), computed here for every row trained,
            own and foreign; None trains on the verified accuracy alone.
        autocast_dtype: mixed precision of the update's forwards (``torch.bfloat16``), None for none.
        episode_template: returns the learner's rendering of multi-turn episodes (docs/multi-turn.md), for peers'
            trajectories; None: a site that cannot train on episodes (a peer episode is then an error).
        max_episode_tokens: an episode's tokens after its first prompt, at most (``ModelConfig.max_episode_tokens``).
    """

    def __init__(self, agent: str, model, tokenizer, *, algo: AlgoConfig, optim: OptimConfig,
                 max_response_tokens: int, roster: Mapping, ref_model=None,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES, gradient_checkpointing: bool = False,
                 response_separator: str | None = None, rewards: WeightedRewards | None = None,
                 autocast_dtype=None, guard: SiteGuard | None = None,
                 episode_template: Callable[[], EpisodeTemplate] | None = None,
                 max_episode_tokens: int = 2048) -> None:
        self.agent = agent
        self.model = model
        self.tokenizer = tokenizer
        self.algo = algo
        self.optim = optim
        self.max_response_tokens = max_response_tokens
        self.roster = roster
        self.ref_model = ref_model
        self.max_batch_bytes = max_batch_bytes
        self.gradient_checkpointing = gradient_checkpointing
        self.response_separator = response_separator
        self.guard = guard
        self.rewards = rewards
        self.autocast_dtype = autocast_dtype
        self.episode_template = episode_template
        self.max_episode_tokens = max_episode_tokens
        if optim.needs_schedule_steps and optim.schedule_steps is None:
            raise ValueError(f"optim.lr_scheduler_type = {optim.lr_scheduler_type!r} / optim.warmup_ratio needs "
                             "optim.schedule_steps: set it to the coordinator's run.steps")
        self.optimizer = make_optimizer(model, optim)
        self.update_fn = hacpo_update
        """The update (:func:`hacpo_update`'s signature); a sharded site's runs it on every rank (docs/distributed.md)."""
        self.pending: StepRollouts | None = None
        self.on_update: Callable[[int, int], None] | None = None
        """Called before update k of M of a step (``on_update(k, M)``; the worker's status display)."""
        self.step = 0
        self.run_id = ""
        self.capability = b""
        """Serialized CapabilityTable of the last completed step (checkpointed)."""

    def remember(self, rollouts: StepRollouts) -> None:
        """Keep the own rollouts of the step Generate just produced (replaces older ones)."""
        self.pending = rollouts

    def train_step(self, plan: pb.RoundPlan, envelopes: Sequence[pb.SignedEnvelope],
                   capability_table: pb.CapabilityTable, peer_plans: Sequence[pb.RoundPlan] = (),
                   peer_prompt_ids: Mapping[str, Sequence[int]] | None = None) -> pb.TrainReport:
        """Verify, build rows, compute advantages and update the model for ``plan``'s step.

        ``peer_plans`` (asynchronous orders, docs/async.md): the plans of pooled peer batches of other steps;
        ``peer_prompt_ids``: the learner's rendering of every peer plan prompt id the own plan lacks.

        Raises :class:`PreconditionError` when this worker holds no rollouts for (run id, step) or
        the capability table is for another run/step; ``PlanError`` for a malformed peer plan
        (:func:`~hacrl_fed.protocol.plans.check_peer_plans`). Everything else costs at most the batch it
        concerns, which is reported in ``TrainReport.rejected`` and left out of training: a peer
        envelope that does not open (or answers no plan of the order) or fails the content checks against
        its plan, a second batch of one (agent, step), a batch repeating a rollout (prompt id, sample index)
        already pooled from its agent, a batch of a peer plan refused for an inconsistent prompt
        (:func:`~hacrl_fed.protocol.plans.pool_problem`), a peer without a usable capability (missing, duplicated
        or not a finite positive number), a peer batch with an invalid reward correction (an invalid correction of the
        learner's own rollouts is ignored).
        """
        t0 = time.perf_counter()
        check_peer_plans(plan, peer_plans)
        own = self._own_rollouts(plan, capability_table)
        cat = catalogue(own, peer_plans, peer_prompt_ids)
        batches, rejected = self._open_batches(envelopes, own, cat)
        t_verify = time.perf_counter()
        rewards = self._rewards(batches, capability_table, rejected, own.step)
        foreign = ({a: [r for b in sorted(bs, key=lambda b: b.step) for r in b.rollouts]
                    for a, bs in batches.items() if a != self.agent}
                   if self.algo.share_rollouts else {})
        origin = {(a, r.prompt_id, r.sample_index): b.step for a, bs in batches.items() for b in bs for r in b.rollouts}
        ratios = self._ratios(capability_table, sorted(foreign), rejected)
        foreign = {a: rollouts for a, rollouts in foreign.items() if a in ratios}
        if self.algo.capability_scope == "task" and not capability_table.warmup:
            ratios = self._task_ratios(capability_table, ratios, cat)
        guard = self.guard if self.guard is not None and self.guard.active and foreign else None
        screened_sources = sorted(foreign)
        if guard is not None:
            foreign = self._screen(guard, own, cat, foreign, rewards)
        rewards, reward_means = self._training_rewards(own, cat, foreign, rewards)
        rows, dropped, cut = self._rows(own, cat, foreign, rewards)
        t_rows = time.perf_counter()
        advantages = row_advantages(rows, ratios, self.algo, learner=self.agent,
                                    no_own_baseline="plain_mean" if peer_plans else "raise")
        t_adv = time.perf_counter()
        metrics = self._update(rows, advantages, ratios, own.temperature, own.step,
                               row_gate=guard.gate if guard is not None else None)
        if guard is not None:
            screen_metrics, refused = guard.finish_step(screened_sources)
            metrics |= screen_metrics
            rejected += refused
        t_update = time.perf_counter()
        self.step, self.run_id = own.step, own.run_id
        self.capability = capability_table.SerializeToString(deterministic=True)
        self.pending = None
        gc.collect()
        timings = {"time/verify_s": t_verify - t0, "time/rows_s": t_rows - t_verify,
                   "time/advantages_s": t_adv - t_rows, "time/update_s": t_update - t_adv,
                   "time/total_s": time.perf_counter() - t0}
        ignored = 0 if self.algo.share_rollouts else sum(len(bs) for bs in batches.values()) - 1
        counts = {"ignored_batches": float(ignored), "dropped_empty_rows": float(dropped),
                  "dropped_truncated_rows": float(sum(cut.values()))}
        counts |= {f"src/{src}/dropped_truncated": float(n) for src, n in cut.items()}
        if peer_plans:
            counts |= async_metrics(rows, origin, own.step)
        return self._report(own, rows, ratios, metrics | timings | counts | reward_means, rejected)

    # ------------------------------------------------------------------ phases

    def _own_rollouts(self, plan: pb.RoundPlan, table: pb.CapabilityTable) -> StepRollouts:
        own = self.pending
        if own is None or own.run_id != plan.run_id or own.step != plan.step:
            have = f"run {own.run_id!r} step {own.step}" if own else "none"
            raise PreconditionError(f"no own rollouts for run {plan.run_id!r} step {plan.step} (this worker holds: "
                                    f"{have}); call Generate for this step first")
        if table.run_id and (table.run_id != plan.run_id or table.step != plan.step):
            raise PreconditionError(f"capability table is for run {table.run_id!r} step {table.step}, "
                                    f"the plan for run {plan.run_id!r} step {plan.step}")
        return own

    def _open_batches(self, envelopes: Sequence[pb.SignedEnvelope], own: StepRollouts,
                      cat: Catalogue | None = None) -> tuple[dict[str, list[pb.RolloutBatch]], list[str]]:
        """Open every envelope against the roster and check it against the plan it answers (``cat``; None: the own
        plan only); bad, duplicate or inconsistent ones are rejected. Returns agent → its accepted batches."""
        cat = cat if cat is not None else catalogue(own)
        batches: dict[str, list[pb.RolloutBatch]] = {self.agent: [own.batch]}
        pooled: dict[str, set[tuple[str, int]]] = {}   # agent → (prompt id, sample index) of its pooled batches
        rejected: list[str] = []
        other_steps = frozenset(cat.plans) - {own.step}
        for n, env in enumerate(envelopes):
            if n >= MAX_ENVELOPES:
                rejected.append(f"{len(envelopes) - n} more envelope(s) ignored: at most {MAX_ENVELOPES} per step")
                break
            who = (env.key_id if re.fullmatch(AGENT_NAME_PATTERN, env.key_id)
                   else repr(env.key_id[:64]) if env.key_id else "<no key id>")
            if env.key_id == self.agent:
                if env.payload != own.payload:
                    rejected.append(f"{who}: own batch differs from the one this worker signed")
                continue
            try:
                batch = open_envelope(env, self.roster, run_id=own.run_id, step=own.step,
                                      max_bytes=self.max_batch_bytes, other_steps=other_steps)
            except EnvelopeError as err:
                rejected.append(f"{who}: {type(err).__name__}: {err}")
                continue
            problem = pool_problem(batch, cat, {b.step for b in batches.get(batch.agent_id, ())},
                                   pooled.get(batch.agent_id, set()))
            if problem:
                rejected.append(f"{who}{_step_note(batch.step, own.step)}: {problem}")
                continue
            batches.setdefault(batch.agent_id, []).append(batch)
            pooled.setdefault(batch.agent_id, set()).update((r.prompt_id, r.sample_index) for r in batch.rollouts)
        return batches, rejected

    def _rewards(self, batches: dict[str, list[pb.RolloutBatch]], table: pb.CapabilityTable,
                 rejected: list[str], own_step: int) -> dict[RowKey, float]:
        """Reward per (agent, prompt id, sample index): the batch's, overridden by the coordinator's corrections.

        A correction whose reward is not a finite number in [0, 1] drops the peer batch holding that rollout
        from ``batches`` (its true rewards are unknown; reported in ``rejected``); for the learner's own
        rollouts it is ignored. Keys are unique across an agent's batches (:meth:`_open_batches`).
        """
        step_of = {(a, r.prompt_id, r.sample_index): b.step for a, bs in batches.items() for b in bs
                   for r in b.rollouts}
        rewards = {(a, r.prompt_id, r.sample_index): float(r.reward) for a, bs in batches.items() for b in bs
                   for r in b.rollouts}
        bad: set[tuple[str, int]] = set()
        for c in table.corrections:
            key = (c.agent_id, c.prompt_id, c.sample_index)
            if key not in rewards:
                continue
            if not (math.isfinite(c.reward) and 0.0 <= c.reward <= 1.0):
                where = (c.agent_id, step_of[key])
                if where not in bad:
                    rejected.append(f"{c.agent_id}{_step_note(where[1], own_step)}: coordinator correction of "
                                    f"{c.prompt_id}#{c.sample_index} has reward {c.reward!r} outside [0, 1]"
                                    + ("; correction ignored" if c.agent_id == self.agent else "; batch left out"))
                bad.add(where)
                continue
            rewards[key] = float(c.reward)
        for agent, step in bad:
            if agent != self.agent:
                batches[agent] = [b for b in batches[agent] if b.step != step]
                if not batches[agent]:
                    del batches[agent]
        return rewards

    def _screen(self, guard: SiteGuard, own: StepRollouts, cat: Catalogue, foreign: dict[str, list],
                rewards: dict[RowKey, float]) -> dict[str, list]:
        """The site's own verdict on every foreign row (into ``rewards``), then the text screens: problems from the
        merged catalogue, own texts (length references, own phrases) from the own plan's rollouts."""
        texts = {key: s.text for key, s in own.samples.items()}
        guard.begin_step(own.step, texts)
        guard.reverify(foreign, cat.prompts, rewards)
        return rollouts_kind(foreign).screen(guard, foreign, texts, cat.prompts, rewards)

    def _training_rewards(self, own: StepRollouts, cat: Catalogue, foreign: Mapping[str, list],
                          rewards: dict[RowKey, float]) -> tuple[dict, dict[str, float]]:
        """The weighted training reward of every row to train, own and foreign, computed by this learner from
        the text it holds (:mod:`hacrl_fed.reward.functions`: only the verified accuracy crosses the wire);
        the ``accuracy`` term is the coordinator-corrected reward. Also ``reward/<function>_mean``. Without
        reward functions the rewards are returned as they are."""
        if self.rewards is None:
            return rewards, {}
        keys = [(self.agent, pid, idx) for pid, idx in own.samples]
        texts = [s.text for s in own.samples.values()]
        finish = [s.finish_reason for s in own.samples.values()]
        for agent, rollouts in foreign.items():
            keys += [(agent, r.prompt_id, r.sample_index) for r in rollouts]
            texts += [r.response_text for r in rollouts]
            finish += ["stop" if r.finish_reason == pb.STOP else "length" for r in rollouts]
        items = [cat.prompts[pid] for _, pid, _ in keys]
        totals, means = self.rewards([p.text for p in items], texts, [rewards[k] for k in keys],
                                     answer=[p.reference_answer for p in items],
                                     answer_style=[p.answer_style or "boxed" for p in items],
                                     source_agent=[a for a, _, _ in keys], finish_reason=finish)
        return rewards | dict(zip(keys, totals, strict=True)), {f"reward/{n}_mean": v for n, v in means.items()}

    def _rows(self, own: StepRollouts, cat: Catalogue, foreign: Mapping[str, list],
              rewards: Mapping) -> tuple[list[TrainingRow], int, dict[str, int]]:
        """Own rows (generated ids) + foreign rows (re-tokenized against the catalogue's learner renderings).
        Rows left without a response token are
        dropped and counted; so are foreign rows cut by ``max_response_tokens`` in the learner's tokens
        (their source sum covers text the learner view lacks: no consistent ratio), per source."""
        own_by_kind = split_by_kind(own.samples.items(), lambda item: sample_kind(item[1]))
        rows = [row for kind in KINDS for row in kind.own_rows(self, own.prompt_ids, dict(own_by_kind[kind]), rewards)]
        for kind in KINDS:
            rows += kind.foreign_rows(self, cat.prompt_ids, {a: split_by_kind(rs, rollout_kind)[kind]
                                                             for a, rs in foreign.items()}, rewards)
        kept = [r for r in rows if r.response_ids]   # e.g. a LENGTH response made only of special tokens
        cut: dict[str, int] = {src: 0 for src in foreign}
        for r in kept:
            if r.truncated and not r.is_own:
                cut[r.source_agent] += 1
        usable = [r for r in kept if r.is_own or not r.truncated]
        return usable, len(rows) - len(kept), cut

    def _ratios(self, table: pb.CapabilityTable, sources: list[str], rejected: list[str]) -> dict[str, float]:
        """r_{j→k} for every foreign source j with a usable capability (1 during warm-up), from the
        coordinator's capabilities. A source without one (missing, listed twice, not finite and > 0)
        is left out and reported in ``rejected``; without a usable capability of the learner itself,
        every source is (outside warm-up)."""
        if not sources:
            return {}
        caps = {a.agent_id: a.capability for a in _listed_once(table)
                if math.isfinite(a.capability) and a.capability > 0}
        learner_ok = table.warmup or self.agent in caps   # outside warm-up every ratio needs the learner's own
        usable = [j for j in sources if j in caps] if learner_ok else []
        for j in sources:
            if j not in usable:
                whose = j if j not in caps else self.agent
                rejected.append(f"{j}: capability table has no usable entry for {whose}; batch left out")
        if table.warmup:
            return {j: 1.0 for j in usable}
        out: dict[str, float] = {}
        for j in usable:
            try:
                out[j] = capability_ratio(caps[j], caps[self.agent], ratio_clip=self.algo.ratio_clip)
            except ValueError as err:
                rejected.append(f"{j}: bad capability: {err}; batch left out")
        return out

    def _task_ratios(self, table: pb.CapabilityTable, ratios: dict[str, float],
                     cat: Catalogue) -> dict[RatioKey, float]:
        """``ratios`` plus r_{j→k}(t) per (source, prompt id) from the table's per-task capabilities
        (``algo.capability_scope = "task"``, :func:`hacrl_fed.algo.capability.task_ratios`). Entries that are not a
        finite positive number, and agents listed twice, are ignored (those rows keep the global ratio)."""
        caps = {a.agent_id: {t: v for t, v in a.task_capability.items() if math.isfinite(v) and v > 0}
                for a in _listed_once(table)}
        tasks = {pid: p.task for pid, p in cat.prompts.items() if p.task}
        return task_ratios(ratios, caps, self.agent, tasks, ratio_clip=self.algo.ratio_clip)

    def _update(self, rows: list[TrainingRow], advantages: list[float], ratios: dict[RatioKey, float],
                temperature: float, step: int, row_gate=None) -> dict[str, float]:
        was_training = self.model.training
        # TRL trains in train mode (dropout active); activation checkpointing needs it in any case
        self.model.train(self.optim.update_mode == "train" or self.gradient_checkpointing)
        try:
            return self.update_fn(self.model, self.optimizer, rows, advantages, ratios, self.algo, self.optim,
                                learner=self.agent, ref_model=self.ref_model, temperature=temperature,
                                pad_id=self.tokenizer.pad_token_id, source_rotation=step, step=step,
                                max_response_tokens=self.max_response_tokens, on_update=self.on_update,
                                autocast_dtype=self.autocast_dtype, row_gate=row_gate)
        finally:
            self.model.train(was_training)

    def _report(self, own: StepRollouts, rows: list[TrainingRow], ratios: dict[RatioKey, float],
                metrics: dict[str, float], rejected: list[str]) -> pb.TrainReport:
        metrics = dict(metrics) | drift_stats(rows)
        groups: dict[str, set[float]] = {}
        for row in rows:
            groups.setdefault(row.prompt_id, set()).add(row.reward)
            key = f"src/{row.source_agent}/"
            metrics[key + "tokens"] = metrics.get(key + "tokens", 0.0) + row.learner_token_count
            metrics[key + "reward_sum"] = metrics.get(key + "reward_sum", 0.0) + row.reward
        for src in {r.source_agent for r in rows}:
            metrics[f"src/{src}/reward_mean"] = metrics.pop(f"src/{src}/reward_sum") / metrics[f"src/{src}/rows"]
        for src in {r.source_agent for r in rows} | {k for k in ratios if isinstance(k, str)}:  # also sources
            metrics[f"src/{src}/capability_ratio"] = ratios.get(src, 1.0)                  # whose rows were all left out
        for src in {k[0] for k in ratios if isinstance(k, tuple)}:   # capability per task: the rows' mean ratio
            mine = [row_ratio(ratios, src, r.prompt_id) for r in rows if r.source_agent == src]
            if mine:
                metrics[f"src/{src}/capability_ratio_rows_mean"] = sum(mine) / len(mine)
        metrics |= {"zero_variance_group_frac": sum(len(v) == 1 for v in groups.values()) / max(1, len(groups)),
                    "rejected_batches": float(len(rejected)),
                    "temperature": own.temperature, "rss_bytes": process_rss_bytes()}
        report = pb.TrainReport(run_id=own.run_id, step=own.step, agent_id=self.agent, rejected=rejected)
        per_source: dict[str, dict[str, float]] = {}
        for key, value in metrics.items():
            if key.startswith("src/"):
                _, src, name = key.split("/", 2)
                per_source.setdefault(src, {})[name] = float(value)
            else:
                report.metrics[key] = float(value)
        for src in sorted(per_source):
            report.per_source.add(source_agent=src, metrics=per_source[src])
        return report
