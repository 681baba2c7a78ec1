"""A sandbox's cgroup and workspace made ahead of time, off the caller's path.

Opening a bwrap sandbox makes a cgroup in every hierarchy with its limits and mounts a fresh
size-limited tmpfs (~0.4 ms of host CPU here, most of ``open()``). When a sandbox opens, the
reaper's thread (``sandboxes.reaper``) makes one more of the same shape (limits, disk size,
ids, root and cgroup manager), and the next sandbox of that shape takes it instead of making
its own. A spare is exactly what ``open()`` would have made: a new name (``sb-<pid>-…``), an
empty cgroup and an empty tmpfs nobody has ever used; nothing runs in it until it is taken,
and it is taken once. At most ``MAX_SHAPES`` spares wait, one per shape; they are removed at
interpreter exit (or by the janitor, if the owner dies), and a forked child never inherits
its parent's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sandboxes.cgroups import CgroupGroup
from sandboxes.workspace import Workspace

MAX_SHAPES = 4


@dataclass
class Spare:
    name: str
    cgroup: CgroupGroup | None
    workspace: Workspace
    #: Why the workspace has no size limit (its tmpfs could not be mounted), or None.
    disk_missing: str | None

    def remove(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
        self.workspace.remove()


_lock = threading.Lock()
_spares: OrderedDict[Hashable, Spare] = OrderedDict()
_pending: set[Hashable] = set()


def take(shape: Hashable) -> Spare | None:
    """The spare of this shape, removed from the set (None if there is none yet)."""
    with _lock:
        return _spares.pop(shape, None)


def prepare(shape: Hashable, make: Callable[[], Spare]) -> None:
    """Has the reaper's thread make a spare of this shape unless one exists or is on its way."""
    from sandboxes import reaper

    with _lock:
        if shape in _spares or shape in _pending:
            return
        _pending.add(shape)
    pid = os.getpid()

    def build() -> None:
        try:
            spare = make()
        finally:
            with _lock:
                _pending.discard(shape)
        evicted = []
        with _lock:
            if os.getpid() != pid:  # made in a forked child: not this process's to keep
                evicted.append(spare)
            else:
                _spares[shape] = spare
                _spares.move_to_end(shape)
                while len(_spares) > MAX_SHAPES:
                    evicted.append(_spares.popitem(last=False)[1])
        for old in evicted:
            old.remove()

    reaper.submit(build)


def discard_all() -> None:
    """Removes every spare now (interpreter exit; a test that counts what is left)."""
    from sandboxes import reaper

    reaper.drain()  # spares still being made land first
    with _lock:
        spares = list(_spares.values())
        _spares.clear()
    for spare in spares:
        with contextlib.suppress(Exception):
            spare.remove()


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    _spares.clear()
    _pending.clear()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(discard_all)
