"""The calculator tool-use task and its safe evaluator."""

from __future__ import annotations

import time

import pytest

from hacrl_fed.envs import Episode, EpisodeSpec, check_trajectory, replay
from hacrl_fed.envs.calculator import last_boxed, INSTRUCTION, REMINDER
from hacrl_fed.envs.expression import MAX_EXPRESSION_CHARS, CalcError, evaluate, format_value

ARITH = {"task": "basic_arithmetic", "task_config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}}


def _expression(question: str) -> str:
    """The arithmetic of a basic_arithmetic question: 'Calculate ( 56 + -33 ) - 84.' → '( 56 + -33 ) - 84'."""
    first_line = question.splitlines()[0]
    return first_line.removeprefix("Calculate ").rstrip(".").replace("×", "*").replace("÷", "/")


def test_a_correct_answer_after_a_calculator_call_earns_one():
    spec = EpisodeSpec("calculator", ARITH, 11, 4)
    episode = Episode(spec)
    question, reference = episode._env.inner.question, episode._env.inner.reference
    assert episode.observations[0] == f"{question}\n\n{INSTRUCTION}"
    step = episode.step(f"Let me compute. <calc>{_expression(question)}</calc>")
    assert not step.done and step.observation == f"<result>{reference}</result>"
    final = episode.step(f"The answer is \\boxed{{{reference}}}.")
    assert final.done and final.reward == 1.0 and final.observation == "Final answer received: correct."
    turns = [("env", episode.observations[0]), ("agent", f"Let me compute. <calc>{_expression(question)}</calc>"),
             ("env", episode.observations[1]), ("agent", f"The answer is \\boxed{{{reference}}}.")]
    assert check_trajectory(spec, turns) == check_trajectory(spec, turns + [("env", episode.observations[2])])
    assert check_trajectory(spec, turns).ok and check_trajectory(spec, turns).reward == 1.0


def test_a_wrong_answer_earns_zero_and_ends_the_episode():
    spec = EpisodeSpec("calculator", ARITH, 11, 4)
    reference = Episode(spec)._env.inner.reference
    result = replay(spec, [f"\\boxed{{{int(reference) + 1}}}"])
    assert result.done and result.reward == 0.0 and result.observations[-1] == "Final answer received: incorrect."
    with pytest.raises(ValueError, match="after the episode ended"):
        replay(spec, [f"\\boxed{{{int(reference) + 1}}}", f"\\boxed{{{reference}}}"])


def test_a_message_without_call_or_answer_gets_the_reminder_and_max_turns_ends_it():
    spec = EpisodeSpec("calculator", ARITH, 11, 2)
    result = replay(spec, ["hmm", "<calc>1+1"])  # an unclosed call is no call
    assert result.observations[1:] == [REMINDER, REMINDER]
    assert not result.done and result.reward == 0.0


def test_only_the_first_call_is_evaluated_and_a_boxed_answer_wins_over_a_call():
    spec = EpisodeSpec("calculator", ARITH, 11, 3)
    reference = Episode(spec)._env.inner.reference
    result = replay(spec, ["<calc>2*3</calc> and <calc>4*5</calc>", f"<calc>1+1</calc> so \\boxed{{{reference}}}"])
    assert result.observations[1] == "<result>6</result>\n(Only the first <calc> of a message is evaluated.)"
    assert result.done and result.reward == 1.0


def test_the_problem_depends_on_the_seed_and_not_on_the_process_state():
    a, b = Episode(EpisodeSpec("calculator", ARITH, 1, 2)), Episode(EpisodeSpec("calculator", ARITH, 2, 2))
    assert a.observations[0] != b.observations[0]
    assert Episode(EpisodeSpec("calculator", ARITH, 1, 2)).observations == a.observations


def test_a_task_whose_answer_is_not_a_number_is_scored_by_its_own_scorer():
    spec = EpisodeSpec("calculator", {"task": "spell_backward"}, 3, 2)
    env = Episode(spec)._env.inner
    assert replay(spec, [f"\\boxed{{{env.reference}}}"]).reward == 1.0
    assert replay(spec, [f"\\boxed{{{env.reference}x}}"]).reward == 0.0


@pytest.mark.parametrize(("expression", "value"), [
    ("1 + 2 * 3", "7"), ("(1 + 2) * 3", "9"), ("-2 ** 2", "-4"), ("(-2) ** 3", "-8"), ("7 / 2", "3.5"),
    ("8 / 2", "4"), ("7 // 2", "3"), ("-7 % 3", "2"), ("2 ** -2", "0.25"), ("1 / 3", "0.333333333333"),
    ("2 ** 64", "18446744073709551616"), ("0.1 + 0.2", "0.3"), ("1e3 + 1", "1001"), ("+5", "5"),
    ("10 ** 50 * 10 ** 50", "1" + "0" * 100),
])
def test_the_calculator_computes(expression, value):
    assert format_value(evaluate(expression)) == value


@pytest.mark.parametrize(("expression", "message"), [
    ("__import__('os').system('echo hacked')", "unsupported element: Call"),
    ("().__class__", "unsupported element: Attribute"),
    ("x + 1", "unsupported element: Name"),
    ("'a' * 3", "unsupported element: Constant"),
    ("[1, 2]", "unsupported element: List"),
    ("1 if 1 else 2", "unsupported element: IfExp"),
    ("lambda: 1", "unsupported element: Lambda"),
    ("1 < 2", "unsupported element: Compare"),
    ("True + 1", "unsupported element: Constant"),
    ("2 ^ 3", "'\\^' is not supported; write powers with \\*\\*"),
    ("1 << 3", "unsupported element: LShift"),
    ("9**9**9", "exponent 387420489 is too large"),
    ("2 ** 65", "exponent 65 is too large"),
    ("10 ** 64 ** 64", "too large"),
    ("99 ** 64", "result is too large"),
    ("10 ** 60 * 10 ** 60", "result is too large"),
    ("1e308 * 10", "result is too large"),
    ("1 / 0", "division by zero"),
    ("1 // 0", "division by zero"),
    ("1 % 0", "modulo by zero"),
    ("0 ** -1", "division by zero"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 +", "syntax error"),
    ("", "empty expression"),
    ("1" * (MAX_EXPRESSION_CHARS + 1), "longer than 200"),
    ("(" * 120 + "1" + ")" * 79, "syntax error"),
    ("-" * 199 + "1", "nested too deeply"),
])
def test_malicious_or_bad_expressions_are_refused_fast(expression, message):
    start = time.process_time()
    with pytest.raises(CalcError, match=message):
        evaluate(expression)
    assert time.process_time() - start < 0.5


def test_a_hostile_message_gets_an_error_observation_fast():
    spec = EpisodeSpec("calculator", ARITH, 11, 4)
    episode = Episode(spec)
    start = time.process_time()
    for expression in ["__import__('os').system('true')", "9**9**9", "9" * 10_000, "(" * 10_000]:
        step = episode.step(f"<calc>{expression}</calc>" + "<calc>" * 10_000)
        assert not step.done and step.observation.startswith("<error>")
    assert time.process_time() - start < 1.0


@pytest.mark.parametrize(("message", "content"), [
    ("\\boxed{12}", "12"), ("a \\boxed{1} then \\boxed{ {2} }", " {2} "), ("\\fbox{x}", "x"),
    ("\\boxed {7}", "7"), ("\\boxed{open", None), ("no box", None), ("\\boxedx{3}", None),
])
def test_the_final_answer_is_the_last_box(message, content):
    assert last_boxed(message) == content
