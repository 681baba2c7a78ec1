"""Websocket routes. Each app's consumer is listed here; all of them sit behind the origin check
and session authentication in console.asgi."""

from django.urls import path

from console.runs.consumers import RunListConsumer, RunLiveConsumer
from console.scheduling.consumers import FleetConsumer, InboxConsumer, QueueConsumer
from console.status.consumers import StatusConsumer

websocket_urlpatterns = [
    path("ws/status/", StatusConsumer.as_asgi()),
    path("ws/runs/", RunListConsumer.as_asgi()),
    path("ws/runs/<int:pk>/", RunLiveConsumer.as_asgi()),
    path("ws/scheduling/queue/", QueueConsumer.as_asgi()),
    path("ws/scheduling/fleet/", FleetConsumer.as_asgi()),
    path("ws/scheduling/inbox/", InboxConsumer.as_asgi()),
]
