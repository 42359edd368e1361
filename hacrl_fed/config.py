"""Typed configuration: TOML files validated by pydantic models.

Three top-level files exist: ``server.toml`` (:class:`ServerConfig`), ``client.toml``
(:class:`ClientConfig`, one agent) and ``simulate.toml`` (:class:`SimulateConfig`, every agent on
one machine). Every model forbids unknown keys, so a typo fails at load time with the key path
and the expected type (:func:`load_config` raises :class:`ConfigError`).

The ``algo`` and ``optim`` sections are defined beside the math they configure
(:mod:`hacrl_fed.algo.config`, :mod:`hacrl_fed.update.optim_config`) and re-exported here.

This module imports nothing heavy (no torch, no transformers) so the CLI and the coordinator can
validate a config in well under a second.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hacrl_fed.algo.config import AlgoConfig
from hacrl_fed.update.optim_config import OptimConfig
from hacrl_fed.registries import ANSWER_STYLES, DATA_SOURCES, ROLLOUT_ENGINES
from hacrl_fed.screen_config import ScreenConfig

__all__ = [
    "AgentConfig",
    "absolute_path",
    "AlgoConfig",
    "ClientConfig",
    "ConfigError",
    "DataConfig",
    "DEFAULT_INSTRUCTION",
    "ModelConfig",
    "OptimConfig",
    "RewardFuncConfig",
    "RunConfig",
    "SamplingConfig",
    "ScreenConfig",
    "TaskSpec",
    "ServerConfig",
    "SimulateConfig",
    "VerifierConfig",
    "VLLM_CPU_ENV",
    "VLLM_DEVICES",
    "format_validation_error",
    "load_config",
    "vllm_devices",
]


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class SamplingConfig(Strict):
    """Behaviour-policy sampling. Defaults are the paper's: temperature 1, top-p 1, top-k off."""

    temperature: Annotated[float, Field(ge=0)] = 1.0
    """Softmax temperature; 0 = greedy. Log-probs use the same temperature (ARCHITECTURE §8)."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling mass; 1 = off."""
    top_k: NonNegInt = 0
    """Top-k sampling; 0 = off."""
    max_new_tokens: PositiveInt = 128
    """Generation length cap per response (tokens of the generating model)."""


DEFAULT_INSTRUCTION = "Put the final answer within \\boxed{}."
"""Appended to every question of a ``reasoning_gym`` source (``data.instruction``): the verifier reads the answer
from the last box (:mod:`hacrl_fed.data.tasks`)."""


class TaskSpec(Strict):
    """One procedural task of a ``reasoning_gym`` data source (:mod:`hacrl_fed.data.tasks`)."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
    """The reasoning-gym generator (``chain_sum``, ``leg_counting``, ``gsm_symbolic`` …)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the generator's config: its difficulty (``min_terms``, ``max_digits`` …)."""
    weight: PositiveFloat = 1.0
    """Share of the training problems (weights are normalised over ``data.tasks``)."""
    label: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] | None = None
    """The task name problems carry (capability per task, reports); default ``name``. Give two entries of
    one generator at two difficulties two labels."""

    @model_validator(mode="after")
    def _default_label(self) -> TaskSpec:
        if self.label is None:
            self.label = self.name
        return self


