"""The text functions a learner runs in-process on peer text stay within a small CPU bound at the length cap.

A learner screens every foreign row in its own process, with no timeout (``SiteGuard.screen_text``: the answer
tail via :func:`hacrl_fed.reward.extract.answer_end`, the phrase screen, extraction on cut rows). One row that
the coordinator accepts costs every learner the CPU these functions spend on it, every step, while the worker
lock is held, so each must be linear (or bounded) in the response length. Each crafted input below is as long as
a row can be under the largest ``max_new_tokens`` a shipped plan uses (``examples/gsm8k.toml``: 512 tokens →
:func:`hacrl_fed.protocol.validation.max_response_chars` = 65 536 characters) and aims at one pattern that used
to backtrack quadratically: long whitespace runs after a marker, an ``=`` or a word, trailing ``and``/``or``,
punctuation and wrapper runs, many markers whose clauses are empty, many correction cues …

Times are CPU seconds of the calling thread (``time.thread_time``), never wall time and never the whole process's
CPU time: threads other tests left running in this process (Flower's, torch's) must not count against a call. A
call whose thread has spent :data:`INTERRUPT_S` CPU seconds is interrupted (``SIGPROF``, re-armed until the
thread's own time is spent), so a regression fails fast instead of hanging.
"""

from __future__ import annotations

import gc
import signal
import time
from collections.abc import Callable
from functools import partial

import pytest

from hacrl_fed.screen_config import ScreenConfig
from hacrl_fed.protocol.validation import max_response_chars
from hacrl_fed.reward.extract import (
    _extract,
    answer_end,
    extract_final_answer,
    find_corrections,
    is_numeric_literal,
    last_boxed,
    normalize_latex,
    strip_formatting,
)
from hacrl_fed.screens import SiteGuard
from hacrl_fed.v1 import rollout_pb2 as pb

CAP = max_response_chars(512)
"""Characters of the longest row a shipped plan accepts (``examples/gsm8k.toml``, 512 new tokens)."""
BOUND_S = 0.5
"""CPU seconds one call may take on one row at the cap (a linear pass takes milliseconds)."""
INTERRUPT_S = 2.0
"""A call is interrupted after this many CPU seconds (it has failed the bound by then)."""


