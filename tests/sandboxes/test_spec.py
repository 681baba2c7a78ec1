"""SandboxSpec validation: every bad field is named, good data round-trips."""

from __future__ import annotations

import json

import pytest

from sandboxes import ImageSpec, SandboxSpec, SandboxSpecError


def test_defaults_match_the_contract():
    spec = SandboxSpec()
    assert (spec.driver, spec.image, spec.cpu, spec.memory_mb, spec.pids) == (
        "bwrap",
        None,
        1.0,
        512,
        64,
    )
    assert (spec.disk_mb, spec.timeout_s, spec.network) == (256, 10, "none")
    assert spec.env == {} and spec.files == {} and spec.allow_weaker is False
    assert spec.output_limit_bytes == 1024 * 1024


def test_from_dict_names_every_bad_and_unknown_field_at_once():
    with pytest.raises(SandboxSpecError) as caught:
        SandboxSpec.from_dict(
            {
                "driver": "lxc",
                "cpu": 0,
                "memory_mb": "lots",
                "pids": 2,
                "disk_mb": True,
                "timeout_s": -1,
                "network": "host",
                "env": {"BAD NAME": "x", "OK": 3},
                "files": {"../escape": "x", "/etc/passwd": "x", "ok.txt": 5},
                "allow_weaker": ["teleport"],
                "colour": "blue",
            }
        )
    errors = caught.value.errors
    assert set(errors) == {
        "driver",
        "cpu",
        "memory_mb",
        "pids",
        "disk_mb",
        "timeout_s",
        "network",
        "env",
        "files",
        "allow_weaker",
        "colour",
    }
    assert "unknown field" in errors["colour"]
    assert "'../escape'" in errors["files"] and "'/etc/passwd'" in errors["files"]
    assert "teleport" in errors["allow_weaker"]
    assert "memory_mb" in str(caught.value)


def test_from_dict_rejects_something_that_is_not_a_mapping():
    with pytest.raises(SandboxSpecError) as caught:
        SandboxSpec.from_dict(["memory_mb", 5])  # type: ignore[arg-type]
    assert "spec" in caught.value.errors


def test_to_dict_round_trips_through_json_with_binary_files_and_images():
    spec = SandboxSpec(
        cpu=0.5,
        memory_mb=64,
        network="loopback",
        env={"A": "1"},
        files={"a.txt": "text", "b.bin": b"\x00\xff"},
        allow_weaker=["disk_limit"],
        image=ImageSpec(name="tools", setup="true", files={"w.bin": b"\x01"}),
    )
    again = SandboxSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert again.files["b.bin"] == b"\x00\xff"
    assert again.allow_weaker == frozenset({"disk_limit"})


def test_allow_weaker_true_allows_every_defence_and_false_none():
    assert SandboxSpec(allow_weaker=True).allows_weaker("cgroup_memory")
    assert not SandboxSpec().allows_weaker("cgroup_memory")
    assert SandboxSpec(allow_weaker=["seccomp"]).allows_weaker("seccomp")
    assert not SandboxSpec(allow_weaker=["seccomp"]).allows_weaker("disk_limit")


def test_image_definitions_are_validated_by_field():
    with pytest.raises(SandboxSpecError) as caught:
        SandboxSpec.from_dict({"image": {"name": "bad name!", "network": "wifi"}})
    assert "image" in caught.value.errors
    assert "image.name" in caught.value.errors["image"]


def test_image_digest_depends_on_contents_not_on_the_name():
    one = ImageSpec(name="a", setup="echo 1")
    assert one.digest() == ImageSpec(name="b", setup="echo 1").digest()
    assert one.digest() != ImageSpec(name="a", setup="echo 2").digest()
    assert one.digest() != ImageSpec(name="a", setup="echo 1", files={"x": "y"}).digest()
