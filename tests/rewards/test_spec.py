"""The rubric spec: validation reports every problem with a path a person can follow."""

from __future__ import annotations

import pytest

from rewards import (
    RUBRIC_SCHEMA,
    Rubric,
    RubricSpecError,
    SpecIssue,
    criterion_kinds,
    validate_spec,
)


def spec_with(*criteria, **top):
    return {"version": 1, "criteria": list(criteria), **top}


EXACT = {"name": "correct", "kind": "exact_match", "weight": 1, "params": {"expected": "4"}}


def test_a_minimal_valid_spec_has_no_issues():
    assert validate_spec(spec_with(EXACT)) == []


def test_weight_below_zero_is_reported_at_its_path_with_a_readable_message():
    issues = validate_spec(spec_with(EXACT, {**EXACT, "name": "other", "weight": -1}))
    assert issues == [SpecIssue("criteria[1].weight", "must be a number ≥ 0")]


def test_every_problem_is_reported_not_just_the_first():
    spec = {
        "version": 2,
        "criteria": [
            {"name": "a", "kind": "exact_match", "weight": "heavy"},
            {"name": "a", "kind": "no_such_kind"},
            {"kind": "regex_match", "params": {"pattern": "(", "bogus": 1}},
        ],
        "aggregate": {"gate": "missing", "then": "max"},
        "clip": [1, 0],
        "colour": "red",
    }
    paths = {issue.path for issue in validate_spec(spec)}
    assert paths == {
        "version",
        "colour",
        "criteria[0].weight",
        "criteria[1].name",
        "criteria[1].kind",
        "criteria[2].name",
        "criteria[2].params.bogus",
        "criteria[2].params.pattern",
        "aggregate.then",
        "aggregate.gate",
        "clip",
    }


def test_issues_come_in_document_order_with_numeric_indexes():
    criteria = [{**EXACT, "name": f"c{i}"} for i in range(12)]
    criteria[2]["weight"] = -1
    criteria[10]["weight"] = -1
    issues = validate_spec(spec_with(*criteria))
    assert [i.path for i in issues] == ["criteria[2].weight", "criteria[10].weight"]


def test_missing_top_level_fields_are_named():
    assert {i.path: i.message for i in validate_spec({})} == {
        "version": "is required",
        "criteria": "is required",
    }


@pytest.mark.parametrize("not_a_spec", [None, [], "rubric", 3])
def test_a_spec_that_is_not_an_object_is_one_clear_issue(not_a_spec):
    assert validate_spec(not_a_spec) == [SpecIssue("", "a rubric spec must be a JSON object")]


def test_gate_must_name_an_existing_criterion():
    spec = spec_with(EXACT, aggregate={"gate": ["correct", "format"], "then": "min"})
    assert validate_spec(spec) == [
        SpecIssue("aggregate.gate[1]", "names no criterion ('format'); criteria: 'correct'")
    ]


def test_an_unknown_aggregate_word_lists_the_choices():
    (issue,) = validate_spec(spec_with(EXACT, aggregate="average"))
    assert issue.path == "aggregate"
    assert "weighted_sum" in issue.message


def test_non_finite_weights_and_clip_bounds_are_rejected():
    spec = spec_with({**EXACT, "weight": float("inf")}, clip=[float("-inf"), 1])
    assert {i.path for i in validate_spec(spec)} == {"criteria[0].weight", "clip"}


def test_names_must_be_identifiers_so_details_keys_stay_unambiguous():
    (issue,) = validate_spec(spec_with({**EXACT, "name": "_aggregate"}))
    assert issue.path == "criteria[0].name"


def test_from_spec_raises_with_all_issues():
    with pytest.raises(RubricSpecError) as caught:
        Rubric.from_spec(
            {"version": 1, "criteria": [{"name": "x", "kind": "nope"}], "clip": [2, 1]}
        )
    assert [i.path for i in caught.value.issues] == ["clip", "criteria[0].kind"]
    assert "criteria[0].kind" in str(caught.value)


def test_every_kind_documents_itself_with_a_checkable_params_schema():
    from jsonschema import Draft202012Validator

    kinds = criterion_kinds()
    assert {"exact_match", "regex_match", "multiple_choice"} <= set(kinds)
    for name, info in kinds.items():
        assert info.name == name
        assert info.summary and info.docs
        Draft202012Validator.check_schema(info.params_schema)
        assert info.params_schema.get("type") == "object"


def test_the_rubric_schema_is_valid_and_agrees_with_validate_spec_on_structure():
    # Editors and other tools validate against the published schema alone; what it accepts and
    # refuses must be what `validate_spec` accepts and refuses, at the same paths.
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(RUBRIC_SCHEMA)
    validator = Draft202012Validator(RUBRIC_SCHEMA)

    def schema_paths(spec):
        return sorted(".".join(map(str, e.absolute_path)) for e in validator.iter_errors(spec))

    good = spec_with(EXACT, sandbox={"pids": 4, "network": "none"})
    assert schema_paths(good) == [] and validate_spec(good) == []
    for bad, path in [
        (spec_with({**EXACT, "weight": -1}), "criteria.0.weight"),
        (spec_with(EXACT, sandbox={"pids": 3}), "sandbox.pids"),
        (spec_with(EXACT, clip=[0]), "clip"),
        (spec_with(EXACT, surprise=True), ""),
    ]:
        assert schema_paths(bad) == [path], bad
        assert validate_spec(bad), bad


def test_a_rubric_whose_weights_are_all_zero_is_refused():
    spec = spec_with({**EXACT, "weight": 0}, {**EXACT, "name": "b", "weight": 0})
    assert validate_spec(spec) == [
        SpecIssue("criteria", "every weight is 0, so every total would be 0")
    ]