def crafted(cap: int) -> dict[str, str]:
    """The crafted inputs, each exactly ``cap`` characters long."""

    def _fill(head: str, unit: str, tail: str = "") -> str:
        """``head`` + ``unit`` repeated + ``tail``, exactly ``cap`` characters (the repeat cut to fit)."""
        room = cap - len(head) - len(tail)
        return head + (unit * (room // len(unit) + 1))[:room] + tail

    return {
        # whitespace runs after a marker, an "=", a word, a connector (\s* … \s* and \s+ … $ backtracking)
        "marker_then_spaces": _fill("The answer", " ", "x"),
        "marker_then_spaces_digit": _fill("answer", " ", "5"),
        "marker_stars_then_spaces": _fill("Final answer **", " ", "5"),
        "final_then_spaces": _fill("final", " ", "answer is 5"),
        "equals_then_spaces": _fill("2 + 3 =", " ", "5"),
        "answer_then_spaces": _fill("2 + 3 = 5", " ", "5"),
        "marker_answer_then_spaces": _fill("The answer is 5", " ", "5"),
        "and_then_spaces": _fill("x = 5 and", " ", "."),
        "spaces_then_and": _fill("x = 5", " ", "and"),
        "tabs_and_spaces": _fill("x = 5", " \t", "1"),
        "nbsp_run": _fill("x = 5", "\u00a0", "1"),
        "newlines_after_marker": _fill("The answer is:", "\n", "5"),
        "mixed_whitespace_after_marker": _fill("The answer is:", " \n\t", "x"),
        "hashes_then_spaces": _fill("#### ", " ", "5"),
        "boxed_then_spaces": _fill("\\boxed", " ", "5"),
        "format_command_then_spaces": _fill("\\text", " ", "x"),
        "spaces_then_brace_runs": _fill("x = 5", " " * 100 + "{"),
        # runs of punctuation, wrappers, connectors and digits
        "commas_after_answer": _fill("answer: 5", ","),
        "punctuation_after_answer": _fill("answer: 5", ",;:"),
        "dollar_pairs_around_answer": _fill("answer: " + "$$" * (cap // 8) + "5", "$$"),
        "bold_pairs_around_answer": _fill("answer: " + "**" * (cap // 8) + "5", "**"),
        "display_pairs_around_answer": _fill("answer: " + "\\[" * (cap // 10) + "5", "\\]"),
        "odd_dollars": _fill("The answer is 5 ", "$ "),
        "many_connectors": _fill("x = 5", " and"),
        "many_or_connectors": _fill("x = 5", " or  "),
        "digits": _fill("", "1"),
        "thousands": _fill("", "1,"),
        "dashes_before_a_cue": _fill("The answer is 5", " (", "x wait, 6."),
        "dash_run_after_a_correction": _fill("The answer is 5 wait 6", " -", "x"),
        # many markers / equals / cues whose clauses are empty or short
        "many_empty_markers": _fill("", "The answer is , "),
        "many_empty_markers_in_braces": _fill("", "The answer is { , "),
        "many_colon_markers": _fill("", "answer: . "),
        "many_equals": _fill("", "= , "),
        "many_cues": _fill("The answer is 5. ", "wait, "),
        "many_separate_cues": _fill("The answer is 5. ", "wait 5 x "),
        "many_cues_with_long_alternatives": _fill("The answer is 5. ", "wait 5" + " ," * 140 + " x "),
        "many_no": _fill("The answer is 5. ", "no "),
        "no_then_spaces": _fill("The answer is 5, no", " ", "wait, 6."),
        "i_then_spaces": _fill("The answer is 5, I", " ", "mean 6"),
        "correction_then_spaces": _fill("The answer is 5. Actually it is 7", " ", "."),
        "many_hashes": _fill("", "####"),
        # LaTeX: boxes, braces, formatting commands
        "many_open_boxes": _fill("", "\\boxed{"),
        "open_braces": _fill("", "{"),
        "textcolor_run": _fill("", "\\textcolor{"),
        "many_text_groups": _fill("", "\\text{1} "),
        "nested_text_groups": _fill("\\text{" * (cap // 8) + "12" + "}" * (cap // 8), " "),
        "sqrt_parentheses": _fill("", "\\sqrt("),
    }


CRAFTED = crafted(CAP)
STYLES = ("boxed", "gsm8k")


def cpu_seconds(fn: Callable[[], object]) -> float:
    """CPU seconds ``fn()`` took in the calling thread; :data:`INTERRUPT_S` or more when it had to be interrupted."""
    class _Over(Exception):
        pass

    start = time.thread_time()

    def _on_prof(*_):
        # SIGPROF counts the whole process's CPU; raise only once this thread has spent its own INTERRUPT_S
        spent = time.thread_time() - start
        if spent >= INTERRUPT_S:
            raise _Over
        signal.setitimer(signal.ITIMER_PROF, INTERRUPT_S - spent)

    _extract.cache_clear()   # each call does all its own work
    gc.collect()   # a full collection of the suite's heap inside the call would count as the call's CPU
    gc.disable()
    old = signal.signal(signal.SIGPROF, _on_prof)
    start = time.thread_time()
    signal.setitimer(signal.ITIMER_PROF, INTERRUPT_S)
    try:
        fn()
    except _Over:
        pass
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
        gc.enable()
    return time.thread_time() - start


def least_cpu_seconds(fn: Callable[[], object], tries: int = 3) -> float:
    """The least of up to ``tries`` :func:`cpu_seconds` measurements, stopping at the first under :data:`BOUND_S`.

    A backtracking pattern is slow on every try; a one-off stall of the calling thread (a page-fault storm on a
    loaded machine) is not."""
    best = cpu_seconds(fn)
    for _ in range(tries - 1):
        if best < BOUND_S:
            break
        best = min(best, cpu_seconds(fn))
    return best


def test_crafted_inputs_are_at_the_cap():
    assert CAP == 65_536 and all(len(t) == CAP for t in CRAFTED.values())


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_extraction_is_cpu_bounded_at_the_cap(name):
    text = CRAFTED[name]
    slow = {}
    calls = {f"{fn.__name__}/{style}": partial(fn, text, style)
             for fn in (extract_final_answer, answer_end) for style in STYLES}
    # normalize_latex and is_numeric_literal run in the verifier's killable pool, the others in-process too
    calls.update({fn.__name__: partial(fn, text)
                  for fn in (strip_formatting, find_corrections, last_boxed, normalize_latex, is_numeric_literal)})
    for what, call in calls.items():
        s = least_cpu_seconds(call)
        if s >= BOUND_S:
            slow[what] = round(s, 2)
    assert not slow, f"{name}: CPU seconds per call at {CAP} characters: {slow}"


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_a_learners_text_screens_are_cpu_bounded_on_one_crafted_row(name):
    """The whole in-process path of one foreign row: its answer end, the recurring-phrase screen (the row sent for
    two prompts, so that each of its phrases recurs and is cut, never inside the answer: answer span and two more
    extractions). The tail and length screens are off so that the phrase screen sees the whole row (on, they
    would cut or reject it first, after the same answer_end)."""
    text = CRAFTED[name]
    rows = [pb.Rollout(prompt_id=pid, sample_index=0, response_text=text, reward=1.0, verdict=pb.CORRECT,
                       behaviour_logprob_sum=-10.0, behaviour_token_count=512, finish_reason=pb.STOP)
            for pid in ("q0", "q1")]
    own = {("q0", 0): "2 + 3 = 5, so \\boxed{5}.", ("q1", 0): "1 + 1 = 2, so \\boxed{2}."}
    for style in STYLES:
        g = SiteGuard("me", ScreenConfig(tail={"enabled": False}))
        g.begin_step(1, own)
        s = least_cpu_seconds(partial(g.screen_text, {"peer": rows}, own, {"q0": style, "q1": style}))
        assert s < 2 * BOUND_S, f"{name}/{style}: screen_text took {s:.2f} CPU s for 2 rows of {CAP} characters"
