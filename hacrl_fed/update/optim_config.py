"""Optimizer settings of the learner update: AdamW, mini-batches, micro-batches by token budget.

The ``optim`` section of an agent's config (:class:`hacrl_fed.config.AgentConfig`; ``hacrl_fed.config``
re-exports :class:`OptimConfig`). It lives beside the update it configures
(:mod:`hacrl_fed.update.loop`), so the math imports nothing above ``algo/``. Pure data; no I/O, no torch.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["OptimConfig"]

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class OptimConfig(BaseModel):
    """Learner update: AdamW, mini-batches, micro-batches by token budget."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    lr: PositiveFloat = 1e-5
    """AdamW learning rate (the paper's 1e-6 is for 1.7B–8B models; small models need more)."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: PositiveFloat = 1e-8
    grad_clip: PositiveFloat = 1.0
    """Global grad-norm clip per optimizer update."""
    mini_batch_rows: PositiveInt = 64
    """Rows per optimizer update (one update = one mini-batch = one stepwise index m)."""
    micro_batch_tokens: PositiveInt = 4096
    """Token budget of one forward/backward (padded prompt + response tokens)."""
    shared_prompt_forward: Literal["auto", "on", "off"] = "auto"
    """Run each prompt once per micro-batch in the update's forward passes (loss, GRPO old log-probs, reference):
    the rows that share identical prompt ids (a group's G samples, foreign rows re-tokenized to the same prompt)
    are packed into one sequence ``[prompt, resp_1, …, resp_k]`` whose 4-D attention mask lets each response
    see the prompt and, causally, itself only, with position ids restarting at the prompt's length
    (:mod:`hacrl_fed.tokenization.packing`); the log-probs and entropies are unpacked to the rows. Why: the
    prompt is otherwise recomputed G times and every row padded to the longest; a pack takes about the
    cheapest number of responses for the model's linear vs attention cost
    (:func:`hacrl_fed.tokenization.packing.pair_cost`; ~4 for SmolLM2-135M). A SmolLM2-135M GSPO update on a CPU costs 0.73× (2 × 4 rows)
    and 0.80× (4 × 8) of the unpacked one (``benchmarks/bench_packing.py``). A computation change, not a
    math change: float32 log-probs and entropies equal the unpacked ones within 1e-6 (max |Δ| measured
    9.5e-7 and 1.9e-6), gradients within 1e-6 of each tensor's largest entry (tests/algo/test_packing.py);
    update Δθ cosine ≥ 0.999999995. ``micro_batch_tokens`` then counts packed tokens. ``auto``: on where the
    family takes such a mask exactly (``model_type`` llama — SmolLM2 — and gemma3_text, whose sliding layers
    get their own windowed mask; sdpa or eager attention; also LoRA-wrapped:
    :func:`hacrl_fed.update.logprobs.packing_unsupported`), the unpacked forward otherwise (flash attention,
    Qwen and other families); ``on``: fail (ValueError) where it cannot; ``off``: never."""
    logprob_chunk_tokens: PositiveInt = 1024
    """Positions per chunk when computing selected-token log-probs (no full [T, V] log-softmax)."""
    epochs: PositiveInt = 1
    seed: int = 0
    skip_zero_grad_updates: bool = True
    """Skip the optimizer step of a mini-batch whose gradient is exactly zero (every advantage 0, or every
    cross row outside its clip window) and count it (``zero_grad_updates``). AdamW would otherwise still move
    the weights by its momentum and weight decay with no signal from the batch (what verl and TRL do)."""
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule (TRL/transformers ``lr_scheduler_type``; formulas in
    :mod:`hacrl_fed.update.schedule`): ``constant`` (default: ``lr`` throughout; with a warm-up it is
    transformers' ``constant_with_warmup``), ``linear`` decay to 0, ``cosine`` decay to 0, over
    ``schedule_steps`` training steps. The lr is a function of the step number alone, so a resumed run
    continues the schedule exactly."""
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Training steps of linear warm-up from 0 to ``lr`` (TRL ``warmup_steps``, which counts optimizer
    steps: here a training step of M updates advances the schedule by 1, each update by 1/M)."""
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Warm-up as a share of ``schedule_steps``: ``ceil(warmup_ratio · schedule_steps)`` steps (TRL
    ``warmup_ratio``). Give ``warmup_steps`` or ``warmup_ratio``, not both."""
    schedule_steps: PositiveInt | None = None
    """N, the training steps the schedule spans: the coordinator's ``run.steps`` (``hacrl-fed simulate``
    fills it in; a ``hacrl-fed client`` site with a decaying schedule or ``warmup_ratio`` must set it)."""
    update_mode: Literal["train", "eval"] = "train"
    """Module mode of the policy during the update's forward passes. ``train`` (TRL and every HF
    ``Trainer``): dropout is active where the model has any, so the ratio of an own row at the first
    mini-batch is not exactly 1 then. ``eval``: the update sees the same deterministic policy as
    generation. Behaviour and old log-probs are always computed in eval mode.
    Models without dropout (SmolLM2, Gemma-3: ``attention_dropout = 0``) compute the same either way."""

    @model_validator(mode="after")
    def _one_warmup(self) -> OptimConfig:
        if self.warmup_steps and self.warmup_ratio:
            raise ValueError("set optim.warmup_steps or optim.warmup_ratio, not both")
        return self

    @property
    def has_schedule(self) -> bool:
        """The lr changes over the run (a decaying schedule or a warm-up)."""
        return self.lr_scheduler_type != "constant" or bool(self.warmup_steps or self.warmup_ratio)

    @property
    def needs_schedule_steps(self) -> bool:
        """The schedule needs ``schedule_steps`` (decay, or a warm-up given as a ratio)."""
        return self.lr_scheduler_type != "constant" or bool(self.warmup_ratio)
