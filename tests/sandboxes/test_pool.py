"""SandboxPool: bounded, first come first served, pre-warmed, and leak-free on crash or cancel."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sandboxes import SandboxError, SandboxPool, SandboxSpec
from tests.sandboxes.conftest import sandboxes_of_this_process


def _wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.005)


def test_run_writes_files_feeds_stdin_and_returns_the_result():
    with SandboxPool(max_active=2) as pool:
        result = pool.run(
            {"memory_mb": 64},
            ["python3", "main.py"],
            files={"main.py": "import sys; print(sys.stdin.read()[::-1])"},
            stdin="abc",
        )
    assert result.stdout == "cba\n"
    assert not sandboxes_of_this_process()


def test_never_more_than_max_active_sandboxes_at_once():
    pool = SandboxPool(max_active=2)
    inside = 0
    most = 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        with pool.acquire(SandboxSpec()) as sandbox:
            with lock:
                inside += 1
                most = max(most, inside)
            sandbox.run(["true"])
            time.sleep(0.05)
            with lock:
                inside -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 1 <= most <= 2
    assert pool.active == 0
    assert not sandboxes_of_this_process()


def test_waiters_are_served_first_come_first_served():
    pool = SandboxPool(max_active=1)
    order: list[int] = []
    release = threading.Event()

    def holder() -> None:
        with pool.acquire():
            release.wait()

    def waiter(n: int) -> None:
        with pool.acquire():
            order.append(n)

    first = threading.Thread(target=holder)
    first.start()
    _wait_until(lambda: pool.active == 1)
    waiters = []
    for n in range(4):
        thread = threading.Thread(target=waiter, args=(n,))
        thread.start()
        _wait_until(lambda n=n: pool.waiting == n + 1)
        waiters.append(thread)
    release.set()
    for thread in [first, *waiters]:
        thread.join()
    assert order == [0, 1, 2, 3]


def test_a_caller_that_raises_releases_its_slot_and_sandbox():
    pool = SandboxPool(max_active=1)
    with pytest.raises(RuntimeError), pool.acquire() as sandbox:
        sandbox.run(["sh", "-c", "(setsid sleep 100 &); echo x > /work/f"])
        raise RuntimeError("caller crashed")
    assert pool.active == 0
    assert not sandboxes_of_this_process()
    with pool.acquire() as again:  # the slot is usable again
        assert again.run(["true"]).exit_code == 0


def test_a_cancelled_async_waiter_gives_its_turn_away():
    pool = SandboxPool(max_active=1)

    async def scenario() -> None:
        release = asyncio.Event()

        async def holder() -> None:
            async with pool.acquire_async():
                await release.wait()

        held = asyncio.create_task(holder())
        while pool.active == 0:
            await asyncio.sleep(0.005)

        async def waiter() -> None:
            async with pool.acquire_async():
                pytest.fail("a cancelled waiter must not get a sandbox")

        waiting = asyncio.create_task(waiter())
        while pool.waiting == 0:
            await asyncio.sleep(0.005)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        await held
        result = await pool.run_async(None, ["echo", "after"])
        assert result.stdout == "after\n"

    asyncio.run(scenario())
    assert pool.active == 0 and pool.waiting == 0
    assert not sandboxes_of_this_process()


def test_cancelling_an_async_run_kills_the_command_and_frees_the_slot():
    pool = SandboxPool(max_active=1)

    async def scenario() -> None:
        task = asyncio.create_task(pool.run_async(SandboxSpec(timeout_s=60), ["sleep", "60"]))
        while pool.active == 0:
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - started < 30  # killed, not waited out

    asyncio.run(scenario())
    assert pool.active == 0
    assert not sandboxes_of_this_process()


def test_prewarmed_sandboxes_serve_the_prewarm_spec_and_are_removed_on_close():
    spec = SandboxSpec(memory_mb=64)
    pool = SandboxPool(max_active=2, prewarm=2, prewarm_spec=spec)
    try:
        _wait_until(lambda: len(pool._warm) == 2)
        warm_names = {s.name for s in pool._warm}
        with pool.acquire(spec) as sandbox:
            assert sandbox.name in warm_names
            assert sandbox.run(["true"]).exit_code == 0
        with pool.acquire(SandboxSpec(memory_mb=96)) as other:
            assert other.name not in warm_names
    finally:
        pool.close()
    assert not sandboxes_of_this_process()
    with pytest.raises(SandboxError):
        pool.run(None, ["true"])


def test_bad_pool_arguments_are_refused():
    with pytest.raises(SandboxError):
        SandboxPool(max_active=0)
    with pytest.raises(SandboxError):
        SandboxPool(prewarm=-1)


def test_many_async_runs_share_a_small_pool_and_all_complete():
    pool = SandboxPool(max_active=2)

    async def scenario() -> list[str]:
        runs = [pool.run_async(None, ["sh", "-c", f"echo {n}"]) for n in range(8)]
        return [r.stdout for r in await asyncio.gather(*runs)]

    assert asyncio.run(scenario()) == [f"{n}\n" for n in range(8)]
    assert pool.active == 0
    assert not sandboxes_of_this_process()
