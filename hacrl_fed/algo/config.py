"""Algorithm configuration: HACPO and every baseline / ablation as settings of one code path.

Presets (``AlgoConfig.preset(name)``) are the named recipes of the paper's tables
(hacpo-spec §9–§11). Pure data; no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class AlgoConfig(BaseModel):
    """HACPO hyper-parameters (hacpo-spec §1 notation). Defaults = the paper's HACPO recipe."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    name: Literal[
        "hacpo", "gspo", "grpo", "isolated", "naive", "gspo_x2",
        "hacpo_no_adv", "hacpo_no_omega", "hacpo_no_clip", "hacpo_no_stepwise",
    ] = "hacpo"
    """Label of the recipe (see :meth:`preset`); the fields below are what the code reads."""
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
    self_clip_low: Annotated[float, Field(ge=0)] = 3e-4
    """ε_l of the self term (GSPO 3e-4; GRPO 0.2)."""
    self_clip_high: Annotated[float, Field(ge=0)] = 4e-4
    """ε_h of the self term (GSPO 4e-4; GRPO 0.28)."""
    alpha: Annotated[float, Field(ge=0)] = 1.0
    """Exponent of exponential importance sampling (Eq. 12)."""
    cross_clip: bool = True
    """Clamp cross ratios to [l_m, 1] (Eq. 13–14). False = "no clip"."""
    cross_clip_delta: Annotated[float, Field(ge=0, le=1)] = 0.2
    """δ: lower bound 1 − δ at m = 0."""
    cross_clip_step: Annotated[float, Field(ge=0)] = 0.025
    """δ_step: lower-bound tightening per optimizer update; 0 = "no stepwise"."""
    stepwise_index: Literal["update", "cross_update"] = "cross_update"
    """What m counts: every optimizer update of the step, or only updates holding cross rows."""
    ratio_clip: tuple[float, float] = (0.1, 10.0)
    """Bounds of the capability ratio r_{j→k}."""
    kl_coef: Annotated[float, Field(ge=0)] = 0.001
    """β of the low-variance (k3) KL to the learner's reference, own rows only."""
    max_abs_log_ratio: Annotated[float, Field(gt=0)] = 10.0
    """Clamp of |log s| before exponentiation (overflow guard)."""
    rollout_multiplier: Annotated[int, Field(ge=1)] = 1
    """Own rollouts per prompt = multiplier × G (GSPO×2 = 2, isolated)."""
