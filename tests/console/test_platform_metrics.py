"""/metrics: Prometheus text for an ops scraper with the token, a 404 for everyone else."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_metrics_do_not_exist_without_a_token_configured(settings, owner_client):
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 404
    assert owner_client.get("/metrics").status_code == 404  # a logged-in user is not a scraper


def test_metrics_answer_the_scraper_with_the_token(settings, people):
    from console.runs.models import Host, HostState

    settings.METRICS_TOKEN = "scrape-me"
    Host.objects.create(name="h1", state=HostState.READY)
    Host.objects.create(name="h2", state=HostState.OFFLINE)
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 404
    response = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-me")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'console_hosts{state="ready"} 1.0' in text
    assert 'console_hosts{state="offline"} 1.0' in text
    assert 'console_runs{state="queued"} 0.0' in text
    assert "console_queue_length 0.0" in text
    assert "console_trajectory_ingest_per_second 0.0" in text
    assert "console_websocket_clients" in text
