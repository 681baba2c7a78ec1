"""Tricky answer formats: at least 50 cases for math_equivalence and numeric_match.

Each case is (response, expected, should it score 1?). The "should not" cases matter as
much: a grader that accepts near-misses teaches the policy to be sloppy.
"""

from __future__ import annotations

import pytest

MATH_CASES = [
    # boxed and extraction
    (r"So the answer is \boxed{42}.", "42", True),
    (r"\boxed{41} ... wait, recheck: \boxed{42}", "42", True),
    (r"\boxed{42} is wrong; final \boxed{41}", "42", False),
    (r"\fbox{7}", "7", True),
    (r"\boxed{\frac{1}{2}}", "0.5", True),
    (r"\boxed{\dfrac{3}{4}}", "3/4", True),
    (r"\boxed{\tfrac34}", "0.75", True),
    (r"\boxed{-\frac{1}{2}}", "-0.5", True),
    (r"\boxed{\frac{1}{3}}", "0.333", False),
    (r"\boxed{0.333333}", r"\frac{1}{3}", True),
    (r"\boxed{0.3333}", r"\frac{1}{3}", False),
    # thousands separators and spaces
    ("The answer is 1,234.", "1234", True),
    (r"\boxed{1\,234}", "1234", True),
    ("#### 1 234 567", "1234567", True),
    ("The answer is 1,234,56", "123456", False),
    (r"\boxed{12,345.50}", "12345.5", True),
    # currency, percent, units
    (r"Total: \$5.00", "5", True),
    ("The answer is $1,250.", "1250", True),
    ("Answer: 45%", "45", True),
    ("Answer: 45%", "0.45", True),
    (r"\boxed{45\%}", "45", True),
    ("Answer: 46%", "0.45", False),
    (r"\boxed{12\text{ cm}}", "12", True),
    ("The answer is 12 cm.", "12", True),
    ("The answer is 3 apples", "3", True),
    (r"\boxed{2 \times 10^{3}}", "2000", True),
    ("Final answer: 1.2e3", "1200", True),
    ("the answer is 1.5 million", "1500000", True),
    # signs and dashes
    ("The answer is −7", "-7", True),
    ("The answer is 7", "-7", False),
    # last-answer extraction without markers
    ("First I got 12, then corrected it to 15", "15", True),
    ("First I got 15, then corrected it to 12", "15", False),
    ("<answer>9</answer>", "9", True),
    ("<answer> 10 </answer> later text 11", "10", True),
    # symbolic (math-verify)
    (r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", True),
    (r"\boxed{(x-1)(x+1)}", "x^2-1", True),
    (r"\boxed{(x-1)(x+2)}", "x^2-1", False),
    (r"\boxed{\{2, 3\}}", r"\{3, 2\}", True),
    (r"\boxed{3.14}", r"\pi", False),
    (r"\boxed{2\pi}", r"2\pi", True),
    (r"\boxed{10^{3}}", "1000", True),
    (r"\boxed{x = 3}", "3", True),
    # a bare expression, no markers: the last number alone would be wrong
    (r"\frac{3}{4}", "0.75", True),
    ("So x = 3/4.", "0.75", True),
    ("The growth was 45%", "0.45", True),
    ("so the count is $2^{10}$", "1024", True),
    # hostile or empty
    ("I don't know.", "3", False),
    ("", "3", False),
]

NUMERIC_CASES = [
    # (response, expected, params, should score 1)
    ("Net income was $1.2m", 1_200_000, {"rel_tol": 0.001}, True),
    ("Net income was $1.2m", 1_250_000, {"rel_tol": 0.01}, False),
    ("Net income was $1.2m", 1_250_000, {"rel_tol": 0.05}, True),
    ("The margin is 12.5%", 0.125, {}, True),
    ("The margin is 12.5%", 12.5, {}, True),
    ("Growth: 3.14159", 3.1416, {"abs_tol": 0.0001}, True),
    ("Growth: 3.14159", 3.1416, {}, False),
    ("Answer: (1,234)", -1234, {}, True),  # accounting parentheses: negative
    ("Answer: (1,234)", 1234, {}, False),
    ("#### -0.5", -0.5, {}, True),
    ("about 2 billion", 2e9, {}, True),
    ("costs $45k overall", 45000, {}, True),
    (r"\boxed{\frac{7}{8}}", 0.875, {}, True),
    ("The result is 1e-3", 0.001, {}, True),
    ("No number here", 1, {}, False),
]


@pytest.mark.parametrize(("response", "expected", "accepted"), MATH_CASES)
def test_math_equivalence_format(scorer, response, expected, accepted):
    score, details = scorer("math_equivalence")(response, expected)
    assert score == (1.0 if accepted else 0.0), details


@pytest.mark.parametrize(("response", "expected", "params", "accepted"), NUMERIC_CASES)
def test_numeric_match_format(scorer, response, expected, params, accepted):
    score, details = scorer("numeric_match", params)(response, expected)
    assert score == (1.0 if accepted else 0.0), details


def test_there_are_at_least_fifty_tricky_formats():
    assert len(MATH_CASES) + len(NUMERIC_CASES) >= 50


def test_plain_numbers_take_the_fast_path_and_expressions_go_to_math_verify(scorer):
    score = scorer("math_equivalence")
    assert score(r"\boxed{1,000}", "1000")[1]["method"] == "numeric"
    assert score(r"\boxed{\sqrt{4}}", "2")[1]["method"] == "symbolic"


def test_an_exponent_tower_times_out_instead_of_hanging(scorer):
    score, details = scorer("math_equivalence", timeout_s=2)(r"\boxed{9^{9^{9^{9}}}}", "1")
    assert score == 0.0
    assert "timed out" in details["error"] or "failed" in details["error"]
    # The worker that was killed is replaced: the next sample is judged normally.
    assert scorer("math_equivalence")(r"\boxed{\sqrt{9}}", "3")[0] == 1.0


def test_linear_credit_falls_off_with_relative_error(scorer):
    score = scorer(
        "numeric_match", {"rel_tol": 0.01, "credit": "linear", "zero_at_rel_error": 0.11}
    )
    assert score("100", 100)[0] == 1.0
    assert score("106", 100)[0] == pytest.approx(0.5)
    assert score("150", 100)[0] == 0.0
