"""Rubric scoring: aggregates, gates, clipping, failures that score 0, batch order."""

from __future__ import annotations

import pytest

from rewards import RewardResult, Rubric, RubricSpecError, Sample
from tests.rewards.conftest import sample

FUNCTIONS = "tests.rewards.reward_functions"


def exact(name: str, expected: str, weight: float = 1.0) -> dict:
    return {"name": name, "kind": "exact_match", "weight": weight, "params": {"expected": expected}}


def rubric(*criteria, **top) -> Rubric:
    return Rubric.from_spec({"version": 1, "criteria": list(criteria), **top})


def test_weighted_sum_adds_weighted_scores_and_reports_the_breakdown():
    result = rubric(exact("a", "x", 2), exact("b", "y", 0.5)).score(sample("x"))
    assert isinstance(result, RewardResult)
    assert result.breakdown == {"a": 1.0, "b": 0.0}
    assert result.total == 2.0
    assert result.details["a"]["extracted"] == "x"
    assert result.details["_aggregate"]["method"] == "weighted_sum"


def test_normalize_divides_the_weighted_sum_by_the_weights():
    result = rubric(exact("a", "x", 3), exact("b", "y", 1), normalize=True).score(sample("x"))
    assert result.total == pytest.approx(0.75)


def test_min_takes_the_weakest_criterion_and_ignores_zero_weights():
    spec = [exact("a", "x"), exact("b", "y"), exact("c", "y", 0)]
    assert rubric(*spec, aggregate="min").score(sample("x")).total == 0.0
    assert (
        rubric(exact("a", "x"), exact("c", "y", 0), aggregate="min").score(sample("x")).total == 1
    )


def test_product_is_zero_when_any_weighted_criterion_is_zero():
    assert (
        rubric(exact("a", "x"), exact("b", "y"), aggregate="product").score(sample("x")).total == 0
    )
    assert (
        rubric(exact("a", "x"), exact("b", "x"), aggregate="product").score(sample("x")).total == 1
    )


def test_a_failed_gate_zeroes_the_total_and_says_so():
    gate = {"gate": "format", "then": "weighted_sum"}
    result = rubric(exact("format", "y", 0), exact("a", "x"), aggregate=gate).score(sample("x"))
    assert result.breakdown == {"format": 0.0, "a": 1.0}
    assert result.total == 0.0
    assert result.details["_aggregate"]["gates"] == {"format": False}
    passed = rubric(exact("format", "x", 0), exact("a", "x"), aggregate=gate).score(sample("x"))
    assert passed.total == 1.0


def test_a_gate_threshold_below_one_accepts_partial_scores():
    spec = {"version": 1, "criteria": [
        {"name": "tests", "kind": "numeric_match", "weight": 1,
         "params": {"expected": 100, "credit": "linear", "zero_at_rel_error": 0.5}},
    ], "aggregate": {"gate": "tests", "threshold": 0.5}}  # fmt: skip
    assert Rubric.from_spec(spec).score(sample("90")).total == pytest.approx(0.8)
    assert Rubric.from_spec(spec).score(sample("60")).total == 0.0


def test_clip_bounds_the_total_last():
    result = rubric(exact("a", "x", 5), clip=[-1, 1.5]).score(sample("x"))
    assert result.total == 1.5
    assert result.details["_aggregate"]["raw"] == 5


def test_a_crashing_criterion_scores_zero_with_the_reason_and_the_others_still_count():
    crash = {
        "name": "boom",
        "kind": "python_function",
        "params": {"function": f"{FUNCTIONS}:crashes"},
    }
    result = rubric(crash, exact("a", "x")).score(sample("x"))
    assert result.breakdown == {"boom": 0.0, "a": 1.0}
    assert "RuntimeError: boom" in result.details["boom"]["error"]
    assert result.total == 1.0


def test_a_criterion_past_its_deadline_scores_zero_without_holding_the_batch():
    slow = {"name": "slow", "kind": "python_function", "timeout_s": 0.3,
            "params": {"function": f"{FUNCTIONS}:sleeps"}}  # fmt: skip
    results = rubric(slow, exact("a", "x")).score_batch([sample("x"), sample("y")], max_workers=2)
    assert [r.breakdown["slow"] for r in results] == [0.0, 0.0]
    assert results[0].details["slow"]["timed_out"] is True
    assert "timed out after 0.3s" in results[0].details["slow"]["error"]


def test_a_non_finite_score_is_a_failure_not_a_reward():
    nan = {
        "name": "nan",
        "kind": "python_function",
        "params": {"function": f"{FUNCTIONS}:returns_nan"},
    }
    result = rubric(nan).score(sample("x"))
    assert result.total == 0.0
    assert "finite" in result.details["nan"]["error"]


def test_score_batch_keeps_the_input_order_with_many_workers():
    r = rubric({"name": "n", "kind": "numeric_match", "params": {}})
    samples = [sample(str(i), ground_truth=i if i % 3 else -1) for i in range(40)]
    results = r.score_batch(samples, max_workers=8)
    assert [res.total for res in results] == [0.0 if i % 3 == 0 else 1.0 for i in range(40)]
    assert [res.details["n"]["extracted"] for res in results] == [float(i) for i in range(40)]


def test_score_batch_accepts_plain_dicts_and_rejects_bad_ones_before_any_work():
    r = rubric(exact("a", "x"))
    good = {"domain": "d", "prompt": "p", "completion": "x"}
    assert [res.total for res in r.score_batch([good, good])] == [1.0, 1.0]
    with pytest.raises(ValueError, match="unknown sample field"):
        r.score_batch([good, {**good, "answer": 3}])
    with pytest.raises(ValueError, match="max_workers"):
        r.score_batch([good], max_workers=0)


def test_messages_supply_the_response_when_there_is_no_completion():
    s = Sample(domain="d", prompt="p", messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
        {"role": "tool", "content": "ignored"},
    ])  # fmt: skip
    assert rubric(exact("a", "x")).score(s).total == 1.0


def test_a_python_function_that_cannot_be_imported_is_a_spec_issue_with_its_path():
    with pytest.raises(RubricSpecError) as caught:
        rubric(exact("a", "x"), {"name": "f", "kind": "python_function",
                                 "params": {"function": "no_such_module:f"}})  # fmt: skip
    (issue,) = caught.value.issues
    assert issue.path == "criteria[1].params.function"
    assert "no_such_module" in issue.message


def test_brevity_bonus_must_name_a_criterion_before_it():
    bonus = {
        "name": "short",
        "kind": "brevity_bonus",
        "params": {"max_tokens": 10, "if_passed": "a"},
    }
    with pytest.raises(RubricSpecError) as caught:
        rubric(bonus, exact("a", "x"))
    assert caught.value.issues[0].path == "criteria[0].params.if_passed"


def test_a_router_scores_each_domain_with_its_rubric_in_input_order():
    from rewards import RubricRouter

    numeric = {"version": 1, "criteria": [{"name": "n", "kind": "numeric_match"}]}
    exact_spec = {"version": 1, "criteria": [exact("e", "yes")]}
    with RubricRouter.from_specs({"math": numeric, "chat": exact_spec}) as router:
        samples = [
            sample("4", 4, domain="math"),
            sample("yes", domain="chat"),
            sample("5", 4, domain="math"),
            sample("no", domain="chat"),
        ]
        results = router.score_batch(samples)
        assert [r.total for r in results] == [1.0, 1.0, 0.0, 0.0]
        assert list(results[1].breakdown) == ["e"]
        with pytest.raises(KeyError, match="no rubric for domain 'code'"):
            router.score_batch([sample("x", domain="code")])
