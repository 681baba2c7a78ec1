"""The host agent: what `manage.py host_agent` runs on every GPU (or CPU) host.

It registers the host with its inventory, writes a heartbeat every HOST_HEARTBEAT_S (for the
host and for each attempt it supervises), and consumes ``host.<name>``. For each attempt it
claims the row, writes the pinned task sets where the job reads them, and starts the job as a
child process group (``manage.py run_attempt``; under ``torchrun`` for several GPUs), never in
the worker itself. It keeps the job's output in the attempt's log, stops a job whose cancel
was not honoured in time, and records a job that died without reporting as failed, with the
end of its output.

The job dies with the agent (``PR_SET_PDEATHSIG`` in the job): a killed agent leaves no orphan
that would keep writing for an attempt the console has already given to another host.

A run on several hosts (a gang) gets one message per host, each naming its node: every
node's agent starts that host's process group, joined to the others by torch.distributed's
rendezvous on node 0's host (the attempt's ``rendezvous``, an address and a port from
RUNS_RENDEZVOUS_PORT_*): ``MASTER_ADDR``/``MASTER_PORT``, ``NNODES``, ``NODE_RANK``, and for a
single-process node ``RANK``/``WORLD_SIZE``; a host with several GPUs runs ``torchrun`` with
``--nnodes``/``--node-rank`` (its static rendezvous: node k holds ranks k*g .. k*g+g-1). Rank 0
(on node 0) reports for the run. Each node's start and exit are recorded (``node.started``,
``node.exited``); a node that dies ends the attempt as a whole (the run goes back to the
queue), and the other nodes' agents then stop their process groups (`gang_stop_reason`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from console.runs import services
from console.runs.models import Attempt, AttemptState, CommandKind, Run, RunState

logger = logging.getLogger(__name__)

HOST_NAME_ENV = "CONSOLE_HOST_NAME"
AGENT_PID_ENV = "CONSOLE_AGENT_PID"

# Attempts this agent process supervises now: id -> job process.
_supervised: dict[int, subprocess.Popen[bytes]] = {}
_supervised_lock = threading.Lock()
_gpus_in_use: set[int] = set()


def host_name() -> str:
    name = os.environ.get(HOST_NAME_ENV)
    if not name:
        raise RuntimeError(f"{HOST_NAME_ENV} is not set: attempts run only in a host agent")
    return name


def inventory() -> dict[str, Any]:
    """GPUs through NVML where the driver is present; CPU cores and memory always."""
    import psutil

    data: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "cpu_cores": os.cpu_count() or 1,
        "memory_mb": psutil.virtual_memory().total // 2**20,
        "gpus": [],
    }
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(handle)
                data["gpus"].append(
                    {
                        "index": index,
                        "name": name.decode() if isinstance(name, bytes) else str(name),
                        "memory_mb": pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20,
                    }
                )
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # no NVML library, no driver, no GPU: a CPU host
        data["gpu_probe"] = f"{type(error).__name__}: {error}"[:300]
    return data


def supervised_ids() -> list[int]:
    with _supervised_lock:
        return list(_supervised)


def heartbeat_forever(name: str, stop: threading.Event) -> None:
    while not stop.wait(settings.HOST_HEARTBEAT_S):
        try:
            services.host_heartbeat(name=name, attempt_ids=supervised_ids())
        except Exception:
            logger.exception("heartbeat failed; retrying")
        finally:
            close_old_connections()


# --- one attempt ----------------------------------------------------------------------------


def write_task_files(run: Run) -> None:
    """The pinned task-set versions, written where the run's spec reads them (once per run:
    the pins never change, so a later attempt finds them written)."""
    from console.registry.models import Task

    pins = {pin["slug"]: pin for pin in run.pins.get("domains", [])}
    for domain in run.spec.get("domains", []):
        pin = pins[domain["name"]]
        for key, split in (("task_source", "train"), ("eval_source", "held_out")):
            source = domain.get(key)
            if not source or source.get("kind") != "jsonl":
                continue
            path = Path(source["path"])
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            # A name of its own: every node of a gang may write the same file at once.
            partial = path.parent / f"{path.name}.{os.getpid()}-{threading.get_ident()}.partial"
            rows = Task.objects.filter(
                domain_id=pin["domain_id"], taskset_version=pin["taskset_version"], split=split
            ).order_by("index")
            with partial.open("w", encoding="utf-8") as handle:
                for task in rows.iterator(chunk_size=2000):
                    handle.write(json.dumps(task_for_training(task), ensure_ascii=False) + "\n")
            partial.replace(path)


def task_for_training(task: Any) -> dict[str, Any]:
    """A registry task as training reads it; ``metadata.task_id`` is the registry's id, which
    each trajectory then carries."""
    data: dict[str, Any] = {}
    if task.prompt:
        data["prompt"] = task.prompt
    if task.messages is not None:
        data["messages"] = task.messages
    data["ground_truth"] = task.ground_truth
    data["metadata"] = {**(task.metadata or {}), "task_id": str(task.pk)}
    return data


def job_command(attempt: Attempt, gpus: list[int], *, node: int = 0, nodes: int = 1) -> list[str]:
    manage = str(Path(settings.BASE_DIR) / "manage.py")
    job = [manage, "run_attempt", str(attempt.pk)]
    if len(gpus) > 1:
        torchrun = shutil.which("torchrun") or "torchrun"
        if nodes > 1:
            address, _, port = attempt.rendezvous.rpartition(":")
            return [
                torchrun, f"--nnodes={nodes}", f"--node-rank={node}",
                f"--nproc-per-node={len(gpus)}", f"--master-addr={address}",
                f"--master-port={port}", *job,
            ]  # fmt: skip
        return [torchrun, "--standalone", f"--nproc-per-node={len(gpus)}", *job]
    return [sys.executable, *job]


def job_environment(
    attempt: Attempt, gpus: list[int], *, name: str, node: int = 0, nodes: int = 1
) -> dict[str, str]:
    """The job's environment: the host's identity (``CONSOLE_HOST_NAME``; and, for the
    training library, which knows nothing of the console, ``TRAINING_HOST_NAME``: what a rank
    may put on what it reports, as two agents on one machine share its hostname), the
    distributed backend, its GPUs, and for a gang the rendezvous."""
    env = {
        **os.environ,
        AGENT_PID_ENV: str(os.getpid()),
        HOST_NAME_ENV: name,
        "TRAINING_HOST_NAME": name,
        "PYTHONUNBUFFERED": "1",
        "TRAINING_DIST_BACKEND": settings.RUNS_DIST_BACKEND,
    }
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    if nodes > 1:
        address, _, port = attempt.rendezvous.rpartition(":")
        env.update(MASTER_ADDR=address, MASTER_PORT=port, NNODES=str(nodes), NODE_RANK=str(node))
        if len(gpus) <= 1:  # one process on this node: it is its own launcher
            env.update(RANK=str(node), LOCAL_RANK="0", WORLD_SIZE=str(nodes), LOCAL_WORLD_SIZE="1")
    return env


def _take_gpus(count: int) -> list[int]:
    with _supervised_lock:
        free = [i for i in range(256) if i not in _gpus_in_use][:count]
        _gpus_in_use.update(free)
        return free


def _give_back_gpus(gpus: list[int]) -> None:
    with _supervised_lock:
        _gpus_in_use.difference_update(gpus)


class _Output:
    """Collects a job's output from its pipe on a thread; `take` returns what is new."""

    def __init__(self, stream: Any) -> None:
        self.chunks: list[str] = []
        self.lock = threading.Lock()
        self.last = ""
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        for raw in iter(lambda: stream.read1(65536), b""):
            text = raw.decode("utf-8", errors="replace")
            with self.lock:
                self.chunks.append(text)
                self.last = (self.last + text)[-4000:]

    def take(self) -> str:
        with self.lock:
            text, self.chunks = "".join(self.chunks), []
        return text


