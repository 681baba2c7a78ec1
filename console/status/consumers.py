from __future__ import annotations

from typing import Any

from console.broadcast import CLOSE_UNAUTHENTICATED, STATUS_GROUP, SessionBoundConsumer
from console.status.prober import prober


class StatusConsumer(SessionBoundConsumer):
    """Forwards status snapshots to a logged-in browser. Anonymous handshakes are refused
    (the origin is checked by SameOriginValidator in console.asgi)."""

    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        await self.join_session_group()
        await self.channel_layer.group_add(STATUS_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        prober.subscribe()

    async def disconnect(self, code: int) -> None:
        await self.leave_session_group()
        if self.joined:
            self.joined = False
            prober.unsubscribe()
            await self.channel_layer.group_discard(STATUS_GROUP, self.channel_name)

    async def broadcast_event(self, message: dict[str, Any]) -> None:
        await self.send_json({"event": message["event"], **message["payload"]})
