"""Isolated execution for model-written code and tool calls: no Django, usable on its own.

    from sandboxes import PythonZygote, Sandbox, SandboxPool, SandboxSpec

    with Sandbox(SandboxSpec(memory_mb=256, timeout_s=5)) as sb:
        sb.write_files({"main.py": "print(input())"})
        result = sb.run(["python3", "main.py"], stdin="hi\\n")
        result.stdout, result.exit_code, result.peak_memory_mb

How runs start: a sandbox's first ``run`` is one ``bwrap`` (new namespaces, mounts, seccomp)
whose pid 1 is a one-line shell init. From the second run on, one ``bwrap`` holding a small
supervisor (``sandboxes.inside``, pid 1) stays up for the rest of the sandbox's life and each
command is a ``posix_spawn`` inside its namespaces, in a cgroup of the run's own, started and
reported exactly as on the first path (same ``ExecResult``; when the command's first process
ends, or at the timeout, every process the run started is killed). So an episode's tool steps
cost about what the command costs bare. Starting the supervisor costs about the CPU of one
bwrap run but more wall time on a busy machine (more hand-offs between processes: 28 ms
against 9 ms for one run at a load of 7 on 2 cores), so a sandbox meant for one or two runs
(a sample's code criteria) answers sooner with ``Sandbox(spec, supervise="never")``;
``"always"`` skips the first bwrap run; ``SANDBOXES_SUPERVISE`` sets the default.

Python-only work (unit tests, ``io_tests``, sandboxed user functions) can skip the interpreter
start altogether with a zygote: a pre-imported Python as a sandbox's pid 1 that forks one
child per evaluation (see ``sandboxes.zygote`` for what is and is not shared)::

    with PythonZygote(SandboxSpec(memory_mb=256, timeout_s=5)) as zygote:  # one per core
        result = zygote.evaluate(
            "harness.py",                        # run as ``python3 -I harness.py *args``
            files={"solution.py": candidate, "harness.py": call_side_only},
            stdin=None, timeout=None, env=None,  # as for Sandbox.run
        )
        result.stdout, result.exit_code        # an ExecResult; compare on the host

Each evaluation starts in an empty /work holding the spec's ``files`` and its own, with /tmp
and /dev/shm empty, one at a time per zygote; nothing of the judge (expected values) should
ever be handed to it.

Many short sandboxes (one run each) cost a new set of namespaces each, about twice a bare run's
CPU. ``SandboxPool(recycle=True)`` (opt-in; the default stays a fresh sandbox per acquire)
resets a released sandbox and hands it to the next acquire of the same spec: every process
killed, SysV IPC removed, /work, /tmp and /dev/shm emptied and proven empty, the supervisor's
inherited state checked, no cgroup limit hit; any doubt (a timeout, an OOM kill, a failed
check, ``max_uses`` reached) closes it instead. POSIX message queues are refused there, and
the namespaces' counters (pid and inode numbers, pid 1's CPU and fault counts) go on across
its users, as across a zygote's evaluations (see ``sandboxes.pool``).

What a ``bwrap`` sandbox sees (the default driver):

- ``/usr`` of the host, read-only, with ``/bin``, ``/lib``, ``/lib64``, ``/sbin`` as on the
  host; so ``python3`` is the host's *system* Python (``/usr/bin/python3``, 3.11 here), with
  only the packages installed under ``/usr``. Venvs come from images (``sandboxes.images``),
  mounted read-only at ``/image`` with their own ``PATH``.
- ``/etc`` holds only what programs need to start (loader cache, TLS roots, time zone, the
  Python config) and its own ``passwd``/``group``/``hosts``; no host accounts or secrets.
- ``/work`` (the home and default working directory), ``/tmp`` and ``/dev/shm``: private,
  writable, persisting across the runs of one sandbox, together at most ``disk_mb`` on one tmpfs.
- ``/proc`` of its own pid namespace, a minimal ``/dev``; no ``/sys``, no ``/home``, no ``/root``.
- The environment is only ``PATH``, ``HOME=/work``, ``TMPDIR=/tmp``, ``LANG=C.UTF-8``,
  ``USER`` and the spec's (and image's) ``env`` — nothing from the host's.
- Its own network namespace: no route anywhere; ``network="loopback"`` keeps a private ``lo``
  up, ``"none"`` also forbids creating IP sockets.
- Pid 1 is a one-line ``/bin/sh`` init (``sandboxes.bwrap.INIT_SCRIPT``) that starts the
  command, reaps orphaned zombies while it waits and exits with the command's status; the
  kernel then kills everything left in the pid namespace (daemons included). On later runs
  pid 1 is the supervisor, which cannot be signalled, traced or read from inside (it is the
  namespace's init and not dumpable), and the run's cgroup is killed when its command ends.
- It runs as an unprivileged uid (``nobody`` when the host side is root) in its own user, pid,
  ipc, uts, mount and cgroup namespaces, with no capabilities, no new privileges (bwrap sets
  ``PR_SET_NO_NEW_PRIVS``) and no further user namespaces.

Limits: memory, pids and CPU quota through a cgroup per sandbox (v1 or v2); disk through the
tmpfs size and inode count; RLIMIT_FSIZE, RLIMIT_NOFILE and RLIMIT_CORE=0 as a second fence.
Files in /work and /tmp are tmpfs pages, i.e. memory charged to the sandbox, so the sandbox's
cgroup allows ``memory_mb + disk_mb`` in all while each run's processes sit in a child cgroup
of ``memory_mb`` (what a run writes counts there too; files kept from earlier runs do not).
``pids`` counts bwrap's own two processes as well as the command's. A supervisor has a cgroup
of its own (``SUPERVISOR_MEMORY_MB``, added to the sandbox's total). All sandboxes' groups sit
under one parent that weighs one busy task per core (``SANDBOXES_CPU_WEIGHT``).
A sandbox whose machine lacks one of these refuses to start unless the spec's
``allow_weaker`` names it (``WeakerIsolationError`` says which).
"""

from sandboxes.errors import (
    EngineUnavailableError,
    ImageBuildError,
    SandboxError,
    SandboxPathError,
    SandboxSpecError,
    WeakerIsolationError,
)
from sandboxes.images import ImageSpec, build_image, register_image
from sandboxes.pool import SandboxPool
from sandboxes.result import ExecResult
from sandboxes.sandbox import Sandbox
from sandboxes.snapshot import Snapshot
from sandboxes.spec import DEFENCES, LIMITS, LimitBounds, SandboxSpec
from sandboxes.zygote import PythonZygote

__all__ = [
    "DEFENCES",
    "EngineUnavailableError",
    "ExecResult",
    "ImageBuildError",
    "LIMITS",
    "ImageSpec",
    "LimitBounds",
    "PythonZygote",
    "Sandbox",
    "SandboxError",
    "SandboxPathError",
    "SandboxPool",
    "SandboxSpec",
    "SandboxSpecError",
    "Snapshot",
    "WeakerIsolationError",
    "build_image",
    "register_image",
]
