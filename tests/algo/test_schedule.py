"""Learning-rate schedules: transformers' values at one update per step, fractional positions, config checks."""

from __future__ import annotations

import math

import pytest
import torch

from hacrl_fed.update.schedule import lr_factor, scheduled_lr, warmup_steps
from hacrl_fed.config import ClientConfig, OptimConfig, SimulateConfig

HF_NAMES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def _transformers_lrs(kind: str, lr: float, warmup: int, total: int) -> list[float]:
    """The lr of each of ``total`` optimizer steps under transformers' scheduler (TRL's)."""
    from transformers import get_scheduler

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = get_scheduler(HF_NAMES[kind], opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_one_update_per_step_is_transformers_schedule(kind, warmup):
    optim = OptimConfig(lr=2e-5, lr_scheduler_type=kind, warmup_steps=warmup, schedule_steps=10)
    ours = [scheduled_lr(optim, step, 0, 1) for step in range(1, 11)]
    assert ours == pytest.approx(_transformers_lrs(kind, 2e-5, warmup, 10), rel=1e-12, abs=1e-18)


def test_warmup_ratio_rounds_up_like_transformers():
    optim = OptimConfig(lr_scheduler_type="linear", warmup_ratio=0.25, schedule_steps=10)
    assert warmup_steps(optim) == 3.0                    # ceil(2.5)
    ours = [scheduled_lr(optim, s, 0, 1) for s in range(1, 11)]
    assert ours == pytest.approx(_transformers_lrs("linear", optim.lr, 3, 10), rel=1e-12, abs=1e-18)


def test_updates_inside_a_step_take_fractional_positions():
    optim = OptimConfig(lr=1.0, lr_scheduler_type="linear", warmup_steps=2, schedule_steps=4)
    # step 1 of 4 updates: s = 0, 0.25, 0.5, 0.75 → λ = s / 2
    assert [scheduled_lr(optim, 1, k, 4) for k in range(4)] == [0.0, 0.125, 0.25, 0.375]
    # step 3 (after warm-up), two updates: s = 2, 2.5 → (4 − s) / (4 − 2)
    assert [scheduled_lr(optim, 3, k, 2) for k in range(2)] == [1.0, 0.75]
    cos = OptimConfig(lr=1.0, lr_scheduler_type="cosine", schedule_steps=2)
    assert scheduled_lr(cos, 1, 1, 2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.25)))
    assert scheduled_lr(cos, 5, 0, 1) == 0.0               # past the horizon: 0, never negative


def test_default_is_constant_and_unscheduled():
    optim = OptimConfig()
    assert not optim.has_schedule and not optim.needs_schedule_steps
    assert scheduled_lr(optim, 7, 1, 3) == optim.lr
    warm = OptimConfig(warmup_steps=2)
    assert warm.has_schedule and not warm.needs_schedule_steps
    assert [scheduled_lr(warm, s, 0, 1) for s in (1, 2, 3, 50)] == [0.0, warm.lr / 2, warm.lr, warm.lr]


def test_bad_schedule_settings_fail_clearly():
    with pytest.raises(ValueError, match="not both"):
        OptimConfig(warmup_steps=2, warmup_ratio=0.1)
    with pytest.raises(ValueError, match="schedule_steps"):
        scheduled_lr(OptimConfig(lr_scheduler_type="cosine"), 1, 0, 1)
    with pytest.raises(ValueError, match="unknown lr_scheduler_type"):
        lr_factor(0.0, "step", warmup=0, total=10)
    with pytest.raises(ValueError):
        scheduled_lr(OptimConfig(), 0, 0, 1)
    with pytest.raises(ValueError, match="schedule_steps is required"):
        ClientConfig.model_validate({"agent": {"name": "a", "model": {"name_or_path": "m"},
                                               "optim": {"lr_scheduler_type": "linear"}}})


def test_simulate_spans_the_schedule_over_the_run():
    cfg = SimulateConfig.model_validate({"run": {"steps": 7}, "agents": [
        {"name": "a", "model": {"name_or_path": "m"}, "optim": {"lr_scheduler_type": "cosine"}},
        {"name": "b", "model": {"name_or_path": "m"}, "optim": {"lr_scheduler_type": "linear", "schedule_steps": 3}},
        {"name": "c", "model": {"name_or_path": "m"}}]})
    assert [a.optim.schedule_steps for a in cfg.agents] == [7, 3, None]
