"""The verifier end to end through its process pool: each known false-positive kind, tri-state,
CPU-time limits (verdicts that survive a loaded machine, pathological inputs that still end),
threads, GSM8K style, and the TRL reward API."""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from math_verify import parse, verify

from hacrl_fed.reward import AccuracyReward, Verdict, VerdictList, Verifier, check_answer

GSM8K = Path("/work/shared/data/math/gsm8k_test.jsonl")
TIMEOUT_S = 2.0  # the session verifier's timeout (tests/reward/conftest.py)


def plain_math_verify(response: str, reference: str) -> bool:
    """What plain math-verify says (the baseline whose false positives the verifier removes)."""
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    return verify(parse(reference, parsing_timeout=None), parse(response, parsing_timeout=None), timeout_seconds=None)


def kinds(verdicts: list[Verdict]) -> list[str]:
    return [v.verdict for v in verdicts]


# --- the known false-positive kinds -----------------------------------------------------------------

def test_different_equations_are_not_equal(verifier):
    ref = "3x-y+13=0"
    assert plain_math_verify("3x+4y+14=0", ref)  # both collapse to 0 in plain math-verify
    out = verifier.verify([r"\boxed{3x+4y+14=0}", r"\boxed{y = 3x + 13}", r"\boxed{6x-2y+26=0}"], [ref] * 3)
    assert kinds(out) == ["incorrect", "correct", "correct"]


def test_tiny_values_do_not_collapse(verifier):
    ref = r"\frac{1}{2004!}"
    assert plain_math_verify(r"$\frac{1}{2006!}$", f"${ref}$")  # rounded/chopped to 0 by plain math-verify
    responses = [r"\boxed{\frac{1}{2006!}}", r"\boxed{\frac{1}{2004!}}", r"\boxed{1.0 \times 10^{-30}}"]
    out = verifier.verify(responses, [ref, ref, r"2 \cdot 10^{-30}"])
    assert kinds(out) == ["incorrect", "correct", "incorrect"]


def test_huge_exact_values_are_compared_exactly(verifier):
    """2004! + 2 and 2004! + 1 differ by 1 in ~5 700 digits: a relative tolerance calls them equal."""
    ref = "2004!+1"
    responses = [r"\boxed{2004!+2}", r"\boxed{2004!+1}", r"\boxed{1+2004!}", r"\boxed{100!\cdot\sqrt{2}+1}"]
    out = verifier.verify(responses, [ref, ref, ref, r"100!\sqrt{2}"])
    assert kinds(out) == ["incorrect", "correct", "correct", "incorrect"]


def test_float_tolerance_is_relative(verifier):
    responses = [r"\boxed{0.333333}", r"\boxed{0.33}", r"\boxed{13.0}", r"\boxed{1234568.0}", r"\boxed{0.7071068}"]
    refs = [r"\frac{1}{3}", r"\frac{1}{3}", "13", "1234567", r"\frac{\sqrt{2}}{2}"]
    assert kinds(verifier.verify(responses, refs)) == ["correct", "incorrect", "correct", "incorrect", "correct"]


def test_partial_answer_to_multi_answer_question(verifier):
    ref = "1331 and 1728"
    responses = [r"\boxed{1728}", "The answer is 1331.", r"\boxed{1728, 1331}", "Answer: 1331 and 1728"]
    assert kinds(verifier.verify(responses, [ref] * 4)) == ["incorrect", "incorrect", "correct", "correct"]


def test_malformed_latex_reference_never_credits_a_wrong_answer(verifier):
    ref = r"4\sqrt(2)"
    assert plain_math_verify("4", ref)  # plain math-verify drops the \sqrt(2)
    out = verifier.verify([r"\boxed{4}", r"\boxed{4\sqrt{2}}", r"\boxed{\sqrt{32}}"], [ref] * 3)
    assert kinds(out) == ["incorrect", "correct", "correct"]
    assert out[0].reason == "mismatch"


def test_unbalanced_reference_is_a_verifier_error(verifier):
    out = verifier.verify([r"\boxed{4}", r"\boxed{4}"], [r"\frac{4}{1", ""])
    assert kinds(out) == ["verifier_error", "verifier_error"]
    assert all(v.reward == 0.0 for v in out)


