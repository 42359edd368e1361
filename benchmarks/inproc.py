"""In-process federation driver for benchmarks: the production worker and coordinator code, no transport.

Every agent is a :class:`hacrl_fed.worker.agent.AgentWorker` (rollout engine, verifier, signing,
trainer, HACPO update) in this one process; every step runs the coordinator's own pure functions
(``build_round_plan`` → ``validate_envelope`` → ``reverify`` → capability window →
``capability_table``) and hands the signed pool to every worker's ``train``, exactly what
``hacrl-fed simulate`` does through Flower — minus the SuperLink, the SuperNodes, the per-message
ClientApp processes and the model reloads. Models are loaded once; :meth:`Federation.reset` puts
every agent back to its initial weights and a fresh optimizer, so many (recipe, seed) cells share
one load and one "before" evaluation (greedy decoding of the same weights gives the same answers).

An agent whose config sets ``endpoint`` is a rollout-only site (docs/cross-vendor.md): a
:class:`hacrl_fed.contributor.EndpointWorker` with its own signing key and a roster entry ``role =
"rollout_only"`` (what ``update_roster`` writes for such a site). It generates every step like the others; its
batch goes through the same validation, re-verification and capability window and is pooled for the learners;
like the coordinator (:func:`hacrl_fed.coordinator.rounds.rollout_only`, read from the roster) the loop never
sends it ``train``. :meth:`Federation.reset`, the initial-weights copy and the evaluations skip it (no weights).
An endpoint failure costs it that step only (recorded in :attr:`StepResult.rejected`), as in a real run.

Used by ``benchmarks/run_collab.py`` and ``benchmarks/ablate_stability.py``.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hacrl_fed.algo.capability import CapabilityTracker
from hacrl_fed.config import AgentConfig, SimulateConfig
from hacrl_fed.data.datasets import load_problems
from hacrl_fed.data.sampler import PromptSampler
from hacrl_fed.coordinator.phases import build_round_plan, capability_table, prompt_item, reverify, step_seed
from hacrl_fed.coordinator.rounds import rollout_only
from hacrl_fed.protocol.keys import Roster, generate_identity, update_roster
from hacrl_fed.protocol.validation import BatchRejected, validate_envelope
from hacrl_fed.reward import Verifier
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.worker.errors import PreconditionError
from hacrl_fed.worker.models import embedding_parameters


RESPONSE_CHARS = 400
"""Longest response text :meth:`Federation.evaluate_outcomes` keeps per problem."""


@dataclass
class StepResult:
    step: int
    accuracy: dict[str, float]
    """Coordinator-verified mean reward of each agent's rollouts at this step (P_t)."""
    reports: dict[str, dict[str, Any]]
    """Per agent: TrainReport metrics and per-source metrics."""
    generate_s: dict[str, float]
    train_s: dict[str, float]
    rejected: dict[str, str] = field(default_factory=dict)
    """Agent → why its batch is not in the pool: the coordinator's rejection, or ``generate refused: …`` for a
    rollout-only site whose endpoint failed this step."""
    generate_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    contributed: list[str] = field(default_factory=list)
    """Rollout-only agents whose batch the coordinator accepted and pooled this step (never trained)."""


def outcome(verdict: str, reason: str, finish_reason: str) -> str:
    """One response's outcome: ``correct``, or why not — ``truncated`` (cut at the token limit), ``no_answer``
    (no stated answer), ``verifier_error``, ``wrong_answer`` (a stated answer that is wrong: content)."""
    if verdict == "correct":
        return "correct"
    if finish_reason == "length":
        return "truncated"
    if reason == "no_final_answer":
        return "no_answer"
    return "verifier_error" if verdict == "verifier_error" else "wrong_answer"


def _report_dict(report: pb.TrainReport) -> dict[str, Any]:
    return {"metrics": dict(report.metrics),
            "per_source": {s.source_agent: dict(s.metrics) for s in report.per_source},
            "rejected": list(report.rejected)}


