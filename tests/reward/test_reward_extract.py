"""Final-answer extraction: what counts as a stated answer, per answer style (pure, no processes)."""

from __future__ import annotations

import doctest
import time

import pytest

import hacrl_fed.reward.compare
import hacrl_fed.reward.extract
import hacrl_fed.reward.verdict
from hacrl_fed.reward.extract import (
    Extraction,
    extract_final_answer,
    find_corrections,
    is_numeric_literal,
    last_boxed,
    max_nesting,
    normalize_latex,
    reference_answer,
    strip_formatting,
)


@pytest.mark.parametrize("module", [hacrl_fed.reward.extract, hacrl_fed.reward.compare, hacrl_fed.reward.verdict])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.failed == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"first \boxed{1} then \boxed{\frac{\sqrt{2}}{\left\{3\right\}}}", r"\frac{\sqrt{2}}{\left\{3\right\}}"),
        (r"\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        (r"so \boxed 5.", "5"),
        (r"\fbox{42}", "42"),
        (r"$\boxed{ 7 }$", "7"),
        (r"\boxed{12} and later \boxed{13", None),  # last box unclosed (truncated): no answer
        ("no box here", None),
        (r"\boxedx{3}", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_last_boxed_is_linear_on_deep_nesting():
    deep = r"\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}"
    assert last_boxed(deep) == "{" * 10_000 + "1" + "}" * 10_000
    assert max_nesting(deep) == 10_001


@pytest.mark.parametrize(
    ("response", "style", "answer", "source"),
    [
        (r"Thus \boxed{15}. The answer is 16.", "boxed", "15", "boxed"),
        ("The answer is 15.", "boxed", "15", "marker"),
        ("**Answer:** $15$", "boxed", "15", "marker"),
        ("Final answer: 1331 and 1728", "boxed", "1331 and 1728", "marker"),
        ("The answer is:\n\n$$\\frac{1}{2}$$", "boxed", r"\frac{1}{2}", "marker"),
        ("The answer is 13 apples.", "boxed", "13", "marker"),
        ("8 + 7 = 15", "boxed", "15", "equation"),
        ("To answer: we add them. 9 + 4 = 13.", "boxed", "13", "equation"),
        ("The answer is 13. Check: 13 - 4 = 9.", "boxed", "13", "marker"),
        ("The answer is 12. No wait, the answer is 13.", "boxed", "13", "marker"),
        ("$8+7=15$.", "boxed", "15", "equation"),
        ("We get 9 + 4 = 13 as the result.", "boxed", "13", "equation"),
        ("Step: 2 * 9 = 18 dollars.\n#### 18", "gsm8k", "18", "hashes"),
        ("She earns 9 * 2 dollars, so 18 dollars in total", "gsm8k", "18", "final_number"),
        ("It costs 1,250 dollars in total", "gsm8k", "1,250", "final_number"),
    ],
)
def test_stated_answers(response, style, answer, source):
    found = extract_final_answer(response, style)
    assert found is not None and (found.answer, found.source) == (answer, source)


@pytest.mark.parametrize(
    "response",
    [
        "To calculate 9 + 4, we need to add 9 and 4. This is a simple operation",
        "To calculate 9 + 4, we need to add the two numbers",
        "We need to calculate 9 + 4. This is a simple operation",
        "First 9 + 4 = 13, then we check 13 - 4 = 9 against 9.",  # a digit follows the last '=' answer
        "#### 18",  # '####' is GSM8K style only
        "She earns 18 dollars",  # the final number is GSM8K style only
        r"We compute \boxed{13",  # unclosed box: no fallback to other forms
    ],
)
def test_no_stated_answer_in_boxed_style(response):
    assert extract_final_answer(response, "boxed") is None


def test_unknown_style_is_an_error():
    with pytest.raises(ValueError, match="unknown answer style"):
        extract_final_answer("x", "latex")


@pytest.mark.parametrize(
    ("reference", "answer"),
    [("42", "42"), ("Some steps.\n#### 1,042", "1042"), (r"... so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
     ("  7 ", "7")],
)
def test_reference_answer(reference, answer):
    assert reference_answer(reference) == answer


def test_normalize_latex_repairs_parenthesized_arguments():
    assert normalize_latex(r"4\sqrt(2)") == r"4\sqrt{2}"
    assert normalize_latex(r"\sqrt((1+2)*3)") == r"\sqrt{(1+2)*3}"
    assert normalize_latex(r"\frac(a+1)(b)") == r"\frac{a+1}{b}"
    assert normalize_latex(r"\sqrt(2") == r"\sqrt(2"  # unbalanced: left alone, parsed (and judged) as is


@pytest.mark.parametrize(
    ("text", "literal"),
    [("13", True), ("-4", True), ("0.5", True), ("3/4", True), (r"\frac{3}{4}", True), (r"\dfrac{-3}{4}", True),
     (r"18 \text{ dollars}", True), (r"\$1{,}000", True), ("50\\%", True), ("30^\\circ", True), ("x = 5", True),
     (r"1.5 \times 10^{3}", True), ("13 apples", True),
     ("9 + 4", False), (r"3 \times 4", False), (r"\sqrt{169}", False), ("2^{10}", False), ("1, 2", False),
     ("x", False), ("", False)],
)
def test_numeric_literal(text, literal):
    assert is_numeric_literal(text) is literal


# --- text formatting around the answer ---------------------------------------------------------------

@pytest.mark.parametrize(
    ("response", "answer", "source"),
    [
        (r"\boxed{\text{12}}", "12", "boxed"),
        (r"\boxed{\textbf{12}}", "12", "boxed"),
        (r"\boxed{\mathrm{12}}", "12", "boxed"),
        (r"\boxed{\mathbf{12}}", "12", "boxed"),
        (r"\boxed{\mathrm{ 12 }}", "12", "boxed"),
        (r"$\boxed{\textbf {12}}$", "12", "boxed"),
        (r"\boxed{\textbf{\text{\mathbf{12}}}}", "12", "boxed"),  # nested
        (r"\boxed{\text{12 apples}}", r"12 \text{apples}", "boxed"),  # words after the number stay a unit
        (r"\boxed{\mathrm{12\,cm}}", r"12 \text{cm}", "boxed"),
        (r"\boxed{\textcolor{red}{12}}", "12", "boxed"),
        (r"\boxed{\emph{-3.5}}", "-3.5", "boxed"),
        (r"\boxed{\frac{\text{3}}{\text{4}}}", r"\frac{3}{4}", "boxed"),
        (r"\boxed{\textbf{(113)}}", "(113)", "boxed"),
        ("The answer is \\textbf{12}.", "12", "marker"),
        ("**Final Answer:** \\text{12}", "12", "marker"),
        (r"\textbf{Final Answer:} $\mathbf{-3.5}$", "-3.5", "marker"),  # formatted marker and number
        (r"\text{The answer is } 12", "12", "marker"),
        ("The answer is 18 \\text{ dollars}.", r"18 \text{ dollars}", "marker"),  # unit words inside braces
    ],
)
def test_formatting_around_a_number_is_the_number(response, answer, source):
    assert extract_final_answer(response) == Extraction(answer, source)


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        (r"\boxed{\text{(C)}}", r"\text{(C)}"),  # words only: left for math-verify
        (r"\boxed{12\text{ apples}}", r"12\text{ apples}"),
        (r"\boxed{\mathbf{v} = (1, 2)}", r"\mathbf{v} = (1, 2)"),
        (r"\boxed{\mathbb{R}}", r"\mathbb{R}"),
        (r"\boxed{\text{Step 1: add}}", r"\text{Step 1: add}"),  # opens with a word
    ],
)
def test_formatting_around_words_is_kept(response, answer):
    assert extract_final_answer(response) == Extraction(answer, "boxed")


def test_strip_formatting_edge_cases():
    assert strip_formatting(r"\text{12") == r"\text{12"  # unclosed: as written
    assert strip_formatting(r"\text{\{12\}}") == r"\{12\}"  # escaped braces are content
    assert strip_formatting(r"\textbackslash{} \mathbf{x}") == r"\textbackslash{} \mathbf{x}"
    assert strip_formatting("no commands {12}") == "no commands {12}"
    deep = r"\text{" * 10_000 + "12" + "}" * 10_000
    start = time.thread_time()  # this thread's CPU time: the bound holds on a busy machine too
    out = strip_formatting(deep)
    assert time.thread_time() - start < 2.0  # linear: deep nesting beyond 16 levels is left as is
    assert out.startswith(r"\text{") and "12" in out
    assert strip_formatting(r"\text{" * 16 + "12" + "}" * 16) == "12"


# --- self-corrections -------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("response", "answer", "source"),
    [
        ("The answer is 5, no wait, it is 7.", "7", "correction"),
        ("The answer is 5. Wait, it is 7.", "7", "correction"),
        ("The answer is 5. No, it's 7.", "7", "correction"),
        ("The answer is 5. No. It is 7.", "7", "correction"),
        ("The answer is 5. Sorry, I mean 7.", "7", "correction"),
        ("The answer is 5, I mean 7.", "7", "correction"),
        ("The answer is 5. Sorry, 7.", "7", "correction"),
        ("The answer is 5. Wait, no, sorry, it is 7.", "7", "correction"),
        ("The answer is 5. Oops, 7.", "7", "correction"),
        ("The answer is 5 -- or rather 7.", "7", "correction"),
        ("The answer is 5 (no, 6).", "6", "correction"),
        ("The answer is 5. No wait, it is 7, not 5.", "7", "correction"),
        ("The answer is 5. No wait, it is 7 apples.", "7", "correction"),
        ("The answer is 5. Actually, 5 + 2 = 7.", "7", "correction"),
        ("The answer is 5. Make that 7.", "7", "correction"),
        ("The answer is 5. Wait, it is $\\frac{7}{2}$.", r"\frac{7}{2}", "correction"),
        ("The answer is x = 5. Wait, it is x = 7.", "x = 7", "correction"),
        ("The answer is 5. Sorry, 7. No wait, 8.", "8", "correction"),  # the last correction counts
        ("\\boxed{5}. No wait, it is 7.", "7", "correction"),  # a correction after the box replaces it
        ("\\boxed{5}\n\nWait, I made a mistake. It is 7.", "7", "correction"),
        (r"\boxed{\textbf{5}}. Wait, it is \textbf{7}.", "7", "correction"),
        ("8 + 7 = 15. No wait, it is 16.", "16", "correction"),  # the equation before the correction
        ("The answer is 5. Actually, the answer is 7.", "7", "marker"),  # a second marker: the last counts
        ("The answer is 5. Correction: the answer is 7.", "7", "marker"),
        (r"\boxed{5}, no wait, \boxed{7}.", "7", "boxed"),
        (r"First \boxed{\textbf{5}}, later \boxed{6}, finally \boxed{\mathbf{7}}.", "7", "boxed"),
    ],
)
def test_self_correction_counts_the_last_stated_value(response, answer, source):
    assert extract_final_answer(response) == Extraction(answer, source)


