"""The agent worker: one site's model, rollout engine, verifier, signing key, trainer and checkpoints.

:class:`AgentWorker` implements the five operations of ``worker.proto`` on protobuf messages;
:mod:`hacrl_fed.worker.service` only exposes them over gRPC. Every operation holds one lock, so
the model is never used by two requests at once. Nothing here returns weights or gradients.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from hacrl_fed.update.logprobs import unwrap_causal_lm
from hacrl_fed.config import AgentConfig, SamplingConfig
from hacrl_fed.data.prompts import prompt_record, render_prompt, response_separator, stop_strings
from hacrl_fed.protocol.site_reply import ALREADY_TRAINED
from hacrl_fed.protocol.envelope import DEFAULT_MAX_BATCH_BYTES, sign_batch
from hacrl_fed.protocol.keys import Roster, load_signing_key
from hacrl_fed.protocol.plans import PlanError, check_peer_plans
from hacrl_fed.reward import Verifier
from hacrl_fed.tokenization.episodes import EpisodeTemplate
from hacrl_fed.screens import SiteGuard
from hacrl_fed.tokenization.views import encode_response_text
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.atomic import DirLock
from hacrl_fed.checkpoints.store import CheckpointError, CheckpointManager, TrainingState, confined_path, export_hf
from hacrl_fed.rollout.engine import Sampling, eos_token_ids
from hacrl_fed.worker.engines import build_engine
from hacrl_fed.worker.errors import InvalidRequestError, PreconditionError
from hacrl_fed.play.episodes import episode_template_of
from hacrl_fed.play.evaluate import summarize
from hacrl_fed.play.kinds import MAX_ID_CHARS, PromptError, check_one_kind, claimed_kind, plan_kind, sample_kind
from hacrl_fed.worker.models import lineage_fingerprint, load_model, model_fingerprint
from hacrl_fed.status import StatusFile, TokenCounter, disk_estimate
from hacrl_fed.worker.trainer import StepRollouts, Trainer, process_rss_bytes, reward_terms

__all__ = ["AgentWorker", "generation_seed", "sampling_from_proto", "train_summary"]

log = logging.getLogger("hacrl_fed.worker")
detail_log = logging.getLogger("hacrl_fed.worker.detail")
"""Lines for the worker's log file only (``hacrl-fed client`` shows ``hacrl_fed.worker`` lines on the terminal)."""

MAX_SAMPLES_PER_PROMPT = 1024
MAX_NEW_TOKENS = 65536
"""Largest generation cap a request may ask for."""
MAX_PROMPTS = 4096
"""Prompts of one request, at most."""
MAX_PROMPT_CHARS = 100_000
"""Characters of one problem statement, at most."""
_VERDICT = {"correct": pb.CORRECT, "incorrect": pb.INCORRECT, "verifier_error": pb.VERIFIER_ERROR}


def verify_samples(verifier, truncated_reward: str, prompts,
                   samples) -> tuple[list[tuple[float, int]], dict[str, float]]:
    """(reward, verdict enum) per sample, in order, with the site verifier; a response cut at the token limit gets
    reward 0 unverified when ``truncated_reward = "zero"``. Also the verifier's ``verifier_timeouts`` /
    ``verifier_retried`` counts of this call. ``prompts``: the plan's prompts (``reference_answer``,
    ``answer_style``, ``text``); ``samples``: objects with ``text``, ``prompt_index``, ``finish_reason``."""
    todo = [i for i, s in enumerate(samples) if not (truncated_reward == "zero" and s.finish_reason == "length")]
    items = [prompts[samples[i].prompt_index] for i in todo]
    verdicts = verifier.verify([samples[i].text for i in todo], [p.reference_answer for p in items],
                               [p.answer_style or "boxed" for p in items], [p.text for p in items])
    out = [(0.0, pb.INCORRECT)] * len(samples)
    for i, v in zip(todo, verdicts):
        out[i] = (float(v.reward), _VERDICT[v.verdict])
    return out, {"verifier_timeouts": float(getattr(verdicts, "timeouts", 0)),
                 "verifier_retried": float(getattr(verdicts, "retried", 0))}


