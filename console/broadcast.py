"""The one way the console pushes live updates to browsers.

Senders name a group and an event; every consumer in that group receives a channel-layer
message `{"type": "broadcast.event", "event": ..., "payload": ...}`, which Channels delivers to
the consumer's `broadcast_event(self, message)` method (consumers just forward it).

Code that changes the database calls `broadcast_on_commit`, so that nobody is told about a row
before it is committed (or about one whose transaction then rolls back). Payloads must be
JSON-serialisable and must never contain secrets: whatever is sent reaches every browser in the
group.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
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
