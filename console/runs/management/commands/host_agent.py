"""`manage.py host_agent [--name NAME]`: this machine's host agent (see console.runs.agent).

It registers the host, heartbeats on a thread, and runs a Celery worker that consumes only
``host.<name>``, with one thread per slot (GPUs, or HOST_CPU_SLOTS on a host without GPUs).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from console.runs import agent, services


class Command(BaseCommand):
    help = "Runs this machine's host agent: heartbeat, and the jobs sent to host.<name>."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default=socket.gethostname(), help="the host's name")
        parser.add_argument("--loglevel", default="INFO")

    def handle(self, *args: Any, **options: Any) -> None:
        from console.celery import app

        name = options["name"]
        os.environ[agent.HOST_NAME_ENV] = name
        host = services.host_register(name=name, inventory=agent.inventory(), agent_pid=os.getpid())
        slots = max(1, host.gpu_slots or host.cpu_slots)
        self.stdout.write(
            f"host agent {name}: queue {host.queue}, {host.gpu_slots} GPU slot(s), "
            f"{host.cpu_slots} CPU slot(s)"
        )
        stop = threading.Event()
        beat = threading.Thread(
            target=agent.heartbeat_forever, args=(name, stop), name="heartbeat", daemon=True
        )
        beat.start()
        try:
            app.worker_main(
                [
                    "worker",
                    "-Q",
                    host.queue,
                    "-n",
                    f"host@{name}",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(slots),
                    "--without-gossip",
                    "--without-mingle",
                    "-l",
                    options["loglevel"],
                ]
            )
        finally:
            stop.set()
