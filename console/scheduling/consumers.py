"""The scheduler's pages, live: `/ws/scheduling/queue/`, `/ws/scheduling/fleet/` and
`/ws/scheduling/inbox/`.

Each socket is a doorbell. It joins the groups whose notices change its page and, after a
burst of them, sends ``{"type": "changed", "seq": n}``; the page then re-reads its part
through the same view a reload uses (`#queue`, `#hosts`, `#inbox`). So nothing a socket
carries was rendered for anyone else, and what a page shows after a ring is exactly what the
view lets this user see (team scoping, other teams' runs unnamed on the fleet, CSRF tokens in
the inbox's forms). Notices are sent after commit (`console.broadcast.broadcast_on_commit`).

Who may open which: like the pages. The queue and the fleet are for members of a team
(annotators too); the inbox for admins (4403 for other roles). Anonymous: 4401; a user with
no team: 4404. The origin is checked for every socket in console.asgi. A member's queue
listens to their team's run notices only; an admin's (every team's runs) and the fleet (every
host) listen to the fleet-wide `fleet.runs` group.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace
from typing import Any

from channels.db import database_sync_to_async

from console.accounts.access import active_membership
from console.accounts.models import Membership, Role
from console.broadcast import (
    FLEET_HOSTS_GROUP,
    FLEET_INBOX_GROUP,
    FLEET_RUNS_GROUP,
    TeamGroupConsumer,
    team_group,
)
from console.runs.services import RUNS_TOPIC, SCHEDULING_EVENTS

# A pass changes many runs at once: notices within this gap make one ring (one re-read per
# open page, not one per run).
RING_GAP_S = 0.25


def _active_membership(scope: dict[str, Any]) -> Membership | None:
    """The page's team, chosen as for a request (`access.active_membership` reads only the
    user and the session, which a socket's scope has too)."""
    return active_membership(SimpleNamespace(user=scope["user"], session=scope["session"]))  # type: ignore[arg-type]


class _SchedulingPage(TeamGroupConsumer):
    """`TeamGroupConsumer` with the team the pages use: the session's active one (so a
    socket can be opened only where the page itself opens)."""

    membership: Membership | None = None
    seq = 0
    ringer: asyncio.Task[None] | None = None

    def groups_of(self, membership: Membership) -> list[str]:
        raise NotImplementedError

    async def team_id_for(self, **url_kwargs: Any) -> int | None:
        self.membership = await database_sync_to_async(_active_membership)(self.scope)
        return self.membership.team_id if self.membership is not None else None

    async def groups_for(self, team_id: int, url_kwargs: dict[str, Any]) -> list[str]:
        assert self.membership is not None
        return self.groups_of(self.membership)

    async def disconnect(self, code: int) -> None:
        if self.ringer is not None and not self.ringer.done():
            self.ringer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.ringer
        await super().disconnect(code)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return  # the page sends nothing

    async def broadcast_event(self, message: dict[str, Any]) -> None:
        if message.get("event", "").startswith("run.") and message["event"] not in (
            SCHEDULING_EVENTS
        ):
            return  # a member's team group also carries each step's metrics: not this page's
        if self.ringer is None or self.ringer.done():
            self.ringer = asyncio.create_task(self._ring())

    async def _ring(self) -> None:
        await asyncio.sleep(RING_GAP_S)
        self.seq += 1
        await self.send_json({"type": "changed", "seq": self.seq})


class QueueConsumer(_SchedulingPage):
    def groups_of(self, membership: Membership) -> list[str]:
        if membership.has_role(Role.ADMIN):
            return [FLEET_RUNS_GROUP]  # admins see every team's queue
        return [team_group(membership.team_id, RUNS_TOPIC)]


class FleetConsumer(_SchedulingPage):
    def groups_of(self, membership: Membership) -> list[str]:
        return [FLEET_RUNS_GROUP, FLEET_HOSTS_GROUP]


class InboxConsumer(_SchedulingPage):
    min_role = Role.ADMIN

    def groups_of(self, membership: Membership) -> list[str]:
        return [FLEET_INBOX_GROUP]
