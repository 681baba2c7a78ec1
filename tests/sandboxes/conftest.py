"""Fixtures for the sandboxes tests: a canary secret in the host environment and a host check.

Every test that opens a sandbox can call ``assert_nothing_left(name)`` after closing it: no
cgroup directory, no workspace, no mount and no process (by cgroup or by marker) remain.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

CANARY = f"canary-secret-{uuid.uuid4().hex}"
os.environ["SANDBOX_TEST_CANARY_SECRET"] = CANARY
os.environ.setdefault("SANDBOXES_CGROUP_PARENT", f"sandboxes-test-{os.getpid()}")


def _cgroup_dirs(name: str) -> list[Path]:
    from sandboxes.cgroups import _parent_name, cgroup_mounts

    v1, v2 = cgroup_mounts()
    mounts = set(v1.values()) | ({v2} if v2 else set())
    return [m / _parent_name() / name for m in mounts]


def leftovers(name: str, marker: str | None = None) -> list[str]:
    """What a sandbox called ``name`` left on the host (empty when nothing), once the reaper
    has removed what closed sandboxes handed it."""
    from sandboxes import reaper
    from sandboxes.workspace import sandboxes_root

    assert reaper.drain(timeout=30), "the reaper did not finish removing closed sandboxes"

    found = [f"cgroup {p}" for p in _cgroup_dirs(name) if p.exists()]
    workspace = sandboxes_root() / name
    if workspace.exists():
        found.append(f"workspace {workspace}")
    if name in Path("/proc/self/mounts").read_text():
        found.append(f"mount of {name}")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cgroups = (proc / "cgroup").read_text()
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state in ("Z", "X"):
            # Dead already; only its parent's wait() is missing (an owner we SIGKILLed leaves
            # its bwrap to the machine's pid 1, which may reap late).
            continue
        if name in cgroups or (marker is not None and marker in cmdline):
            found.append(f"process {proc.name}: {cmdline!r}")
    return found


def skip_unless_sandboxes_start_ahead() -> None:
    """Sandboxes are started ahead only with the compiled launcher (its init waits for the
    first command), the shell launch has none, and only while ``SANDBOXES_PRESTART`` allows."""
    from sandboxes.bwrap import launch_binary, prestart_enabled
    from sandboxes.workspace import sandboxes_root

    if not prestart_enabled():
        pytest.skip("SANDBOXES_PRESTART=0: nothing is started ahead")
    if launch_binary(sandboxes_root()) is None:
        pytest.skip("no C compiler here: no init waits for a command, nothing is started ahead")


def open_started_ahead(spec):  # type: ignore[no-untyped-def]
    """An open sandbox of ``spec`` that took a spare whose bwrap was started ahead and waits
    for its first command (``sandboxes.bwrap.Prestarted``); skips where none can be."""
    from sandboxes import Sandbox, reaper

    skip_unless_sandboxes_start_ahead()
    Sandbox(spec).open().close()  # spares of this shape are made (at open if none, and close)
    assert reaper.drain(timeout=30)
    sandbox = Sandbox(spec).open()
    if sandbox._require()._prestarted is None:
        sandbox.close()  # not left open for the next tests to find as a leftover
        pytest.fail("no spare started ahead was ready")
    return sandbox


def assert_nothing_left(name: str, marker: str | None = None) -> None:
    left = leftovers(name, marker)
    assert not left, f"sandbox {name} left behind: {left}"


@pytest.fixture
def canary() -> str:
    return CANARY


@pytest.fixture(scope="session", autouse=True)
def _cgroup_parent_removed_at_end():
    yield
    import gc

    from sandboxes import reaper, spares
    from sandboxes.cgroups import _parent_name, cgroup_mounts

    # Unreachable rubrics close their zygotes when collected; collect before judging (once the
    # reaper has removed what closing handed it; spares made ahead are this process's own).
    gc.collect()
    spares.discard_all()
    assert reaper.drain(timeout=30), "the reaper did not finish removing closed sandboxes"

    v1, v2 = cgroup_mounts()
    for mount in set(v1.values()) | ({v2} if v2 else set()):
        parent = mount / _parent_name()
        if parent.is_dir() and _parent_name().startswith("sandboxes-test-"):
            children = [p for p in parent.iterdir() if p.is_dir()]
            assert not children, f"cgroups left under {parent}: {children}"
            parent.rmdir()


def sandboxes_of_this_process() -> list[str]:
    """Workspaces and cgroups still present that this test process created (once the reaper
    has removed what closed sandboxes handed it, and without the spares made ahead, which no
    sandbox used)."""
    from sandboxes import reaper, spares
    from sandboxes.cgroups import _parent_name, cgroup_mounts
    from sandboxes.workspace import sandboxes_root

    spares.discard_all()
    assert reaper.drain(timeout=30), "the reaper did not finish removing closed sandboxes"

    prefix = f"sb-{os.getpid()}-"
    found = []
    root = sandboxes_root()
    if root.is_dir():
        found += [str(p) for p in root.iterdir() if p.name.startswith(prefix)]
    v1, v2 = cgroup_mounts()
    for mount in set(v1.values()) | ({v2} if v2 else set()):
        parent = mount / _parent_name()
        if parent.is_dir():
            found += [str(p) for p in parent.iterdir() if p.name.startswith(prefix)]
    return found


_MACHINE_INDEPENDENT = {"test_spec.py", "test_oci.py"}


@pytest.fixture(autouse=True)
def _machine_provides_every_defence(request):
    """Skips, naming what is missing, on a machine that cannot run full-strength sandboxes.

    (This one runs as root with cgroup v1, bubblewrap and user namespaces: nothing is
    skipped here.) The spec and OCI-command tests need none of it and always run.
    """
    if Path(str(request.node.fspath)).name in _MACHINE_INDEPENDENT:
        return
    import shutil

    from sandboxes.cgroups import manager

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (scripts/bootstrap.sh installs it)")
    missing = {k: v for k, v in manager().missing.items()}
    if os.geteuid() != 0:
        missing.setdefault("disk_limit", "a size-limited tmpfs needs root")
    if missing:
        pytest.skip(f"this machine lacks sandbox defences: {missing}")
