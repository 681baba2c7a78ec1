"""Sandboxes: latency, pool throughput, snapshot/restore — each next to a same-run baseline.

    .venv/bin/python bench/bench_sandboxes.py [--iterations 100] [--pool-runs 256] [--host-mb 0]

1. create + run(["python3", "-c", "pass"]) + destroy, against a bare ``subprocess.run`` of
   the same command (interleaved, so both see the same load): p50, p99 and the p50 ratio.
2. ``--pool-runs`` short Python runs through a SandboxPool (one thread per slot): runs/s,
   failures and leftovers, against the same number of bare runs at the same concurrency
   (bare before and after, averaged), for a fresh sandbox per run and for a recycling pool
   (``SandboxPool(recycle=True)``: a reset sandbox per run).
3. Snapshot (to a file) and restore (into a new sandbox) of a 10 MB work directory.
4. ``--evaluations`` HumanEval-style unit-test evaluations (a candidate function plus a
   call-side harness that prints what the calls return; the judge compares on the host) through
   ``PythonZygote``s, one per slot, against a bare ``subprocess.run(["python3", "-I", ...])``
   of the same files at the same concurrency.

**Fair baseline.** The sandboxes' processes sit under one parent cgroup weighted as
``SANDBOXES_CPU_WEIGHT`` busy tasks (one per core by default), where the bench's own nice level
does not reach; a bare child of the bench ran at the bench's priority (``nice -n 19``, as
benches are run on this shared machine), so under load the sandboxes got more CPU than the
bare processes they were compared with. The bench now runs in a cgroup of its own with the
sandboxes' weight, and both sides inside it (``BenchGroups``): the bare processes with the
bench's process, the sandboxes under it; against the machine's other work both sides have
the same share. Each bare baseline is also taken **as before** (the bench's thread steps out
to where it started, at its own priority), and wall-time ratios are printed against both:
"fair" is the one to quote. CPU-per-run ratios (host process and every process started for
the run, load-independent) are printed next to them.

``--host-mb`` keeps that much memory resident in this process first (a trainer or worker
that imported torch holds GBs): anything that forks the host pays for it, vfork does not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sandboxes import PythonZygote, Sandbox, SandboxPool, SandboxSpec, Snapshot, reaper, spares
from sandboxes.bwrap import launcher_mode
from sandboxes.workspace import sandboxes_root

COMMAND = ["python3", "-c", "pass"]
BARE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def bare_run() -> None:
    subprocess.run(COMMAND, env=BARE_ENV, check=True)


class BenchGroups:
    """The bench and its sandboxes in one cgroup, so both sides get the same CPU share.

    ``sandboxes-bench-<pid>`` (weighted as the sandboxes' parent is by default,
    ``SANDBOXES_CPU_WEIGHT``) holds two groups of equal weight: ``host``, where this process,
    its threads and so its bare children run, and ``sandboxes``, the sandboxes' parent (its
    CPU counter holds this bench's sandboxes alone). Against the machine's other work the bench
    then has one share whichever side is running; inside, the host's Python and the sandboxes
    split it. ``outside()`` runs a block where the process was before (at the bench's own
    priority, where nice reaches): the unfair baseline the bench used before, kept for
    comparison. A sandbox's own CPU quota (one core by default) cannot bind the
    single-threaded commands timed here, so only the weight differed between the two sides.
    """

    def __init__(self) -> None:
        from sandboxes.cgroups import V1_CONTROLLERS, cgroup_mounts, sandboxes_cpu_weight

        self.name = f"sandboxes-bench-{os.getpid()}"
        v1, v2 = cgroup_mounts()
        mine: dict[str, str] = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                mine[controller] = path.lstrip("/")
        self.made: list[Path] = []  # removed in reverse
        self.host: list[Path] = []
        self.home: list[Path] = []
        forced = os.environ.get("SANDBOXES_CGROUP_VERSION")
        self.version = 1 if ("memory" in v1 or "pids" in v1) and forced != "2" else 2
        if self.version == 1:
            shares = str(min(262_144, max(2, round(1024 * sandboxes_cpu_weight()))))
            for controller in V1_CONTROLLERS:
                if controller in v1:
                    self._make(v1[controller] / self.name)
            for controller in ("cpu", "cpuacct"):
                if controller in v1:
                    host = self._make(v1[controller] / self.name / "host")
                    if controller == "cpu":
                        (host.parent / "cpu.shares").write_text(shares)
                        host.joinpath("cpu.shares").write_text(shares)
                    self.host.append(host)
                    self.home.append(v1[controller] / mine[controller])
        elif v2 is not None and not mine.get("", "x"):  # a v2 tree of our own only at its root
            weight = str(min(10_000, max(1, round(100 * sandboxes_cpu_weight()))))
            enable = " ".join(
                f"+{c}"
                for c in ("cpu", "memory", "pids")
                if c in (v2 / "cgroup.controllers").read_text().split()
            )
            (v2 / "cgroup.subtree_control").write_text(enable)
            base = self._make(v2 / self.name)
            (base / "cgroup.subtree_control").write_text(enable)
            host = self._make(base / "host")
            if (base / "cpu.weight").exists():
                (base / "cpu.weight").write_text(weight)
                (host / "cpu.weight").write_text(weight)
            self.host.append(host)
            self.home.append(v2)
        if not self.host:
            raise SystemExit("no cgroup of our own to run the bench in (needs root)")
        self._move(self.host, whole=True)
        os.environ["SANDBOXES_CGROUP_PARENT"] = f"{self.name}/sandboxes"

    def _make(self, path: Path) -> Path:
        path.mkdir()
        self.made.append(path)
        return path

    def _move(self, groups: list[Path], whole: bool = False) -> None:
        # v1 moves one thread (``tasks`` takes a thread id; the children it starts and the
        # threads it creates inherit its group); v2 (no threaded groups here) the process.
        for group in groups:
            if self.version == 1 and not whole:
                (group / "tasks").write_text(str(threading.get_native_id()))
            else:
                (group / "cgroup.procs").write_text(str(os.getpid()))

    @contextlib.contextmanager
    def outside(self):
        self._move(self.home)
        try:
            yield
        finally:
            self._move(self.host)

    def remove(self) -> None:
        from sandboxes.cgroups import manager

        self._move(self.home, whole=True)
        reaper.drain()
        spares.discard_all()  # their cgroups sit under the sandboxes' parent
        reaper.drain()
        cgroups = manager()
        for parent in [*cgroups._v1_parents.values(), cgroups._v2_parent]:
            if parent is not None:
                with contextlib.suppress(OSError):
                    parent.rmdir()
        for path in reversed(self.made):
            with contextlib.suppress(OSError):
                path.rmdir()


def sandbox_run(spec: SandboxSpec) -> None:
    with Sandbox(spec) as sandbox:
        result = sandbox.run(COMMAND)
    if result.exit_code != 0:
        raise RuntimeError(result)


def sandboxes_cpu() -> float:
    """CPU seconds of every process in this bench's sandboxes (bwrap, supervisors, commands):
    their parent cgroup's counter, since a supervisor killed at close is never waited for."""
    from sandboxes.cgroups import manager

    cgroups = manager()
    if "cpuacct" in cgroups._v1_parents:
        return int((cgroups._v1_parents["cpuacct"] / "cpuacct.usage").read_text()) / 1e9
    if cgroups._v2_parent is not None:
        for line in (cgroups._v2_parent / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    return 0.0


def kernel_threads_cpu() -> dict[int, float]:
    """CPU seconds of each kernel thread of the machine (kworkers, ksoftirqd, rcu...): work no
    process is charged for, such as tearing down namespaces and cgroups. Machine-wide, so it
    also holds other processes' share: compare phases of the same run only."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[6]) & 0x00200000:  # PF_KTHREAD
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def kernel_threads_since(before: dict[int, float]) -> float:
    # Per thread: kworkers come and go, and a gone one's CPU must not count as negative.
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in kernel_threads_cpu().items())


def cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def latency(iterations: int, fair: BenchGroups) -> None:
    spec = SandboxSpec(memory_mb=128, timeout_s=10)
    for _ in range(5):  # warm caches on both sides
        bare_run()
        sandbox_run(spec)
    fair_bare: list[float] = []
    bare: list[float] = []
    boxed: list[float] = []
    steps: list[float] = []
    bare_cpu = boxed_cpu = step_cpu = 0.0
    episode = Sandbox(spec).open()
    episode.run(COMMAND)  # an episode's first step starts it; the steps measured come after
    for _ in range(iterations):
        start, own, kids = time.perf_counter(), cpu_self(), cpu_children()
        bare_run()
        fair_bare.append(time.perf_counter() - start)
        bare_cpu += cpu_self() - own + cpu_children() - kids
        with fair.outside():  # at the bench's own priority, as before (the same CPU)
            start = time.perf_counter()
            bare_run()
            bare.append(time.perf_counter() - start)
        start, own, kids = time.perf_counter(), cpu_self(), cpu_children()
        sandbox_run(spec)
        boxed.append(time.perf_counter() - start)
        # The caller's wait ends there; the CPU goes on until the reaper thread has removed
        # the closed sandbox and made the next one's storage, which counts here too.
        reaper.drain()
        # Host-side Python plus every process of the launch, each waited for (the launch
        # chain and bwrap by us, the sandbox's init by bwrap, the command by the init), as
        # for bare: so the cost of starting bwrap (a fork of this process, or the launcher's
        # execs) counts wherever it runs, inside the cgroup or not.
        boxed_cpu += cpu_self() - own + cpu_children() - kids
        # One step of a multi-step episode: a run in a sandbox that is already open.
        start, own = time.perf_counter(), cpu_self()
        step = episode.run(COMMAND)
        steps.append(time.perf_counter() - start)
        step_cpu += cpu_self() - own + (step.cpu_s or 0.0)
    episode.close()
    f50, f99 = percentile(fair_bare, 50) * 1000, percentile(fair_bare, 99) * 1000
    b50, b99 = percentile(bare, 50) * 1000, percentile(bare, 99) * 1000
    s50, s99 = percentile(boxed, 50) * 1000, percentile(boxed, 99) * 1000
    r50, r99 = percentile(steps, 50) * 1000, percentile(steps, 99) * 1000
    bare_ms, boxed_ms = bare_cpu / iterations * 1000, boxed_cpu / iterations * 1000
    step_ms = step_cpu / iterations * 1000
    print(f"latency ({iterations} each, interleaved)")
    print(f"  bare, fair (same share)            p50 {f50:6.1f} ms  p99 {f99:6.1f} ms")
    print(f"  bare, at the bench's priority      p50 {b50:6.1f} ms  p99 {b99:6.1f} ms")
    print(f"  sandbox create+run+close           p50 {s50:6.1f} ms  p99 {s99:6.1f} ms")
    print(f"  run in an open sandbox (a step)    p50 {r50:6.1f} ms  p99 {r99:6.1f} ms")
    print(
        f"  create+run+close: fair {s50 / f50:.2f}x (as before {s50 / b50:.2f}x; aim <= 1.5x), "
        f"CPU {boxed_ms / bare_ms:.2f}x; p99 {s99:.1f} ms (aim < 60 ms)"
    )
    print(
        f"  episode step:     fair {r50 / f50:.2f}x (as before {r50 / b50:.2f}x; aim <= 1.2x), "
        f"CPU {step_ms / bare_ms:.2f}x"
    )
    print(
        f"  CPU per run (load-independent): bare {bare_ms:.1f} ms, sandbox {boxed_ms:.1f} ms, "
        f"episode step {step_ms:.1f} ms"
    )


def throughput(runs: int, concurrency: int, fair: BenchGroups) -> None:
    def drive(job, count: int) -> tuple[float, int]:
        failures = 0
        lock = threading.Lock()
        remaining = list(range(count))

        def worker() -> None:
            nonlocal failures
            while True:
                with lock:
                    if not remaining:
                        return
                    remaining.pop()
                try:
                    job()
                except Exception:
                    with lock:
                        failures += 1

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start, failures

    spec = SandboxSpec(memory_mb=128, timeout_s=30)

    def through(pool: SandboxPool):
        def pooled() -> None:
            result = pool.run(spec, COMMAND)
            if result.exit_code != 0:
                raise RuntimeError(result)

        return pooled

    kernel: dict[str, float] = {}

    def phase(job_or_pool, label: str = "") -> tuple[float, int, float]:
        """(seconds, failures, CPU seconds of this process and all it started, pool closed);
        the kernel threads' CPU meanwhile goes into ``kernel[label]``."""
        threads = kernel_threads_cpu()
        if isinstance(job_or_pool, SandboxPool):
            before = cpu_self() + sandboxes_cpu()
            with job_or_pool:
                seconds, failures = drive(through(job_or_pool), runs)
            reaper.drain()  # removing the closed sandboxes is part of their CPU
            cpu = cpu_self() + sandboxes_cpu() - before
        else:
            before = cpu_self() + cpu_children()
            seconds, failures = drive(job_or_pool, runs)
            cpu = cpu_self() + cpu_children() - before
        kernel[label] = kernel.get(label, 0.0) + kernel_threads_since(threads)
        return seconds, failures, cpu

    # Fair bare, bare as before, the two pools, then both bare again in the reverse order.
    bare_s, bare_failures, bare_cpu = phase(bare_run, "bare")
    with fair.outside():  # the worker threads start where this one is and stay there
        old_s, old_failures, _ = phase(bare_run)
    pool_s, pool_failures, pool_cpu = phase(SandboxPool(max_active=concurrency), "pool")
    recycled_s, recycled_failures, recycled_cpu = phase(
        SandboxPool(max_active=concurrency, recycle=True), "recycling"
    )
    with fair.outside():
        old_again_s, old_again_failures, _ = phase(bare_run)
    bare_again_s, bare_again_failures, bare_again_cpu = phase(bare_run, "bare")
    bare_s = (bare_s + bare_again_s) / 2
    old_s = (old_s + old_again_s) / 2
    bare_cpu = (bare_cpu + bare_again_cpu) / 2
    bare_failures += bare_again_failures + old_failures + old_again_failures
    reaper.drain()  # closing leaves the removal to the reaper thread
    spares.discard_all()  # storage made ahead for the next sandbox: not a leftover
    prefix = f"sb-{os.getpid()}-"
    root = sandboxes_root()
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(prefix)]

    def per_run(cpu: float) -> str:
        return f"CPU per run {cpu / runs * 1000:.1f} ms ({cpu / bare_cpu:.2f}x)"

    def ratios(seconds: float) -> str:
        return f"fair {bare_s / seconds:.2f}x bare (as before {old_s / seconds:.2f}x)"

    print(f"pool ({runs} runs, {concurrency} at a time)")
    print(
        f"  bare, fair      {runs / bare_s:7.1f} runs/s  failures {bare_failures}  "
        f"(mean of before and after; CPU per run {bare_cpu / runs * 1000:.1f} ms)"
    )
    print(f"  bare, as before {runs / old_s:7.1f} runs/s  (at the bench's priority)")
    print(
        f"  pool      {runs / pool_s:7.1f} runs/s  failures {pool_failures}  "
        f"{ratios(pool_s)} (aim >= 0.8), {per_run(pool_cpu)}; a fresh sandbox per run"
    )
    print(
        f"  recycling {runs / recycled_s:7.1f} runs/s  failures {recycled_failures}  "
        f"{ratios(recycled_s)}, {per_run(recycled_cpu)}; a reset sandbox per run"
    )
    ms = {label: cpu / runs * 1000 for label, cpu in kernel.items()}
    print(
        f"  kernel threads' CPU per run (charged to no process; machine-wide, others' included): "
        f"bare {ms['bare'] / 2:.2f} ms, pool {ms['pool']:.2f} ms, "
        f"recycling {ms['recycling']:.2f} ms"
    )
    print(f"  leftovers {len(leftovers)} (both pools closed)")