def _should_stop(attempt: Attempt) -> bool:
    """A cancel delivered to the job more than RUN_CANCEL_GRACE_S ago that it did not honour."""
    deadline = timezone.now() - dt.timedelta(seconds=settings.RUN_CANCEL_GRACE_S)
    return (
        attempt.run.commands.filter(kind=CommandKind.CANCEL, created_at__lt=deadline).exists()
        or Run.objects.filter(pk=attempt.run_id, state=RunState.CANCELLED).exists()
    )


def _preempt_requested_at(attempt: Attempt) -> dt.datetime | None:
    """When the scheduler's preemption of this attempt was approved, or None. (An operator's
    preempt command goes through the job's Control alone, as it always has.)"""
    command = (
        attempt.run.commands.filter(
            kind=CommandKind.PREEMPT,
            created_at__gte=attempt.scheduled_at,
            payload__has_key="preemption_request",
        )
        .order_by("created_at")
        .first()
    )
    return command.created_at if command else None


def _preempt_grace_s(run: Run) -> float:
    """The grace period of the run's priority class (SIGTERM, then SIGKILL this much later)."""
    from console.scheduling.services import default_class

    cls = run.priority_class or default_class()
    return float(cls.grace_s)


class _Preemption:
    """The agent's side of a preemption: the job's Control asks it to checkpoint and stop at
    its next step; the agent also sends a single-process job SIGTERM (which the job turns
    into the same preempt), and SIGKILLs the job's process group if it still runs the class's
    grace period later. A job under torchrun gets no SIGTERM first: torchrun answers one by
    tearing its workers down, checkpoint or not, so it stops through its Control alone."""

    def __init__(self, attempt: Attempt, *, ranks: int) -> None:
        self.attempt = attempt
        self.grace_s = _preempt_grace_s(attempt.run)
        self.single_process = ranks <= 1
        self.asked_at: float | None = None
        self.killed = False

    def check(self, process: subprocess.Popen[bytes], now: float) -> None:
        if self.killed:
            return
        if self.asked_at is None:
            if _preempt_requested_at(self.attempt) is None:
                return
            # Only once the job runs: before that its SIGTERM handler may not be installed
            # (the Control delivers the preempt at its first step anyway).
            if not Attempt.objects.filter(pk=self.attempt.pk, state=AttemptState.RUNNING).exists():
                return
            self.asked_at = now
            if self.single_process:
                services.attempt_append_log(self.attempt.pk, "[agent] preempted: SIGTERM\n")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
            return
        if now - self.asked_at >= self.grace_s:
            self.killed = True
            services.attempt_append_log(
                self.attempt.pk,
                f"[agent] still running {self.grace_s:.0f} s after the preemption: SIGKILL\n",
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def execute(attempt_id: int, node: int = 0) -> dict[str, Any]:
    """Runs node `node` of the attempt on this host (node 0 for a run on one host)."""
    name = host_name()
    if not services.attempt_claim(
        attempt_id=attempt_id, host_name=name, pid=os.getpid(), node=node
    ):
        logger.info("attempt %s node %s: not claimable here (taken or ended)", attempt_id, node)
        return {"attempt": attempt_id, "node": node, "claimed": False}
    attempt = Attempt.objects.select_related("run", "host").get(pk=attempt_id)
    nodes = attempt.allocations.count()
    gpus = _take_gpus(attempt.run.gpus) if attempt.run.gpus else []
    started = False
    try:
        try:
            write_task_files(attempt.run)
        except Exception as error:
            services.attempt_finished(
                attempt_id=attempt_id,
                status="failed",
                step=attempt.start_step,
                error=f"could not write the run's task files on {name}: "
                f"{type(error).__name__}: {error}",
            )
            return {"attempt": attempt_id, "node": node, "claimed": True, "started": False}
        env = job_environment(attempt, gpus, name=name, node=node, nodes=nodes)
        command = job_command(attempt, gpus, node=node, nodes=nodes)
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=settings.BASE_DIR,
            start_new_session=True,  # its own process group: a stop reaches every rank
        )
        started = True
        with _supervised_lock:
            _supervised[attempt_id] = process
        prefix = f"[node {node} on {name}] " if nodes > 1 else ""
        services.attempt_append_log(
            attempt_id, f"{prefix}$ {' '.join(command)}  (pid {process.pid})\n"
        )
        services.node_started(attempt=attempt, node=node, pid=process.pid, command=command)
        output = _Output(process.stdout)
        prefixed = _Prefixed(prefix)
        stopped = False
        gang_stopped = ""
        preemption = _Preemption(attempt, ranks=nodes * max(len(gpus), 1))
        while process.poll() is None:
            # Wakes at once when the job exits (the slot is free sooner than a plain sleep).
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=1.0)
            services.attempt_append_log(attempt_id, prefixed(output.take()))
            if not stopped and _should_stop(attempt):
                stopped = True
                services.attempt_append_log(
                    attempt_id, f"{prefix}[agent] cancel not honoured: stopping\n"
                )
                _stop_group(process)
            if nodes > 1 and not stopped and not gang_stopped:
                gang_stopped = services.gang_stop_reason(attempt_id)
                if gang_stopped:
                    services.attempt_append_log(
                        attempt_id, f"{prefix}[agent] {gang_stopped}: stopping this node\n"
                    )
                    _stop_group(process)
            if not stopped:
                preemption.check(process, time.monotonic())
        output.thread.join(timeout=10)
        services.attempt_append_log(attempt_id, prefixed(output.take(), last=True))
        code = process.returncode
        services.node_exited(attempt=attempt, node=node, exit_code=code)
        if stopped:
            services.attempt_finished(
                attempt_id=attempt_id, status="cancelled", step=attempt.start_step, exit_code=code
            )
        elif preemption.killed:
            # Killed after the grace period: it resumes from its last recorded checkpoint.
            step = Run.objects.values_list("last_step", flat=True).get(pk=attempt.run_id)
            services.attempt_finished(
                attempt_id=attempt_id,
                status="preempted",
                step=step,
                exit_code=code if node == 0 else None,
                error=f"killed {preemption.grace_s:.0f} s after the preemption (its class's grace)",
            )
        elif gang_stopped:
            pass  # the attempt had already ended: this node only followed
        elif node == 0 or code != 0:
            # A job that reported its outcome has already ended its attempt; one that did not
            # died (a signal, the OOM killer): its run resumes from its last checkpoint. In a
            # gang, any node's death ends the attempt (rank 0 speaks for the job: the other
            # nodes exit 0 when their ranks end, whatever the outcome).
            services.attempt_died(
                attempt_id=attempt_id,
                exit_code=code,
                last_output=output.last,
                where=f"'s node {node} on {name}" if nodes > 1 else "",
            )
        return {"attempt": attempt_id, "node": node, "claimed": True, "exit_code": code}
    finally:
        with _supervised_lock:
            _supervised.pop(attempt_id, None)
        _give_back_gpus(gpus)
        if not started:
            services.node_never_started(attempt_id=attempt_id, node=node)
        # The slot is free only now (the scheduler counts an ended attempt whose exit the
        # agent has not recorded as still here): ask for a pass.
        services.request_placement()
        close_old_connections()


class _Prefixed:
    """A gang's nodes share the attempt's log: each node's lines say which node wrote them
    (whole lines only; a line's start waits for its end)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.partial = ""

    def __call__(self, text: str, *, last: bool = False) -> str:
        if not self.prefix:
            return text
        text, self.partial = self.partial + text, ""
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n") and not last:
            self.partial = lines.pop()
        return "".join(self.prefix + line for line in lines)
