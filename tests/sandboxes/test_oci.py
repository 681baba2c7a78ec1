"""The podman/docker driver. Runs only where an engine answers; the rest checks its command."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from sandboxes import EngineUnavailableError, Sandbox, SandboxError, SandboxSpec
from sandboxes.oci import container_args, engine_for
from sandboxes.workspace import Workspace


def _engine_or_skip(driver: str) -> str:
    try:
        return engine_for(driver)
    except EngineUnavailableError as exc:
        pytest.skip(f"no {driver} engine answers on this machine: {exc}")


def test_the_container_command_carries_every_limit(tmp_path):
    spec = SandboxSpec(
        driver="podman", image="python:3.11-slim", cpu=0.5, memory_mb=96, pids=20, disk_mb=8
    )
    args = container_args(
        "podman",
        spec,
        "sb-x-1",
        "python:3.11-slim",
        Workspace(tmp_path, "w", 8, None, None),
        "/work",
        {"A": "1"},
        ["python3", "-c", "pass"],
        interactive=False,
    )
    joined = " ".join(args)
    for expected in (
        "--network none",
        "--memory 96m",
        "--memory-swap 96m",
        "--pids-limit 20",
        "--cpus 0.5",
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        "--user 65534:65534",
        "--ulimit core=0:0",
        f"--ulimit fsize={8 * 2**20}:{8 * 2**20}",
        "--env A=1",
        "--workdir /work",
    ):
        assert expected in joined
    assert args[-4:] == ["python:3.11-slim", "python3", "-c", "pass"]


def test_an_oci_spec_without_an_image_reference_is_refused():
    with pytest.raises(SandboxError, match="OCI image reference"):
        Sandbox(SandboxSpec(driver="docker")).open()


def test_without_an_engine_opening_says_so_clearly():
    for driver in ("docker", "podman"):
        try:
            engine_for(driver)
        except EngineUnavailableError as exc:
            assert "no container engine answers" in str(exc)
            with pytest.raises(EngineUnavailableError):
                Sandbox(SandboxSpec(driver=driver, image="alpine")).open()
            return
    pytest.skip("an engine answers here; the clear-error path is not reachable")


@pytest.mark.parametrize("driver", ["podman", "docker"])
def test_a_container_run_reports_like_bwrap(driver):
    _engine_or_skip(driver)
    image = "docker.io/library/python:3.11-slim"
    probe = subprocess.run(
        [shutil.which(driver) or driver, "image", "inspect", image],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"image {image} is not present locally (no registry here)")
    with Sandbox(SandboxSpec(driver=driver, image=image, memory_mb=64, timeout_s=5)) as sandbox:
        sandbox.write_files({"main.py": "print('hi')"})
        result = sandbox.run(["python3", "main.py"])
        slow = sandbox.run(["sleep", "60"], timeout=1)
        bomb = sandbox.run(["python3", "-c", "x = bytearray(512 * 2**20)"])
    assert result.stdout == "hi\n" and result.exit_code == 0 and result.image_digest
    assert slow.timed_out
    assert bomb.oom_killed
