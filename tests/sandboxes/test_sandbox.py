"""A sandbox over a multi-step episode: capture, files, cwd, streaming, snapshots, CLI, images."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandboxes import (
    ImageSpec,
    Sandbox,
    SandboxError,
    SandboxPathError,
    SandboxSpec,
    Snapshot,
    WeakerIsolationError,
    build_image,
    register_image,
)
from tests.sandboxes.conftest import assert_nothing_left


def test_a_command_reports_output_exit_code_and_resource_use():
    with Sandbox(SandboxSpec(memory_mb=128)) as sandbox:
        result = sandbox.run(
            [
                "python3",
                "-c",
                "import sys; print('out'); print('err', file=sys.stderr); "
                "x = bytearray(32 * 2**20); sys.exit(3)",
            ]
        )
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 3)
    assert result.signal is None and not result.timed_out and not result.oom_killed
    assert not result.truncated and not result.ok
    assert result.peak_memory_mb is not None and 32 <= result.peak_memory_mb < 128
    assert result.cpu_s is not None and result.cpu_s > 0
    assert result.wall_s > 0 and result.image_digest is None
    assert_nothing_left(sandbox.name)


def test_the_environment_holds_only_the_spec_variables(canary):
    with Sandbox(SandboxSpec(env={"TASK": "42"})) as sandbox:
        result = sandbox.run(
            ["python3", "-c", "import os, json; print(json.dumps(dict(os.environ)))"]
        )
        per_run = sandbox.run(["sh", "-c", "echo $EXTRA"], env={"EXTRA": "x"})
    env = json.loads(result.stdout)
    assert env.pop("TASK") == "42"
    assert set(env) <= {"PATH", "HOME", "TMPDIR", "LANG", "USER", "PWD"}
    assert canary not in result.stdout
    assert per_run.stdout == "x\n"


def test_files_and_the_working_directory_persist_across_runs():
    spec = SandboxSpec(files={"src/main.py": "print(open('data.txt').read())"})
    with Sandbox(spec) as sandbox:
        sandbox.run(["sh", "-c", "echo from-step-1 > src/data.txt && mkdir -p /tmp/scratch"])
        sandbox.cwd = "src"
        assert sandbox.cwd == "/work/src"
        result = sandbox.run(["python3", "main.py"])
        sandbox.write_files({"/tmp/scratch/b.bin": b"\x00\x01"})
        assert sandbox.read_file("/tmp/scratch/b.bin") == b"\x00\x01"
        assert sandbox.read_file("data.txt") == b"from-step-1\n"
        pwd = sandbox.run(["pwd"]).stdout
        with pytest.raises(SandboxPathError):
            sandbox.cwd = "/etc"
    assert result.stdout == "from-step-1\n\n"
    assert pwd == "/work/src\n"


def test_stdin_is_fed_and_streaming_callbacks_see_output_as_it_comes():
    seen: list[str] = []
    with Sandbox(SandboxSpec()) as sandbox:
        result = sandbox.run(
            [
                "python3",
                "-c",
                "import sys\nfor line in sys.stdin: print(line.upper(), end='', flush=True)",
            ],
            stdin="a\nb\n",
            on_stdout=seen.append,
        )
    assert result.stdout == "A\nB\n"
    assert "".join(seen) == "A\nB\n"


def test_output_is_capped_at_the_spec_limit_with_truncated_set():
    with Sandbox(SandboxSpec(output_limit_bytes=10)) as sandbox:
        result = sandbox.run(["sh", "-c", "printf '0123456789abcdef'; printf 'x' >&2"])
    assert result.stdout == "0123456789" and result.stderr == "x"
    assert result.truncated


def test_a_killed_command_reports_its_signal():
    with Sandbox(SandboxSpec()) as sandbox:
        result = sandbox.run(["sh", "-c", "kill -TERM $$"])
    assert result.signal == 15 and result.exit_code == 143


def test_bad_arguments_are_clear_errors():
    with Sandbox(SandboxSpec()) as sandbox:
        with pytest.raises(SandboxError):
            sandbox.run("echo hi")  # type: ignore[arg-type]
        with pytest.raises(SandboxError):
            sandbox.run([])
        with pytest.raises(SandboxError):
            sandbox.run(["true"], timeout=0)
        with pytest.raises(SandboxPathError):
            sandbox.write_files({"../x": "y"})
        with pytest.raises(FileNotFoundError):
            sandbox.read_file("missing.txt")
        with pytest.raises(SandboxPathError, match="not a directory"):
            sandbox.run(["true"], cwd="/work/missing")
        result = sandbox.run(["/no/such/program"])
        assert result.exit_code != 0 and "no/such/program" in result.stderr
    with pytest.raises(SandboxError):
        sandbox.run(["true"])


def test_writing_more_than_the_disk_through_write_files_fails_cleanly():
    with Sandbox(SandboxSpec(disk_mb=1)) as sandbox:
        with pytest.raises(SandboxError, match="disk is full"):
            sandbox.write_files({"big.bin": b"x" * (2 * 1024 * 1024)})
        assert sandbox.run(["true"]).exit_code == 0


def test_snapshot_to_a_file_and_restore_resume_the_episode(tmp_path):
    with Sandbox(SandboxSpec(memory_mb=64, env={"K": "v"})) as sandbox:
        sandbox.run(["sh", "-c", "mkdir -p a/b && echo state > a/b/s.txt && ln -s b a/link"])
        stuck = sandbox.run(["sh", "-c", "echo partial > a/p.txt; sleep 60"], timeout=0.3)
        assert stuck.timed_out  # the episode timed out; its state is still worth saving
        sandbox.cwd = "a"
        path = sandbox.snapshot().save(tmp_path / "episode.snap")
    with Sandbox.restore(Snapshot.load(path)) as restored:
        assert restored.spec.memory_mb == 64 and restored.spec.env == {"K": "v"}
        assert restored.cwd == "/work/a"
        result = restored.run(["sh", "-c", "cat link/s.txt p.txt; echo $K"])
    assert result.stdout == "state\npartial\nv\n"
    assert_nothing_left(restored.name)


def test_a_corrupt_snapshot_is_refused(tmp_path):
    bad = tmp_path / "bad.snap"
    bad.write_bytes(b"not a tar")
    with pytest.raises(SandboxError):
        Snapshot.load(bad)


def test_refuses_to_start_without_a_defence_unless_the_spec_allows_it(monkeypatch):
    from sandboxes import cgroups

    weak = cgroups.CgroupManager()
    weak.missing["cgroup_memory"] = "pretend the kernel has no memory controller"
    monkeypatch.setattr(cgroups, "_manager", weak)
    with pytest.raises(WeakerIsolationError) as caught:
        Sandbox(SandboxSpec()).open()
    assert caught.value.missing == ["cgroup_memory"]
    assert "no memory controller" in str(caught.value)
    with Sandbox(SandboxSpec(allow_weaker=["cgroup_memory"])) as sandbox:
        assert "cgroup_memory" in sandbox.weakened
        assert sandbox.run(["true"]).exit_code == 0


def test_cgroup_v2_groups_kill_and_measure_on_a_real_unified_hierarchy(monkeypatch):
    from sandboxes import cgroups, reaper

    v1, v2 = cgroups.cgroup_mounts()
    if v2 is None or not os.access(v2, os.W_OK):
        pytest.skip("no writable cgroup2 hierarchy here")
    unified = cgroups.CgroupManager(version=2)
    if unified.version != 2 or unified._v2_parent is None:
        pytest.skip(f"cgroup v2 unusable here: {unified.missing}")
    monkeypatch.setattr(cgroups, "_manager", unified)
    spec = SandboxSpec(allow_weaker=sorted(unified.missing), timeout_s=0.5)
    with Sandbox(spec) as sandbox:
        result = sandbox.run(["sh", "-c", "(setsid sleep 100 &); sleep 100"])
        group_path = Path(unified._v2_parent) / sandbox.name
        assert group_path.is_dir()
    assert result.timed_out and result.cpu_s is not None
    assert reaper.drain(timeout=30)  # closing left the removal to the reaper
    assert not group_path.exists()


def test_cli_prints_the_exec_result_as_json(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"memory_mb": 64, "env": {"WHO": "cli"}}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandboxes",
            "run",
            "--spec",
            str(spec),
            "--",
            "sh",
            "-c",
            "echo $WHO; exit 4",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 4, done.stderr
    result = json.loads(done.stdout)
    assert result["stdout"] == "cli\n" and result["exit_code"] == 4
    spec.write_text(json.dumps({"memory_mb": 1, "nonsense": True}))
    bad = subprocess.run(
        [sys.executable, "-m", "sandboxes", "run", "--spec", str(spec), "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "memory_mb" in bad.stderr and "nonsense" in bad.stderr


def test_an_image_is_built_once_cached_by_digest_and_mounted_read_only(tmp_path, monkeypatch):
    cache = Path("/var/tmp") / f"sandboxes-images-test-{os.getpid()}"
    monkeypatch.setenv("SANDBOXES_IMAGE_CACHE", str(cache))
    image = ImageSpec(
        name="venv-tool",
        files={"src/tool.py": "def shout(s):\n    return s.upper()\n"},
        setup="python3 -m venv --without-pip /image/venv && "
        "cp src/tool.py /image/venv/lib/python3*/site-packages/ && echo built >> /image/log",
        env={"PATH": "/image/venv/bin:/usr/bin:/bin"},
    )
    try:
        register_image(image)
        with Sandbox(SandboxSpec(image="venv-tool")) as sandbox:
            result = sandbox.run(
                [
                    "sh",
                    "-c",
                    "python -c 'import tool; print(tool.shout(\"hi\"))'; "
                    "cat /image/log; touch /image/x || echo read-only",
                ]
            )
        assert result.stdout == "HI\nbuilt\nread-only\n"
        assert result.image_digest == image.digest()
        built = build_image(image)  # cached: the setup does not run again
        assert (built.path / "log").read_text() == "built\n"
        failing = ImageSpec(name="broken", setup="echo nope; exit 7")
        with pytest.raises(SandboxError, match="nope"):
            build_image(failing)
    finally:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)


def test_orphans_are_reaped_by_the_sandbox_init():
    with Sandbox(SandboxSpec()) as sandbox:
        result = sandbox.run(
            [
                "sh",
                "-c",
                "for i in 1 2 3; do (sleep 0.05 &) ; done; sleep 0.5; "
                "grep -l 'State:.*Z' /proc/[0-9]*/status; echo checked",
            ]
        )
    assert result.stdout == "checked\n"  # no zombie left for grep to list


def test_closing_from_another_thread_kills_a_running_command():
    import threading

    sandbox = Sandbox(SandboxSpec(timeout_s=60)).open()
    results = []
    runner = threading.Thread(target=lambda: results.append(sandbox.run(["sleep", "60"])))
    runner.start()
    deadline = time.monotonic() + 10
    while not sandbox._require().cgroup.pids() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.01)
    sandbox.close()
    runner.join(timeout=20)
    assert not runner.is_alive()
    assert results and results[0].signal == 9 and not results[0].timed_out
    assert_nothing_left(sandbox.name)


def test_leftovers_of_a_crashed_owner_are_reaped(tmp_path):
    from sandboxes.janitor import reap_stale

    script = tmp_path / "owner.py"
    script.write_text(
        "import sys\n"
        "from sandboxes import Sandbox, SandboxSpec\n"
        "sandbox = Sandbox(SandboxSpec(timeout_s=60)).open()\n"
        "sandbox.run(['sh', '-c', 'echo running; sleep 60'],\n"
        "            on_stdout=lambda text: print(sandbox.name, flush=True))\n"
    )
    owner = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert owner.stdout is not None
    name = owner.stdout.readline().strip()  # printed once the command runs in the sandbox
    owner.kill()  # SIGKILL: no chance to clean up
    owner.wait()
    deadline = time.monotonic() + 10
    from tests.sandboxes.conftest import leftovers

    # --die-with-parent: the sandbox's processes die with their owner...
    while any(item.startswith("process") for item in leftovers(name)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert not any(item.startswith("process") for item in leftovers(name))
    # ...and the next owner removes its cgroup and work directory.
    assert leftovers(name), "expected the crashed owner's cgroup and workspace to remain"
    assert name in reap_stale()
    assert_nothing_left(name)


def test_running_as_root_inside_counts_as_a_missing_defence(monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("only a root caller chooses the sandbox uid")
    monkeypatch.setenv("SANDBOXES_UID", "0")
    with pytest.raises(WeakerIsolationError) as caught:
        Sandbox(SandboxSpec()).open()
    assert caught.value.missing == ["privilege_drop"]


def test_callbacks_stream_output_while_the_command_still_runs():
    # The command waits for a file that only the callback creates, on seeing the first line:
    # if output were delivered at the end, the command would time out instead.
    with Sandbox(SandboxSpec(timeout_s=20)) as sandbox:

        def on_stdout(text: str) -> None:
            if "ready" in text:
                sandbox.write_files({"go": "1"})

        result = sandbox.run(
            ["sh", "-c", "echo ready; while [ ! -e go ]; do sleep 0.05; done; echo done"],
            on_stdout=on_stdout,
        )
    assert not result.timed_out
    assert result.stdout == "ready\ndone\n"


def test_files_kept_from_earlier_runs_do_not_starve_later_runs():
    # The work tmpfs is memory charged to the sandbox; each run has its own memory_mb limit.
    with Sandbox(SandboxSpec(memory_mb=32, disk_mb=128)) as sandbox:
        for name in "abc":
            step = sandbox.run(["sh", "-c", f"head -c 20000000 /dev/zero > {name}; echo ok"])
            assert step.stdout == "ok\n" and not step.oom_killed
        fits = sandbox.run(["python3", "-c", "x = bytearray(16 * 2**20); print('fits')"])
        too_big = sandbox.run(["python3", "-c", "x = bytearray(48 * 2**20); print('no')"])
    assert fits.stdout == "fits\n" and not fits.oom_killed
    assert too_big.oom_killed and too_big.stdout == ""
    assert too_big.peak_memory_mb is not None and too_big.peak_memory_mb <= 32 + 1


def test_cli_copies_files_feeds_stdin_and_reports_the_machine(tmp_path):
    host_file = tmp_path / "prog.py"
    host_file.write_text("import sys; print(sys.stdin.read().strip() + '!')")
    stdin = tmp_path / "in.txt"
    stdin.write_text("hello")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sandboxes",
            "run",
            "--file",
            f"src/prog.py={host_file}",
            "--stdin",
            str(stdin),
            "--",
            "python3",
            "src/prog.py",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stdout"] == "hello!\n"
    check = subprocess.run(
        [sys.executable, "-m", "sandboxes", "check"], capture_output=True, text=True, check=True
    )
    report = json.loads(check.stdout)
    assert report["cgroup_version"] in (1, 2)
    assert set(report["defences"]) >= {"cgroup_memory", "disk_limit", "seccomp"}


def test_a_planted_symlink_in_place_of_the_root_is_refused(tmp_path, monkeypatch):
    planted = tmp_path / "planted-root"
    planted.symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("SANDBOXES_ROOT", str(planted))
    with pytest.raises(SandboxError, match="not a plain directory"):
        Sandbox(SandboxSpec()).open()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_sandbox_never_closed_is_removed_when_its_process_exits(tmp_path):
    from tests.sandboxes.conftest import leftovers

    script = tmp_path / "forgetful.py"
    script.write_text(
        "from sandboxes import Sandbox, SandboxSpec\n"
        "sandbox = Sandbox(SandboxSpec()).open()\n"
        "sandbox.run(['sh', '-c', 'echo x > kept'])\n"
        "print(sandbox.name)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert not leftovers(done.stdout.strip())


def test_a_quick_episode_never_runs_out_of_a_small_pids_limit():
    # Each run's init is reaped by bwrap itself, so no dead process of an earlier run still
    # counts against the limit when the next run starts.
    with Sandbox(SandboxSpec(pids=6)) as sandbox:
        codes = [sandbox.run(["true"]).exit_code for _ in range(12)]
    assert codes == [0] * 12


def test_restoring_into_a_different_image_is_refused_unless_allowed(tmp_path, monkeypatch):
    import dataclasses

    monkeypatch.setenv("SANDBOXES_IMAGE_CACHE", str(Path("/var/tmp") / f"sbx-img-{os.getpid()}"))
    image = ImageSpec(name="plain", setup="echo v1 > /image/version")
    try:
        with Sandbox(SandboxSpec(image=image)) as sandbox:
            sandbox.write_files({"state.txt": "kept"})
            snapshot = sandbox.snapshot()
        assert snapshot.image_digest == image.digest()
        moved = dataclasses.replace(snapshot, image_digest="sha256:" + "0" * 64)
        with pytest.raises(SandboxError, match="allow_image_change"):
            Sandbox.restore(moved).open()
        with Sandbox.restore(moved, allow_image_change=True) as resumed:
            assert resumed.read_file("state.txt") == b"kept"
    finally:
        import shutil

        shutil.rmtree(Path("/var/tmp") / f"sbx-img-{os.getpid()}", ignore_errors=True)


def test_runs_from_several_threads_on_one_sandbox_take_turns():
    import threading

    results: dict[int, str] = {}
    with Sandbox(SandboxSpec()) as sandbox:

        def call(n: int) -> None:
            out = sandbox.run(["sh", "-c", f"echo {n} >> log; sleep 0.1; echo {n}"])
            results[n] = out.stdout

        threads = [threading.Thread(target=call, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        log = sandbox.read_file("log").decode().split()
    assert results == {n: f"{n}\n" for n in range(4)}
    assert sorted(log) == ["0", "1", "2", "3"]


def _run_until_closed(sandbox: Sandbox, argv: list[str]) -> None:
    """A run the test ends by closing the sandbox: killed, or refused if the close came first."""
    with contextlib.suppress(SandboxError):
        sandbox.run(argv)


def _cgroup_lines(pid: int) -> dict[str, str]:
    """/proc/PID/cgroup as {controller: path} (v1 lines name one or more controllers)."""
    paths: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else ["unified"]:
            paths[controller] = path
    return paths


@pytest.mark.parametrize("supervise", ["never", "always"])
def test_a_run_and_the_children_it_spawns_are_in_every_hierarchy_of_its_sandbox(
    supervise, monkeypatch
):
    """Joining by ``tasks`` (v1) or from outside must still put every process of a run, and
    what it forks, in each of the sandbox's groups (memory: the run's own child group)."""
    import threading

    from sandboxes.cgroups import cgroup_mounts

    monkeypatch.setenv("SANDBOXES_SUPERVISE", supervise)
    v1, v2 = cgroup_mounts()
    sandbox = Sandbox(SandboxSpec(timeout_s=60)).open()
    runner: threading.Thread | None = None  # the skip below comes before it exists
    try:
        group = sandbox._require().cgroup  # type: ignore[attr-defined]
        if group is None:
            pytest.skip("no cgroup here")
        runner = threading.Thread(
            target=_run_until_closed, args=(sandbox, ["sh", "-c", "sleep 60 & sleep 61; wait"])
        )
        runner.start()
        sleepers: set[int] = set()
        deadline = time.monotonic() + 10
        while len(sleepers) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
            sleepers = set()
            for pid in group.pids():
                with contextlib.suppress(OSError):
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                        sleepers.add(pid)
        assert len(sleepers) == 2, "the run's child and grandchild never showed up"
        everyone = group.pids()
        assert sleepers <= everyone
        for pid in everyone:
            lines = _cgroup_lines(pid)
            for controller, directory in group.dirs.items():
                mount = v2 if controller == "unified" else v1[controller]
                assert mount is not None
                expected = "/" + str(directory.relative_to(mount))
                where = lines[controller if controller != "unified" else "unified"]
                assert where == expected or where.startswith(expected + "/"), (
                    pid,
                    controller,
                    where,
                )
            if "memory" in group.dirs and pid in sleepers:
                assert lines["memory"].startswith(
                    "/" + str(group.dirs["memory"].relative_to(v1["memory"])) + "/run-"
                )
    finally:
        sandbox.close()
        if runner is not None:
            runner.join(timeout=20)
    assert_nothing_left(sandbox.name)


@pytest.mark.parametrize("launcher", ["built", "shell"])
@pytest.mark.parametrize("supervise", ["never", "always"])
def test_bwrap_starts_with_the_sandbox_ids_limits_and_no_capabilities(
    supervise, launcher, monkeypatch
):
    """The launch (``sandbox-launch``, or a shell and setpriv; no Python preexec_fn) gives
    what the preexec_fn gave."""
    from sandboxes import bwrap
    from sandboxes.workspace import sandboxes_root

    monkeypatch.setenv("SANDBOXES_SUPERVISE", supervise)
    if launcher == "shell":
        monkeypatch.setenv("SANDBOXES_LAUNCHER", "shell")
    elif bwrap.launch_binary(sandboxes_root()) is None:
        pytest.skip("no C compiler here: the shell launch is the only one")
    spec = SandboxSpec(open_files=77, disk_mb=3)
    with Sandbox(spec) as sandbox:
        result = sandbox.run(["cat", "/proc/self/status", "/proc/self/limits"])
    lines = result.stdout.splitlines()
    fields = dict(line.split(":", 1) for line in lines if line.startswith(("Groups", "Cap")))
    limits = {line[:26].strip(): line[26:].split()[:2] for line in lines}
    assert limits["Max open files"] == ["77", "77"]
    assert limits["Max file size"] == [str(3 * 2**20)] * 2
    assert limits["Max core file size"] == ["0", "0"]
    assert fields["CapEff"].strip() == fields["CapPrm"].strip() == "0000000000000000"
    if os.geteuid() == 0:
        # Inside the user namespace the ids show as the mapped ones; outside they are nobody's.
        assert fields["Groups"].strip() == ""
    assert result.exit_code == 0


@pytest.mark.parametrize("launcher", ["built", "shell"])
def test_bwrap_never_starts_when_joining_its_cgroup_fails(launcher, monkeypatch, tmp_path):
    """A launch whose cgroup join fails stops before bwrap: nothing runs outside the group."""
    from sandboxes.cgroups import RunMark

    monkeypatch.setenv("SANDBOXES_PRESTART", "0")  # a bwrap started for the run: begin_run
    if launcher == "shell":
        monkeypatch.setenv("SANDBOXES_LAUNCHER", "shell")
    with Sandbox(SandboxSpec()) as sandbox:
        driver = sandbox._require()  # type: ignore[attr-defined]
        real_begin = driver.cgroup.begin_run

        def broken_begin(name: str, memory_mb: int) -> RunMark:
            mark = real_begin(name, memory_mb)
            mark.procs_paths = [*mark.procs_paths, os.fsencode(tmp_path / "absent" / "tasks")]
            return mark

        monkeypatch.setattr(driver.cgroup, "begin_run", broken_begin)
        with pytest.raises(SandboxError, match="could not set up the sandbox"):
            sandbox.run(["touch", "/work/ran"])
        monkeypatch.setattr(driver.cgroup, "begin_run", real_begin)
        assert sandbox.run(["ls", "/work"]).stdout == ""
    assert_nothing_left(sandbox.name)


def test_a_bwrap_started_ahead_never_starts_when_joining_its_cgroup_fails(monkeypatch, tmp_path):
    """The same for a spare's bwrap started ahead: its launch stops before bwrap, and the
    sandbox's first run fails as a launch on the spot would (it joins the same groups)."""
    from sandboxes.cgroups import CgroupV1Group, CgroupV2Group, RunMark, manager
    from tests.sandboxes.conftest import open_started_ahead, skip_unless_sandboxes_start_ahead

    skip_unless_sandboxes_start_ahead()
    group_class = CgroupV1Group if manager().version == 1 else CgroupV2Group
    real_begin = group_class.begin_run

    def broken_begin(self: object, name: str, memory_mb: int) -> RunMark:
        mark = real_begin(self, name, memory_mb)  # type: ignore[arg-type]
        mark.procs_paths = [*mark.procs_paths, os.fsencode(tmp_path / "absent" / "tasks")]
        return mark

    monkeypatch.setattr(group_class, "begin_run", broken_begin)
    spec = SandboxSpec(memory_mb=97)  # a shape of its own: its spares are made broken
    sandbox = open_started_ahead(spec)
    with sandbox:
        with pytest.raises(SandboxError, match="could not set up the sandbox"):
            sandbox.run(["touch", "/work/ran"])
        monkeypatch.setattr(group_class, "begin_run", real_begin)
        assert sandbox.run(["ls", "/work"]).stdout == ""
    assert_nothing_left(sandbox.name)


