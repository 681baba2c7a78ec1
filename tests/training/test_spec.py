"""RunSpec: validation names every bad field; the dict round trip is lossless."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest

from training.spec import RunSpec, SpecError, run_spec_json_schema

ARITH_RUBRIC = {
    "version": 1,
    "criteria": [{"name": "correct", "kind": "math_equivalence", "weight": 1.0, "params": {}}],
}


def minimal_spec(**changes):
    spec = {
        "base_model": "var/models/demo",
        "domains": [
            {"name": "arithmetic", "rubric_spec": ARITH_RUBRIC, "task_source": {"kind": "demo"}}
        ],
    }
    spec.update(changes)
    return spec


def test_a_minimal_spec_gets_the_documented_defaults():
    spec = RunSpec.from_dict(minimal_spec())
    assert spec.algorithm.advantage_estimator == "grpo"
    assert spec.batch.group_size == 4
    assert spec.domains[0].weight == 1.0
    assert spec.checkpoint.resume == "latest"


def test_to_dict_then_from_dict_gives_the_same_spec():
    spec = RunSpec.from_dict(
        minimal_spec(
            algorithm={"algorithm": "dapo"},
            kl={"coef": 0.01},
            deepspeed={"zero_optimization": {"stage": 2}},
            checkpoint={"dir": "/tmp/x", "every_steps": 3},
            cpu_threads=1,
        )
    )
    data = spec.to_dict()
    json.dumps(data)  # plain JSON
    assert RunSpec.from_dict(data) == spec
    assert spec.algorithm.clip_high == 0.28  # the dapo preset was applied


def test_every_bad_field_is_named_in_one_error():
    bad = minimal_spec(
        lr=-1,
        max_steps="ten",
        batch={"group_size": 0, "micro_batch_tokens": 4},
        sampling={"top_p": 2},
        deepspeed={"zero_optimization": {"stage": 7}, "train_batch_size": 8},
        checkpoint={"keep_last": 0, "typo": 1},
        cpu_threads=-1,
        surprise=True,
    )
    bad["domains"].append({"name": "arithmetic", "weight": -2, "rubric_spec": {"criteria": []}})
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict(bad)
    paths = {error.split(":")[0] for error in caught.value.errors}
    for expected in (
        "lr",
        "max_steps",
        "batch.group_size",
        "batch.micro_batch_tokens",
        "sampling.top_p",
        "deepspeed.zero_optimization.stage",
        "deepspeed.train_batch_size",
        "checkpoint.keep_last",
        "checkpoint.typo",
        "cpu_threads",
        "surprise",
        "domains[1].name",
        "domains[1].weight",
        "domains[1]",
    ):
        assert expected in paths, (expected, caught.value.errors)
    assert any(p.startswith("domains[1].rubric_spec") for p in paths)


def test_a_bad_algorithm_field_is_reported_under_algorithm():
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict(minimal_spec(algorithm={"algorithm": "grpo", "clip_low": 3}))
    assert "algorithm.clip_low: must be < 1.0, got 3" in caught.value.errors


def test_unknown_preset_and_missing_essentials_are_errors():
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict({"algorithm": "nope"})
    text = str(caught.value)
    assert "base_model: required" in text
    assert "domains: required" in text
    assert "unknown algorithm 'nope'" in text


def test_all_zero_weights_are_refused():
    spec = minimal_spec()
    spec["domains"][0]["weight"] = 0
    with pytest.raises(SpecError, match="at least one domain needs a weight > 0"):
        RunSpec.from_dict(spec)


def test_kl_section_folds_into_the_algorithm_config():
    spec = RunSpec.from_dict(minimal_spec(kl={"coef": 0.05, "estimator": "k1"}))
    config = spec.algorithm_config()
    assert config.kl_coef == 0.05 and config.kl_estimator == "k1"
    assert spec.algorithm_config(kl_coef=0.2).kl_coef == 0.2


def test_dr_grpo_divides_by_the_generation_budget_unless_told_otherwise():
    domains = [
        {"name": "a", "rubric_spec": ARITH_RUBRIC, "task_source": {"kind": "demo"}},
        {
            "name": "b",
            "rubric_spec": ARITH_RUBRIC,
            "task_source": {"kind": "demo"},
            "max_new_tokens": 200,
        },
    ]
    spec = RunSpec.from_dict(minimal_spec(algorithm={"algorithm": "dr_grpo"}, domains=domains))
    assert spec.algorithm_config().constant_normalizer == 200.0
    tools = RunSpec.from_dict(
        minimal_spec(
            algorithm={"algorithm": "dr_grpo"},
            domains=domains,
            tools={"enabled": True, "max_total_tokens": 640},
        )
    )
    assert tools.algorithm_config().constant_normalizer == 640.0
    told = RunSpec.from_dict(
        minimal_spec(algorithm={"algorithm": "dr_grpo", "constant_normalizer": 64})
    )
    assert told.algorithm_config().constant_normalizer == 64.0
    assert RunSpec.from_dict(minimal_spec()).algorithm_config().constant_normalizer is None


def test_ewc_with_zero_3_is_refused_before_the_run_starts():
    ewc = {"strength": 1.0, "fisher_path": "f", "anchor_path": "a"}
    with pytest.raises(SpecError, match="ewc: EWC needs whole parameters"):
        RunSpec.from_dict(minimal_spec(ewc=ewc, deepspeed={"zero_optimization": {"stage": 3}}))
    assert RunSpec.from_dict(minimal_spec(ewc=ewc, deepspeed={"zero_optimization": {"stage": 2}}))


def test_from_json_file_reports_broken_json(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        RunSpec.from_json_file(path)


def test_rollout_options_are_checked_by_name():
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict(minimal_spec(rollout={"engine": "sglang", "max_model_len": 0, "x": 1}))
    paths = {error.split(":")[0] for error in caught.value.errors}
    assert {"rollout.engine", "rollout.max_model_len", "rollout.x"} <= paths


def test_importing_the_spec_does_not_import_torch():
    # A web process validating a form must not pay for torch (issue 10).
    code = (
        "import sys, training.spec\n"
        "training.spec.RunSpec.from_dict({'base_model': 'demo', 'domains': [{'name': 'a',"
        " 'rubric_spec': {'version': 1, 'criteria': [{'name': 'c', 'kind': 'exact_match'}]},"
        " 'task_source': {'kind': 'demo'}}]})\n"
        "training.spec.run_spec_json_schema()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("domain", ["arithmetic", "parity"])
def test_the_json_schema_accepts_a_preset_spec_and_refuses_what_from_dict_refuses(domain):
    from training.presets import learning_run_dict

    schema = run_spec_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    preset = learning_run_dict(domain)
    assert list(validator.iter_errors(preset)) == []
    assert list(validator.iter_errors(RunSpec.from_dict(preset).to_dict())) == []
    assert list(validator.iter_errors(minimal_spec(algorithm="dapo"))) == []
    for bad in (
        minimal_spec(batch={"group_size": 0}),
        minimal_spec(surprise=True),
        minimal_spec(algorithm={"algorithm": "nope"}),
        minimal_spec(rollout={"engine": "sglang"}),
        {"domains": []},
    ):
        assert list(validator.iter_errors(bad)), bad
        with pytest.raises(SpecError):
            RunSpec.from_dict(bad)


def test_a_spec_is_frozen_and_reads_by_attribute():
    spec = RunSpec.from_dict(minimal_spec())
    assert spec.domains[0].rubric_spec == ARITH_RUBRIC
    assert isinstance(spec.domains, tuple)
    with pytest.raises(ValueError):
        spec.batch.group_size = 3  # type: ignore[misc]
    assert spec.with_changes(batch={"group_size": 2}).batch.group_size == 2
    assert spec.rollout_engine_config().engine == "hf"
