"""A run's live stream, `/ws/runs/<id>/`.

The broadcast the sink sends after each commit (`services.notify` to `run.<id>`) is only a
doorbell: on each one the consumer reads, from PostgreSQL (`console.runs.live`), everything
newer than this connection's cursors and sends it as one delta. Doorbells that ring while a
read is in progress only mark the connection dirty, and one more read follows: a slow client
(or a slow read) costs one read in flight per connection, never a queue of them, and the
channel layer's buffer for this socket is drained at once. Pages of the same run at the same
cursors (they received the same messages) share one read and its encoding (`shared_delta`).

Messages to the browser (JSON): ``snapshot`` first, then ``delta``s, each with ``seq`` (1, 2,
... per connection) and the ``cursors`` to send back with ``resume``. A browser that
reconnects opens ``/ws/runs/<id>/?resume=1`` and sends ``{"type": "resume", "since":
cursors}``; it gets one delta with exactly what it missed instead of a snapshot (no snapshot
is sent if the resume frame comes within RESUME_WAIT_S). Shapes: docs in `live.py` and
`static/runs-live.js`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from console.accounts.access import SESSION_TEAM_KEY
from console.broadcast import CLOSE_INVALID_PAYLOAD, TeamGroupConsumer
from console.runs import live, selectors, services
from console.runs.models import Run
from console.status.metrics import websocket_clients

RESUME_WAIT_S = 5.0
# A read that left committed events unsent (`live` ``held_back``: a long transaction kept the
# horizon back past MAX_SENT_XIDS newer ones) reads again after this long, even when no
# doorbell rings (the transaction holding the horizon may be another run's, or no writer's).
HELD_BACK_RETRY_S = 0.05


@dataclass
class _Read:
    """One delta read from PostgreSQL, shared by every connection of this process that watches
    the same run from the same cursors (pages that received the same messages are in lockstep:
    50 pages cost one read per doorbell, not 50). ``text`` is the message as JSON without its
    closing brace, so each connection only appends its own ``seq``."""

    started: float
    task: asyncio.Task[tuple[dict[str, Any], str]]


_reads: dict[tuple[int, str], _Read] = {}


async def _read_delta(run_id: int, cursors: live.Cursors) -> tuple[dict[str, Any], str]:
    message = await database_sync_to_async(live.delta)(run_id, cursors)
    text = json.dumps(message)
    return message, text[:-1]


async def shared_delta(
    run_id: int, cursors: live.Cursors, rang_at: float
) -> tuple[dict[str, Any], str]:
    """The delta after `cursors`, from a read that started no earlier than `rang_at` (the
    doorbell this connection answers: a read that began before it might not see that commit),
    joining one in flight when there is such a read."""
    loop = asyncio.get_running_loop()
    key = (run_id, json.dumps(cursors, sort_keys=True))
    read = _reads.get(key)
    if read is None or read.started < rang_at:
        read = _Read(started=loop.time(), task=loop.create_task(_read_delta(run_id, cursors)))
        _reads[key] = read

        def forget(_: Any, key: tuple[int, str] = key, read: _Read = read) -> None:
            if _reads.get(key) is read:
                del _reads[key]

        read.task.add_done_callback(forget)
    # Shielded: one page leaving must not cancel the read the others wait for.
    return await asyncio.shield(read.task)


def _team_of_run(pk: int) -> int | None:
    return Run.objects.filter(pk=pk).values_list("team_id", flat=True).first()


class RunLiveConsumer(TeamGroupConsumer):
    """Every member of the run's team may watch (annotators too); outsiders get 4404 exactly
    as for a run that does not exist."""

    topic = "runs"
    local_fanout = True  # the run's doorbells: one subscription per server process

    run_id: int
    cursors: live.Cursors | None = None
    seq = 0
    dirty = False
    rang_at = 0.0  # when the newest doorbell arrived (loop time)
    answer_resume = False
    last_facts: tuple[Any, ...] | None = None
    reader: asyncio.Task[None] | None = None
    waiting_for_resume: asyncio.Task[None] | None = None
    retry: asyncio.TimerHandle | None = None

    async def team_id_for(self, **url_kwargs: Any) -> int | None:
        self.run_id = int(url_kwargs["pk"])
        team_id: int | None = await database_sync_to_async(_team_of_run)(self.run_id)
        return team_id

    async def groups_for(self, team_id: int, url_kwargs: dict[str, Any]) -> list[str]:
        return [services.run_group(self.run_id)]

    async def connect(self) -> None:
        await super().connect()
        if not getattr(self, "groups_joined", None):
            return  # refused
        self.counted = True
        websocket_clients["runs"] += 1
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        if query.get("resume"):
            self.waiting_for_resume = asyncio.create_task(self._snapshot_unless_resumed())
        else:
            await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            websocket_clients["runs"] -= 1
        if self.retry is not None:
            self.retry.cancel()
            self.retry = None
        for task in (self.reader, self.waiting_for_resume):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await super().disconnect(code)

    async def _send(self, message: dict[str, Any], text: str | None = None) -> None:
        """Sends `message` with this connection's next ``seq``; `text` is the message already
        encoded, without its closing brace (a shared read encodes once for every page)."""
        self.seq += 1
        self.cursors = message["cursors"]
        self.last_facts = self._facts(message)
        self._retry_if_held_back(message)
        if text is None:
            await self.send_json({**message, "seq": self.seq})
        else:
            await self.send(text_data=f'{text},"seq":{self.seq}}}')

    async def _send_snapshot(self) -> None:
        await self._send(await database_sync_to_async(live.snapshot)(self.run_id))
        self._kick()  # a doorbell that rang during the read

    async def _snapshot_unless_resumed(self) -> None:
        await asyncio.sleep(RESUME_WAIT_S)
        if self.cursors is None:
            self.waiting_for_resume = None
            await self._send_snapshot()

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict) or content.get("type") != "resume":
            return  # nothing else is expected from the browser
        since = live.clean_cursors(content.get("since"))
        if since is None:
            await self.close(code=CLOSE_INVALID_PAYLOAD)
            return
        if self.waiting_for_resume is not None:
            self.waiting_for_resume.cancel()
            self.waiting_for_resume = None
        self.cursors = since
        self.answer_resume = True
        self._ring()

    async def broadcast_event(self, message: dict[str, Any]) -> None:
        self._ring()

    def fanout_event(self, message: dict[str, Any]) -> None:
        self._ring()

    def _ring(self) -> None:
        self.dirty = True
        self.rang_at = asyncio.get_running_loop().time()
        self._kick()

    def _kick(self) -> None:
        """Start a read unless one is running (it then reads once more) or nothing is owed."""
        if self.cursors is None or not self.dirty:
            return  # before the snapshot: it reads everything anyway, then kicks
        if self.reader is None or self.reader.done():
            self.reader = asyncio.create_task(self._read_while_dirty())

    async def _read_while_dirty(self) -> None:
        while self.dirty and self.cursors is not None:
            self.dirty = False
            message, text = await shared_delta(self.run_id, self.cursors, self.rang_at)
            if message["type"] == "snapshot" or self.answer_resume or self._news(message):
                self.answer_resume = False
                await self._send(message, text)
            else:
                self.cursors = message["cursors"]
                self._retry_if_held_back(message)

    def _retry_if_held_back(self, message: dict[str, Any]) -> None:
        if message.get("held_back") and self.retry is None:

            def again() -> None:
                self.retry = None
                self._ring()

            self.retry = asyncio.get_running_loop().call_later(HELD_BACK_RETRY_S, again)

    def _news(self, message: dict[str, Any]) -> bool:
        """Whether a delta holds anything (a doorbell for rows this client already has
        sends nothing; a resume is always answered, empty or not)."""
        return bool(
            message["series"]
            or message["events"]
            or message["trajectories"]
            or "truncate_after" in message
            or self._facts(message) != self.last_facts
        )

    @staticmethod
    def _facts(message: dict[str, Any]) -> tuple[Any, ...]:
        return (message["state"], message["reason"], message["last_step"], message["max_steps"])


def _list_team(user: Any, team_param: str, session_team: Any) -> int | None:
    """The team a runs list watches: the page's `team` (it must be one of the user's), else
    the session's active team, else the user's first."""
    from console.accounts.models import Membership

    memberships = Membership.objects.filter(user=user).order_by("team__name")
    for wanted in (team_param, session_team):
        if wanted not in (None, "") and str(wanted).isdigit():
            if memberships.filter(team_id=int(wanted)).exists():
                return int(wanted)
            if wanted is team_param:
                return None  # another team's list: refused like a run of another team
    first = memberships.values_list("team_id", flat=True).first()
    return int(first) if first is not None else None


def _list_rows(team_id: int, filters: selectors.RunListFilters, ids: set[int] | None) -> Any:
    """The rows to send (`ids` None: the whole list) and the ids among `ids` that no longer
    match the filters (the page drops them)."""
    runs = selectors.run_list_filtered(team=team_id, filters=filters)
    if ids is not None:
        runs = runs.filter(pk__in=ids)
    found = selectors.run_list_summaries(list(runs[: selectors.RUN_LIST_LIMIT]))
    rows = [
        {
            "id": run.pk,
            "state": run.state,
            "last_step": run.last_step,
            "max_steps": run.max_steps,
            "eta_s": run.eta_s,  # type: ignore[attr-defined]
            "latest_reward": run.latest_reward,  # type: ignore[attr-defined]
            "sparkline": run.sparkline,  # type: ignore[attr-defined]
            "html": render_to_string("runs/run_list.html#row", {"run": run}),
        }
        for run in found
    ]
    removed = sorted((ids or set()) - {run.pk for run in found})
    return rows, removed


class RunListConsumer(TeamGroupConsumer):
    """`/ws/runs/?team=<id>&<filters>`: the runs list, live. Any member of the team may watch;
    another team's id is refused with 4404, an anonymous user with 4401.

    The team's run notices (created, state changes, each step's metrics, checkpoints) are
    doorbells carrying the run's id: the consumer re-reads those runs' rows (with the page's
    filters) from PostgreSQL and sends ``{"type": "rows", "seq", "rows": [{id, state,
    last_step, max_steps, eta_s, latest_reward, sparkline, html}], "removed": [ids]}``.
    The first message (``"type": "snapshot"``) holds every row of the list; a page that
    reconnects gets a fresh snapshot, so it misses nothing. Doorbells that ring during a read
    are gathered into one more read."""

    topic = services.RUNS_TOPIC
    local_fanout = True  # doorbells carrying a run id: one subscription per server process

    seq = 0
    filters: selectors.RunListFilters
    dirty: set[int]
    reader: asyncio.Task[None] | None = None

    async def team_id_for(self, **url_kwargs: Any) -> int | None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin1"))
        flat = {key: values[0] for key, values in query.items() if values}
        self.filters = selectors.RunListFilters.from_query(flat)
        session = self.scope.get("session")
        session_team = session.get(SESSION_TEAM_KEY) if session is not None else None
        team_id: int | None = await database_sync_to_async(_list_team)(
            self.scope["user"], flat.get("team", ""), session_team
        )
        self.team_id = team_id
        return team_id

    async def connect(self) -> None:
        self.dirty = set()
        await super().connect()
        if not getattr(self, "groups_joined", None):
            return  # refused
        self.counted = True
        websocket_clients["runs"] += 1
        await self._send("snapshot", None)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "counted", False):
            self.counted = False
            websocket_clients["runs"] -= 1
        if self.reader is not None and not self.reader.done():
            self.reader.cancel()
        await super().disconnect(code)

    async def _send(self, kind: str, ids: set[int] | None) -> None:
        rows, removed = await database_sync_to_async(_list_rows)(self.team_id, self.filters, ids)
        if kind == "rows" and not rows and not removed:
            return
        self.seq += 1
        await self.send_json({"type": kind, "seq": self.seq, "rows": rows, "removed": removed})

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return  # the page sends nothing

    async def broadcast_event(self, message: dict[str, Any]) -> None:
        self.fanout_event(message)

    def fanout_event(self, message: dict[str, Any]) -> None:
        run_id = message.get("payload", {}).get("run")
        if isinstance(run_id, int):
            self.dirty.add(run_id)
            if self.reader is None or self.reader.done():
                self.reader = asyncio.create_task(self._read_while_dirty())

    async def _read_while_dirty(self) -> None:
        while self.dirty:
            ids, self.dirty = self.dirty, set()
            await self._send("rows", ids)
