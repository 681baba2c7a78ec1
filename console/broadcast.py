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

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "broadcast.event"
STATUS_GROUP = "status"


def team_group(team_id: int, topic: str) -> str:
    """The group for one team's `topic` (e.g. `runs`); group names allow [A-Za-z0-9._-]."""
    return f"team.{team_id}.{topic}"


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


def broadcast_on_commit(group: str, event: str, payload: dict[str, Any]) -> None:
    """Send once the current transaction commits (at once when there is none)."""
    transaction.on_commit(lambda: _broadcast_logged(group, event, payload))


class TeamGroupConsumer(AsyncJsonWebsocketConsumer):
    """Base for websockets that stream one team's updates: it authenticates, checks the
    membership, joins the groups and forwards every broadcast as JSON `{"event", **payload}`.

    Subclasses set `topic` (the group is `team_group(team_id, topic)`) and, when the team
    comes from an object in the URL rather than a `team_id` URL argument, override
    `team_id_for(**url_kwargs)` (return None when the object does not exist). Anonymous users
    and outsiders are refused alike (close code 4401 / 4404), so an outsider cannot learn that
    an object exists; `min_role` refuses lower roles with 4403."""

    topic: str = ""
    min_role: str = "annotator"

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
            await self.close(code=4401)
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
        for group in await self.groups_for(team_id, url_kwargs):
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        self.groups_joined = []

    async def broadcast_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"event": message["event"], **message["payload"]})
