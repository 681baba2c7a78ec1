"""The one way the console pushes live updates to browsers.

Senders name a group and an event; every consumer in that group receives a channel-layer
message `{"type": "broadcast.event", "event": ..., "payload": ...}`, which Channels delivers to
the consumer's `broadcast_event(self, message)` method (consumers just forward it).

Code that changes the database calls `broadcast_on_commit`, so that nobody is told about a row
before it is committed (or about one whose transaction then rolls back). Payloads must be
JSON-serialisable and must never contain secrets: whatever is sent reaches every browser in the
group.

The receiving side for team data is `TeamGroupConsumer` below: subclass it, list the subclass in
console/routing.py, and broadcast to `team_group(team.id, topic)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "broadcast.event"
SESSION_ENDED_TYPE = "session.ended"
STATUS_GROUP = "status"
# The scheduler's pages (console/scheduling/consumers.py). Fleet-wide, so only doorbells go
# there (no payload reaches a browser): every run's state change (`runs.services.notify`),
# host changes (cordon, drain, pool), and preemption requests filed or decided.
FLEET_RUNS_GROUP = "fleet.runs"
FLEET_HOSTS_GROUP = "fleet.hosts"
FLEET_INBOX_GROUP = "fleet.inbox"
# Close codes: 4401 like HTTP 401 (no session, or it ended); 1003 and 1007 are the websocket
# protocol's own "unsupported data" (a binary frame) and "invalid payload" (not JSON).
CLOSE_UNAUTHENTICATED = 4401
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_INVALID_PAYLOAD = 1007


def team_group(team_id: int, topic: str) -> str:
    """The group for one team's `topic` (e.g. `runs`); group names allow [A-Za-z0-9._-]."""
    return f"team.{team_id}.{topic}"


def session_group(session_key: str) -> str:
    """The group of every websocket opened with one login session. Named by a digest, so the
    session key itself (a credential) is never written to Redis."""
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


def session_ended(session_key: str | None) -> None:
    """Close every websocket of a session that just ended (logout), so it stops receiving a
    team's updates at once rather than until the browser closes the tab."""
    if not session_key:
        return
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(session_group(session_key), {"type": SESSION_ENDED_TYPE})
    except Exception:
        # The logout itself must succeed even with Redis away; the sockets then close when
        # their next message finds no session (or when the browser leaves).
        logger.exception("could not close the websockets of an ended session")


def message(event: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"type": MESSAGE_TYPE, "event": event, "payload": payload}


async def abroadcast(group: str, event: str, payload: dict[str, Any]) -> None:
    """Send now, from async code (consumers, the status prober)."""
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("CHANNEL_LAYERS is not configured")
    await layer.group_send(group, message(event, payload))


def broadcast(group: str, event: str, payload: dict[str, Any]) -> None:
    """Send now, from sync code that has no transaction to wait for (e.g. a Celery task's
    progress that is not stored)."""
    async_to_sync(abroadcast)(group, event, payload)


def _broadcast_logged(group: str, event: str, payload: dict[str, Any]) -> None:
    # A broadcast is a courtesy to open pages: a Redis hiccup must not fail the committed write.
    try:
        broadcast(group, event, payload)
    except Exception:
        logger.exception("broadcast of %s to %s failed", event, group)


# Notices sent from a background thread (`wait=False`): a job writing trajectories must not wait
# for Redis once per batch (that was a quarter of the sink's time). Bounded; when full, new
# notices are dropped and counted: pages re-read PostgreSQL, the source of truth, anyway.
_SOON_MAX = 10_000
# (group, event, payload, doorbell): a doorbell's payload means nothing to its receivers (they
# re-read the database), so doorbells for one group waiting together go out as one.
_soon: queue.Queue[tuple[str, str, dict[str, Any], bool]] = queue.Queue(maxsize=_SOON_MAX)
_soon_thread: threading.Thread | None = None
_soon_lock = threading.Lock()
dropped_notices = 0