def sampling_from_proto(sp: pb.SamplingParams, default_max_new_tokens: int) -> Sampling:
    """Proto ``SamplingParams`` → :class:`Sampling`. Proto3 zeros mean unset: ``top_p`` 0 ⇒ 1,
    ``max_new_tokens`` 0 ⇒ ``default_max_new_tokens`` (temperature 0 is greedy). Raises
    :class:`InvalidRequestError` for out-of-range values."""
    if sp.max_new_tokens > MAX_NEW_TOKENS:
        raise InvalidRequestError(f"max_new_tokens must be <= {MAX_NEW_TOKENS}, got {sp.max_new_tokens}")
    try:
        return Sampling(temperature=sp.temperature, top_p=sp.top_p or 1.0, top_k=sp.top_k,
                        max_new_tokens=sp.max_new_tokens or default_max_new_tokens)
    except ValueError as err:
        raise InvalidRequestError(f"bad sampling parameters: {err}") from None


def generation_seed(seed: int, step: int, agent: str) -> int:
    """Deterministic 63-bit seed of one agent's generation at one step (independent of RNG state).

    ``seed`` is the plan's sampling seed (the coordinator derives it from ``run.seed`` and the step). The run
    id is deliberately not part of it: ``hacrl-fed simulate`` names runs with a timestamp, and two runs of
    the same config must draw the same samples (the README's numbers are reproducible).
    """
    digest = hashlib.sha256(f"{seed}|{step}|{agent}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


def train_summary(report: pb.TrainReport) -> str:
    """One line for the site's terminal: rows trained (own / from peers), mean reward, loss, time.

    Mean rewards are over the rows trained (coordinator-corrected rewards), from the report's
    per-source ``rows`` and ``reward_mean``; loss is the mean HACPO loss over the step's updates.
    """
    rows = {s.source_agent: s.metrics.get("rows", 0.0) for s in report.per_source}
    total = sum(rows.values())
    reward = (sum(rows[s.source_agent] * s.metrics.get("reward_mean", 0.0) for s in report.per_source) / total
              if total else 0.0)
    own = next((s.metrics for s in report.per_source if s.source_agent == report.agent_id), {})
    peers = len([a for a in rows if a != report.agent_id])
    m = report.metrics
    own_rows = rows.get(report.agent_id, 0.0)
    parts = [(f"step {report.step} trained: {total:.0f} rows ({own_rows:.0f} own, "
              f"{total - own_rows:.0f} from {peers} peer{'s' if peers != 1 else ''})"),
             f"mean reward {reward:.3f} (own {own.get('reward_mean', 0.0):.3f})",
             f"loss {m.get('loss', float('nan')):.4f}", f"{m.get('time/total_s', 0.0):.1f} s"]
    if report.rejected:
        parts.append(f"{len(report.rejected)} peer batch(es) refused")
    return ", ".join(parts)


def _check_prompts(prompts) -> None:
    """Raises InvalidRequestError for no prompts, too many, empty/duplicate/overlong ids, a mix of kinds, overlong
    text, or a prompt its kind refuses (:meth:`~hacrl_fed.play.kinds.OneShot.check_prompt`: no text, an unknown
    answer style; :meth:`~hacrl_fed.play.kinds.Episodes.check_prompt`)."""
    if not prompts:
        raise InvalidRequestError("the request has no prompts")
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequestError(f"the request has {len(prompts)} prompts, at most {MAX_PROMPTS} are allowed")
    ids = [p.prompt_id for p in prompts]
    if any(not i or len(i) > MAX_ID_CHARS for i in ids) or len(set(ids)) != len(ids):
        raise InvalidRequestError(f"prompt ids must be non-empty, unique and at most {MAX_ID_CHARS} characters")
    try:
        check_one_kind(prompts)
        for p in prompts:
            if len(p.text) > MAX_PROMPT_CHARS:
                raise InvalidRequestError(f"prompt {p.prompt_id!r} has {len(p.text)} characters, at most "
                                          f"{MAX_PROMPT_CHARS} are allowed")
            claimed_kind(p).check_prompt(p)
    except PromptError as err:
        raise InvalidRequestError(str(err)) from None


def _check_peer_plans(plan: pb.RoundPlan, peer_plans) -> None:
    """An asynchronous train order's peer plans (docs/async.md, :func:`~hacrl_fed.protocol.plans.check_peer_plans`
    with a Generate request's bounds), and each plan's prompts as a Generate request's. Raises InvalidRequestError."""
    try:
        check_peer_plans(plan, peer_plans, max_samples_per_prompt=MAX_SAMPLES_PER_PROMPT, max_new_tokens=MAX_NEW_TOKENS)
        for i, p in enumerate(peer_plans):
            try:
                _check_prompts(p.prompts)
            except InvalidRequestError as err:
                raise PlanError(f"peer plan {i} (step {p.step}): {err}") from None
    except PlanError as err:
        raise InvalidRequestError(str(err)) from None


def _check_release(cfg: AgentConfig, roster: Mapping[str, Any]) -> None:
    """``screens.release`` may name only peers of the roster (a typo would release nobody, silently).
    Raises ``ValueError`` naming the unknown names and the roster's agents."""
    bad = sorted({n for n in cfg.screens.release if n == cfg.name or (roster and n not in roster)})
    if bad:
        peers = ", ".join(sorted(n for n in roster if n != cfg.name)) or "none"
        raise ValueError(f"screens.release names {', '.join(map(repr, bad))}: not a peer of {cfg.name!r} in the roster "
                         f"{cfg.roster} (peers: {peers})")


class AgentWorker:
    """A site's agent worker (ARCHITECTURE §1).

    Args:
        cfg: the agent's configuration (model, algorithm, optimizer, verifier, keys, roster).
        checkpoint_dir: where checkpoints go (default ``cfg.checkpoint_dir`` or ``runs/<name>/checkpoints``).
        sampling: defaults for requests that leave sampling fields unset.
        max_batch_bytes: size cap of one peer RolloutBatch.
        resume: load the newest intact checkpoint in ``checkpoint_dir`` at start-up, if any (an unusable one
            is skipped with a warning naming it).
        run_id: the run this worker is for (None: any); a resumed checkpoint of another run is refused.
        keep_checkpoints: checkpoints kept on disk (older ones are deleted).
        max_batch_sequences: sequences per ``generate`` call.
        verifier: a running :class:`~hacrl_fed.reward.Verifier` to share (default: start one from ``cfg.verifier``).
        status_file: where to keep the worker's phase for a progress display (:mod:`hacrl_fed.status`);
            None: nowhere.

    Raises ``ModelLoadError`` / ``KeyFileError`` / ``RosterError`` when the model, key or roster cannot be loaded;
    ``CheckpointError`` when checkpoints exist but none is intact, or they belong to another run than ``run_id``;
    ``LockedError`` when another process uses ``checkpoint_dir``.
    """

    def __init__(self, cfg: AgentConfig, *, checkpoint_dir: str | Path | None = None,
                 sampling: SamplingConfig | None = None, max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                 resume: bool = True, keep_checkpoints: int = 3, max_batch_sequences: int = 32,
                 verifier: Verifier | None = None, run_id: str | None = None,
                 status_file: str | Path | None = None, site_dir: str | Path | None = None) -> None:
        if not cfg.private_key:
            raise ValueError(f"agent {cfg.name!r} needs agent.private_key (create one with `hacrl-fed keys gen`)")
        self.cfg = cfg
        self.name = cfg.name
        self.sampling_defaults = sampling or SamplingConfig()
        self.key = load_signing_key(cfg.private_key)
        self.roster = Roster.load(cfg.roster) if cfg.roster else {}
        _check_release(cfg, self.roster)                 # an operator's typo fails before the model loads
        self.lock = threading.Lock()
        rewards = reward_terms(cfg)                      # a bad reward function fails before the model loads
        root = Path(checkpoint_dir or cfg.checkpoint_dir or Path("runs") / cfg.name / "checkpoints")
        self._dir_lock = DirLock(root, what=f"the checkpoints of {cfg.name}")  # before a model loads
        self.status = StatusFile(status_file, cfg.name)
        self.status.set("loading", model=cfg.model.name_or_path, device=cfg.model.device)
        try:
            self.loaded = load_model(cfg.model)
        except BaseException:
            self._dir_lock.release()
            raise
        self.model, self.tokenizer = self.loaded.model, self.loaded.tokenizer
        ref = None
        if cfg.algo.kl_coef > 0:
            ref = copy.deepcopy(self.model).merge_and_unload() if self.loaded.is_lora else copy.deepcopy(self.model)
            ref.requires_grad_(False).eval()
        m = cfg.model
        try:
            self.engine = build_engine(
                self.loaded, m, stop_strings=stop_strings(self.tokenizer, m.chat_template, m.stop),
                max_batch_sequences=max_batch_sequences, logprob_chunk_tokens=cfg.optim.logprob_chunk_tokens,
                work_dir=root / "vllm",
                max_model_len=m.max_prompt_tokens + max(m.max_response_tokens, self.sampling_defaults.max_new_tokens))
        except BaseException:
            self._dir_lock.release()
            raise
        self.trainer = Trainer(cfg.name, self.model, self.tokenizer, algo=cfg.algo, optim=cfg.optim,
                               max_response_tokens=cfg.model.max_response_tokens, roster=self.roster, ref_model=ref,
                               max_batch_bytes=max_batch_bytes, gradient_checkpointing=cfg.model.gradient_checkpointing,
                               response_separator=response_separator(self.tokenizer, cfg.model.chat_template),
                               rewards=rewards, autocast_dtype=self.loaded.autocast_dtype,
                               guard=SiteGuard(cfg.name, cfg.screens, truncated_reward=cfg.verifier.truncated_reward),
                               episode_template=lambda: self.episode_template,
                               max_episode_tokens=cfg.model.max_episode_tokens)
        self.checkpoints = CheckpointManager(root, keep_last=keep_checkpoints)
        if cfg.trainer.world_size > 1:                  # rank 0 of the site's trainer (docs/distributed.md)
            from hacrl_fed.worker.sharded import shard_worker

            try:
                shard_worker(self, keep_checkpoints)
            except BaseException:
                self._dir_lock.release()
                raise
        self.path_roots = [Path(site_dir), root] if site_dir else [root]
        """Where a Checkpoint request's ``path`` may lead (a relative one starts at the first)."""
        self._fingerprint: str | None = None
        self._saved_step = 0
        self.checkpoint_every: int | None = None
        """The run's checkpoint interval as the last train order said (None: not said; 0: never)."""
        try:
            def restore(state: TrainingState) -> None:  # a screen state it cannot read: an older checkpoint is used
                self.trainer.guard.load_state_dict(state.extra.get("screens"))

            found = self.checkpoints.load_latest(self.model, self.trainer.optimizer, fingerprint=model_fingerprint,
                                                 restore=restore) if resume else None
            if found is not None:
                path, state = found
                self.trainer.step, self.trainer.run_id, self.trainer.capability = (state.step, state.run_id,
                                                                                   state.capability)
                self._saved_step = state.step
                self.engine.weights_updated()            # the checkpoint's weights generate next
                published = state.extra.get("published_fingerprint")
                self._fingerprint = published if isinstance(published, str) and published else None
                detail_log.info("resumed run %r after step %d from %s", state.run_id, state.step, path)
                if run_id and state.run_id and state.run_id != run_id:
                    raise CheckpointError(f"{root} holds checkpoints of run {state.run_id!r} (step {state.step}), "
                                          f"this site is for run {run_id!r}: move them away or use another output_dir")
        except BaseException:
            self._dir_lock.release()
            raise
        self._own_verifier = verifier is None
        self.verifier = Verifier.from_config(cfg.verifier).start() if verifier is None else verifier
        self.trainer.guard.verify = self.verifier.verify
        self.trainer.guard.release(cfg.screens.release)
        _ = self.fingerprint
        self.tokens = TokenCounter(unwrap_causal_lm(self.model)[0], self.status)
        self.trainer.on_update = lambda k, m: self.status.update(update=k, updates=m, force=True)
        self.status.state["disk"] = disk_estimate(self.model, is_lora=self.loaded.is_lora)
        self.status.set("idle", step=self.trainer.step)
        self._example_prompt: pb.PromptItem | None = None   # a prompt this site played: its export's example

    # ------------------------------------------------------------------ helpers

    @property
    def episode_template(self) -> EpisodeTemplate:
        """How this site renders a multi-turn episode (:func:`~hacrl_fed.play.episodes.episode_template_of`).
        Raises InvalidRequestError for a template that cannot render one."""
        try:
            return episode_template_of(self.tokenizer, self.cfg.model)
        except ValueError as err:
            raise InvalidRequestError(f"this site cannot play episodes: {err}") from None

    @property
    def fingerprint(self) -> str:
        """The fingerprint this worker publishes (``RolloutBatch.model_fingerprint``, ``Health``).

        At start-up: :func:`~hacrl_fed.worker.models.model_fingerprint` of the loaded weights (``sha256:``,
        config and every tensor). After each completed training step: :func:`~hacrl_fed.worker.models.
        lineage_fingerprint` of the previous value and :meth:`_update_digest` of the step (``lineage:``), so no
        weight is re-hashed per step. A resumed worker first checks the loaded weights against the content
        hash its checkpoint recorded, then publishes the value its predecessor published at that step. After a
        train request that failed mid-way (weights possibly half-updated) the content hash is computed again.
        """
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.model)
        return self._fingerprint

    def _update_digest(self, req: wpb.TrainRequest) -> bytes:
        """SHA-256 of everything a train request's update reads: run, step, every envelope (key id, payload,
        signature) in order, the capability table, the peer plans when there are any (asynchronous orders) and
        the algorithm and optimizer settings (not the deadline, the notice or the checkpoint interval)."""
        h = hashlib.sha256(f"{req.run_id}\0{req.step}\0".encode())
        for env in req.envelopes:
            for part in (env.key_id.encode(), env.payload, env.signature):
                h.update(len(part).to_bytes(8, "big") + part)
        h.update(req.capabilities.SerializeToString(deterministic=True))
        for p in req.peer_plans:                   # none in synchronous runs: their digest is unchanged
            part = p.SerializeToString(deterministic=True)
            h.update(b"peer-plan" + len(part).to_bytes(8, "big") + part)
        h.update(self.cfg.algo.model_dump_json().encode() + self.cfg.optim.model_dump_json().encode())
        return h.digest()

    def _check_run(self, run_id: str, step: int, *, for_generate: bool) -> None:
        if not run_id or len(run_id) > MAX_ID_CHARS:
            raise InvalidRequestError(f"run_id must be 1..{MAX_ID_CHARS} characters")
        bound = self.trainer.run_id
        if bound and run_id != bound:
            raise PreconditionError(f"this worker is in run {bound!r}, the request is for run {run_id!r}")
        if for_generate and bound and step <= self.trainer.step:
            raise PreconditionError(f"step {step} is already trained (last completed step {self.trainer.step})")

    def _render_peer_prompts(self, plan: pb.RoundPlan, peer_plans) -> dict[str, tuple[int, ...]]:
        """The learner's rendering of every peer plan prompt id the own ``plan`` lacks (the first text of an id)."""
        mine = {p.prompt_id for p in plan.prompts}   # reversed: the first text of an id is the one kept
        todo = {q.prompt_id: q for pp in reversed(peer_plans) for q in reversed(pp.prompts) if q.prompt_id not in mine}
        return self._render(list(todo.values()))

    def _render(self, prompts) -> dict[str, tuple[int, ...]]:
        try:
            return plan_kind(prompts).render(self, prompts)
        except PromptError as err:
            raise InvalidRequestError(str(err)) from None

    def render_text(self, text: str) -> tuple[int, ...]:
        """The site's rendering of a one-shot prompt's text: its chat template, system prompt and prompt cap."""
        m = self.cfg.model
        literal = partial(encode_response_text, self.tokenizer)  # the plan's text never writes a turn boundary
        return tuple(render_prompt(self.tokenizer, text, system_prompt=m.system_prompt, template=m.chat_template,
                                   max_tokens=m.max_prompt_tokens, literal=literal))

    def close(self) -> None:
        """Stop the verifier processes (unless the verifier was passed in by the caller) and release the
        checkpoint directory."""
        if self._own_verifier:
            self.verifier.close()
        self._dir_lock.release()

    def save_on_shutdown(self) -> Path | None:
        """On a clean shutdown: checkpoint the trained steps no checkpoint holds yet (waits for a running
        request), unless the run turned checkpoints off (``checkpoint_every = 0``). Returns the path or None."""
        with self.lock:
            if not self.trainer.run_id or self.trainer.step <= self._saved_step or self.checkpoint_every == 0:
                return None
            path = self._save("")
        log.info("step %d checkpoint saved on shutdown: %s", self.trainer.step, path)
        return path

    def _save(self, path: str) -> Path:
        """Checkpoint the current state (the lock is held)."""
        step = self.trainer.step
        # the content hash proves the weights at resume; the published value carries on after it
        state = TrainingState(step=step, run_id=self.trainer.run_id, capability=self.trainer.capability,
                              fingerprint=model_fingerprint(self.model),
                              extra={"agent": self.name, "published_fingerprint": self.fingerprint,
                                     "screens": self.trainer.guard.state_dict()})
        saved = self.checkpoints.save(self.model, self.trainer.optimizer, state, path or None)
        if not path:
            self._saved_step = step
        return saved

    # ------------------------------------------------------------------ operations

    def generate(self, plan: pb.RoundPlan, notice: str = "") -> wpb.GenerateResponse:
        """G × multiplier responses per prompt → verify → sign. Raises InvalidRequestError / PreconditionError.

        ``notice`` (what the coordinator tells this site, e.g. why its last batch was refused) is logged as a
        warning line, which the site's terminal shows.

        With ``algo.rollout_multiplier`` m > 1 (GSPO×2) the learner trains on all m·G own responses, but
        publishes (signs and returns) only the plan's G per prompt (sample indices 0..G−1), so the
        protocol, the coordinator's checks and the capability statistics stay the same for every agent.
        """
        if not 1 <= plan.samples_per_prompt <= MAX_SAMPLES_PER_PROMPT:
            raise InvalidRequestError(f"samples_per_prompt must be in 1..{MAX_SAMPLES_PER_PROMPT}, "
                                      f"got {plan.samples_per_prompt}")
        _check_prompts(plan.prompts)
        sampling = sampling_from_proto(plan.sampling, self.sampling_defaults.max_new_tokens)
        _show_notice(notice)
        if plan.deadline_unix_s and time.time() > plan.deadline_unix_s:
            raise PreconditionError(f"the plan's deadline ({plan.deadline_unix_s:.0f}) has passed")
        with self.lock:
            if plan.deadline_unix_s and time.time() > plan.deadline_unix_s:
                raise PreconditionError(f"the plan's deadline ({plan.deadline_unix_s:.0f}) passed while waiting")
            self._check_run(plan.run_id, plan.step, for_generate=True)
            t0 = time.perf_counter()
            prompt_ids = self._render(plan.prompts)
            self._example_prompt = plan.prompts[0]
            order = [p.prompt_id for p in plan.prompts]
            n = plan.samples_per_prompt * self.cfg.algo.rollout_multiplier
            seed = generation_seed(plan.sampling.seed, plan.step, self.name)
            with self.status.phase("generating", step=plan.step, rollouts=n * len(order)), self.tokens.counting():
                samples, verdicts, verifier_counts, t_gen = plan_kind(plan.prompts).generate(
                    self, plan, prompt_ids, order, n, sampling, seed)
            t_ver = time.perf_counter()
            batch = self._batch(plan, sampling, order, samples, verdicts)
            envelope = sign_batch(_published(batch, plan.samples_per_prompt), self.key, self.name)
            self.trainer.remember(StepRollouts(
                run_id=plan.run_id, step=plan.step, prompt_ids=prompt_ids, samples_per_prompt=plan.samples_per_prompt,
                samples={(order[s.prompt_index], s.sample_index): s for s in samples},
                payload=envelope.payload, temperature=sampling.logprob_temperature, batch=batch,
                max_new_tokens=sampling.max_new_tokens, prompts={p.prompt_id: p for p in plan.prompts}))
            tokens = sum(s.token_count for s in samples)
            metrics = {
                "time/generate_s": t_gen - t0, "time/verify_s": t_ver - t_gen,
                "time/sign_s": time.perf_counter() - t_ver, "tokens_generated": float(tokens),
                "tokens_per_s": tokens / max(t_gen - t0, 1e-9), "rollouts": float(len(samples)),
                "reward_mean": sum(r.reward for r in batch.rollouts) / len(batch.rollouts),
                "stop_frac": sum(s.finish_reason == "stop" for s in samples) / len(samples),
                "verifier_error": float(sum(r.verdict == pb.VERIFIER_ERROR for r in batch.rollouts)),
                **verifier_counts,
                "payload_bytes": float(len(envelope.payload)), "rss_bytes": process_rss_bytes(),
                "state/trained_step": float(self.trainer.step),   # the coordinator compares it with its record
            }
            detail_log.info("step %d generated: %d rollouts for %d prompts, mean reward %.3f, %d tokens, %.1f s",
                     plan.step, len(samples), len(order), metrics["reward_mean"], tokens, time.perf_counter() - t0)
            return wpb.GenerateResponse(envelope=envelope, metrics=metrics)

    def _verify(self, prompts, samples) -> tuple[list[tuple[float, int]], dict[str, float]]:
        """(reward, verdict enum) per sample (:func:`verify_samples`), and the verifier's ``verifier_timeouts`` /
        ``verifier_retried`` counts of this call (metrics)."""
        return verify_samples(self.verifier, self.cfg.verifier.truncated_reward, prompts, samples)

    def _batch(self, plan, sampling: Sampling, order, samples, verdicts) -> pb.RolloutBatch:
        batch = pb.RolloutBatch(
            run_id=plan.run_id, step=plan.step, agent_id=self.name, model_fingerprint=self.fingerprint,
            model_version=self.trainer.step,
            sampling=pb.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                                       max_new_tokens=sampling.max_new_tokens, seed=plan.sampling.seed))
        for s, (reward, verdict) in zip(samples, verdicts):
            sample_kind(s).add_rollout(batch, s, plan.prompts, order, reward, verdict)
        return batch

    def train(self, req: wpb.TrainRequest) -> pb.TrainReport:
        """Verify the pooled envelopes and run the HACPO update of ``req.step``.

        An asynchronous order's ``peer_plans`` (docs/async.md) are checked (:func:`_check_peer_plans`) and their
        prompts rendered for the learner: pooled peer batches may answer them (:meth:`Trainer.train_step`).

        Refuses (PreconditionError, weights unchanged) an order whose ``deadline_unix_s`` has passed when it
        would start, e.g. after a stall: the coordinator has already recorded that step as failed here.
        """
        _show_notice(req.notice)
        with self.lock:
            late = time.time() - req.deadline_unix_s
            if req.deadline_unix_s and late > 0:
                raise PreconditionError(f"the train order of step {req.step} expired {late:.0f} s ago (the "
                                        f"coordinator no longer waits for it): not trained")
            if req.HasField("checkpoint_every"):
                self.checkpoint_every = req.checkpoint_every
            plan = req.plan if req.HasField("plan") else pb.RoundPlan(run_id=req.run_id, step=req.step)
            if (plan.run_id, plan.step) != (req.run_id, req.step):
                raise InvalidRequestError(f"train request is for run {req.run_id!r} step {req.step}, its plan for "
                                          f"run {plan.run_id!r} step {plan.step}")
            self._check_run(req.run_id, req.step, for_generate=False)
            if req.step and self.trainer.step == req.step and self.trainer.run_id == req.run_id:
                raise PreconditionError(f"{ALREADY_TRAINED} step {req.step} of run {req.run_id!r} is in this worker's "
                                        "weights (a re-sent order): not trained again")
            peer_plans = list(req.peer_plans)
            _check_peer_plans(plan, peer_plans)
            peer_prompt_ids = self._render_peer_prompts(plan, peer_plans) if peer_plans else None
            parent = self.fingerprint
            self._fingerprint = None               # undefined while the weights change: Health waits for the lock
            self.engine.prepare_update()
            try:
                with self.status.phase("training", step=req.step):
                    report = self.trainer.train_step(plan, list(req.envelopes), req.capabilities,
                                                     peer_plans=peer_plans, peer_prompt_ids=peer_prompt_ids)
            except (PreconditionError, InvalidRequestError):
                self._fingerprint = parent         # refused before any weight changed
                raise
            finally:
                self.engine.weights_updated()      # possibly half-updated on a failure: the engine syncs either way
            # any other failure leaves it None: the weights may be half-updated, they are hashed when next asked
            self._fingerprint = lineage_fingerprint(parent, self._update_digest(req))
            log.info("%s", train_summary(report))
            for line in report.rejected:
                log.warning("step %d: refused a peer batch: %s", report.step, line)
            return report

    def evaluate(self, req: wpb.EvaluateRequest) -> wpb.EvaluateResponse:
        """k samples per prompt (greedy if k = 1 and temperature 0); avg@k and pass@k.

        Refuses (PreconditionError) a request of another run than the one this worker's weights belong to.
        """
        bound = self.trainer.run_id
        if req.run_id and bound and req.run_id != bound:
            raise PreconditionError(f"this worker holds the model of run {bound!r} (step {self.trainer.step}), "
                                    f"not of run {req.run_id[:MAX_ID_CHARS]!r}: not evaluated")
        _check_prompts(req.prompts)
        k = req.samples or 1
        if k > MAX_SAMPLES_PER_PROMPT:
            raise InvalidRequestError(f"samples must be <= {MAX_SAMPLES_PER_PROMPT}, got {k}")
        sampling = sampling_from_proto(req.sampling, self.sampling_defaults.max_new_tokens)
        with self.lock, self.status.phase("evaluating", step=self.trainer.step, problems=len(req.prompts)), \
                self.tokens.counting():
            results = plan_kind(req.prompts).evaluate(self, req.prompts, k, sampling, req.sampling.seed)
        resp = wpb.EvaluateResponse(metrics=summarize(results))
        log.info("held-out evaluation %s: %s",
                 "before training" if self.trainer.step == 0 else f"after step {self.trainer.step}",
                 " ".join(f"{k}={v:.3f}" for k, v in sorted(resp.metrics.items())))
        for r in results:
            resp.results.add(prompt_id=r.prompt_id, correct=r.correct, total=r.total, reward_sum=sum(r.rewards))
        return resp

    def health(self) -> wpb.HealthResponse:
        """Identity, fingerprint, last completed step. Answers at once while Generate/Evaluate run;
        waits for a running Train (the fingerprint of weights being updated is not defined)."""
        fingerprint = self._fingerprint
        if fingerprint is None:
            with self.lock:
                fingerprint = self.fingerprint
        return wpb.HealthResponse(agent_id=self.name, model_fingerprint=fingerprint, step=self.trainer.step,
                                  device=str(self.loaded.device), ready=True, run_id=self.trainer.run_id,
                                  engine=self.cfg.model.engine)   # the name the site's config gave (registry)

    def checkpoint(self, req: wpb.CheckpointRequest) -> wpb.CheckpointResponse:
        """SAVE a resumable checkpoint or EXPORT a plain Hugging Face directory.

        A ``path`` must lead inside the site's directory or the checkpoint directory
        (:func:`~hacrl_fed.checkpoints.store.confined_path`), else the request is refused (InvalidRequestError)."""
        if req.kind not in (wpb.CheckpointRequest.SAVE, wpb.CheckpointRequest.EXPORT):
            raise InvalidRequestError("checkpoint kind must be SAVE or EXPORT")
        export = req.kind == wpb.CheckpointRequest.EXPORT
        with self.lock:
            try:
                target = str(confined_path(req.path, self.path_roots, export=export,
                                           checkpoints=self.checkpoints.root)) if req.path else ""
            except ValueError as err:
                raise InvalidRequestError(f"CheckpointRequest.path: {err}") from None
            return self._checkpoint(export, target)

    def _checkpoint(self, export: bool, target: str) -> wpb.CheckpointResponse:
        with self.status.phase("exporting" if export else "checkpointing", step=self.trainer.step):
            step = self.trainer.step
            if export:
                out = target or str(self.checkpoints.root / "export" / f"step-{step:08d}")
                m = self.cfg.model
                prompt = prompt_record(self.tokenizer, system_prompt=m.system_prompt, template=m.chat_template,
                                       stop=m.stop, eos_token_ids=eos_token_ids(self.model, self.tokenizer),
                                       example=_example_text(self._example_prompt))
                return wpb.CheckpointResponse(path=str(export_hf(self.model, self.tokenizer, out, prompt=prompt)),
                                              step=step)
            path = self._save(target)
            detail_log.info("step %d checkpoint saved: %s", step, path)
            return wpb.CheckpointResponse(path=str(path), step=step)


def _show_notice(notice: str) -> None:
    """Log what the coordinator tells this site (one printable line, at most 500 characters)."""
    if notice:
        text = "".join(c if c.isprintable() else " " for c in notice[:500])
        log.warning("coordinator: %s", text)


def _example_text(prompt: pb.PromptItem | None) -> str | None:
    """The text of a played prompt's first user turn (its kind's :meth:`~hacrl_fed.play.kinds.OneShot.example_text`),
    ``None`` for no prompt: the export then shows :data:`~hacrl_fed.data.prompts.EXAMPLE_PROBLEM`."""
    return None if prompt is None else claimed_kind(prompt).example_text(prompt)


def _published(batch: pb.RolloutBatch, samples_per_prompt: int) -> pb.RolloutBatch:
    """The part of the learner's own batch it publishes: sample indices below the plan's G."""
    if all(r.sample_index < samples_per_prompt for r in batch.rollouts):
        return batch
    out = pb.RolloutBatch()
    out.CopyFrom(batch)
    del out.rollouts[:]
    out.rollouts.extend(r for r in batch.rollouts if r.sample_index < samples_per_prompt)
    return out