class Federation:
    """All agents of a simulate config in one process.

    Args:
        cfg: the simulate config (agents, run, verifier); ``agents[i].private_key``/``roster`` are generated.
        workdir: keys and checkpoints (default: a temporary directory).
        threads: torch intra-op threads (the agents take turns, so each phase may use every core).
    """

    def __init__(self, cfg: SimulateConfig, *, workdir: str | Path | None = None, threads: int | None = None) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.cfg = cfg
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hacrl-inproc-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        roster_path = self.workdir / "roster.toml"
        self.verifier = Verifier.from_config(cfg.verifier).start()
        self.workers: dict[str, Any] = {}
        """Agent → its worker: an ``AgentWorker``, or an ``EndpointWorker`` for a rollout-only site."""
        self.agent_cfgs: dict[str, AgentConfig] = {}
        self.learners = [a.name for a in cfg.agents if not a.rollout_only]
        """Agents that train and are evaluated, in config order."""
        self.contributors = [a.name for a in cfg.agents if a.rollout_only]
        """Rollout-only agents (``agent.endpoint`` set), in config order."""
        for agent in cfg.agents:
            ident = generate_identity(agent.name, self.workdir / "keys", force=True)
            # a rollout-only site's entry says role = "rollout_only" (docs/cross-vendor.md; Roster.rollout_only)
            update_roster(roster_path, agent.name, ident.ed25519,
                          role="rollout_only" if agent.rollout_only else "learner")
        self.roster = Roster.load(roster_path)
        t0 = time.perf_counter()
        self.load_s: dict[str, float] = {}
        for agent in cfg.agents:
            a = agent.model_copy(deep=True)
            a.private_key = str(self.workdir / "keys" / f"{agent.name}.ed25519.key")
            a.roster = str(roster_path)
            a.checkpoint_dir = str(self.workdir / agent.name / "checkpoints")
            t = time.perf_counter()
            self.workers[a.name] = self._worker(a)
            self.load_s[a.name] = time.perf_counter() - t
            self.agent_cfgs[a.name] = a
        self.initial = {n: copy.deepcopy(self.workers[n].model.state_dict()) for n in self.learners}
        self.total_load_s = time.perf_counter() - t0
        self.train_problems, self.held_out = load_problems(cfg.run.data)

    def _worker(self, agent: AgentConfig):
        """The worker of ``agent`` (keys and roster filled in): an ``EndpointWorker`` when ``agent.endpoint`` is
        set (no model loaded), else an ``AgentWorker`` (the model loaded); both share this federation's verifier."""
        if agent.rollout_only:
            from hacrl_fed.contributor import EndpointWorker

            return EndpointWorker(agent, verifier=self.verifier)
        from hacrl_fed.worker.agent import AgentWorker

        return AgentWorker(agent, resume=False, verifier=self.verifier)

    # ------------------------------------------------------------------ set-up of one cell

    def reset(self, *, algo: dict[str, Any] | None = None, optim: dict[str, Any] | None = None,
              per_agent: dict[str, dict[str, Any]] | None = None, train_embeddings: bool | None = None) -> None:
        """Initial weights, a fresh optimizer and step 0 for every agent; ``algo``/``optim`` override fields
        for every agent (``per_agent[name] = {"algo": {...}, "optim": {...}}`` for one agent);
        ``train_embeddings`` overrides ``model.train_embeddings`` (full fine-tuning only). Every learner's screens
        start over (:meth:`_fresh_guard`): a cell never inherits the windows, key ledger or source standings of the
        cell before it. A rollout-only agent has no weights: only its run binding is cleared (so the next cell's run
        id is accepted)."""
        from hacrl_fed.algo.config import AlgoConfig
        from hacrl_fed.update.loop import make_optimizer
        from hacrl_fed.config import OptimConfig

        for name in self.contributors:
            self.workers[name].run_id, self.workers[name].last_step = "", 0
        for name in self.learners:
            w = self.workers[name]
            base = self.agent_cfgs[name]
            a_over = dict(algo or {}) | (per_agent or {}).get(name, {}).get("algo", {})
            o_over = dict(optim or {}) | (per_agent or {}).get(name, {}).get("optim", {})
            algo_cfg = (AlgoConfig(**a_over) if "name" in a_over
                        else AlgoConfig(**(base.algo.model_dump() | a_over)))
            optim_cfg = OptimConfig(**(base.optim.model_dump() | o_over))
            w.model.load_state_dict(self.initial[name])
            emb = base.model.train_embeddings if train_embeddings is None else train_embeddings
            if not self.workers[name].loaded.is_lora:
                for p in embedding_parameters(w.model):
                    p.requires_grad_(emb)
            w.cfg = base.model_copy(update={"algo": algo_cfg, "optim": optim_cfg})
            t = w.trainer
            t.algo, t.optim = algo_cfg, optim_cfg
            torch.manual_seed(optim_cfg.seed)
            t.optimizer = make_optimizer(w.model, optim_cfg)
            t.pending, t.step, t.run_id, t.capability = None, 0, "", b""
            t.guard = self._fresh_guard(name)
            w._fingerprint = None

    def _fresh_guard(self, name: str):
        """A new :class:`hacrl_fed.screens.SiteGuard` for learner ``name``, built as its worker builds one (its
        ``agent.screens``, its verifier, ``verifier.truncated_reward``): the screens' state is per run, and a
        site process runs one run, where this federation runs one per cell."""
        from hacrl_fed.screens import SiteGuard

        w, base = self.workers[name], self.agent_cfgs[name]
        old = w.trainer.guard
        return SiteGuard(name, base.screens, old.verify if old is not None else w.verifier.verify,
                         truncated_reward=base.verifier.truncated_reward)

    # ------------------------------------------------------------------ the loop

    def run(self, *, run_id: str, steps: int, seed: int, agents: Sequence[str] | None = None,
            on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
        """``steps`` federation steps from the current weights (call :meth:`reset` first). Every agent of
        ``agents`` (default: all, rollout-only ones included) generates; every accepted one that is not
        rollout-only by the roster trains on the pool."""
        run = self.cfg.run
        names = list(agents or self.workers)
        sampler = PromptSampler(self.train_problems, run.prompts_per_step, seed=seed)
        tracker = CapabilityTracker(run.capability_window, warmup_steps=run.capability_warmup_steps)
        out = []
        for step in range(1, steps + 1):
            plan = build_round_plan(run_id=run_id, step=step, problems=sampler.next_batch(),
                                    samples_per_prompt=run.samples_per_prompt, sampling=run.sampling, seed=seed,
                                    deadline_unix_s=time.time() + 3600)
            envelopes, gen_s, gen_m, refused = {}, {}, {}, {}
            for n in names:
                t = time.perf_counter()
                try:
                    resp = self.workers[n].generate(plan)
                except PreconditionError as err:
                    if n not in self.contributors:
                        raise
                    refused[n] = f"generate refused: {err}"   # a failed endpoint: this step only
                else:
                    envelopes[n] = resp.envelope.SerializeToString()
                    gen_m[n] = dict(resp.metrics)
                gen_s[n] = time.perf_counter() - t
            accepted, rejected, accuracy, table, pool = self.coordinate(envelopes, plan, tracker)
            rejected |= refused
            reports, train_s = {}, {}
            contributed = [i.agent for i in accepted if rollout_only(self.roster, i.agent)]
            for item in accepted:
                if item.agent in contributed:
                    continue
                t = time.perf_counter()
                req = wpb.TrainRequest(run_id=run_id, step=step, envelopes=pool, capabilities=table, plan=plan)
                reports[item.agent] = _report_dict(self.workers[item.agent].train(req))
                train_s[item.agent] = time.perf_counter() - t
            result = StepResult(step, accuracy, reports, gen_s, train_s, rejected, gen_m, contributed)
            out.append(result)
            if on_step:
                on_step(result)
        return out

    def coordinate(self, envelopes: dict[str, bytes], plan, tracker):
        """The coordinator's part of a step on serialized envelopes (agent → bytes): validation, re-verification,
        the capability update and table. Returns (accepted items, {agent: rejection}, {agent: accuracy}, the
        CapabilityTable, the pooled SignedEnvelopes)."""
        accepted, rejected = [], {}
        for n, raw in envelopes.items():
            try:
                accepted.append(validate_envelope(raw, self.roster, plan, expected_agent=n,
                                                  max_bytes=self.cfg.run.max_batch_bytes))
            except BatchRejected as err:
                rejected[n] = str(err)
        verdicts = reverify(self.verifier.verify, accepted, plan)
        accuracy = {a: v.accuracy for a, v in verdicts.items()}
        tracker.update(accuracy, {a: v.task_accuracy for a, v in verdicts.items()})
        table = capability_table(tracker, plan, accuracy, [c for v in verdicts.values() for c in v.corrections])
        return accepted, rejected, accuracy, table, [pb.SignedEnvelope.FromString(i.envelope) for i in accepted]

    def evaluate(self, problems: Sequence[Any], *, max_new_tokens: int | None = None,
                 agents: Sequence[str] | None = None) -> dict[str, dict[str, bool]]:
        """Greedy avg@1 per problem: agent → {problem id: correct}; ``agents`` default: the learners."""
        results = self._evaluate(problems, max_new_tokens=max_new_tokens, agents=agents)
        return {n: {r.prompt_id: r.correct > 0 for r in res} for n, res in results.items()}

    def evaluate_rewards(self, problems: Sequence[Any], *, agents: Sequence[str] | None = None
                         ) -> dict[str, dict[str, float]]:
        """Episodes (docs/multi-turn.md): one greedy episode per instance, agent → {problem id: its reward in
        [0, 1]} (1 = won; a partial reward counts how close a lost episode came). Same episodes as
        :meth:`evaluate`, so ``reward >= 1`` agrees with its ``correct`` problem for problem."""
        results = self._evaluate(problems, agents=agents)
        return {n: {r.prompt_id: r.reward_sum / max(r.total, 1) for r in res} for n, res in results.items()}

    def _evaluate(self, problems: Sequence[Any], *, max_new_tokens: int | None = None,
                  agents: Sequence[str] | None = None) -> dict[str, Any]:
        """Each agent's greedy ``EvaluateResult`` list (one sample per problem)."""
        run = self.cfg.run
        req = wpb.EvaluateRequest(
            prompts=[prompt_item(p) for p in problems],   # an episode's instance, or the problem's text
            samples=1, sampling=pb.SamplingParams(temperature=0.0, top_p=1.0, top_k=0,
                                                  max_new_tokens=max_new_tokens or run.sampling.max_new_tokens,
                                                  seed=step_seed(run.seed, -1)))
        return {n: list(self.workers[n].evaluate(req).results) for n in agents or self.learners}

    def evaluate_outcomes(self, problems: Sequence[Any], *, agents: Sequence[str] | None = None,
                          responses: dict[str, dict[str, str]] | None = None) -> dict[str, dict[str, str]]:
        """Greedy, one response per problem, with why it failed: agent → {problem id: ``correct`` | ``truncated``
        (cut at the token limit) | ``no_answer`` (nothing stated) | ``wrong_answer`` (a stated, wrong answer) |
        ``verifier_error``}; episodes (docs/multi-turn.md): ``correct`` (won) or ``lost``. The same generation and verification as :meth:`evaluate` (the worker's engine and
        verifier, the run's seed), so ``outcome == "correct"`` agrees with it problem for problem. ``responses``,
        when given, is filled with agent → {problem id: the response text, at most :data:`RESPONSE_CHARS`
        characters} (single-turn problems only), so an outcome can be read."""
        from hacrl_fed.rollout.engine import Sampling
        from hacrl_fed.play.evaluate import EvalItem, evaluate_items

        run = self.cfg.run
        if any(getattr(p, "episode", None) is not None for p in problems):   # episodes: won, or not (no text)
            won = self.evaluate(problems, agents=agents)
            return {n: {pid: "correct" if ok else "lost" for pid, ok in per.items()} for n, per in won.items()}
        items = [EvalItem(p.id, p.problem, p.answer, p.answer_style or "boxed") for p in problems]
        out = {}
        for n in agents or self.learners:
            w, m = self.workers[n], self.workers[n].cfg.model
            res = evaluate_items(w.engine, w.tokenizer, w.verifier, items, samples=1,
                                 sampling=Sampling(temperature=0.0, max_new_tokens=run.sampling.max_new_tokens),
                                 seed=step_seed(run.seed, -1), system_prompt=m.system_prompt, template=m.chat_template,
                                 max_prompt_tokens=m.max_prompt_tokens, chunk_prompts=w.engine.max_batch_sequences)
            out[n] = {r.prompt_id: outcome(r.verdicts[0], r.reasons[0], r.finish_reasons[0]) for r in res}
            if responses is not None:
                responses[n] = {r.prompt_id: r.responses[0][:RESPONSE_CHARS] for r in res}
        return out

    def close(self) -> None:
        for w in self.workers.values():
            w.close()
        self.verifier.close()
        if self._tmp is not None:
            self._tmp.cleanup()