def test_deep_nesting_is_a_verifier_error_without_a_timeout(verifier):
    assert verifier.timeout_s == TIMEOUT_S
    braces = r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}"
    parens = "The answer is " + "(" * 10_000 + "1" + ")" * 10_000
    out = verifier.verify([braces, parens, r"\boxed{1}"], ["1", "1", "(" * 10_000 + "1" + ")" * 10_000])
    assert kinds(out) == ["verifier_error"] * 3
    # refused by the guards before parsing, not by the time limit
    assert [v.reason for v in out] == ["answer_too_complex", "answer_too_complex", "reference_too_complex"]
    assert out.timeouts == 0 and out.retried == 0


def test_huge_exponent_times_out_and_the_pool_recovers():
    """A pathological reference that no size bound cuts (a polynomial expansion: pure CPU; towers of powers are
    cut before, tests/reward/test_verifier_cost.py) is still a verifier_error, after the retry, in bounded
    time; the pool serves on."""
    with Verifier(timeout_s=0.5, workers=2, wall_timeout_s=20.0) as v:
        assert v.verify_one(r"\boxed{7}", "7").verdict == "correct"
        restarts = v.restarts
        start = time.monotonic()
        out = v.verify([r"\boxed{1}", r"\boxed{2}"], ["(x+y+z)^{150}-(x+y-z)^{150}", "2"])
        elapsed = time.monotonic() - start
        assert out[0] == Verdict.error("timeout after 1 s CPU")  # 0.5 s, then 1 s on the retry
        assert out[1].verdict == "correct"  # the other worker kept going
        assert (out.timeouts, out.retried) == (1, 1)
        assert (v.timeouts, v.retried) == (1, 1)
        assert v.restarts == restarts + 2  # killed twice
        # 1.5 CPU seconds cannot pass sooner; the wall-clock backstops (20 s + 40 s) and one worker
        # start bound it however loaded the machine is
        assert 1.5 <= elapsed < 180
        assert v.verify_one(r"\boxed{7}", "7").verdict == "correct"  # replacement worker serves


# Items that each take about 0.01-0.25 CPU seconds in sympy, with their verdicts.
_HEAVY = [(r"\boxed{3x+4y+14=0}", "3x-y+13=0", "incorrect"), (r"\boxed{\frac{1}{20002!}}", r"\frac{1}{20000!}", "incorrect"),
          (r"\boxed{y = 3x + 13}", "3x-y+13=0", "correct"), (r"\boxed{x^2+5x+6}", "x^2+5x+6", "correct"),
          (r"\boxed{0.7071068}", r"\frac{\sqrt{2}}{2}", "correct"), (r"\boxed{\sqrt{32}}", r"4\sqrt(2)", "correct")]


def test_verdicts_survive_a_stalled_worker():
    """A worker that gets no CPU for 2 s (SIGSTOP: a machine so busy the worker is not scheduled)
    while it holds items with a 1 s limit: the verdicts are the same as on an idle machine."""
    with Verifier(timeout_s=1.0, workers=1) as v:
        assert v.verify_one(r"\boxed{1}", "1").verdict == "correct"  # the worker is up and ready
        pid = v._pool._slots[0].proc.pid
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(2.0, os.kill, (pid, signal.SIGCONT))
        resume.start()
        start = time.monotonic()
        try:
            out = v.verify([c[0] for c in _HEAVY], [c[1] for c in _HEAVY])
        finally:
            resume.join()
        assert time.monotonic() - start >= 2.0  # the stall fell inside the items' time
    assert kinds(out) == [c[2] for c in _HEAVY]
    assert (out.timeouts, out.retried) == (0, 0)


def test_verdicts_survive_cpu_burners():
    """Real load: three CPU-burning processes per core compete with the verifier's workers."""
    n = 3 * len(os.sched_getaffinity(0))
    with Verifier(timeout_s=1.0, workers=2) as v:
        assert v.verify_one(r"\boxed{1}", "1").verdict == "correct"
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
        try:
            time.sleep(0.5)
            out = v.verify([c[0] for c in _HEAVY] * 2, [c[1] for c in _HEAVY] * 2)
        finally:
            for b in burners:
                b.kill()
                b.wait()
    assert kinds(out) == [c[2] for c in _HEAVY] * 2
    assert out.timeouts == 0