def test_self_correction_in_gsm8k_style():
    assert extract_final_answer("#### 5, no wait, 7", "gsm8k") == Extraction("7", "correction")
    text = "She had 5 apples. No wait, 7 apples were eaten, so 3 remain.\n#### 3"
    assert extract_final_answer(text, "gsm8k") == Extraction("3", "hashes")


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 5. Wait, 7 apples were eaten.",  # a mention after a cue, not a new answer
        "The answer is 5. No, 7 is wrong.",
        "The answer is 5. Actually, 7 people came.",
        "The answer is 5. Wait, it's 7 minus 2, so 5.",
        "The answer is 5. Sorry, 7 was a typo.",
        "The answer is 5. Sorry for the confusion.",
        "The answer is 5. Wait, is that right? Yes.",
        "The answer is 5. Wait, let me double-check: 3 + 4 = 7 is wrong, so it's 5.",
        "The answer is 5, not 7.",
        "The answer is 5. 7 was the number of apples.",
        "Wait, it is 7. So the answer is 5.",  # a correction before the answer does not replace it
        "No, it is 7. Hence the answer is 5.",
        "The answer is 5. Awaiting 7 more.",  # 'wait' inside a word is no cue
        "The answer is 5. Wait, 7? No, 5 is right.",  # a doubt is no correction
    ],
)
def test_mentions_are_not_corrections(response):
    assert extract_final_answer(response) == Extraction("5", "marker")


def test_find_corrections_positions_and_values():
    text = "The answer is 5, no wait, it is 7. Wait, 7 apples were eaten. Oops, 8!"
    assert [v for _, v in find_corrections(text)] == ["7", "8"]
    assert find_corrections(text, text.index("Oops")) == [(text.index("Oops"), "8")]


def test_extraction_stays_linear_on_many_cues_and_markers():
    for text in ["The answer is 5. " + "wait, " * 20_000, "The answer is 5 " + "I mean " * 20_000,
                 "The answer is " * 20_000, r"\text{12 apples} " * 20_000]:
        start = time.thread_time()  # this thread's CPU time: the bound holds on a busy machine too
        extract_final_answer(text)
        assert time.thread_time() - start < 5.0  # quadratic: minutes