def test_bwrap_is_launched_without_a_python_preexec_fn(monkeypatch):
    """A preexec_fn makes subprocess fork the whole host process instead of vfork."""
    from sandboxes import bwrap

    calls: list[dict[str, object]] = []
    real_popen = subprocess.Popen

    def spy(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        calls.append(kwargs)
        return real_popen(*args, **kwargs)  # type: ignore[call-overload, no-any-return]

    monkeypatch.setattr(bwrap.subprocess, "Popen", spy)
    if os.geteuid() == 0 and bwrap.setpriv_path() is None:
        pytest.skip("no setpriv here: a root caller falls back to a preexec_fn")
    with Sandbox(SandboxSpec()) as sandbox:
        assert sandbox.run(["true"]).exit_code == 0
        assert sandbox.run(["true"]).exit_code == 0  # the supervisor's launch
    assert calls and all("preexec_fn" not in kwargs for kwargs in calls)


@pytest.mark.parametrize("supervise", ["never", "always"])
def test_the_spec_environment_reaches_the_command_but_not_the_launch_or_bwrap(
    supervise, monkeypatch
):
    """The launch shell runs as root: a spec's LD_PRELOAD must not load anything into it.

    The process that sets the sandbox up is bwrap, or with ``SANDBOXES_LAUNCHER=native`` the
    launcher itself (the monitor outside the namespaces)."""
    import threading

    from sandboxes.bwrap import bwrap_path, launch_binary, launcher_mode
    from sandboxes.workspace import sandboxes_root

    setup = bwrap_path()
    if launcher_mode() == "native":
        setup = launch_binary(sandboxes_root()) or setup
    monkeypatch.setenv("SANDBOXES_SUPERVISE", supervise)
    spec = SandboxSpec(timeout_s=60, env={"SANDBOX_MARK": "spec-variable", "LD_PRELOAD": ""})
    sandbox = Sandbox(spec).open()
    try:
        group = sandbox._require().cgroup  # type: ignore[attr-defined]
        runner = threading.Thread(target=_run_until_closed, args=(sandbox, ["sleep", "60"]))
        runner.start()
        environs: dict[str, bytes] = {}
        deadline = time.monotonic() + 10
        while len(environs) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
            for pid in group.pids():
                with contextlib.suppress(OSError):
                    program = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    if program in (os.fsencode(setup), b"sleep"):
                        environs[os.fsdecode(program)] = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"SANDBOX_MARK=spec-variable" in environs["sleep"]
        assert b"SANDBOX_MARK" not in environs[setup]
        assert b"LD_PRELOAD" not in environs[setup]
    finally:
        sandbox.close()
        runner.join(timeout=20)
    assert_nothing_left(sandbox.name)


def test_the_janitor_also_reaps_dead_owners_workspaces_under_the_old_disk_root(
    tmp_path, monkeypatch
):
    """The default root moved to /dev/shm; what older code's dead owners left on disk goes."""
    from sandboxes import janitor, workspace

    monkeypatch.delenv("SANDBOXES_ROOT", raising=False)
    monkeypatch.setattr(workspace, "DISK_ROOT", tmp_path / "disk-root")
    monkeypatch.setattr(workspace, "_default_root", lambda: tmp_path / "memory-root")
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / "disk-root" / f"sb-{dead.pid}-1-0123abcd"
    (left / "work").mkdir(parents=True)
    alive = tmp_path / "disk-root" / f"sb-{os.getpid()}-1-0123abcd"
    alive.mkdir()
    assert workspace.roots_to_reap() == [tmp_path / "memory-root", tmp_path / "disk-root"]
    assert left.name in janitor.reap_stale()
    assert not left.exists() and alive.exists()


def _skip_unless_a_launcher_can_be_built_in(tmp_path: Path) -> None:
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the shell launch is the only one")
    if os.statvfs(tmp_path).f_flag & os.ST_NOEXEC:
        # A launcher is built there, but a noexec root is never used (the shell launch is:
        # test_a_root_where_nothing_may_execute_falls_back_to_the_shell_launch).
        pytest.skip("pytest's temporary directory is noexec here: no launcher runs from it")


def test_a_planted_launcher_binary_is_never_executed(tmp_path):
    """The launcher runs as root: a file at its name that others could write is built over."""
    import hashlib

    from sandboxes import bwrap

    _skip_unless_a_launcher_can_be_built_in(tmp_path)
    root = tmp_path / "root"
    root.mkdir(mode=0o711)
    digest = hashlib.sha256(bwrap.LAUNCH_SOURCE.read_bytes()).hexdigest()[:16]
    planted = root / f"sandbox-launch-{digest}"
    planted.write_text("#!/bin/sh\ntouch /tmp/owned\n")
    planted.chmod(0o777)
    built = bwrap.launch_binary(root)
    assert built == str(planted)
    assert planted.read_bytes()[:4] == b"\x7fELF"
    assert planted.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in root.iterdir()] == [planted.name]  # no staging file left
    # It refuses what it is not told to run: no relative program, no unknown option.
    refused = subprocess.run([built, "--", "true"], capture_output=True, text=True, check=False)
    assert refused.returncode == 125 and "absolute" in refused.stderr
    refused = subprocess.run(
        [built, "--bogus", "--", "/bin/true"], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 125 and "bad argument" in refused.stderr


def test_one_launcher_per_source_is_reused_and_old_ones_are_removed(tmp_path, monkeypatch):
    """The launcher's name is its source's hash: every process reuses the one file, and what
    older sources and dead builds left in the root goes (at a build, and with the janitor)."""

    from sandboxes import bwrap, janitor

    _skip_unless_a_launcher_can_be_built_in(tmp_path)
    root = tmp_path / "root"
    root.mkdir(mode=0o711)
    dead = subprocess.Popen(["true"])
    dead.wait()
    old = time.time() - 2 * bwrap.STALE_LAUNCHER_S
    unused = root / "sandbox-launch-0123456789abcdef"  # another source, nobody started it lately
    recent = root / "sandbox-launch-fedcba9876543210"  # another source, in use elsewhere
    dead_build = root / f".sandbox-launch-{dead.pid}-1"  # a build killed half-way
    live_build = root / f".sandbox-launch-{os.getpid()}-99"  # a build still going
    for path in (unused, recent, dead_build, live_build):
        path.write_bytes(b"\x7fELF")
    os.utime(unused, (old, old))
    built = bwrap.launch_binary(root)
    assert built is not None
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [Path(built).name, recent.name, live_build.name]
    )
    # Another process (a new cache) reuses the file as it is: no build, same inode.
    inode = os.stat(built).st_ino
    bwrap._launch_binary.cache_clear()
    assert bwrap.launch_binary(root) == built
    assert os.stat(built).st_ino == inode
    # Removed under a process that uses it: the next launch builds it again.
    os.unlink(built)
    assert bwrap.launch_binary(root) == built
    assert os.path.exists(built)
    # The janitor removes a version nobody started using for an hour, never the current one.
    os.utime(recent, (old, old))
    os.utime(built, (old, old))
    monkeypatch.setenv("SANDBOXES_ROOT", str(root))
    assert recent.name in janitor.reap_stale()
    assert sorted(p.name for p in root.iterdir()) == sorted([Path(built).name, live_build.name])


