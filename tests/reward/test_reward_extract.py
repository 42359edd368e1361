"""Final-answer extraction: what counts as a stated answer, per answer style (pure, no processes)."""

from __future__ import annotations

import doctest

import pytest

import hacrl_fed.reward.compare
import hacrl_fed.reward.extract
import hacrl_fed.reward.verdict
from hacrl_fed.reward.extract import (
    extract_final_answer,
    is_numeric_literal,
    last_boxed,
    max_nesting,
    normalize_latex,
    reference_answer,
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
