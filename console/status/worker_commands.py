"""A remote-control command every console Celery worker answers, for the status page.

Celery's built-in `ping` says only "pong"; this also reports the software version and the
queues the worker consumes. Registered when console.celery is imported, which every worker
started with `-A console` does."""

from __future__ import annotations

import os
import platform
from typing import Any

import celery
from celery.worker.control import inspect_command


@inspect_command(name="console_info")
def console_info(state: Any) -> dict[str, Any]:
    consumer = state.consumer
    queues = sorted(queue.name for queue in consumer.task_consumer.queues)
    return {
        "celery": celery.__version__,
        "python": platform.python_version(),
        "queues": queues,
        "pid": os.getpid(),
        "concurrency": getattr(consumer.pool, "limit", None),
    }
