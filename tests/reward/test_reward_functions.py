"""Weighted reward functions with TRL's plain-callable signature (reward_funcs / reward_weights)."""

from __future__ import annotations

import doctest

import pytest

import hacrl_fed.reward.functions as functions
from hacrl_fed.config import AgentConfig
from hacrl_fed.reward.functions import format_reward, load_reward_function, weighted_rewards


def test_docstring_examples():
    assert doctest.testmod(functions).failed == 0


def test_format_reward_by_style():
    texts = [r"so \boxed{5}", r"\boxed{}", "The answer is 5.", "#### 7", r"\boxed{1"]
    assert format_reward([""] * 5, texts) == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert format_reward([""] * 5, texts, answer_style=["gsm8k"] * 5) == [1.0, 0.0, 0.0, 1.0, 0.0]


def _spec(*pairs):
    return AgentConfig.model_validate({"name": "a", "model": {"name_or_path": "m"},
                                       "reward_funcs": [{"name": n, "weight": w} for n, w in pairs]}).reward_funcs


def test_weighted_sum_with_a_user_function(tmp_path, monkeypatch):
    (tmp_path / "site_rewards.py").write_text(
        "def brevity(prompts, completions, answer, **kwargs):\n"
        "    return [None if a == '?' else 1.0 / len(c) for c, a in zip(completions, answer)]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rewards = weighted_rewards(_spec(("accuracy", 1.0), ("format", 0.5), ("site_rewards:brevity", 2.0)))
    totals, means = rewards(["p1", "p2"], [r"\boxed{5}", "five"], [1.0, 0.0], answer=["5", "?"],
                            answer_style=["boxed", "boxed"])
    assert totals == pytest.approx([1.0 + 0.5 + 2.0 / 9, 0.0])        # None counts as 0
    assert means == pytest.approx({"accuracy": 0.5, "format": 0.5, "brevity": 1 / 18})
    assert weighted_rewards([]) is None


def test_bad_functions_fail_with_their_name(tmp_path, monkeypatch):
    (tmp_path / "bad_rewards.py").write_text(
        "def short(prompts, completions, **kw):\n    return [1.0]\n"
        "def nan(prompts, completions, **kw):\n    return [float('nan')] * len(completions)\n"
        "def boom(prompts, completions, **kw):\n    raise KeyError('solution')\n"
        "NOT_CALLABLE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, message in (("bad_rewards:short", "returned 1 values for 2"), ("bad_rewards:nan", "finite number"),
                          ("bad_rewards:boom", "failed: KeyError")):
        with pytest.raises(ValueError, match=message):
            weighted_rewards(_spec((name, 1.0)))(["p", "q"], ["a", "b"], [0.0, 1.0])
    with pytest.raises(ValueError, match="no callable 'NOT_CALLABLE'"):
        load_reward_function("bad_rewards:NOT_CALLABLE")
    with pytest.raises(ValueError, match="cannot import no_such_module"):
        load_reward_function("no_such_module:f")
    with pytest.raises(ValueError, match="unknown reward function 'lenght'"):
        load_reward_function("lenght")
    with pytest.raises(ValueError, match="each function once"):
        _spec(("format", 1.0), ("format", 0.5))
