"""A rubric's ``sandbox`` block accepts exactly the limits a sandbox accepts (issue #10).

For each limit in ``sandboxes.LIMITS``: the minimum and maximum pass both
``rewards.validate_spec`` and ``SandboxSpec``; one step below and above fail both, and the
rubric's problem names the field.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from rewards import Rubric, RubricSpecError, validate_spec
from sandboxes import LIMITS, LimitBounds, SandboxSpec, SandboxSpecError


def boundary_cases(bounds: LimitBounds) -> list[tuple[float, bool]]:
    """(value, accepted) for the minimum, the maximum and one step outside each."""
    if bounds.whole:
        below, above = int(bounds.minimum) - 1, int(bounds.maximum) + 1
        return [
            (int(bounds.minimum), True),
            (int(bounds.maximum), True),
            (below, False),
            (above, False),
        ]
    return [
        (bounds.minimum, True),
        (bounds.maximum, True),
        (math.nextafter(bounds.minimum, -math.inf), False),
        (math.nextafter(bounds.maximum, math.inf), False),
    ]


CASES = [
    pytest.param(name, value, accepted, id=f"{name}={value!r}")
    for name, bounds in LIMITS.items()
    for value, accepted in boundary_cases(bounds)
]


def rubric_spec(sandbox: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": 1,
        "criteria": [{"name": "runs", "kind": "compiles"}],
        "sandbox": sandbox,
    }


@pytest.mark.parametrize(("name", "value", "accepted"), CASES)
def test_every_layer_agrees_on_the_bounds(name: str, value: float, accepted: bool) -> None:
    try:
        SandboxSpec(**{name: value})
        sandbox_accepts = True
    except SandboxSpecError as refused:
        sandbox_accepts = False
        assert set(refused.errors) == {name}
    assert sandbox_accepts is accepted

    issues = validate_spec(rubric_spec({name: value}))
    assert (not issues) is accepted
    if not accepted:
        assert [issue.path for issue in issues] == [f"sandbox.{name}"]
        assert LIMITS[name].message() in issues[0].message
        with pytest.raises(RubricSpecError):
            Rubric.from_spec(rubric_spec({name: value}))
    else:
        # What the rubric validated, its code criteria's sandbox spec takes as it is.
        rubric = Rubric.from_spec(rubric_spec({name: value}))
        try:
            assert rubric._sandboxes is not None
            assert getattr(rubric._sandboxes.spec(), name) == value
        finally:
            rubric.close()


def test_a_whole_number_written_as_a_float_still_starts() -> None:
    # JSON Schema counts 64.0 as an integer; the sandbox spec must get the int, not a refusal.
    rubric = Rubric.from_spec(rubric_spec({"pids": 64.0, "memory_mb": 256.0}))
    try:
        assert rubric._sandboxes is not None
        spec = rubric._sandboxes.spec()
        assert (spec.pids, spec.memory_mb) == (64, 256)
        assert isinstance(spec.pids, int)
    finally:
        rubric.close()


def test_spec_defaults_are_the_table_defaults() -> None:
    spec = SandboxSpec()
    for name, bounds in LIMITS.items():
        assert getattr(spec, name) == bounds.default
        assert bounds.accepts(bounds.default)
