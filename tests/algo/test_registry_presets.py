"""Registries (duplicate / unknown names) and the presets of every baseline and ablation (spec §10)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from hacrl_fed.algo.config import PRESETS, AlgoConfig
from hacrl_fed.algo.losses import LossInputs, compute_loss
from hacrl_fed.algo.registry import ADVANTAGE_ESTIMATORS, CROSS_OBJECTIVES, SELF_OBJECTIVES, Registry


def test_registry_duplicate_and_unknown_names():
    reg = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a")(lambda: 2)
    assert reg.get("a") is a and reg.names() == ["a"] and "a" in reg
    with pytest.raises(KeyError, match="unknown widget 'b'; valid names: a"):
        reg.get("b")


def test_builtin_registries_and_their_errors():
    assert ADVANTAGE_ESTIMATORS.names() == ["grpo", "hacpo"]
    assert SELF_OBJECTIVES.names() == ["sequence", "token"]
    assert CROSS_OBJECTIVES.names() == ["hacpo", "self"]
    with pytest.raises(KeyError, match="valid names: hacpo, self"):
        CROSS_OBJECTIVES.get("vanilla")
    with pytest.raises(ValueError, match="already registered"):
        CROSS_OBJECTIVES.register("hacpo")(lambda inputs, cfg: None)
    assert CROSS_OBJECTIVES.names() == ["hacpo", "self"]          # the failed registration left no trace


EXPECTED = {
    "hacpo": dict(share_rollouts=True, capability_advantage=True, capability_gradient=True, cross_objective="hacpo",
                  ratio_level="sequence", self_clip_low=3e-4, self_clip_high=4e-4, alpha=1.0, cross_clip=True,
                  cross_clip_delta=0.2, cross_clip_step=0.025, kl_coef=0.001, rollout_multiplier=1,
                  cross_ratio_unit="token", cross_below_window="drop", cross_above_window="clamp"),
    "grpo": dict(share_rollouts=False, ratio_level="token", self_clip_low=0.2, self_clip_high=0.28,
                 rollout_multiplier=1, kl_coef=0.0),
    "gspo": dict(share_rollouts=False, ratio_level="sequence", self_clip_low=3e-4, self_clip_high=4e-4, kl_coef=0.0),
    "isolated": dict(share_rollouts=False, ratio_level="sequence", kl_coef=0.001),
    "gspo_x2": dict(share_rollouts=False, ratio_level="sequence", rollout_multiplier=2, kl_coef=0.0),
    "naive": dict(share_rollouts=True, capability_advantage=False, capability_gradient=False,
                  cross_objective="self", ratio_level="sequence"),
    "hacpo_no_adv": dict(capability_advantage=False, capability_gradient=True, cross_clip=True),
    "hacpo_no_omega": dict(capability_advantage=True, capability_gradient=False),
    "hacpo_no_clip": dict(cross_clip=False, capability_gradient=True),
    "hacpo_no_stepwise": dict(cross_clip=True, cross_clip_step=0.0),
    "hacpo_cross_family": dict(share_rollouts=True, capability_advantage=True, capability_gradient=True,
                               cross_objective="hacpo", cross_clip=True, cross_ratio_unit="byte",
                               cross_below_window="success_gated", cross_above_window="on_policy"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_presets_produce_documented_settings(name):
    cfg = AlgoConfig.preset(name)
    assert cfg.name == name
    for field, value in EXPECTED[name].items():
        assert getattr(cfg, field) == value, field
    assert AlgoConfig(name=name) == cfg                     # TOML `name = "..."` fills the same fields


def test_every_recipe_name_has_a_preset():
    assert set(PRESETS) == set(EXPECTED) == set(AlgoConfig.model_fields["name"].annotation.__args__)


def test_overrides_alpha_sweep_and_errors():
    assert [AlgoConfig.preset("hacpo", alpha=a).alpha for a in (0.0, 1.0, 2.0, 3.0)] == [0.0, 1.0, 2.0, 3.0]
    assert AlgoConfig(name="grpo", self_clip_low=0.1).self_clip_low == 0.1       # explicit field wins
    assert AlgoConfig(name="gspo", kl_coef=0.04).kl_coef == 0.04                  # a KL term only when asked
    with pytest.raises(ValueError, match="valid names: hacpo"):
        AlgoConfig.preset("ppo")
    with pytest.raises(ValidationError):
        AlgoConfig(alpha=-1.0)
    with pytest.raises(ValidationError, match="ratio_clip"):
        AlgoConfig(ratio_clip=(2.0, 1.0))
    with pytest.raises(ValidationError):
        AlgoConfig(stepwise_index="epoch")
    assert AlgoConfig.preset("hacpo_no_adv").advantage_estimator == "grpo"
    assert AlgoConfig().advantage_estimator == "hacpo"


def cross_row(s, adv=1.0, r=2.0, m=4):
    t = torch.full((1, 5), -1.0, dtype=torch.float64, requires_grad=True)
    return LossInputs(token_logprobs=t, response_mask=torch.ones(1, 5, dtype=torch.bool),
                      advantages=torch.tensor([adv], dtype=torch.float64),
                      old_logprob_sum=torch.tensor([(-1.0 - math.log(s)) * 6], dtype=torch.float64),
                      old_token_count=torch.tensor([6.0]), is_own=torch.tensor([False]),
                      capability_ratio=torch.tensor([r], dtype=torch.float64), update_index=m)


def objective(name, inputs, **kw):
    return -float(compute_loss(inputs, AlgoConfig.preset(name, kl_coef=0.0, **kw)).loss.detach())


def test_presets_change_the_cross_objective_as_documented():
    s = 0.85                                                # inside [0.8, 1] at m = 0, below l_4 = 0.9
    assert objective("hacpo", cross_row(s, m=0)) == pytest.approx(s * s * 2.0)
    assert objective("hacpo", cross_row(s)) == pytest.approx(0.9 * 0.9 * 2.0)      # stepwise clamp at m = 4
    assert objective("hacpo_no_stepwise", cross_row(s)) == pytest.approx(s * s * 2.0)
    assert objective("hacpo_no_omega", cross_row(s, m=0)) == pytest.approx(s * s)
    assert objective("hacpo_no_clip", cross_row(1.5)) == pytest.approx(1.5 * 1.5 * 2.0)
    assert objective("hacpo", cross_row(s, m=0), alpha=3.0) == pytest.approx(s ** 4 * 2.0)
    # naive: GSPO surrogate with the source's log-prob, no ω: min(s·A, clip(s, 1 − 3e-4, 1 + 4e-4)·A)
    assert objective("naive", cross_row(s)) == pytest.approx(s)
    assert objective("naive", cross_row(s, adv=-1.0)) == pytest.approx(-(1 - 3e-4))