def _send_soon_forever() -> None:
    # One event loop for the thread's life: the channel layer keeps its Redis connections per
    # loop, so `async_to_sync` (a new loop each call) opened a connection for every notice.
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    def send(group: str, event: str, payload: dict[str, Any]) -> None:
        try:
            loop.run_until_complete(abroadcast(group, event, payload))
        except Exception:
            logger.exception("broadcast of %s to %s failed", event, group)

    while True:
        waiting = [_soon.get()]
        while True:  # everything queued meanwhile (a transaction's notices arrive together)
            try:
                waiting.append(_soon.get_nowait())
            except queue.Empty:
                break
        last_doorbell = {item[0]: i for i, item in enumerate(waiting) if item[3]}
        for i, (group, event, payload, doorbell) in enumerate(waiting):
            # A doorbell goes out where its group's last one was: after every row it announces.
            if not doorbell or last_doorbell[group] == i:
                send(group, event, payload)
        for _ in waiting:
            _soon.task_done()


def broadcast_soon(
    group: str, event: str, payload: dict[str, Any], *, doorbell: bool = False
) -> None:
    """Send from a background thread, in order, without waiting for Redis. A `doorbell` (a
    notice whose receivers only re-read what is newer) is sent once for all the doorbells of
    its group that are waiting together."""
    global _soon_thread, dropped_notices
    with _soon_lock:
        if _soon_thread is None or not _soon_thread.is_alive():
            _soon_thread = threading.Thread(
                target=_send_soon_forever, name="broadcast", daemon=True
            )
            _soon_thread.start()
    try:
        _soon.put_nowait((group, event, payload, doorbell))
    except queue.Full:
        dropped_notices += 1


def flush_soon(timeout: float = 5.0) -> None:
    """Wait (up to `timeout`) until notices sent with `broadcast_soon` have gone out."""
    deadline = time.monotonic() + timeout
    while _soon.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.01)


def broadcast_on_commit(
    group: str, event: str, payload: dict[str, Any], *, wait: bool = True, doorbell: bool = False
) -> None:
    """Send once the current transaction commits (at once when there is none); with
    ``wait=False`` from a background thread (`broadcast_soon`, where a `doorbell` is
    coalesced with its group's others)."""
    if wait:
        transaction.on_commit(lambda: _broadcast_logged(group, event, payload))
    else:
        transaction.on_commit(lambda: broadcast_soon(group, event, payload, doorbell=doorbell))


class LocalFanout:
    """One channel-layer subscription per group and server process, shared by that process's
    pages. A group of 50 pages watching one run otherwise costs 50 Redis messages per
    broadcast (one per page's own channel, each decoded by its consumer); through the fanout
    it costs one, handed to each page in memory.

    Pages `join(group, deliver)` and `leave(group, deliver)`; the first join of a group adds a
    process channel to it (awaited, so a page that has joined misses nothing committed after),
    the last leave removes it. `deliver(message)` is called in the event loop, in order, and
    must not block (pages only note that something is new). One fanout per event loop
    (`for_loop`): the channel layer's connections belong to a loop."""

    def __init__(self) -> None:
        self.members: dict[str, list[Callable[[dict[str, Any]], None]]] = {}
        self.channels: dict[str, str] = {}
        self.readers: dict[str, asyncio.Task[None]] = {}
        self.lock = asyncio.Lock()

    _by_loop: ClassVar[dict[asyncio.AbstractEventLoop, LocalFanout]] = {}

    @classmethod
    def for_loop(cls) -> LocalFanout:
        loop = asyncio.get_running_loop()
        for other in [old for old in cls._by_loop if old.is_closed()]:
            del cls._by_loop[other]
        fanout = cls._by_loop.get(loop)
        if fanout is None:
            fanout = cls._by_loop[loop] = cls()
        return fanout

    async def join(self, group: str, deliver: Callable[[dict[str, Any]], None]) -> None:
        layer = get_channel_layer()
        assert layer is not None, "CHANNEL_LAYERS is not configured"
        async with self.lock:
            members = self.members.setdefault(group, [])
            members.append(deliver)
            if group not in self.channels:
                # The default prefix: channels_redis pops every process channel with that
                # prefix in one loop; another prefix would wait behind the pages' own.
                channel = await layer.new_channel()
                await layer.group_add(group, channel)
                self.channels[group] = channel
                self.readers[group] = asyncio.create_task(self._read(layer, group, channel))

    async def leave(self, group: str, deliver: Callable[[dict[str, Any]], None]) -> None:
        layer = get_channel_layer()
        async with self.lock:
            members = self.members.get(group, [])
            if deliver in members:
                members.remove(deliver)
            if members or group not in self.channels:
                return
            del self.members[group]
            channel = self.channels.pop(group)
            reader = self.readers.pop(group)
            reader.cancel()
            # Awaited: a receive left half-cancelled keeps the layer's receive lock on this
            # loop, and the next loop to receive (another test's, say) would wait forever.
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            if layer is not None:
                await layer.group_discard(group, channel)

    async def _read(self, layer: Any, group: str, channel: str) -> None:
        while True:
            message = await layer.receive(channel)
            for deliver in list(self.members.get(group, [])):
                try:
                    deliver(message)
                except Exception:  # one page's failure must not cut the others off
                    logger.exception("a page failed to take a broadcast to %s", group)