def test_close_kills_every_process_before_it_returns_and_the_reaper_removes_the_rest():
    """Closing hands the removal to the reaper, but not before every process has its SIGKILL."""
    from sandboxes import reaper

    sandbox = Sandbox(SandboxSpec()).open()
    sandbox.run(["true"])
    sandbox.run(["true"])  # a supervisor (Python, in its pid namespace) and its bwrap now live
    group = sandbox._require().cgroup  # type: ignore[attr-defined]
    pids = group.pids()
    assert len(pids) >= 2
    sandbox.close()
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            flags = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[6])
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone already
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        pending = int(fields["ShdPnd"], 16) | int(fields["SigPnd"], 16)
        dying = (
            fields["State"].startswith(("Z", "X"))
            or pending & (1 << (signal.SIGKILL - 1))
            or flags & 0x4  # PF_EXITING: the SIGKILL was taken and it is on its way out
        )
        assert dying, f"process {pid} of a closed sandbox is not dying: {fields['State']}"
    assert reaper.drain(timeout=30)
    assert_nothing_left(sandbox.name)


def test_a_root_where_nothing_may_execute_falls_back_to_the_shell_launch(monkeypatch):
    """On a ``noexec`` root the launcher could not run (nor be the init): the shell launch is."""
    import shutil

    from sandboxes import bwrap, workspace

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the shell launch is the only one")
    # Where the sandbox uid can reach it (pytest's tmp_path is private to root).
    root = Path("/dev/shm") / f"sandboxes-noexec-test-{os.getpid()}"  # noqa: S108
    root.mkdir(mode=0o711)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=8m", "tmpfs", str(root)], check=True)
    os.chmod(root, 0o711)  # noqa: S103 - the sandbox uid passes through, as for the real root
    try:
        assert bwrap.launch_binary(root) is None
        monkeypatch.setenv("SANDBOXES_ROOT", str(root))
        with Sandbox(SandboxSpec(allow_weaker=["disk_limit"])) as sandbox:
            result = sandbox.run(["echo", "ran"])
            assert result.stdout == "ran\n", result
    finally:
        from sandboxes import reaper

        reaper.drain(timeout=30)
        workspace.unmount(root)
        root.rmdir()


