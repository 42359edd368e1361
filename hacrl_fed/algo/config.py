"""Algorithm configuration: HACPO and every baseline / ablation as settings of one code path.

Presets (``AlgoConfig.preset(name)`` / :data:`PRESETS`) are the named recipes of the paper's
tables (hacpo-spec §9–§11). Giving ``name`` alone (``AlgoConfig(name="grpo")``, or
``name = "grpo"`` in TOML) fills every field the preset sets; fields given explicitly win.
Pure data; no I/O, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RecipeName = Literal[
    "hacpo", "gspo", "grpo", "isolated", "naive", "gspo_x2",
    "hacpo_no_adv", "hacpo_no_omega", "hacpo_no_clip", "hacpo_no_stepwise",
    "hacpo_cross_family",
]

_GSPO_ALONE: dict[str, Any] = {
    "share_rollouts": False, "ratio_level": "sequence", "self_clip_low": 3e-4, "self_clip_high": 4e-4,
}
_NO_KL: dict[str, Any] = {"kl_coef": 0.0}
"""GSPO (arXiv 2507.18071) and DAPO-style GRPO have no KL term, nor does TRL's GRPOTrainer by default
(``beta = 0``): with ``kl_coef = 0`` no frozen reference copy is built and no reference forward runs."""

PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    # HACPO, the paper's recipe (App. A, Table 5 "commonly used" column): all four mechanisms.
    "hacpo": MappingProxyType({}),
    # GRPO, isolated: token-level ratio, DAPO clip-higher 0.2 / 0.28, plain group baseline, no KL (DAPO,
    # TRL's default beta = 0; DeepSeekMath's original GRPO had beta = 0.04: set kl_coef to ask for it).
    "grpo": MappingProxyType({"share_rollouts": False, "ratio_level": "token", "self_clip_low": 0.2,
                              "self_clip_high": 0.28, "capability_advantage": False, **_NO_KL}),
    # GSPO, isolated: sequence-level ratio, 3e-4 / 4e-4, no KL (the GSPO paper's objective).
    "gspo": MappingProxyType({**_GSPO_ALONE, "capability_advantage": False, **_NO_KL}),
    # Isolated training: each agent alone with HACPO's own-rollout objective (GSPO settings, and HACPO's
    # own-row KL: the ablation of sharing alone, everything else as in `hacpo`).
    "isolated": MappingProxyType({**_GSPO_ALONE, "capability_advantage": False}),
    # GSPO×2, the resource-equivalent baseline: twice the own rollouts per prompt, no sharing, no KL (GSPO).
    "gspo_x2": MappingProxyType({**_GSPO_ALONE, "capability_advantage": False, "rollout_multiplier": 2, **_NO_KL}),
    # Naive sharing: foreign rows used as if they were own (plain joint group mean, no ω,
    # the self objective with the source's behaviour log-prob as the old log-prob).
    "naive": MappingProxyType({"share_rollouts": True, "capability_advantage": False,
                               "capability_gradient": False, "cross_objective": "self"}),
    # Ablations of Tables 2–3 and Fig. 4.
    "hacpo_no_adv": MappingProxyType({"capability_advantage": False}),
    "hacpo_no_omega": MappingProxyType({"capability_gradient": False}),
    "hacpo_no_clip": MappingProxyType({"cross_clip": False}),
    "hacpo_no_stepwise": MappingProxyType({"cross_clip_step": 0.0}),
    # Extension (not the paper): HACPO for agents of different families and tokenizers — the cross ratio
    # per byte of the shared text, verified peer successes below the window kept at the edge weight, rows
    # above it kept at weight 1 (docs/benchmarks.md "Cross-family collaboration").
    "hacpo_cross_family": MappingProxyType({"cross_ratio_unit": "byte", "cross_below_window": "success_gated",
                                            "cross_above_window": "on_policy"}),
})
"""Recipe name → the fields it sets (everything else keeps the HACPO default)."""


class AlgoConfig(BaseModel):
    """HACPO hyper-parameters (hacpo-spec §1 notation). Defaults = the paper's HACPO recipe."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: RecipeName = "hacpo"
    """Recipe (see :data:`PRESETS`). On construction its preset fills the fields not given
    explicitly; afterwards it is a label. The fields below are what the code reads."""
    share_rollouts: bool = True
    """Train on other agents' rollouts. False = isolated training (each agent alone)."""
    capability_advantage: bool = True
    """Capability-weighted baseline μ̂ (Eq. 7). False = plain joint mean ("HACPO − Adv")."""
    capability_gradient: bool = True
    """Multiply cross rows by r_{j→k} = ω^(j,k) (Eq. 10). False = "HACPO − ω"."""
    cross_objective: Literal["hacpo", "self"] = "hacpo"
    """``hacpo``: Eq. 50 clamp·sg^α·ω·A for foreign rows; ``self``: foreign rows get the self
    (GSPO/GRPO) objective with the source's behaviour log-prob — the naive-sharing baseline."""
    ratio_level: Literal["sequence", "token"] = "sequence"
    """Self-term importance ratio: GSPO sequence ratio or GRPO per-token ratio."""
    self_clip_low: Annotated[float, Field(ge=0, lt=1)] = 3e-4
    """ε_l of the self term (GSPO 3e-4; GRPO 0.2)."""
    self_clip_high: Annotated[float, Field(ge=0)] = 4e-4
    """ε_h of the self term (GSPO 4e-4; GRPO 0.28)."""
    alpha: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    """Exponent of exponential importance sampling (Eq. 12); the paper sweeps 0, 1, 2, 3."""
    cross_clip: bool = True
    """Clamp cross ratios to [l_m, 1] (Eq. 13–14). False = "no clip"."""
    cross_ratio_unit: Literal["token", "byte"] = "token"
    """Unit of the cross ratio's length normalization (:func:`hacrl_fed.algo.losses.cross_log_ratio`).
    ``token``: the paper's two-length form, log s = Σ log π_k / L_k − Σ log π_j,old / L_j. ``byte``
    (extension): log s = (Σ log π_k − Σ log π_j,old) / B over the B UTF-8 bytes of the same text — the
    same normalizer for both tokenizers; δ then bounds the per-byte log-ratio (≈ 3× looser per token at
    3 bytes per token)."""
    cross_below_window: Literal["drop", "success_gated"] = "drop"
    """Cross rows with s < l_m. ``drop`` (paper, Eq. 13): clamped, no gradient. ``success_gated``
    (extension; LUFFY arXiv 2504.14945 and F-TIS keep verified off-policy successes): a row with A > 0
    keeps the edge weight, J = l_m · sg(l_m)^α · r_{j→k} · A with gradient l_m^(1+α)·r·A·∇ mean log π_k;
    rows with A ≤ 0 stay dropped."""
    cross_above_window: Literal["clamp", "on_policy"] = "clamp"
    """Cross rows with s > 1. ``clamp`` (paper, Eq. 13): c = 1, no gradient. ``on_policy`` (extension):
    the learner already gives the text more probability than its author, so the row is treated as
    on-policy, J = r_{j→k} · A with weight 1 and gradient r·A·∇ mean log π_k."""
    missing_behaviour_logprob: Literal["success_only", "luffy_shaping"] = "success_only"
    """Foreign rows whose source sent no behaviour log-prob (an API endpoint without log-probs,
    docs/cross-vendor.md): their cross ratio s is undefined, so the paper's Eqs. 10–14 cannot apply. Both rules
    are named extensions (:func:`hacrl_fed.algo.extensions.missing_logprob_objective`); rows with a log-prob are
    untouched. ``success_only``: a verified success (A > 0) is kept at the window's edge weight,
    J = l_m · sg(l_m)^α · r_{j→k} · A (gradient l_m^(1+α)·r·A·∇ mean log π_k), a non-success (A ≤ 0) is dropped
    — this project's ``success_gated`` rule with the behaviour probability unknown, in the spirit of the
    success-only supervised terms of learning from samples without a behaviour probability.
    ``luffy_shaping`` (LUFFY, arXiv 2504.14945, §3: behaviour probability taken as 1, policy shaping
    f(π) = π/(π + γ)): J = r_{j→k} · A · (1/L_k) Σ_t f(π_k(y_t)), every row whatever the sign of A."""
    luffy_gamma: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 0.1
    """γ of LUFFY's policy shaping f(π) = π/(π + γ) (``missing_behaviour_logprob = "luffy_shaping"``; LUFFY's
    default 0.1)."""
    cross_clip_delta: Annotated[float, Field(ge=0, le=1)] = 0.2
    """δ: lower bound 1 − δ at m = 0."""
    cross_clip_step: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.025
    """δ_step: lower-bound tightening per optimizer update; 0 = "no stepwise"."""
    stepwise_index: Literal["update", "cross_update"] = "cross_update"
    """What m counts: every optimizer update of the step (Eq. 14 read literally, as the authors'
    rewrite does), or only updates holding cross rows (default; docs/algorithm.md)."""
    ratio_clip: tuple[float, float] = (0.1, 10.0)
    """Bounds of the capability ratio r_{j→k}."""
    capability_scope: Literal["global", "task"] = "global"
    """Which capability P̂ the ratio r_{j→k} of a row uses. ``global`` (paper, Eqs. 8–9): each agent's mean reward
    over its last K steps. ``task`` (extension, :mod:`hacrl_fed.algo.capability`): for a prompt of task t,
    r_{j→k}(t) = clip(P̂_j(t) / P̂_k(t), 0.1, 10) with P̂(t) the window mean of the agent's per-step mean rewards
    on task t's prompts (the coordinator's ``CapabilityTable.task_capability``), in the baseline weight
    ω^(k,j) = 1 / r (Eq. 7) and the gradient weight (Eq. 10) alike; the global ratio where either agent has no
    value for t yet, or the data source has no tasks."""
    baseline_guard: Annotated[float, Field(allow_inf_nan=False)] | None = 1.0
    """If the weighted baseline μ̂ exceeds this, μ̂ := mean of the learner's own rewards in the
    group (both reference codes; meant for rewards in [0, 1]). None disables the guard."""
    kl_coef: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.001
    """β of the low-variance (k3) KL to the learner's reference, own rows only. 0.001 is the HACPO
    reference code's setting (hacpo-spec §6; the paper does not mention a KL term); the ``gspo``,
    ``grpo`` and ``gspo_x2`` presets set 0. Any value > 0 makes the worker keep a frozen reference copy
    of the model (its weights' memory again) and run one extra no-grad forward per micro-batch."""
    max_abs_log_ratio: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 10.0
    """Clamp of |log s| before exponentiation (overflow guard)."""
    rollout_multiplier: Annotated[int, Field(ge=1)] = 1
    """Own rollouts per prompt = multiplier × G (GSPO×2 = 2, isolated)."""
    loss_aggregation: Literal["sequence_mean", "token_mean", "constant"] = "sequence_mean"
    """How row losses −J_i become the mini-batch loss (:func:`hacrl_fed.algo.losses.aggregate`; L_i = the
    row's response tokens, n = rows of the mini-batch). ``sequence_mean`` (the paper, spec §6; TRL
    ``loss_type="grpo"``): Σ_i −J_i / n. ``token_mean`` (DAPO, arXiv 2503.14476; TRL ``"dapo"``, and
    ``"bnpo"`` which normalizes per micro-batch): Σ_i L_i·(−J_i) / Σ_i L_i — every token weighs the same.
    ``constant`` (Dr. GRPO, arXiv 2503.20783; TRL ``"dr_grpo"``): Σ_i L_i·(−J_i) / (n · L_max), L_max = the
    learner's ``model.max_response_tokens``: no length normalization at all."""
    reward_scaling: Literal["group", "batch", "none"] = "group"
    """Denominator of the advantage (:func:`hacrl_fed.algo.advantages.group_advantages`; TRL
    ``scale_rewards``). ``group`` (the paper, Eq. 6; TRL ``"group"``/``True``): A = (R − μ̂)/(σ_group + ε).
    ``batch`` (TRL ``"batch"``; Hu et al., REINFORCE++): σ = unbiased std of every reward of the learner's
    step. ``none`` (Dr. GRPO; TRL ``"none"``/``False``): A = R − μ̂. The baseline μ̂ (capability-weighted
    for HACPO) and the uniform-group and size-1 rules are the same in every mode."""
    peer_distill_coef: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    """Peer distillation (named extension, :mod:`hacrl_fed.algo.peer_distill`): λ₀ of a supervised NLL term on the
    foreign rows above their group's baseline after the screens, L = L_HACPO + λ_t · L_PD. 0 (default, every
    preset): off, the update is exactly the recipe's."""
    peer_distill_schedule: Literal["constant", "linear"] = "constant"
    """λ_t: ``constant`` λ₀, or ``linear`` λ₀ · max(0, 1 − (t − 1)/T) over ``peer_distill_steps`` T."""
    peer_distill_steps: Annotated[int, Field(ge=1)] | None = None
    """T of the ``linear`` schedule (training steps until λ_t reaches 0)."""
    peer_distill_weighting: Literal["indicator", "advantage"] = "indicator"
    """ω_i of a distilled row: ``indicator`` 1, or ``advantage`` A_i · g_i (advantage-weighted regression)."""
    mask_truncated_completions: bool = False
    """Rows that do not end with EOS (cut at ``max_new_tokens``, or at the learner's ``max_response_tokens``)
    give no loss and no gradient (TRL ``mask_truncated_completions``; DAPO's overlong filtering). Their
    rewards still enter the advantages of their group; they still count in the ``sequence_mean`` and
    ``constant`` denominators, not in ``token_mean``'s or the KL's token counts."""

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("name") in PRESETS:
            return {**PRESETS[data["name"]], **data}
        return data

    @model_validator(mode="after")
    def _check(self) -> AlgoConfig:
        lo, hi = self.ratio_clip
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 < lo <= hi):
            raise ValueError(f"ratio_clip must be finite with 0 < low <= high, got {self.ratio_clip}")
        if self.peer_distill_coef > 0 and self.peer_distill_schedule == "linear" and self.peer_distill_steps is None:
            raise ValueError("peer_distill_schedule = 'linear' needs peer_distill_steps (the steps until λ reaches 0)")
        return self

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> AlgoConfig:
        """The named recipe of :data:`PRESETS`, with ``overrides`` on top (e.g. ``alpha=3.0``).

        Raises ``ValueError`` for an unknown name (listing the valid ones) or invalid overrides.
        """
        if name not in PRESETS:
            raise ValueError(f"unknown algorithm preset {name!r}; valid names: {', '.join(PRESETS)}")
        return cls(**{"name": name, **overrides})

    @property
    def advantage_estimator(self) -> str:
        """Name in ``ADVANTAGE_ESTIMATORS``: ``"hacpo"`` (Eq. 7) or ``"grpo"`` (plain joint mean)."""
        return "hacpo" if self.capability_advantage else "grpo"

    def cross_lower_bound(self, m: int) -> float:
        """Stepwise lower clip bound l_m = min(1, 1 − δ + m·δ_step) (Eq. 14; spec T11).

        Capped at 1.0: from then on every cross row is clamped to 1 and gives no gradient.
        Raises ``ValueError`` for m < 0.
        """
        if m < 0:
            raise ValueError(f"stepwise index m must be >= 0, got {m}")
        # l_m = 1 − δ + m·δ_step, capped at the upper bound 1.0 (spec §12 "l_m > 1")
        return min(1.0, 1.0 - self.cross_clip_delta + m * self.cross_clip_step)
