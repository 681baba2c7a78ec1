"""Answer, document, structure and efficiency criteria: passing, failing, adversarial."""

from __future__ import annotations

import pytest

from rewards import Rubric, validate_spec
from tests.rewards.conftest import one_criterion, sample

# --- exact / regex / multiple choice -------------------------------------------------------


def test_exact_match_normalises_case_space_and_punctuation(scorer):
    score = scorer("exact_match", {"expected": ["Paris", "Paris, France"]})
    assert score("The answer is:  PARIS.")[0] == 1.0
    assert score(r"\boxed{paris, france}")[0] == 1.0
    assert score("The answer is Lyon")[0] == 0.0
    assert score("Paris is lovely, but the answer is Lyon")[0] == 0.0


def test_exact_match_case_sensitive_when_asked(scorer):
    assert scorer("exact_match", {"case_sensitive": True})("answer: abc", "ABC")[0] == 0.0


def test_exact_match_with_a_custom_answer_pattern(scorer):
    score = scorer("exact_match", {"answer_pattern": r"FINAL=(\w+)"})
    assert score("FINAL=cat ... FINAL=dog", "dog")[0] == 1.0
    assert score("no marker here dog", "dog")[1]["reason"] == "no answer found"


def test_regex_match_search_fullmatch_and_negate(scorer):
    assert (
        scorer("regex_match", {"pattern": r"\bSELECT\b", "flags": ["IGNORECASE"]})(
            "use select * from t"
        )[0]
        == 1.0
    )
    assert scorer("regex_match", {"pattern": r"\d+", "mode": "fullmatch"})("12a")[0] == 0.0
    assert scorer("regex_match", {"pattern": "as an AI", "negate": True})("Sure.")[0] == 1.0
    assert scorer("regex_match", {"pattern": "as an AI", "negate": True})("as an AI, no")[0] == 0.0


def test_a_catastrophic_regex_scores_zero_with_a_timeout_instead_of_hanging(scorer):
    value, details = scorer("regex_match", {"pattern": r"(a|aa)+$"})("a" * 60 + "b")
    assert value == 0.0 and "regex timed out" in details["error"]


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("The answer is (B).", 1.0),
        ("Answer: b", 1.0),
        (r"\boxed{B}", 1.0),
        ("Reasoning...\n\nB", 1.0),
        ("The answer is B. A is wrong because it ignores friction.", 1.0),
        ("The answer is (C)", 0.0),
        ("The answer is A or B", 0.0),
        ("Answer: A, B, C, D", 0.0),
        (r"\boxed{A, B}", 0.0),
        ("I cannot decide.", 0.0),
    ],
)
def test_multiple_choice_needs_one_committed_option(scorer, response, score):
    assert scorer("multiple_choice")(response, "B")[0] == score


def test_multiple_choice_accepts_the_option_text_when_mapped(scorer):
    score = scorer("multiple_choice", {"options": {"A": "Paris", "B": "Rome"}})
    assert score("It must be Rome", "B")[0] == 1.0


# --- documents: labelled values and consistency ----------------------------------------------

REPORT = """## Results

Revenue was $1.2m in 2025, up from $900k. Net margin: 12.5%.

| Metric | 2024 | 2025 |
|---|---|---|
| Revenue | 900,000 | 1,200,000 |
| Net margin | 11% | 12.5% |
| Headcount | 40 | 52 |

In summary, revenue reached $1.5 million."""


def test_labelled_values_read_prose_and_tables_and_use_the_last_statement(scorer):
    score = scorer("labelled_values", {"values": {
        "Revenue": {"expected": 1_500_000, "rel_tol": 0.001},
        "Net margin": "12.5%",
        "Headcount": 52,
        "EBITDA": 10,
    }})  # fmt: skip
    value, details = score(REPORT)
    assert value == 0.75
    assert details["values"]["EBITDA"] == {"found": None, "ok": False}
    assert details["values"]["Headcount"]["found"] == 52


def test_labelled_values_from_a_dict_ground_truth_and_aliases(scorer):
    score = scorer("labelled_values")
    assert score("Sales totalled $2.5bn.", {"Sales": 2.5e9})[0] == 1.0
    aliased = scorer(
        "labelled_values", {"values": {"Revenue": {"expected": 3, "aliases": ["Sales"]}}}
    )
    assert aliased("Sales: 3")[0] == 1.0


def test_consistency_catches_a_quantity_restated_differently(scorer):
    score = scorer("consistency", {"labels": ["Revenue", "Net margin", "Headcount"]})
    value, details = score(REPORT)
    assert details["labels"]["Revenue"]["consistent"] is False
    assert details["labels"]["Net margin"]["consistent"] is True
    assert value == pytest.approx(2 / 3)
    fixed = REPORT.replace("$1.5 million", "$1.2 million")
    assert score(fixed)[0] == 1.0


