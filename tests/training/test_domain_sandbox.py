"""A domain's sandbox (the console pins the registered image version) reaches the sandboxes a
run uses: the rubric's code criteria start from it, and bad settings are refused by path."""

from __future__ import annotations

import uuid

import pytest

from rewards import Rubric
from tests.rewards.conftest import one_criterion, sample
from tests.training.conftest import tiny_spec
from training.loop import domain_sandbox, scoring_rubric_spec
from training.spec import RunSpec, SpecError

READ_MARKER = "```python\nprint(open('/image/marker.txt').read().strip())\n```"


def image_settings() -> dict:
    # A bwrap image with a setup script, as the console's sandbox image versions give it.
    name = f"test-marker-{uuid.uuid4().hex[:8]}"
    setup = "echo from-the-registered-image > /image/marker.txt"
    return {"driver": "bwrap", "image": {"name": name, "setup": setup}, "memory_mb": 256}


def test_code_criteria_run_in_the_domains_image():
    rubric_spec = one_criterion(
        "io_tests", {"cases": [{"stdin": "", "stdout": "from-the-registered-image\n"}]}
    )
    sandbox = domain_sandbox(image_settings())
    with Rubric.from_spec(scoring_rubric_spec(rubric_spec, sandbox)) as rubric:
        in_image = rubric.score(sample(READ_MARKER))
    with Rubric.from_spec(rubric_spec) as rubric:
        default = rubric.score(sample(READ_MARKER))
    assert in_image.total == 1.0
    assert default.total == 0.0  # the default sandbox has no such image


def test_the_rubrics_own_sandbox_settings_win_over_the_domains():
    sandbox = domain_sandbox({"memory_mb": 256, "timeout_s": 5, "network": "none"})
    spec = scoring_rubric_spec({"version": 1, "criteria": [], "sandbox": {"timeout_s": 2}}, sandbox)
    assert spec["sandbox"]["timeout_s"] == 2
    assert spec["sandbox"]["memory_mb"] == 256
    assert scoring_rubric_spec({"version": 1, "criteria": []}, None) == {
        "version": 1,
        "criteria": [],
    }


def test_a_bad_domain_sandbox_is_refused_at_its_path(tmp_path):
    data = tiny_spec(tmp_path, tmp_path)
    data["domains"][0]["sandbox"] = {"memory_mb": -5, "colour": "red"}
    with pytest.raises(SpecError) as caught:
        RunSpec.from_dict(data)
    paths = [line.split(":", 1)[0] for line in caught.value.errors]
    assert "domains[0].sandbox.memory_mb" in paths
    assert "domains[0].sandbox.colour" in paths