def test_restating_the_problem_is_not_an_answer(verifier):
    echoes = [
        "To calculate 9 + 4, we need to add 9 and 4. This is a simple operation",
        "To calculate 9 + 4, we need to add the two numbers",
        "We need to calculate 9 + 4. This is a simple operation",
    ]
    assert plain_math_verify(echoes[1], "13") and plain_math_verify(echoes[2], "13")
    stated = [r"\boxed{9 + 4}", "9 + 4 = 9 + 4", "8 + 7 = 15", "The answer is 13.", r"So \boxed{13}."]
    refs = ["13"] * 3 + ["13", "13", "15", "13", "13"]
    out = verifier.verify(echoes + stated, refs, problems=["Calculate 9 + 4."] * 5 + ["Calculate 8 + 7."] + [None] * 2)
    assert kinds(out) == ["incorrect"] * 5 + ["correct"] * 3
    assert [v.reason for v in out[:5]] == ["no_final_answer"] * 3 + ["unevaluated_expression"] * 2


def test_restated_symbolic_problem_is_incorrect(verifier):
    problem = "Expand (x+2)(x+3)."
    out = verifier.verify([r"\boxed{(x+2)(x+3)}", r"\boxed{x^2+5x+6}"], ["x^2+5x+6"] * 2, problems=[problem] * 2)
    assert kinds(out) == ["incorrect", "correct"]
    assert out[0].reason == "restates_problem"


def test_formatted_answers_are_credited(verifier):
    responses = [r"\boxed{\text{12}}", r"\boxed{\textbf{12}}", r"\boxed{\mathrm{ 12 }}", r"\boxed{\mathbf{12}}",
                 r"\boxed{\text{12 apples}}", r"\boxed{\textbf{\text{12}}}", "The answer is \\textbf{12} dollars.",
                 r"\boxed{\textbf{13}}", r"\boxed{\text{twelve}}"]
    assert kinds(verifier.verify(responses, ["12"] * 9)) == ["correct"] * 7 + ["incorrect"] * 2
    # a formatted reference; an AIME-style bold answer in parentheses
    out = verifier.verify([r"\boxed{12}", r"\boxed{\textbf{(113)}}"], [r"\textbf{12}", "113"])
    assert kinds(out) == ["correct", "correct"]


def test_self_corrected_answer_is_judged_by_its_last_value(verifier):
    responses = ["The answer is 5, no wait, it is 7.", "The answer is 5. Actually, the answer is 7.",
                 "\\boxed{5}. Sorry, I mean 7.", r"\boxed{\textbf{5}} so finally \boxed{\textbf{7}}",
                 "The answer is 5. I made a mistake: it is 7."]
    assert kinds(verifier.verify(responses, ["7"] * 5)) == ["correct"] * 5
    assert kinds(verifier.verify(responses, ["5"] * 5)) == ["incorrect"] * 5


def test_mentioning_the_reference_is_not_stating_it(verifier):
    responses = ["The answer is 5. Wait, 7 apples were eaten.", "The answer is 5, not 7.",
                 "The answer is 5. No, 7 is wrong.", "Wait, it is 7. So the answer is 5.",
                 r"\boxed{5}. Note: \text{7} was a distractor.", r"The answer is \textbf{5}, since \text{7 apples} is too many.",
                 "The answer is 5. Actually, 7 people came."]
    n = len(responses)
    assert kinds(verifier.verify(responses, ["7"] * n)) == ["incorrect"] * n
    assert kinds(verifier.verify(responses, ["5"] * n)) == ["correct"] * n  # each one states 5


# --- tri-state, threads, styles ----------------------------------------------------------------------