def test_a_spare_made_ahead_serves_one_sandbox_once_and_is_as_fresh_as_a_new_one():
    """``open()`` takes storage made ahead (sandboxes.spares): never used, never shared."""
    from sandboxes import reaper, spares
    from sandboxes.workspace import sandboxes_root

    spec = SandboxSpec(memory_mb=96, disk_mb=16)
    with Sandbox(spec) as first:
        first.write_files({"mine.txt": "first's"})
        assert first.run(["sh", "-c", "echo x > /tmp/t; echo y > /dev/shm/s"]).exit_code == 0
    assert reaper.drain(timeout=30)  # the spare for this shape is made by now
    made = [p.name for p in sandboxes_root().iterdir() if p.name.startswith(f"sb-{os.getpid()}-")]
    second = Sandbox(spec)
    planned = second.name
    with second:
        assert second.name != planned and second.name in made  # it took the spare
        listing = second.run(["ls", "-A", "/work", "/tmp", "/dev/shm"])
        assert listing.stdout == "/dev/shm:\n\n/tmp:\n\n/work:\n"
        pid = os.fork()
        if pid == 0:  # a forked child never gets its parent's spares
            os._exit(0 if not spares._spares else 1)
        assert os.waitpid(pid, 0)[1] == 0
    assert_nothing_left(first.name)
    assert_nothing_left(second.name)
    spares.discard_all()
    assert not [p for p in sandboxes_root().iterdir() if p.name.startswith(f"sb-{os.getpid()}-")]
