"""Log in through the browser and watch the status page come up live."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid

from tests.e2e.conftest import login, screenshot


def test_the_status_page_shows_every_part_up_and_updates_live(page, people, live_server_url):
    node = f"e2e-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", "control",
         "-n", node, "--pool", "solo", "--without-heartbeat", "--without-gossip",
         "--without-mingle", "-l", "WARNING"],
        stdout=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        login(page, people.owner)
        page.goto("/status/")
        # Pushed over the websocket, not reloaded: the live marker says "updated".
        page.wait_for_selector("#live-state[data-state=updated]")
        for part in ("PostgreSQL", "Redis", "Channel layer"):
            assert page.locator(f'tr[data-part="{part}"]').get_attribute("data-up") == "true"
        # The worker comes up in a later push without any reload.
        page.wait_for_selector(f'tr[data-worker="{node}"][data-up="true"]', timeout=90_000)
        assert "control" in page.locator(f'tr[data-worker="{node}"]').inner_text()
        screenshot(page, "platform-status")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)
    # ...and goes down in a later push once it stops.
    page.wait_for_selector(f'tr[data-worker="{node}"][data-up="false"]', timeout=30_000)
    screenshot(page, "platform-status-worker-down")
