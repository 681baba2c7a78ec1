"""Publish-to-browser latency of a run's live stream, against a Redis pub/sub round trip
measured in the same run.

    .venv/bin/python bench/bench_live.py [--clients 50] [--rate 1000] [--seconds 10]
        [--per-commit 10] [--writers 1]

A real ASGI server (uvicorn) serves `/ws/runs/<id>/`; `--clients` websocket clients log in
and watch one run; a writer stores events through `ConsoleSink.event` at `--rate` events per
second (`--per-commit` per transaction: one doorbell each) with each event's commit time.
Each client records when each event id reaches it in a delta; latency = arrival - commit.
Every event must reach every client (no notice lost). With ``--writers N`` N processes write at
once, `--rate / N` each: their transactions commit out of id order, the case that lost events
when the stream followed ids. Baseline: `PUBLISH` to one subscriber
on the same Redis, the same number of messages.

The writer runs in a process of its own (``--write``): in the clients' process it shared one
interpreter lock with 50 websocket clients decoding messages, which held it to ~350 events/s
and delayed the clients' own clocks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--per-commit", type=int, default=10, help="events per transaction")
    parser.add_argument("--writers", type=int, default=1, help="concurrent writer processes")
    parser.add_argument(
        "--trace", action="store_true", help="time the server's side too (bench/live_trace.py)"
    )
    parser.add_argument("--write", type=int, default=0, help=argparse.SUPPRESS)  # attempt id
    parser.add_argument("--writer", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        return _write_process(args.write, args.rate, args.seconds, args.per_commit, args.writer)
    from bench._console import console

    server: subprocess.Popen[bytes] | None = None
    with console("bench-live-", own_var_dir=False) as (work, env):
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            trace = work / "trace.jsonl"
            if args.trace:
                env["BENCH_LIVE_TRACE"] = str(trace)
            app = "bench.live_trace:application" if args.trace else "console.asgi:application"
            server = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1",
                 "--port", str(port), "--ws", "websockets-sansio", "--lifespan", "off",
                 "--no-access-log", "--log-level", "warning"],
                cwd=ROOT, env={**env, "DEBUG": "1"},
            )  # fmt: skip
            _wait_for_port(port, server)
            return asyncio.run(
                _bench(
                    port, args.clients, args.rate, args.seconds, args.per_commit, args.writers,
                    trace if args.trace else None,
                )
            )  # fmt: skip
        finally:
            if server is not None:
                server.terminate()
                try:
                    server.wait(60)
                except subprocess.TimeoutExpired:
                    server.kill()  # figures are printed already; do not leave it behind
                    server.wait(10)


def _wait_for_port(port: int, server: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    """Until the server accepts connections (its start takes seconds on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode})")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the server did not listen within {timeout:.0f} s")


def _setup() -> tuple[Any, str]:
    from django.test import Client

    from bench._console import fixture, running_attempt
    from console.accounts.models import Role

    fx = fixture(username="watcher", host="h", role=Role.RESEARCHER)  # logs in by session
    user = fx.user
    attempt = running_attempt(fx, name="live", state="running")
    client = Client()
    client.force_login(user)
    from django.conf import settings

    return attempt, client.cookies[settings.SESSION_COOKIE_NAME].value


