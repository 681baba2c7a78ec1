"""`/metrics`: the console's state in the Prometheus text format, for an ops scraper.

Off unless `METRICS_TOKEN` is set (it counts every team's runs, so it is not for the public):
then a scraper sends `Authorization: Bearer <METRICS_TOKEN>`; anything else is a 404, as if
the page did not exist.
"""

from __future__ import annotations

import datetime as dt
import hmac

from django.conf import settings
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

from console.runs.models import Host, HostState, Run, RunState, TrajectoryRecord

# Open run streams in this server process (console.runs.consumers counts them).
websocket_clients = {"runs": 0}


def _authorized(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(header.encode(), f"Bearer {token}".encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _authorized(request):
        raise Http404("No such page")
    registry = CollectorRegistry()
    runs = Gauge("console_runs", "Runs by state", ["state"], registry=registry)
    by_state = dict(Run.objects.values_list("state").annotate(n=Count("id")))
    for state in RunState.values:
        runs.labels(state=state).set(by_state.get(state, 0))
    Gauge("console_queue_length", "Runs waiting for a host", registry=registry).set(
        by_state.get(RunState.QUEUED, 0)
    )
    hosts = Gauge("console_hosts", "Hosts by state", ["state"], registry=registry)
    hosts_by_state = dict(Host.objects.values_list("state").annotate(n=Count("id")))
    for state in HostState.values:
        hosts.labels(state=state).set(hosts_by_state.get(state, 0))
    window = 60
    since = timezone.now() - dt.timedelta(seconds=window)
    recent = TrajectoryRecord.objects.filter(created_at__gte=since).count()
    Gauge(
        "console_trajectory_ingest_per_second",
        f"Trajectories stored per second over the last {window} s",
        registry=registry,
    ).set(recent / window)
    Gauge(
        "console_websocket_clients",
        "Open run streams on this server process",
        registry=registry,
    ).set(websocket_clients["runs"])
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