class SessionBoundConsumer(AsyncJsonWebsocketConsumer):
    """Base of every console websocket: it belongs to the login session that opened it (and
    is closed when that session logs out), and a frame it cannot read closes it with the
    protocol's code instead of raising in the consumer. Browsers send nothing today; a
    subclass that expects messages overrides `receive_json`."""

    session_group_joined: str | None = None

    async def join_session_group(self) -> None:
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None) if session is not None else None
        if session_key:
            self.session_group_joined = session_group(session_key)
            await self.channel_layer.group_add(self.session_group_joined, self.channel_name)

    async def leave_session_group(self) -> None:
        if self.session_group_joined:
            await self.channel_layer.group_discard(self.session_group_joined, self.channel_name)
            self.session_group_joined = None

    async def session_ended(self, message: dict[str, Any]) -> None:
        # Leave the groups now: the server reports the disconnect only after the close
        # handshake, and nothing more may be forwarded to a session that has ended.
        # (disconnect() must therefore be safe to run twice.)
        await self.disconnect(CLOSE_UNAUTHENTICATED)
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if text_data is None:
            await self.close(code=CLOSE_UNSUPPORTED_DATA)
            return
        try:
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):
            await self.close(code=CLOSE_INVALID_PAYLOAD)
            return
        await self.receive_json(content, **kwargs)


class TeamGroupConsumer(SessionBoundConsumer):
    """Base for websockets that stream one team's updates: it authenticates, checks the
    membership, joins the groups and forwards every broadcast as JSON `{"event", **payload}`.

    Subclasses set `topic` (the group is `team_group(team_id, topic)`) and, when the team
    comes from an object in the URL rather than a `team_id` URL argument, override
    `team_id_for(**url_kwargs)` (return None when the object does not exist). Anonymous users
    and outsiders are refused alike (close code 4401 / 4404), so an outsider cannot learn that
    an object exists; `min_role` refuses lower roles with 4403."""

    topic: str = ""
    min_role: str = "annotator"
    # True: the groups are joined through the process's `LocalFanout` (one subscription per
    # group for every page of the process) and each broadcast reaches `fanout_event`. For
    # pages that only take broadcasts as doorbells; False: through this socket's own channel.
    local_fanout: bool = False

    groups_joined: list[str]

    async def team_id_for(self, **url_kwargs: Any) -> int | None:
        team_id = url_kwargs.get("team_id")
        return int(team_id) if team_id is not None else None

    async def groups_for(self, team_id: int, url_kwargs: dict[str, Any]) -> list[str]:
        """The groups to join; override to add e.g. one run's own group."""
        return [team_group(team_id, self.topic)]

    async def connect(self) -> None:
        self.groups_joined = []
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        url_kwargs = self.scope.get("url_route", {}).get("kwargs", {})
        team_id = await self.team_id_for(**url_kwargs)
        membership = None
        if team_id is not None:
            from console.accounts.access import membership_for

            membership = await database_sync_to_async(membership_for)(user, team_id)
        if membership is None or team_id is None:
            await self.close(code=4404)
            return
        if not membership.has_role(self.min_role):
            await self.close(code=4403)
            return
        await self.join_session_group()
        for group in await self.groups_for(team_id, url_kwargs):
            if self.local_fanout:
                await LocalFanout.for_loop().join(group, self.fanout_event)
            else:
                await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.leave_session_group()
        for group in getattr(self, "groups_joined", []):
            if self.local_fanout:
                await LocalFanout.for_loop().leave(group, self.fanout_event)
            else:
                await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    def fanout_event(self, message: dict[str, Any]) -> None:
        """A broadcast through the `LocalFanout` (called in the loop; must not block)."""
        asyncio.get_running_loop().create_task(self.broadcast_event(message))

    async def broadcast_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"event": message["event"], **message["payload"]})
