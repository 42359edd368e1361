"""Answers of procedural tasks that are not numbers: the last box, scored by the task's own scorer, binary."""

from __future__ import annotations

import pytest

from hacrl_fed.reward import Verifier
from hacrl_fed.reward.compare import check_answer
from hacrl_fed.reward.extract import check_style, extract_final_answer, task_of_style


def test_the_task_scorer_decides_on_the_last_box():
    assert check_answer(r"reversed: \boxed{ssehc}", "ssehc", "task:spell_backward").verdict == "correct"
    assert check_answer(r"\boxed{\text{ssehc}}", "ssehc", "task:spell_backward").verdict == "correct"
    # reasoning-gym's default scorer gives partial credit to an answer containing the reference: not correct here
    v = check_answer(r"\boxed{ssehc or chess}", "ssehc", "task:spell_backward")
    assert (v.verdict, v.reward) == ("incorrect", 0.0)
    # no box: no answer, even when the text says it (task styles take the box alone)
    assert check_answer("The answer is ssehc.", "ssehc", "task:spell_backward").reason == "no_final_answer"
    assert check_answer(r"\boxed{a} then \boxed{ssehc}", "ssehc", "task:spell_backward").verdict == "correct"


def test_task_errors_are_verifier_errors_not_crashes():
    assert check_answer(r"\boxed{x}", "x", "task:no_such_task").reason == "unknown_task"
    assert check_answer(r"\boxed{Friday}", "Friday", "task:calendar_arithmetic").reason == "task_scorer_failed"
    assert check_answer(r"\boxed{x}", "   ", "task:spell_backward").verdict == "verifier_error"
    assert check_answer(r"\boxed{" + "x" * 3000 + "}", "x", "task:spell_backward").reason == "answer_too_long"


def test_task_styles_are_well_formed_names_only():
    assert task_of_style("task:leg_counting") == "leg_counting"
    for bad in ("task:", "task:Leg", "task:a/b", "task:" + "a" * 65, "tasks:x", 7):
        assert task_of_style(bad) is None
        with pytest.raises(ValueError, match="unknown answer style"):
            check_style(bad)
    assert extract_final_answer(r"So \boxed{ ab c }.", "task:spell_backward").answer == "ab c"


def test_the_verifier_pool_scores_task_styles():
    with Verifier(workers=1, timeout_s=30.0) as v:
        out = v.verify([r"\boxed{olleh}", r"\boxed{hello}", r"\boxed{12}"], ["olleh", "olleh", "12"],
                       ["task:spell_backward", "task:spell_backward", "boxed"])
        assert [x.verdict for x in out] == ["correct", "incorrect", "correct"]
        with pytest.raises(ValueError, match="unknown answer style"):
            v.verify(["x"], ["x"], ["task:../x"])