async def _bench(
    port: int,
    clients: int,
    rate: int,
    seconds: float,
    per_commit: int,
    writers: int,
    trace: Path | None,
) -> int:
    import websockets
    from asgiref.sync import sync_to_async
    from django.conf import settings

    attempt, session = await sync_to_async(_setup)()
    url = f"ws://127.0.0.1:{port}/ws/runs/{attempt.run_id}/"
    headers = {
        "Cookie": f"{settings.SESSION_COOKIE_NAME}={session}",
        "Origin": f"http://127.0.0.1:{port}",
    }
    committed: dict[int, float] = {}
    arrivals: list[dict[int, float]] = [{} for _ in range(clients)]

    async def watch(index: int, ready: asyncio.Event, done: asyncio.Event) -> None:
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
            await ws.recv()  # the snapshot
            ready.set()
            while not done.is_set():
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), timeout=1.0))
                except TimeoutError:
                    continue
                now = time.time()
                for event in message.get("events", []):
                    arrivals[index].setdefault(event["id"], now)

    def write() -> None:
        started = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--write",
                    str(attempt.pk),
                    "--writer",
                    str(w),
                    "--rate",
                    str(rate // writers),
                    "--seconds",
                    str(seconds),
                    "--per-commit",
                    str(per_commit),
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for w in range(writers)
        ]
        for process in started:
            out, _ = process.communicate()
            if process.returncode:
                raise RuntimeError(f"writer failed ({process.returncode})")
            report = json.loads(out)
            committed.update({int(k): v for k, v in report["committed"].items()})
            written_s.append(report["seconds"])

    readies = [asyncio.Event() for _ in range(clients)]
    done = asyncio.Event()
    watchers = [asyncio.create_task(watch(i, readies[i], done)) for i in range(clients)]
    # Every page has its snapshot (a watcher that failed to connect fails the bench).
    all_ready = asyncio.ensure_future(asyncio.gather(*(r.wait() for r in readies)))
    await asyncio.wait([all_ready, *watchers], timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if not all_ready.done():
        all_ready.cancel()
        done.set()
        for task in watchers:
            if task.done():
                task.result()  # raises the watcher's error
        raise RuntimeError("not every client got its snapshot within 120 s")
    written_s: list[float] = []  # the writer's own, without its start
    await asyncio.to_thread(write)
    await asyncio.sleep(5)  # the tail
    done.set()
    await asyncio.gather(*watchers, return_exceptions=True)

    latencies = sorted(
        (arrived[event_id] - committed[event_id]) * 1000
        for arrived in arrivals
        for event_id in committed
        if event_id in arrived
    )
    expected = len(committed) * clients
    lost = expected - len(latencies)
    baseline = await asyncio.to_thread(_redis_round_trip, len(committed))

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")

    print(f"{clients} clients, {len(committed)} events in {max(written_s):.1f} s "
          f"({len(committed) / max(written_s):.0f} events/s, {per_commit} per commit, "
          f"{writers} writer(s))")  # fmt: skip
    print(f"  publish-to-browser  p50 {pct(latencies, 0.5):7.1f} ms   "
          f"p99 {pct(latencies, 0.99):7.1f} ms   (aim p99 <= 250 ms)")  # fmt: skip
    print(f"  lost={lost} of {expected} deliveries")
    print(f"  Redis PUBLISH round trip  p50 {pct(baseline, 0.5):7.2f} ms   "
          f"p99 {pct(baseline, 0.99):7.2f} ms")  # fmt: skip
    print(f"  p99 ratio: {pct(latencies, 0.99) / pct(baseline, 0.99):.0f}x the Redis round trip")
    # Where the tail goes: to the first page that got an event (the writer's notice, Redis,
    # the server's read), or from it to the others (the fan-out: sending 50 frames and the
    # clients' own decoding, in this one process).
    first = {
        event_id: min(arrived[event_id] for arrived in arrivals if event_id in arrived)
        for event_id in committed
        if any(event_id in arrived for arrived in arrivals)
    }
    upstream = sorted((first[e] - committed[e]) * 1000 for e in first)
    spread = sorted(
        (arrived[e] - first[e]) * 1000 for arrived in arrivals for e in first if e in arrived
    )
    print(f"  commit -> first page   p50 {pct(upstream, 0.5):7.1f} ms   "
          f"p99 {pct(upstream, 0.99):7.1f} ms")  # fmt: skip
    print(f"  first page -> each     p50 {pct(spread, 0.5):7.1f} ms   "
          f"p99 {pct(spread, 0.99):7.1f} ms")  # fmt: skip
    if trace is not None:
        _print_trace(trace, committed, first, pct)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0 if lost == 0 else 1


def _print_trace(
    trace: Path, committed: dict[int, float], first: dict[int, float], pct: Any
) -> None:
    """Each event's way from its commit to the first page, stage by stage (the server's
    moments from bench/live_trace.py): p50 and p99 of each stage over the events."""
    import bisect

    rings: list[float] = []
    reads: dict[int, dict[str, Any]] = {}  # event id -> the first read that carried it
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if "ring" in record:
            rings.append(record["ring"])
            continue
        for event_id in record["ids"]:
            if event_id not in reads or record["sent"] < reads[event_id]["sent"]:
                reads[event_id] = record
    rings.sort()
    stages: dict[str, list[float]] = {}
    for event_id, read in reads.items():
        if event_id not in committed or event_id not in first:
            continue
        at = bisect.bisect_left(rings, committed[event_id])
        ring = rings[at] if at < len(rings) and rings[at] <= read["task"] else read["task"]
        moments = [
            ("commit -> doorbell at the server", committed[event_id], ring),
            ("doorbell -> read task", ring, read["task"]),
            ("read task -> its database thread", read["task"], read["read"]),
            ("database read (live.delta)", read["read"], read["done"]),
            ("JSON encoding", read["done"], read["encoded"]),
            ("encoded -> first frame sent", read["encoded"], read["sent"]),
            ("sent -> first page's arrival", read["sent"], first[event_id]),
        ]
        for name, start, end in moments:
            stages.setdefault(name, []).append((end - start) * 1000)
    print(f"  server trace ({len(reads)} events, {len(rings)} doorbells):")
    for name, values in stages.items():
        values.sort()
        print(f"    {name:36} p50 {pct(values, 0.5):7.1f} ms   p99 {pct(values, 0.99):7.1f} ms")


def _write_process(attempt_id: int, rate: int, seconds: float, per_commit: int, writer: int) -> int:
    """The writer: events through `ConsoleSink.event` at `rate` per second; prints each event
    id's commit time as JSON."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.db import transaction

    from console.broadcast import flush_soon
    from console.runs.models import Attempt, RunEvent
    from console.runs.sink import ConsoleSink

    attempt = Attempt.objects.select_related("run").get(pk=attempt_id)
    sink = ConsoleSink(attempt)
    committed: dict[int, float] = {}
    interval = per_commit / rate
    next_at = time.time()
    stop_at = next_at + seconds
    while time.time() < stop_at:
        with transaction.atomic():
            for _ in range(per_commit):
                # Through the sink's own path: the row, then the doorbell after commit.
                sink.event("bench.tick", {"reason": "tick", "writer": writer})
            ids = list(  # this transaction's own (the other writers' may be newer)
                RunEvent.objects.filter(
                    run_id=attempt.run_id, kind="bench.tick", data__writer=writer
                )
                .order_by("-id")
                .values_list("id", flat=True)[:per_commit]
            )
        now = time.time()
        for event_id in ids:
            committed[event_id] = now
        next_at += interval
        time.sleep(max(0.0, next_at - time.time()))
    flush_soon()
    print(json.dumps({"committed": committed, "seconds": time.time() - (stop_at - seconds)}))
    return 0


def _redis_round_trip(count: int) -> list[float]:
    import redis
    from django.conf import settings

    url = settings.REDIS_URL
    if url.startswith("redis+socket://"):
        connection = redis.Redis(unix_socket_path=url.removeprefix("redis+socket://"))
    else:
        connection = redis.Redis.from_url(url)
    received: dict[int, float] = {}
    pubsub = connection.pubsub()
    pubsub.subscribe("bench-live")
    pubsub.get_message(timeout=1.0)
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            message = pubsub.get_message(timeout=0.1)
            if message and message["type"] == "message":
                received[int(message["data"])] = time.time()

    thread = threading.Thread(target=listen)
    thread.start()
    sent: dict[int, float] = {}
    for i in range(count):
        sent[i] = time.time()
        connection.publish("bench-live", str(i))
        time.sleep(0.001)
    time.sleep(1.0)
    stop.set()
    thread.join()
    return sorted((received[i] - sent[i]) * 1000 for i in sent if i in received)


if __name__ == "__main__":
    raise SystemExit(main())