def snapshots() -> None:
    spec = SandboxSpec(memory_mb=128, disk_mb=64)
    with Sandbox(spec) as sandbox:
        sandbox.run(
            [
                "sh",
                "-c",
                "mkdir d && head -c 10485760 /dev/urandom > d/blob && "
                "for i in $(seq 100); do echo $i > d/f$i; done",
            ]
        )
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            path = sandbox.snapshot().save(Path(tmp) / "s.snap")
            saved = time.perf_counter() - start
            size = path.stat().st_size
            start = time.perf_counter()
            with Sandbox.restore(Snapshot.load(path)) as restored:
                restored_s = time.perf_counter() - start
                check = restored.run(["sh", "-c", "wc -c < d/blob"]).stdout.strip()
    copy_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "blob").write_bytes(os.urandom(10 * 2**20))
    copy_s = time.perf_counter() - copy_start
    print("snapshot of a 10 MB work dir")
    print(f"  snapshot+save {saved * 1000:6.1f} ms ({size / 2**20:.1f} MB file)")
    print(f"  load+restore  {restored_s * 1000:6.1f} ms (new sandbox included; blob {check} B)")
    print(f"  baseline: writing 10 MB of random bytes to a file {copy_s * 1000:6.1f} ms")


CANDIDATE = """\
from typing import List


def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
"""
#: Call side only: it prints what each call returns; the expected values stay on the host.
HARNESS = """\
namespace = {"__name__": "solution"}
with open("solution.py") as source:
    exec(compile(source.read(), "solution.py", "exec"), namespace)
calls = [
    ([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3),
    ([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05),
    ([1.0, 2.0, 5.9, 4.0, 5.0], 0.95),
    ([1.0, 2.0, 5.9, 4.0, 5.0], 0.8),
    ([1.0, 2.0, 3.0, 4.0, 5.0, 2.0], 0.1),
    ([1.1, 2.2, 3.1, 4.1, 5.1], 1.0),
    ([1.1, 2.2, 3.1, 4.1, 5.1], 0.5),
]
for args in calls:
    print(repr(namespace["has_close_elements"](*args)))
"""
EXPECTED = "True\nFalse\nTrue\nFalse\nTrue\nTrue\nFalse\n"


