"""The built-in arithmetic generator: determinism, answers, levels, and the disjoint default split."""

from __future__ import annotations

import doctest
import logging
import re

import pytest

import hacrl_fed.data.arithmetic
import hacrl_fed.data.sampler
from hacrl_fed.config import DataConfig
from hacrl_fed.data.arithmetic import LEVELS, generate, iter_problems, level_one_problems
from hacrl_fed.data.datasets import load_problems


@pytest.mark.parametrize("module", [hacrl_fed.data.arithmetic, hacrl_fed.data.sampler])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("level", LEVELS)
def test_deterministic_per_seed_and_distinct(level):
    a, b, c = generate(50, level, seed=1), generate(50, level, seed=1), generate(50, level, seed=2)
    assert a == b
    assert a != c
    assert len({p.id for p in a}) == 50 and len({p.problem for p in a}) == 50
    assert all(p.answer.isdigit() and p.answer_style == "boxed" for p in a)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_calculate_answers_are_the_expressions_value(level):
    for p in generate(100, level, seed=0):
        m = re.fullmatch(r"Calculate (.+)\.", p.problem)
        assert m, p.problem
        value = eval(m.group(1).replace("/", "//"), {})  # operands are small, trusted, generated here
        assert str(value) == p.answer, p.problem
        if "/" in m.group(1):
            a, b = map(int, m.group(1).split(" / "))
            assert a % b == 0


def test_level_shapes():
    one = level_one_problems()
    assert len(one) == 230 and len({p.problem for p in one}) == 230
    assert all(re.fullmatch(r"Calculate \d [-+*/] \d\.", p.problem) for p in one)
    assert "Calculate 9 + 4." in {p.problem for p in one}
    two = generate(200, 2, 0)
    assert all(max(map(int, re.findall(r"\d+", p.problem))) >= 10 for p in two)
    three = generate(200, 3, 0)
    assert all(len(re.findall(r"[-+*]", p.problem)) == 2 for p in three)
    for level in (4, 5):
        assert all(p.problem.endswith("?") and re.search(r"[A-Z][a-z]+ ", p.problem) for p in generate(100, level, 0))


def test_word_problem_answers_spot_check():
    for p in generate(300, 4, seed=5):
        nums = list(map(int, re.findall(r"\d+", p.problem)))
        if " buys " in p.problem and " more." in p.problem:
            assert int(p.answer) == nums[0] + nums[1]
        elif " bags with " in p.problem:
            assert int(p.answer) == nums[0] + nums[1] * nums[2]
        elif " gives " in p.problem:
            assert int(p.answer) == nums[0] - nums[1]
    for p in generate(300, 5, seed=5):
        nums = list(map(int, re.findall(r"\d+", p.problem)))
        if p.problem.startswith("A bus"):
            assert int(p.answer) == nums[0] - nums[1] + nums[2] - nums[3]
        elif "change" in p.problem:
            assert int(p.answer) == nums[4] - (nums[0] * nums[2] + nums[1] * nums[3])


def test_too_many_and_bad_level():
    with pytest.raises(ValueError, match="only 230 distinct"):
        generate(231, 1, 0)
    with pytest.raises(ValueError, match="difficulty"):
        generate(1, 6, 0)
    assert len(list(iter_problems(1, 0))) == 230


def test_default_split_is_disjoint_and_seed_independent_held_out(caplog):
    with caplog.at_level(logging.WARNING):
        train0, held0 = load_problems(DataConfig())  # level 1: the 230 problems are exhausted
    assert len(held0) == 48 and len(train0) == 230 - 48
    assert "182 training problems" in caplog.text
    train1, held1 = load_problems(DataConfig(seed=1))
    assert held1 == held0
    assert [p.id for p in train1] != [p.id for p in train0] and set(train1) == set(train0)
    assert not {p.problem for p in train0} & {p.problem for p in held0}


@pytest.mark.parametrize("level", [2, 5])
def test_split_higher_levels(level):
    cfg = DataConfig(difficulty=level, num_problems=500, eval_size=100, seed=3)
    train, held = load_problems(cfg)
    assert (len(train), len(held)) == (500, 100)
    assert not {p.id for p in train} & {p.id for p in held}
    assert not {p.problem for p in train} & {p.problem for p in held}
    assert load_problems(cfg) == (train, held)
    bigger, held2 = load_problems(cfg.model_copy(update={"num_problems": 600}))
    assert held2 == held and bigger[:500] == train  # stable: more problems extend, never reshuffle


def test_gsm8k_style_is_applied():
    train, held = load_problems(DataConfig(answer_style="gsm8k", difficulty=4, num_problems=10, eval_size=2))
    assert {p.answer_style for p in train + held} == {"gsm8k"}