class EnvTaskSpec(Strict):
    """One multi-turn environment of an ``episodes`` data source (:mod:`hacrl_fed.data.episodes`,
    docs/multi-turn.md)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_./-]{0,127}$")]
    """The environment's registry id (``textarena/GuessTheNumber-v0``, ``calculator`` …; ``hacrl_fed.envs``)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """The environment's configuration (a JSON object; checked by the environment)."""
    weight: PositiveFloat = 1.0
    """Share of the training episodes (weights are normalised over ``data.envs``)."""
    label: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] | None = None
    """The task name episodes carry (capability per task, reports); default ``name`` with ``/`` as ``-``."""

    @model_validator(mode="after")
    def _default_label(self) -> EnvTaskSpec:
        if self.label is None:
            self.label = self.name.replace("/", "-")[:64]
        return self


def _unique_labels(specs: list, what: str, where: str, hint: str = "") -> None:
    """Raise ``ValueError`` naming the labels that ``specs`` (tasks or environments) give more than once."""
    labels = [t.label for t in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"{what} must be unique across {where}: {dup}{hint}")


class DataConfig(Strict):
    """Where training and held-out problems come from."""

    source: str = "arithmetic"
    """A name of :data:`hacrl_fed.registries.DATA_SOURCES`: ``arithmetic``: the built-in seeded generator; ``file``:
    JSONL/parquet; ``hf``: ``datasets``; ``reasoning_gym``: procedural tasks of the reasoning-gym library
    (``tasks``); ``episodes``: multi-turn environments (``envs``, docs/multi-turn.md); a registered source, or an
    import path ``package.module:load`` (docs/extending.md)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Settings of a registered source (a JSON object its loader reads as ``cfg.options`` and checks)."""
    path: str | None = None
    """File path (``file``) or dataset name / local dataset directory (``hf``)."""
    split: str = "train"
    """Split name for ``hf`` sources."""
    eval_path: str | None = None
    """Optional separate held-out file; otherwise ``eval_size`` rows are held out of the source."""
    eval_size: NonNegInt = 48
    """Held-out problems for before/after evaluation (``reasoning_gym``: per task, of ``tasks`` and ``eval_tasks``)."""
    difficulty: Annotated[int, Field(ge=1, le=5)] = 1
    """Arithmetic generator level: 1 = single-digit single operation … 5 = multi-step words."""
    num_problems: PositiveInt = 2000
    """Problems generated by the arithmetic source; training problems of a ``reasoning_gym`` source (all tasks)."""
    answer_style: str = "boxed"
    """How a response states its final answer, a name of :data:`hacrl_fed.registries.ANSWER_STYLES`: ``boxed``
    demands a stated final answer; ``gsm8k`` also accepts ``####``/final number; or a registered style
    (docs/extending.md; every site must have it registered)."""
    seed: int = 0
    tasks: list[TaskSpec] = Field(default_factory=list)
    """``reasoning_gym``: the training tasks, e.g. ``[{ name = "chain_sum", config = { max_terms = 3 } }]``."""
    eval_tasks: list[TaskSpec] = Field(default_factory=list)
    """``reasoning_gym``: held-out task families, evaluated before and after training, never trained on."""
    instruction: Annotated[str, Field(max_length=500)] = DEFAULT_INSTRUCTION
    """``reasoning_gym``: appended to every question (the verifier reads the answer from the last box)."""
    envs: list[EnvTaskSpec] = Field(default_factory=list)
    """``episodes``: the training environments, e.g. ``[{ name = "textarena/GuessTheNumber-v0" }]``."""
    eval_envs: list[EnvTaskSpec] = Field(default_factory=list)
    """``episodes``: held-out environments, evaluated before and after training, never trained on."""
    max_turns: Annotated[int, Field(ge=1, le=32)] = 8
    """``episodes``: agent turns per episode at most; an episode not done after them has reward 0."""

    @field_validator("source")
    @classmethod
    def _registered_source(cls, value: str) -> str:
        return DATA_SOURCES.check(value)

    @field_validator("answer_style")
    @classmethod
    def _registered_style(cls, value: str) -> str:
        return ANSWER_STYLES.check(value)

    @model_validator(mode="after")
    def _path_needed(self) -> DataConfig:
        if self.source in ("file", "hf") and not self.path:
            raise ValueError(f"data.path is required when data.source = {self.source!r}")
        if self.source == "reasoning_gym":
            if not self.tasks:
                raise ValueError("data.tasks needs at least one task when data.source = 'reasoning_gym'")
            _unique_labels([*self.tasks, *self.eval_tasks], "task labels", "data.tasks and data.eval_tasks",
                           " (give entries of one generator a label each)")
            if self.num_problems < len(self.tasks):
                raise ValueError(f"data.num_problems ({self.num_problems}) is below the number of tasks "
                                 f"({len(self.tasks)})")
            if self.num_problems > 2**24 or self.eval_size > 2**20:
                raise ValueError("data.num_problems must be <= 2^24 and data.eval_size <= 2^20 per task")
        elif self.tasks or self.eval_tasks:
            raise ValueError(f"data.tasks / data.eval_tasks apply to data.source = 'reasoning_gym', not {self.source!r}")
        if self.source == "episodes":
            if not self.envs:
                raise ValueError("data.envs needs at least one environment when data.source = 'episodes'")
            _unique_labels([*self.envs, *self.eval_envs], "environment labels", "data.envs and data.eval_envs")
            if self.num_problems < len(self.envs) or self.num_problems > 2**24 or self.eval_size > 2**20:
                raise ValueError("data.num_problems must be in [number of environments, 2^24] and data.eval_size "
                                 "<= 2^20 per environment")
        elif self.envs or self.eval_envs:
            raise ValueError(f"data.envs / data.eval_envs apply to data.source = 'episodes', not {self.source!r}")
        return self


class VerifierConfig(Strict):
    """Answer verification (math-verify in a killable process pool)."""

    timeout_s: PositiveFloat = 5.0
    """Limit per item in CPU seconds of the verifier process (so machine load does not change a verdict); an
    item over it is retried once with a longer limit, and one over that too is a ``verifier_error`` verdict
    (reward 0, counted as ``verifier_timeouts``). A generous wall-clock limit backs it up against a process that
    sleeps."""
    workers: PositiveInt = 2
    """Processes in the verifier pool."""
    truncated_reward: Literal["zero", "verify"] = "zero"
    """Responses cut at ``max_new_tokens`` (finish reason ``length``): reward 0, or verify as usual."""
    source_budget_s: PositiveFloat | None = 30.0
    """CPU seconds of verification one source's rows may use per step, at the coordinator and at every site
    that re-verifies them; its remaining rows are then refused (``verifier_error``, reason ``source_budget``,
    reward 0). Bounds what one site's crafted answers cost everyone (``hacrl_fed.reward.verifier``); None: no
    bound."""


VLLM_DEVICES = ("cuda", "cuda:0")
"""The ``model.device`` values the vllm engine takes: vLLM runs on the first visible GPU (no device index)."""
VLLM_CPU_ENV = "HACRL_FED_VLLM_CPU"
"""Set to ``1`` (in the environment of every process that reads the site's config: worker and client) to let
``engine = "vllm"`` take ``device = "cpu"``: the worker's environment holds a CPU build of vLLM (``vllm-cpu``),
training model and engine both on the CPU. Off by default — a CUDA build of vLLM cannot start there
(docs/engines.md, "A federation with a vLLM site")."""


def vllm_devices() -> tuple[str, ...]:
    """The ``model.device`` values the vllm engine takes here: :data:`VLLM_DEVICES`, plus ``cpu`` when
    :data:`VLLM_CPU_ENV` is ``1``."""
    return (*VLLM_DEVICES, "cpu") if os.environ.get(VLLM_CPU_ENV) == "1" else VLLM_DEVICES


class ModelConfig(Strict):
    """The site's private model."""

    name_or_path: str
    """Hub id, local directory, ``.gguf`` file, or an alias (``smollm2-135m-instruct``, ``gemma3-270m``)."""
    gguf_file: str | None = None
    """GGUF file name inside ``name_or_path`` (hub repo or directory), when loading from GGUF."""
    device: str = "cpu"
    """``cpu``, ``cuda``, ``cuda:1`` …"""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype for training and generation."""
    autocast: Literal["none", "bfloat16"] = "none"
    """Mixed precision: ``bfloat16`` runs every forward (generation, scoring, the update) under
    ``torch.autocast`` on the model's device (CPU or CUDA), with float32 weights, gradients and AdamW
    state (so needs ``dtype = "float32"``). Log-probs then carry bf16 rounding (docs/benchmarks.md, "Behaviour
    log-probs and mixed precision")."""
    behaviour_logprobs: Literal["auto", "generation", "teacher_forced"] = "auto"
    """Where the behaviour log-probs of the sampled tokens come from: ``generation`` reads them from the
    sampling pass (no second forward); ``teacher_forced`` re-scores every response in one more forward, the
    trainer's layout; ``auto`` picks ``generation`` for float32 and ``teacher_forced`` under bf16 / fp16
    (weights or autocast), where only the trainer's layout reproduces the trainer's own first forward to
    float32 rounding (``hacrl_fed.rollout.engine``; docs/benchmarks.md, "Behaviour log-probs and mixed
    precision"). With ``engine = "vllm"``, ``generation`` takes vLLM's log-probs of the sampled tokens and
    ``auto`` means ``teacher_forced`` (vLLM's kernels and bf16 differ from the trainer's forward;
    docs/engines.md)."""
    chat_template: Literal["auto", "plain"] = "auto"
    """``auto``: the tokenizer's chat template when it has one, else the plain template."""
    system_prompt: str = "Solve the problem. Put the final answer in \\boxed{}."
    """Instruction placed before every problem (system turn, or the plain template's header)."""
    stop: list[str] | None = None
    """Strings that end a response, cut off before them (like vLLM's ``stop``); the response then ends with
    EOS. Default: ``["\\nQuestion:"]`` under the plain template (a base model goes on to write the next
    question), none under a chat template. ``[]`` turns stop strings off."""
    max_prompt_tokens: PositiveInt = 512
    """Prompt tokens kept (left truncation) in the learner's tokenization."""
    max_response_tokens: PositiveInt = 256
    """Response tokens kept (right truncation) when training, own and foreign rows alike."""
    max_episode_tokens: PositiveInt = 2048
    """Multi-turn episodes (docs/multi-turn.md): tokens after the first prompt (agent turns and the template's
    turns between them) at most. The site ends an own episode before its next turn could pass it (reward 0); a
    peer's episode longer than this in the learner's tokens is left out of training and counted."""
    gradient_checkpointing: bool = False
    lora_rank: NonNegInt = 0
    """LoRA rank through ``peft``; 0 = full fine-tuning."""
    lora_alpha: PositiveInt = 16
    lora_target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    train_embeddings: bool = True
    """Full fine-tuning only: ``false`` freezes the token embedding and the LM head (tied or not). AdamW
    normalizes every gradient, so each of a 262k-entry vocabulary's rows moves by ≈ lr per update even
    when its gradient is ~1e-9 (the softmax pushes down every token not sampled); freezing them keeps a
    small-batch RL update to the transformer blocks and skips the head's weight gradient (docs/benchmarks.md,
    "Base-model stability")."""
    engine: str = "hf"
    """Rollout engine, a name of :data:`hacrl_fed.registries.ROLLOUT_ENGINES`: ``hf`` (Hugging Face ``generate``,
    any device), ``loop`` (a decode loop on the same model whose finished rows leave the batch;
    :mod:`hacrl_fed.rollout.decode_loop`), ``ct2`` (a CTranslate2 copy of the model, float32 by default, on the CPU,
    refreshed after every update; ``engine_options`` ``compute_type`` / ``threads``;
    :mod:`hacrl_fed.rollout.ct2_engine`), ``auto`` (``ct2`` where ctranslate2 is installed and the model is on the
    CPU, else ``hf``; :func:`hacrl_fed.worker.engines.auto_choice`),
    ``vllm`` (a colocated vLLM engine on the model's CUDA device, installed in the worker's own
    environment; :mod:`hacrl_fed.rollout.vllm_engine`, docs/engines.md "vLLM on a GPU site"; on the CPU with a CPU
    build of vLLM where :data:`VLLM_CPU_ENV` is set), a registered engine,
    or an import path ``package.module:factory`` (docs/extending.md). The three settings below are used by
    ``vllm`` only."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """Settings of a registered engine (a JSON object its factory reads as ``request.options`` and checks)."""
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.3
    """vLLM: share of the GPU's memory its engine may take (weights, activations, KV cache); the rest stays
    for the training model, its gradients and optimizer state (TRL's colocate default, 0.3)."""
    enable_sleep_mode: bool = False
    """vLLM: free the engine's GPU memory during each update (``LLM.sleep``: KV cache dropped; weights dropped
    under full fine-tuning, which re-syncs them, offloaded to CPU RAM under LoRA) and wake it for the next
    generation; costs host↔device copies."""
    tensor_parallel_size: PositiveInt = 1
    """vLLM: GPUs the engine shards the model over (the training model stays on ``device``; the engine runs in
    bf16, or fp16 for an fp16 model, whatever ``dtype`` the training model keeps)."""
    trust_remote_code: bool = False
    cache_dir: str | None = None
    """Where assembled GGUF files and tiny test models are cached; default ``$HACRL_FED_CACHE`` or ``~/.cache/hacrl-fed``."""

    @field_validator("engine")
    @classmethod
    def _registered_engine(cls, value: str) -> str:
        return ROLLOUT_ENGINES.check(value)

    @model_validator(mode="after")
    def _vllm_needs_cuda(self) -> ModelConfig:
        if self.engine == "vllm" and self.device not in vllm_devices():
            if self.device.startswith("cuda:"):
                raise ValueError(f"model.engine = 'vllm' runs on the first visible GPU (vLLM takes no device index): "
                                 f"for GPU {self.device[5:]} set CUDA_VISIBLE_DEVICES={self.device[5:]} and device = 'cuda'")
            raise ValueError(f"model.engine = 'vllm' needs a CUDA device (model.device = 'cuda'), got device = "
                             f"{self.device!r}; use engine = 'hf' on a CPU (or, with a CPU build of vLLM in the "
                             f"worker's environment, set {VLLM_CPU_ENV}=1)")
        return self

    @model_validator(mode="after")
    def _autocast_needs_float32(self) -> ModelConfig:
        if self.autocast != "none" and self.dtype != "float32":
            raise ValueError(f"model.autocast = {self.autocast!r} needs model.dtype = 'float32' (the weights autocast "
                             f"computes from); with dtype = {self.dtype!r} set autocast = 'none'")
        return self


class RewardFuncConfig(Strict):
    """One weighted term of the learner's training reward (TRL ``reward_funcs`` + ``reward_weights``)."""

    name: Annotated[str, Field(min_length=1)]
    """``accuracy`` (the coordinator-verified verdict), ``format`` (a stated ``\\boxed{}`` answer), or an
    import path ``package.module:function`` to a TRL-style ``reward(prompts, completions, **kwargs)``
    (:mod:`hacrl_fed.reward.functions`)."""
    weight: Annotated[float, Field(allow_inf_nan=False)] = 1.0
    """Its weight w_f in R = Σ_f w_f · r_f."""


class EndpointConfig(Strict):
    """A rollout-only site's OpenAI-compatible endpoint (``[agent.endpoint]``; docs/cross-vendor.md,
    :mod:`hacrl_fed.rollout.endpoint`). The site's ``agent.model`` then names the endpoint's model
    (``name_or_path``) and gives the system prompt and stop strings; no weights are loaded or trained."""

    url: Annotated[str, Field(pattern=r"^https?://\S+$", max_length=2000)]
    """Base URL of the API, e.g. ``http://127.0.0.1:8000/v1``."""
    api_key_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")] | None = None
    """Name of the environment variable that holds the API key (never the key itself: it is read at start-up,
    sent only to the endpoint, never logged). Unset: no key (a local server)."""
    max_concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    """Requests in flight at once."""
    timeout_s: PositiveFloat = 120.0
    """Seconds one request may take."""
    max_retries: Annotated[int, Field(ge=0, le=20)] = 3
    """Retries of one request on 429, 5xx, timeouts and connection errors (exponential back-off)."""
    step_budget_s: PositiveFloat = 1800.0
    """Seconds all requests of one step may take together (the plan's deadline also bounds them)."""
    logprobs: bool = True
    """Ask for the sampled tokens' log-probs (used as the behaviour log-prob when returned; for vLLM start the
    server with ``--logprobs-mode processed_logprobs``)."""
    n: Literal["auto", "never"] = "auto"
    """``auto``: ask for G choices per request while the server honours ``n``; ``never``: single requests."""
    max_reply_bytes: Annotated[int, Field(ge=1024)] = 8 * 1024 * 1024
    """Largest reply body read."""


class TrainerConfig(Strict):
    """How many processes train the site's model (docs/distributed.md): 1 (default) trains in the worker itself; N > 1
    shards parameters, gradients and AdamW state over N processes with FSDP2 (gloo on a CPU, NCCL on CUDA), the
    worker being rank 0 (its gRPC service and rollout engine) and every rank running the same HACPO update."""

    world_size: PositiveInt = 1
    """Processes in all, the worker included."""
    local_ranks: NonNegInt | None = None
    """Ranks the worker starts on its own machine (ranks 1..local_ranks); default all of them (world_size − 1). The
    others join from the site's other machines (``torchrun ... -m hacrl_fed.distributed.rank``)."""
    master_addr: str = "127.0.0.1"
    """Rendezvous address every rank reaches (rank 0's machine); keep it on the site's private network."""
    master_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """Rendezvous port; 0 picks a free one (single machine only: other machines need a fixed port)."""
    timeout_s: Annotated[float, Field(gt=0, le=86400)] = 300.0
    """Timeout of every collective (``init_process_group(timeout=...)``): a rank that hangs fails the step after this."""

    @model_validator(mode="after")
    def _ranks_fit(self) -> TrainerConfig:
        if self.local_ranks is not None and self.local_ranks > self.world_size - 1:
            raise ValueError(f"trainer.local_ranks = {self.local_ranks} but world_size = {self.world_size} leaves "
                             f"{self.world_size - 1} ranks besides the worker")
        if self.world_size > 1 and self.local_ranks is not None and self.local_ranks < self.world_size - 1 \
                and self.master_port == 0:
            raise ValueError("ranks on other machines need a fixed trainer.master_port (0 picks one on this machine)")
        return self


class AgentConfig(Strict):
    """One site's agent: identity, model, algorithm, optimizer."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
    """Agent id: roster name, key id and metrics label."""
    model: ModelConfig
    algo: AlgoConfig = Field(default_factory=AlgoConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    reward_funcs: list[RewardFuncConfig] = Field(default_factory=list)
    """The training reward as a weighted sum (TRL ``reward_funcs``/``reward_weights``), e.g.
    ``[{name = "accuracy"}, {name = "format", weight = 0.1}]``. Empty (default): the verified accuracy alone.
    The learner computes every term but ``accuracy`` itself, for its own and its peers' rows alike; only the
    accuracy crosses the wire and feeds the capability P̂. With weights summing above 1, raise
    ``algo.baseline_guard`` to the largest total reward (the guard is meant for rewards in [0, 1])."""
    screens: ScreenConfig = Field(default_factory=ScreenConfig)
    """What this site checks in its peers' rows before training on them: its own re-verification, the likelihood
    and answer-tail screens, per-source quarantine (:mod:`hacrl_fed.screen_config`, :mod:`hacrl_fed.screens`; on by default)."""
    private_key: str | None = None
    """Ed25519 private key file (``hacrl-fed keys gen``); generated into the run directory if unset."""
    roster: str | None = None
    """Roster TOML mapping agent names to public keys, received out of band."""
    checkpoint_dir: str | None = None
    """Where the worker keeps checkpoints; defaults to ``<output_dir>/<name>/checkpoints``."""
    worker_address: str = "127.0.0.1:0"
    """Worker gRPC bind address: loopback ``host:port`` (0 = pick a free port) or ``unix:/path``."""
    slowdown: Annotated[float, Field(ge=1.0, le=100.0)] = 1.0
    """Benchmark knob (docs/async.md): this site's Generate and Train calls each take ``slowdown`` times as long (its
    worker waits (slowdown − 1) × the call's own time before answering), to measure a slow site on one machine.
    1 (default): off."""
    endpoint: EndpointConfig | None = None
    """Set: a rollout-only site whose rollouts come from this OpenAI-compatible endpoint (``hacrl-fed client
    --endpoint URL --api-model NAME``); its roster entry must say ``role = "rollout_only"``."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """The trainer over several processes (``trainer.world_size``, docs/distributed.md); full fine-tuning only."""

    @property
    def rollout_only(self) -> bool:
        """The site contributes rollouts from an endpoint and never trains."""
        return self.endpoint is not None

    @model_validator(mode="after")
    def _unique_rewards(self) -> AgentConfig:
        names = [f.name for f in self.reward_funcs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"reward_funcs: each function once; repeated: {', '.join(dupes)}")
        return self


class RunConfig(Strict):
    """The training run, as the coordinator drives it."""

    run_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] = "hacrl-run"
    steps: PositiveInt = 10
    prompts_per_step: PositiveInt = 8
    """B: prompts sampled per step."""
    samples_per_prompt: PositiveInt = 8
    """G: responses per prompt per agent."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    capability_window: PositiveInt = 5
    """K: per-step mean rewards averaged into the capability estimate (current step included)."""
    capability_warmup_steps: NonNegInt = 0
    """Steps during which every capability ratio is forced to 1."""
    min_agents: Annotated[int, Field(ge=1)] = 2
    """A step proceeds when at least this many agents delivered valid batches."""
    generate_timeout_s: PositiveFloat = 1800.0
    train_timeout_s: PositiveFloat = 1800.0
    join_timeout_s: Annotated[float, Field(ge=0)] = 300.0
    """At (re)start the coordinator waits up to this long for every roster agent, then runs with ≥ min_agents."""
    checkpoint_every: NonNegInt = 1
    """Ask every site to save a resumable checkpoint after every N-th step it trained (0 = never)."""
    max_batch_bytes: PositiveInt = 16 * 1024 * 1024
    """Size cap of one signed RolloutBatch; larger payloads are rejected before parsing."""
    eval_every: NonNegInt = 0
    """Evaluate on the held-out split every N steps (0 = only before and after)."""
    seed: int = 0
    mode: Literal["sync", "async"] = "sync"
    """``sync``: every step waits for every site (the paper's setting). ``async``: every site generates and trains
    at its own pace, learning from the peer batches that arrived since its last update (docs/async.md); ``steps``
    is then each site's number of updates."""
    max_staleness: NonNegInt = 4
    """Asynchronous runs: a peer batch reaches a learner only while its source has trained at most this many times
    since generating it (TRL AsyncGRPO ``max_staleness``, default 4); staler rows are dropped and counted."""
    max_row_age_s: PositiveFloat = 3600.0
    """Asynchronous runs: a peer batch accepted longer ago than this (seconds) is dropped and counted."""
    async_steps: Literal["each", "slowest"] = "each"
    """Asynchronous runs: ``each`` — every site makes ``steps`` updates and stops; ``slowest`` — sites keep training
    until every site has made ``steps`` updates (faster sites make more; none idles while the slowest catches up)."""
    output_dir: str = "runs"
    report_to: list[Literal["tensorboard"]] = Field(default_factory=list)
    """Where the coordinator's metrics go besides ``metrics.jsonl`` (always written; TRL ``report_to``):
    ``"tensorboard"`` also writes every numeric field of every metrics line as a TensorBoard scalar to
    ``<run dir>/tensorboard/`` (``tensorboard --logdir runs``; needs ``pip install "hacrl-fed[tensorboard]"``).
    One name may be given as a string; ``"none"`` is the empty list."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _report_to_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [] if value == "none" else [value]
        return value


class SuperLinkConfig(Strict):
    """How ``hacrl-fed server`` starts ``flower-superlink``."""

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 9092
    insecure: bool = False
    """Plain HTTP (loopback testing only). Otherwise TLS with the files below."""
    ca_cert: str | None = None
    server_cert: str | None = None
    server_key: str | None = None
    node_auth: bool = True
    """Require SuperNode authentication with registered EC keys (needs TLS)."""
    database: str | None = None
    """SQLite file for SuperLink state; defaults to ``<run.output_dir>/<run.run_id>/superlink.db``."""

    @model_validator(mode="after")
    def _tls_files(self) -> SuperLinkConfig:
        if not self.insecure:
            missing = [k for k in ("ca_cert", "server_cert", "server_key") if getattr(self, k) is None]
            if missing:
                raise ValueError(
                    "TLS needs " + ", ".join(f"superlink.{k}" for k in missing)
                    + " (create them with `hacrl-fed keys certs`), or set superlink.insecure = true"
                )
        if self.insecure and self.node_auth:
            raise ValueError("superlink.node_auth needs TLS: set superlink.insecure = false or node_auth = false")
        return self


class ServerConfig(Strict):
    """``hacrl-fed server --config server.toml``."""

    run: RunConfig = Field(default_factory=RunConfig)
    superlink: SuperLinkConfig
    """Required: the secure default needs the TLS file paths (a default section could never validate)."""
    roster: str
    """Roster TOML: agent names → Ed25519 public keys (+ SuperNode EC public keys)."""
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)


class ClientConfig(Strict):
    """``hacrl-fed client --config client.toml`` (command-line flags override these)."""

    agent: AgentConfig
    superlink: str = "127.0.0.1:9092"
    """Address of the coordinator's SuperLink (fleet API)."""
    insecure: bool = False
    root_certificates: str | None = None
    """CA certificate that signed the SuperLink's TLS certificate."""
    node_key: str | None = None
    """SuperNode EC private key (OpenSSH format) registered at the coordinator."""
    output_dir: str = "runs"
    run_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] | None = None
    """The coordinator's ``run.run_id`` this site joins, if known: a site whose checkpoints belong to another
    run then refuses to start (unset: the first order of another run is refused, never trained on)."""

    @model_validator(mode="after")
    def _schedule_horizon(self) -> ClientConfig:
        optim = self.agent.optim
        if optim.needs_schedule_steps and optim.schedule_steps is None:
            raise ValueError(f"agent.optim.schedule_steps is required with lr_scheduler_type = "
                             f"{optim.lr_scheduler_type!r} or warmup_ratio: set it to the coordinator's run.steps")
        return self


class SimulateConfig(Strict):
    """``hacrl-fed simulate --config simulate.toml``: every agent on one machine, loopback."""

    run: RunConfig = Field(default_factory=RunConfig)
    agents: Annotated[list[AgentConfig], Field(min_length=1)]
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    tls: bool = False
    """Loopback TLS + SuperNode authentication (CA, server certificate and node keys generated into
    the run directory). Default: plain HTTP on 127.0.0.1."""

    @model_validator(mode="after")
    def _unique_names(self) -> SimulateConfig:
        names = [a.name for a in self.agents]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"agents[].name must be unique; repeated: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _schedule_horizon(self) -> SimulateConfig:
        """A schedule without ``optim.schedule_steps`` spans the run: ``run.steps``."""
        for agent in self.agents:
            if agent.optim.needs_schedule_steps and agent.optim.schedule_steps is None:
                agent.optim.schedule_steps = self.run.steps
        return self


def absolute_path(path: str | None, base: Path) -> str | None:
    """``path`` made absolute against ``base`` (``~`` expanded); None stays None."""
    return None if path is None else str((base / Path(path).expanduser()).resolve())


class ConfigError(ValueError):
    """A config file is missing, is not valid TOML, or does not match its schema."""


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    """One line per problem: ``source: key.path: message (expected TYPE, got VALUE)``."""
    lines = []
    for e in err.errors():
        where = _loc(tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
        kind = e["type"]
        if kind == "extra_forbidden":
            msg = "unknown key"
        elif kind == "missing":
            msg = "item is missing" if e["loc"] and isinstance(e["loc"][-1], int) else "required key is missing"
        elif kind in ("value_error", "assertion_error"):  # validator messages already say what to change
            msg = str(e["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        elif kind.endswith(("_type", "_parsing")):
            expected = kind.removesuffix("_parsing").removesuffix("_type")
            expected = {"model": "table", "dict": "table"}.get(expected, expected)  # TOML's word
            msg = f"{e['msg']} (expected {expected}, got {e.get('input')!r})"
        else:  # constraint errors (greater_than, literal_error, too_short …): the message names the bound
            msg = f"{e['msg']} (got {e.get('input')!r})"
        lines.append(f"{source}: {where}: {msg}")
    return "\n".join(lines)


M = TypeVar("M", bound=BaseModel)


def parse_config(data: dict, model: type[M], source: str = "config") -> M:
    """Validate a mapping against ``model``. Raises :class:`ConfigError` naming every bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read."""


def override_run(data: dict, run: dict | None) -> dict:
    """``data`` (a config mapping) with ``run``'s keys set in its ``[run]`` table (command-line overrides such as
    ``hacrl-fed simulate --steps``), before validation, so that what derives from them (a schedule spanning
    ``run.steps``) follows. ``data`` is not modified."""
    if not run:
        return data
    table = data.get("run", {})
    if not isinstance(table, dict):
        raise ConfigError("[run] must be a table")
    return {**data, "run": {**table, **run}}


def load_config(path: str | Path, model: type[M], *, run: dict | None = None) -> M:
    """Read a TOML file and validate it; ``run``: overrides of its ``[run]`` keys (:func:`override_run`). Raises
    :class:`ConfigError` (missing file, not a regular file, larger than :data:`MAX_CONFIG_BYTES`, bad TOML,
    schema)."""
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):  # a directory, a device, a FIFO: never opened
            raise ConfigError(f"{p}: cannot read config file: not a regular file")
        with p.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{p}: cannot read config file: larger than {MAX_CONFIG_BYTES} bytes")
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except OSError as err:  # no permission …
        raise ConfigError(f"{p}: cannot read config file: {err.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{p}: not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"{p}: not valid TOML: nested too deeply") from None
    return parse_config(override_run(data, run), model, source=str(p))
