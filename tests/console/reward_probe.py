"""Reward functions the console's tests list in TRUSTED_REWARD_FUNCTIONS: they report where
they ran, so a test can tell the web process from the scoring child."""

from __future__ import annotations

import os
import time
from typing import Any


def where_am_i(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> Any:
    return {
        "score": 1.0,
        "pid": os.getpid(),
        "sees_console_settings": any(
            name in os.environ for name in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL")
        ),
        "cwd": os.getcwd(),
    }


def sleeps(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    time.sleep(60)
    return 1.0
