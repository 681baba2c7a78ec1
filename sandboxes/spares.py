"""Sandboxes made ahead of time, off the caller's path.

Opening a bwrap sandbox makes a cgroup in every hierarchy with its limits and mounts a fresh
size-limited tmpfs (~0.4 ms of host CPU here, most of ``open()``), and its first run starts
bwrap (~2.5 ms of wall time: launcher, namespaces, mounts, seccomp). When a sandbox opens, the
reaper's thread (``sandboxes.reaper``) makes more of the same shape (limits, disk size, ids,
root, cgroup manager, network, first-run path): storage, the first run's memory group and,
where the first run goes through bwrap, that bwrap itself, started and waiting for the command
(``sandboxes.bwrap.Prestarted``). The next sandbox of that shape takes one instead of making
its own. A spare is exactly what ``open()`` and a first run would have made: a new name
(``sb-<pid>-…``), an empty cgroup, an empty tmpfs and fresh namespaces nobody has ever used;
nothing of anyone's runs in it until it is taken, and it is taken once. At most ``PER_SHAPE``
spares wait for each of ``MAX_SHAPES`` shapes; they are removed at interpreter exit (or by the
janitor, if the owner dies; a started bwrap dies with the process), and a forked child never
inherits its parent's.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from sandboxes.cgroups import CgroupGroup, RunMark
from sandboxes.workspace import Workspace

MAX_SHAPES = 4


@dataclass
class Spare:
    name: str
    cgroup: CgroupGroup | None
    workspace: Workspace
    #: Why the workspace has no size limit (its tmpfs could not be mounted), or None.
    disk_missing: str | None
    #: The first run's own memory group, made ahead with the bwrap started in it (below;
    #: ``BwrapDriver._begin_run``); its counters are read before anything ever ran in it.
    first_run: RunMark | None = None
    #: Its bwrap, started ahead and waiting in ``first_run`` for the first command
    #: (``sandboxes.bwrap.Prestarted``), or None.
    prestarted: Any = None

    def remove(self) -> None:
        if self.prestarted is not None:
            self.prestarted.end()  # its init exits without running anything
            if self.cgroup is not None:
                self.cgroup.kill_all()
            # Reaped before the group's removal: an unreaped bwrap keeps it busy.
            self.prestarted.reap()
        if self.cgroup is not None:
            self.cgroup.remove()
        self.workspace.remove()


#: Spares kept per shape: two sandboxes opened at once (a pool's slots on this 2-core
#: machine) both find one; each is 2 idle processes (a started bwrap and its init) and a tmpfs.
PER_SHAPE = 2

_lock = threading.Lock()
_spares: OrderedDict[Hashable, list[Spare]] = OrderedDict()
_pending: dict[Hashable, int] = {}


def take(shape: Hashable) -> Spare | None:
    """A spare of this shape, removed from the set (None if there is none yet)."""
    with _lock:
        ready = _spares.get(shape)
        if not ready:
            return None
        spare = ready.pop(0)
        if not ready:
            del _spares[shape]
        return spare


def prepare(shape: Hashable, make: Callable[[], Spare]) -> None:
    """Has the reaper's thread make spares of this shape until ``PER_SHAPE`` are ready or on
    their way."""
    from sandboxes import reaper

    with _lock:
        missing = PER_SHAPE - len(_spares.get(shape, ())) - _pending.get(shape, 0)
        if missing <= 0:
            return
        _pending[shape] = _pending.get(shape, 0) + missing
    pid = os.getpid()

    def build() -> None:
        try:
            spare = make()
        finally:
            with _lock:
                _pending[shape] -= 1
                if not _pending[shape]:
                    del _pending[shape]
        evicted = []
        with _lock:
            if os.getpid() != pid:  # made in a forked child: not this process's to keep
                evicted.append(spare)
            else:
                _spares.setdefault(shape, []).append(spare)
                _spares.move_to_end(shape)
                while len(_spares) > MAX_SHAPES:
                    evicted += _spares.popitem(last=False)[1]
        for old in evicted:
            old.remove()

    for _ in range(missing):
        reaper.submit(build)


def discard_all() -> None:
    """Removes every spare now (interpreter exit; a test that counts what is left)."""
    from sandboxes import reaper

    reaper.drain()  # spares still being made land first
    with _lock:
        spares = [spare for ready in _spares.values() for spare in ready]
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