def test_tri_state_and_rewards(verifier):
    out = verifier.verify([r"\boxed{5}", r"\boxed{6}", r"\boxed{5}"], ["5", "5", r"\frac{1}{"])
    assert [(v.verdict, v.reward) for v in out] == [("correct", 1.0), ("incorrect", 0.0), ("verifier_error", 0.0)]
    assert out[0].extracted == "5" and out[2].is_error


def test_verify_from_worker_threads(verifier):
    results: dict[int, list[Verdict]] = {}

    def work(k: int) -> None:
        results[k] = verifier.verify([rf"\boxed{{{k + 10}}}", "wrong 0"], [str(k + 10), str(k + 10)])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert {k: kinds(v) for k, v in results.items()} == {k: ["correct", "incorrect"] for k in range(4)}


def test_gsm8k_style_on_real_rows(verifier):
    rows = [json.loads(line) for line in GSM8K.read_text().splitlines()[:20]]
    answers = [r["answer"] for r in rows]
    right = [f"{r['solution']}\n#### {r['answer']}" for r in rows]
    wrong = [f"{r['solution']}\n#### {int(r['answer']) + 1}" for r in rows]
    final_number = [f"So she ends up with {r['answer']} in total" for r in rows]
    out = verifier.verify(right + wrong + final_number, answers * 3, "gsm8k")
    assert kinds(out) == ["correct"] * 20 + ["incorrect"] * 20 + ["correct"] * 20
    # the same final-number responses state no answer in boxed style
    assert set(kinds(verifier.verify(final_number, answers, "boxed"))) == {"incorrect"}


def test_verdict_list_counts_and_behaves_as_a_list(verifier):
    out = verifier.verify([r"\boxed{5}", r"\boxed{6}"], ["5", "5"])
    assert isinstance(out, VerdictList) and (out.timeouts, out.retried) == (0, 0)
    assert out == [Verdict.correct("match", "5"), Verdict.incorrect("mismatch", "6")]
    clone = pickle.loads(pickle.dumps(VerdictList(out, timeouts=2, retried=3)))
    assert clone == out and (clone.timeouts, clone.retried) == (2, 3)


def test_bad_arguments_raise(verifier):
    with pytest.raises(ValueError, match="expected 2"):
        verifier.verify(["a", "b"], ["1"])
    with pytest.raises(ValueError, match="unknown answer style"):
        verifier.verify(["a"], ["1"], ["latex"])
    assert verifier.verify([], []) == []


def test_verifier_pickles_as_settings():
    v = Verifier(timeout_s=3.0, workers=1, wall_timeout_s=40.0, retries=0, retry_factor=3.0)
    clone = pickle.loads(pickle.dumps(v))
    assert (clone.timeout_s, clone.workers) == (3.0, 1)
    assert (clone.wall_timeout_s, clone.retries, clone.retry_factor) == (40.0, 0, 3.0)
    assert Verifier(timeout_s=5.0).wall_timeout_s == 60.0  # default backstop: max(60 s, 10 × timeout_s)


def test_in_process_check_matches_pool(verifier):
    cases = [(r"\boxed{12}", "12"), ("8 + 7 = 15", "16"), (r"\boxed{x}", r"\frac{1")]
    pooled = verifier.verify([c[0] for c in cases], [c[1] for c in cases])
    assert pooled == [check_answer(*c) for c in cases]


# --- TRL reward-function API ---------------------------------------------------------------------------

def test_accuracy_reward_trl_api():
    reward = AccuracyReward(timeout_s=TIMEOUT_S, workers=1)
    try:
        completions = [
            [{"role": "assistant", "content": r"So \boxed{13}."}],
            [{"role": "assistant", "content": "To calculate 9 + 4, we need to add the two numbers"}],
            [{"role": "assistant", "content": r"\boxed{2}"}],
        ]
        out = reward(completions, solution=["13", "13", r"\frac{2}{"], prompts=["Calculate 9 + 4."] * 3)
        assert out == [1.0, 0.0, None]
        assert reward.__name__ == "accuracy_reward"
        clone = pickle.loads(pickle.dumps(reward))
        assert clone.answer_style == "boxed" and clone._verifier is None
        assert reward(["#### 18"], answer=["18"], answer_style=["gsm8k"]) == [1.0]
    finally:
        reward.close()
