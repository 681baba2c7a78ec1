"""Reaps what a crashed owner left behind: cgroups and workspaces named ``sb-<dead pid>-...``,
and launchers built from an old ``launch.c`` that nobody started using for an hour.

A process that dies without closing its sandboxes (SIGKILL, power loss of the Python side)
cannot clean up; the next process to open a sandbox does it instead, once.
"""

from __future__ import annotations

import contextlib
import os
import threading

from sandboxes.cgroups import manager
from sandboxes.errors import SandboxError
from sandboxes.workspace import Workspace, roots_to_reap

_done = False
_lock = threading.Lock()


def owner_alive(name: str) -> bool:
    """For ``sb-<pid>-...`` / ``build-<pid>-...`` names: is that owner still running?"""
    parts = name.split("-")
    if len(parts) < 3 or parts[0] not in ("sb", "build") or not parts[1].isdigit():
        return True  # not ours: never touch it
    return pid_alive(int(parts[1]))


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale() -> list[str]:
    """Removes the leftovers of dead owners; returns the names it removed."""
    from sandboxes.bwrap import remove_stale_launchers

    reaped: list[str] = []
    for name, group in manager().existing_groups().items():
        if not owner_alive(name):
            try:
                group.remove()
                reaped.append(name)
            except SandboxError:
                continue
    for root in roots_to_reap():
        if not root.is_dir():
            continue
        reaped += remove_stale_launchers(root)
        for entry in root.iterdir():
            if entry.name.startswith("sb-") and not owner_alive(entry.name):
                try:
                    Workspace(root, entry.name, 1, None, None).remove()
                    if entry.name not in reaped:
                        reaped.append(entry.name)
                except (SandboxError, OSError):
                    continue
    return reaped


def reap_once() -> None:
    global _done
    if _done:
        return
    with _lock:
        if not _done:
            _done = True
            # Best effort: a leftover we cannot remove must not stop a new sandbox.
            with contextlib.suppress(OSError, SandboxError):
                reap_stale()