def test_consistency_require_all_punishes_silence(scorer):
    assert scorer("consistency", {"labels": ["Cash"], "require_all": True})(REPORT)[0] == 0.0
    assert scorer("consistency", {"labels": ["Cash"]})(REPORT)[0] == 1.0


# --- structure -------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
}


def test_json_schema_finds_fenced_json_and_validates_it(scorer):
    score = scorer("json_schema", {"schema": SCHEMA})
    assert score('Here:\n```json\n{"name": "Ada", "age": 36}\n```')[0] == 1.0
    assert score('{"name": "Ada", "age": 36}')[0] == 1.0
    assert score('Sure! {"name": "Ada", "age": 36} hope that helps')[0] == 1.0
    value, details = score('{"name": "Ada", "age": -1}')
    assert value == 0.0 and details["errors"][0]["path"] == "$.age"
    assert score("{'name': 'Ada'}")[1]["reason"] == "no parseable JSON found"


def test_json_schema_full_mode_refuses_prose_and_deep_nesting_is_harmless(scorer):
    assert (
        scorer("json_schema", {"schema": SCHEMA, "where": "full"})('ok {"name":"a","age":1}')[0]
        == 0.0
    )
    assert scorer("json_schema", {"schema": True})("[" * 100000 + "]" * 100000)[0] == 0.0


def test_an_invalid_json_schema_is_a_spec_issue():
    spec = one_criterion("json_schema", {"schema": {"type": "nonsense"}})
    (issue,) = validate_spec(spec)
    assert issue.path.startswith("criteria[0].params.schema")


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("<think>a</think><answer>b</answer>", 1.0),
        ("  <think>\na\n</think>\n<answer>b</answer>\n", 1.0),
        ("<answer>b</answer><think>a</think>", 0.0),
        ("<think>a</think>", 0.0),
        ("<think></think><answer>b</answer>", 0.0),
        ("<think>a</think><answer>b</answer> trailing", 0.0),
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),
        ("<think>a<answer>b</answer></think>", 0.0),
    ],
)
def test_format_tags_in_order_once_each_nothing_outside(scorer, response, score):
    assert scorer("format_tags", {"tags": ["think", "answer"]})(response)[0] == score


def test_format_tags_fractional_credit(scorer):
    score = scorer("format_tags", {"tags": ["think", "answer"], "credit": "fraction"})
    assert 0 < score("<think>a</think>")[0] < 1


# --- efficiency -------------------------------------------------------------------------------


def test_length_penalty_is_flat_within_budget_and_linear_after(scorer):
    score = scorer("length_penalty", {"budget_tokens": 100, "zero_at_tokens": 200})
    assert score("x", metadata={"response_tokens": 100})[0] == 1.0
    assert score("x", metadata={"response_tokens": 150})[0] == 0.5
    assert score("x", metadata={"response_tokens": 500})[0] == 0.0
    value, details = score("one two three")
    assert value == 1.0 and details["counted_by"] == "approximate" and details["tokens"] == 3


def test_brevity_bonus_pays_only_when_the_named_criterion_passed():
    spec = {"version": 1, "criteria": [
        {"name": "correct", "kind": "numeric_match", "weight": 1},
        {"name": "short", "kind": "brevity_bonus", "weight": 0.5,
         "params": {"target_tokens": 10, "max_tokens": 110, "if_passed": "correct"}},
    ]}  # fmt: skip
    rubric = Rubric.from_spec(spec)
    short_right = rubric.score(sample("7", 7, metadata={"response_tokens": 10}))
    long_right = rubric.score(sample("7", 7, metadata={"response_tokens": 60}))
    short_wrong = rubric.score(sample("8", 7, metadata={"response_tokens": 5}))
    assert short_right.total == 1.5
    assert long_right.total == 1.25
    assert short_wrong.total == 0.0


def test_length_penalty_params_are_checked():
    spec = one_criterion("length_penalty", {"budget_tokens": 100, "zero_at_tokens": 50})
    assert [i.path for i in validate_spec(spec)] == ["criteria[0].params.zero_at_tokens"]


def test_a_catastrophic_schema_pattern_times_out_instead_of_freezing_the_process(scorer):
    score = scorer("json_schema", {"schema": {"type": "string", "pattern": "^(a|aa)+$"}})
    value, details = score('"' + "a" * 60 + 'b"')
    assert value == 0.0 and "timed out" in details["error"]
    assert score('"aaaa"')[0] == 1.0
