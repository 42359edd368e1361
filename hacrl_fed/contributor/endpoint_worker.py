"""The worker of a rollout-only site: rollouts from an OpenAI-compatible endpoint, verified, signed, never trained.

:class:`EndpointWorker` answers the same five operations as :class:`~hacrl_fed.worker.agent.AgentWorker`
(``worker.proto``), so the site's courier, SuperNode, TLS and node authentication are those of any site:

* ``Generate``: the plan's prompts as chat messages (the site's ``model.system_prompt``, then the problem
  text) → :class:`~hacrl_fed.rollout.endpoint.EndpointRolloutSource` (G per prompt, the plan's temperature,
  top-p, token cap, the site's stop strings) → the site verifier → one signed ``RolloutBatch``. A row carries
  the behaviour log-prob only when the endpoint returned the sampled tokens' log-probs (the wire's presence
  flag); otherwise none. An endpoint failure refuses that step only (``FAILED_PRECONDITION``, the cause in
  the message: the site's terminal and the coordinator's record show it); the worker keeps serving.
* ``Train`` / ``Checkpoint``: refused (no weights). The coordinator never sends a train order to an agent
  whose roster entry says ``role = "rollout_only"``.
* ``Evaluate``: refused (held-out evaluation measures a trained model).

``model_fingerprint`` is ``api:`` + SHA-256 of the endpoint URL and model name (never the key), constant
over the run.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

from hacrl_fed.config import AgentConfig, SamplingConfig
from hacrl_fed.protocol.envelope import sign_batch
from hacrl_fed.protocol.keys import Roster, load_signing_key
from hacrl_fed.protocol.validation import max_response_chars
from hacrl_fed.reward import Verifier
from hacrl_fed.rollout.endpoint import EndpointError, EndpointRolloutSource, EndpointSettings
from hacrl_fed.status import StatusFile
from hacrl_fed.v1 import rollout_pb2 as pb
from hacrl_fed.v1 import worker_pb2 as wpb
from hacrl_fed.worker.agent import (MAX_ID_CHARS, MAX_SAMPLES_PER_PROMPT, _check_prompts, _show_notice,
                                    generation_seed, sampling_from_proto, verify_samples)
from hacrl_fed.worker.errors import InvalidRequestError, PreconditionError

__all__ = ["EndpointWorker", "endpoint_fingerprint"]

log = logging.getLogger("hacrl_fed.worker")
_FINISH = {"stop": pb.STOP, "length": pb.LENGTH}


def endpoint_fingerprint(url: str, model: str) -> str:
    """``api:`` + SHA-256 hex of ``url`` and ``model`` (68 printable ASCII characters)."""
    return "api:" + hashlib.sha256(f"{url}\0{model}".encode()).hexdigest()


class EndpointWorker:
    """A rollout-only site's worker (module docstring). ``cfg.endpoint`` must be set.

    ``source``: an :class:`EndpointRolloutSource` to use (tests); default one from ``cfg.endpoint``.
    Raises ``ValueError`` without ``agent.private_key`` or ``agent.endpoint``, ``KeyFileError`` / ``RosterError``
    when the key or roster cannot be loaded, :class:`~hacrl_fed.rollout.endpoint.EndpointError` when the API-key
    variable it names is unset.
    """

    def __init__(self, cfg: AgentConfig, *, sampling: SamplingConfig | None = None, verifier: Verifier | None = None,
                 run_id: str | None = None, status_file=None, source: EndpointRolloutSource | None = None) -> None:
        if not cfg.private_key:
            raise ValueError(f"agent {cfg.name!r} needs agent.private_key (create one with `hacrl-fed keys gen`)")
        if cfg.endpoint is None:
            raise ValueError(f"agent {cfg.name!r} has no agent.endpoint")
        e = cfg.endpoint
        self.cfg, self.name = cfg, cfg.name
        self.sampling_defaults = sampling or SamplingConfig()
        self.key = load_signing_key(cfg.private_key)
        self.roster = Roster.load(cfg.roster) if cfg.roster else {}
        self.source = source or EndpointRolloutSource(EndpointSettings(
            base_url=e.url, model=cfg.model.name_or_path, api_key_env=e.api_key_env,
            max_concurrency=e.max_concurrency, timeout_s=e.timeout_s, max_retries=e.max_retries,
            step_budget_s=e.step_budget_s, logprobs=e.logprobs, n=e.n, max_reply_bytes=e.max_reply_bytes))
        self.fingerprint = endpoint_fingerprint(e.url, cfg.model.name_or_path)
        self.lock = threading.Lock()
        self.run_id = run_id or ""
        self.last_step = 0
        self.status = StatusFile(status_file, cfg.name)
        self._own_verifier = verifier is None
        self.verifier = Verifier.from_config(cfg.verifier).start() if verifier is None else verifier
        self.status.set("idle", step=0)

    def _messages(self, text: str) -> list[dict[str, str]]:
        system = self.cfg.model.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]

    def generate(self, plan: pb.RoundPlan, notice: str = "") -> wpb.GenerateResponse:
        """G responses per prompt from the endpoint → verify → sign (module docstring). Raises
        InvalidRequestError for a bad plan, PreconditionError for another run, a past deadline or a failed
        endpoint (the cause in the message)."""
        if not 1 <= plan.samples_per_prompt <= MAX_SAMPLES_PER_PROMPT:
            raise InvalidRequestError(f"samples_per_prompt must be in 1..{MAX_SAMPLES_PER_PROMPT}, "
                                      f"got {plan.samples_per_prompt}")
        _check_prompts(plan.prompts)
        if not plan.run_id or len(plan.run_id) > MAX_ID_CHARS:
            raise InvalidRequestError(f"run_id must be 1..{MAX_ID_CHARS} characters")
        sampling = sampling_from_proto(plan.sampling, self.sampling_defaults.max_new_tokens)
        _show_notice(notice)
        with self.lock:
            if self.run_id and plan.run_id != self.run_id:
                raise PreconditionError(f"this site is in run {self.run_id!r}, the request is for run {plan.run_id!r}")
            if plan.deadline_unix_s and time.time() > plan.deadline_unix_s:
                raise PreconditionError(f"the plan's deadline ({plan.deadline_unix_s:.0f}) has passed")
            t0 = time.perf_counter()
            g = plan.samples_per_prompt
            with self.status.phase("generating", step=plan.step, rollouts=g * len(plan.prompts)):
                try:
                    samples = self.source.generate(
                        [self._messages(p.text) for p in plan.prompts], g, temperature=sampling.temperature,
                        top_p=sampling.top_p, max_tokens=sampling.max_new_tokens, stop=self.cfg.model.stop or (),
                        seed=generation_seed(plan.sampling.seed, plan.step, self.name), top_k=sampling.top_k,
                        deadline=plan.deadline_unix_s or None, max_chars=max_response_chars(sampling.max_new_tokens))
                except EndpointError as err:
                    raise PreconditionError(f"step {plan.step}: the endpoint failed: {err}") from None
                t_gen = time.perf_counter()
                self.status.set("verifying", step=plan.step, rollouts=len(samples))
                verdicts = self._verify(plan.prompts, samples)
            batch = pb.RolloutBatch(
                run_id=plan.run_id, step=plan.step, agent_id=self.name, model_fingerprint=self.fingerprint,
                sampling=pb.SamplingParams(temperature=sampling.temperature, top_p=sampling.top_p,
                                           top_k=sampling.top_k, max_new_tokens=sampling.max_new_tokens,
                                           seed=plan.sampling.seed))
            for s, (reward, verdict) in zip(samples, verdicts, strict=True):
                r = batch.rollouts.add(prompt_id=plan.prompts[s.prompt_index].prompt_id, sample_index=s.sample_index,
                                       response_text=s.text, reward=reward, verdict=verdict,
                                       behaviour_token_count=min(s.token_count, sampling.max_new_tokens),
                                       finish_reason=_FINISH[s.finish_reason])
                if s.logprob_sum is not None and 1 <= s.token_count <= sampling.max_new_tokens:
                    r.behaviour_logprob_sum = s.logprob_sum            # the presence flag: set only when known
                    if s.eos_logprob is not None and s.finish_reason == "stop":
                        r.behaviour_eos_logprob = s.eos_logprob
            envelope = sign_batch(batch, self.key, self.name)
            self.run_id = plan.run_id
            self.last_step = plan.step
            self.status.set("idle", step=plan.step)
            with_lp = sum(r.HasField("behaviour_logprob_sum") for r in batch.rollouts)
            metrics = {"time/generate_s": t_gen - t0, "time/verify_s": time.perf_counter() - t_gen,
                       "rollouts": float(len(samples)),
                       "reward_mean": sum(r.reward for r in batch.rollouts) / len(batch.rollouts),
                       "stop_frac": sum(s.finish_reason == "stop" for s in samples) / len(samples),
                       "behaviour_logprob_rows": float(with_lp), "payload_bytes": float(len(envelope.payload)),
                       "state/trained_step": 0.0}
            log.info("step %d: %d rollouts from the endpoint, mean reward %.3f, %d with a behaviour log-prob, "
                     "%.1f s", plan.step, len(samples), metrics["reward_mean"], with_lp, time.perf_counter() - t0)
            return wpb.GenerateResponse(envelope=envelope, metrics=metrics)

    def _verify(self, prompts, samples) -> list[tuple[float, int]]:
        return verify_samples(self.verifier, self.cfg.verifier.truncated_reward, prompts, samples)[0]

    def train(self, req: wpb.TrainRequest) -> pb.TrainReport:
        """Refused: a rollout-only site has no weights to train (PreconditionError)."""
        raise PreconditionError(f"{self.name} is a rollout-only site (an API endpoint): it does not train; its "
                                "roster entry should say role = \"rollout_only\"")

    def evaluate(self, req: wpb.EvaluateRequest) -> wpb.EvaluateResponse:
        """Refused (PreconditionError): held-out evaluation measures a model this site trains."""
        raise PreconditionError(f"{self.name} is a rollout-only site: no held-out evaluation")

    def checkpoint(self, req: wpb.CheckpointRequest) -> wpb.CheckpointResponse:
        """Refused (PreconditionError): no weights, nothing to save or export."""
        raise PreconditionError(f"{self.name} is a rollout-only site: no weights to checkpoint")

    def health(self) -> wpb.HealthResponse:
        return wpb.HealthResponse(agent_id=self.name, model_fingerprint=self.fingerprint, step=0, device="api",
                                  ready=True, run_id=self.run_id, engine="endpoint")

    def save_on_shutdown(self) -> None:
        return None

    def close(self) -> None:
        if self._own_verifier:
            self.verifier.close()
