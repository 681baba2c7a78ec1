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


@pytest.fixture
def fake_engine(tmp_path, monkeypatch):
    """The OCI driver pointed at tests/sandboxes/fake_engine.py (see its docstring)."""
    import sys
    from pathlib import Path

    state = tmp_path / "engine-state"
    state.mkdir()
    engine = tmp_path / "docker"
    script = Path(__file__).with_name("fake_engine.py")
    engine.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    engine.chmod(0o755)
    monkeypatch.setenv("SANDBOXES_OCI_ENGINE", str(engine))
    monkeypatch.setenv("FAKE_ENGINE_STATE", str(state))
    engine_for.cache_clear()
    yield state
    engine_for.cache_clear()


def test_the_oci_driver_streams_feeds_stdin_reads_state_and_removes_containers(fake_engine):
    import json

    seen: list[str] = []
    spec = SandboxSpec(driver="docker", image="python:3.11-slim", memory_mb=64, env={"K": "v"})
    with Sandbox(spec) as sandbox:
        sandbox.write_files({"in.txt": "from the host"})
        result = sandbox.run(
            ["sh", "-c", 'cat in.txt; read line; echo "$line $K" >&2; exit 3'],
            stdin="typed\n",
            on_stdout=seen.append,
        )
        assert sandbox.image_digest == "sha256:" + "f" * 64
        slow = sandbox.run(["sleep", "30"], timeout=0.5)
    assert (result.stdout, result.stderr, result.exit_code) == ("from the host", "typed v\n", 3)
    assert "".join(seen) == "from the host"
    assert result.image_digest == "sha256:" + "f" * 64 and not result.oom_killed
    assert slow.timed_out and slow.exit_code == 137 and slow.signal == 9
    args = json.loads(next(fake_engine.glob("*-1.args")).read_text())
    assert "--interactive" in args and "--read-only" in args
    assert len(list(fake_engine.glob("*.removed"))) >= 2  # every container removed