def evaluations(count: int, concurrency: int) -> None:
    files = {"solution.py": CANDIDATE, "harness.py": HARNESS}
    wrong = 0
    lock = threading.Lock()

    def judge(stdout: str) -> None:
        nonlocal wrong
        if stdout != EXPECTED:
            with lock:
                wrong += 1

    def drive(job, slots: list, n: int) -> float:
        remaining = list(range(n))

        def worker(slot) -> None:
            while True:
                with lock:
                    if not remaining:
                        return
                    remaining.pop()
                job(slot)

        threads = [threading.Thread(target=worker, args=(slot,)) for slot in slots]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text)

        def bare(slot: object) -> None:
            done = subprocess.run(
                ["python3", "-I", "harness.py"],
                env=BARE_ENV,
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
            )
            judge(done.stdout)

        bare(None)
        kids = cpu_children()
        bare_s = drive(bare, [None] * concurrency, count)
        bare_cpu = cpu_children() - kids
    spec = SandboxSpec(memory_mb=256, timeout_s=10)
    zygotes = [PythonZygote(spec).open() for _ in range(concurrency)]
    cpu: list[float] = []

    def zygote_eval(zygote: PythonZygote) -> None:
        result = zygote.evaluate("harness.py", files=files)
        judge(result.stdout)
        with lock:
            cpu.append(result.cpu_s or 0.0)

    for zygote in zygotes:
        zygote_eval(zygote)
    own = cpu_self()
    cpu.clear()
    zygote_s = drive(zygote_eval, zygotes, count)
    host_cpu = cpu_self() - own
    for zygote in zygotes:
        zygote.close()
    pool_count = max(concurrency, count // 4)  # today's rubric path, for reference
    before = cpu_self() + sandboxes_cpu()
    with SandboxPool(max_active=concurrency) as pool:

        def fresh_sandbox(slot: object) -> None:
            result = pool.run(spec, ["python3", "-I", "harness.py"], files=files)
            judge(result.stdout)

        pool_s = drive(fresh_sandbox, [None] * concurrency, pool_count)
    reaper.drain()
    pool_cpu = cpu_self() + sandboxes_cpu() - before
    bare_ms = bare_cpu / count * 1000
    zygote_ms = (sum(cpu) + host_cpu) / count * 1000
    pool_ms = pool_cpu / pool_count * 1000
    print(f"unit-test evaluations ({count} HumanEval-style, {concurrency} at a time)")
    print(
        f"  bare python3 -I    {count / bare_s:7.1f} evals/s (fair), CPU per eval {bare_ms:.1f} ms"
    )
    print(
        f"  PythonZygote       {count / zygote_s:7.1f} evals/s  "
        f"({bare_s / zygote_s:.2f}x bare; aim >= 100/s), CPU per eval {zygote_ms:.1f} ms "
        f"({zygote_ms / bare_ms:.2f}x): {sum(cpu) / count * 1000:.1f} ms in the sandbox + "
        f"{host_cpu / count * 1000:.1f} ms host side"
    )
    print(
        f"  fresh sandbox each {pool_count / pool_s:7.1f} evals/s "
        f"({bare_s / count * pool_count / pool_s:.2f}x bare; "
        f"{pool_count} through a pool), CPU per eval {pool_ms:.1f} ms ({pool_ms / bare_ms:.2f}x)"
    )
    print(f"  wrong verdicts: {wrong} (all paths)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--pool-runs", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=max(2, os.cpu_count() or 1))
    parser.add_argument("--evaluations", type=int, default=400)
    parser.add_argument(
        "--host-mb",
        type=int,
        default=0,
        help="hold this many MB resident in the bench process, as a worker that imported "
        "torch does (what a fork of the host costs grows with it)",
    )
    args = parser.parse_args()
    ballast = bytearray(args.host_mb * 2**20)
    for page in range(0, len(ballast), 4096):
        ballast[page] = 1  # resident, not just reserved
    print(
        "load:",
        os.getloadavg(),
        "cpus:",
        os.cpu_count(),
        f"host ballast: {args.host_mb} MB",
        f"launcher: {launcher_mode()} (SANDBOXES_LAUNCHER)",
    )
    fair = BenchGroups()  # before anything makes the sandboxes' parent
    try:
        latency(args.iterations, fair)
        throughput(args.pool_runs, args.concurrency, fair)
        snapshots()
        evaluations(args.evaluations, args.concurrency)
    finally:
        fair.remove()
    print("load:", os.getloadavg())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
