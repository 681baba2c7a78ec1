"""ExecResult and the capped, streaming capture of a command's output."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

OutputCallback = Callable[[str], object]


@dataclass(frozen=True)
class ExecResult:
    """What one command did inside a sandbox.

    ``exit_code`` is the command's status; a command killed by a signal reports
    ``signal`` (its number) and, as shells do, ``exit_code = 128 + signal``. ``stdout`` and
    ``stderr`` hold at most the spec's ``output_limit_bytes`` each (``truncated`` says when
    more was produced and dropped); bytes that are not UTF-8 are decoded with U+FFFD.
    ``peak_memory_mb`` and ``cpu_s`` come from the sandbox's cgroup (``None`` where the driver
    cannot measure them). ``image_digest`` names the image the command ran in (``None``: the
    host's base system only).
    """

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    wall_s: float
    cpu_s: float | None
    peak_memory_mb: float | None
    timed_out: bool
    oom_killed: bool
    truncated: bool
    image_digest: str | None = None

    @property
    def ok(self) -> bool:
        """True when the command exited 0 on its own (no timeout, no OOM, no signal)."""
        return (
            self.exit_code == 0
            and self.signal is None
            and not self.timed_out
            and not self.oom_killed
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecResult:
        return cls(**data)


class StreamCapture:
    """Collects one output stream up to ``limit`` bytes, counting (and dropping) the rest.

    Bytes are decoded incrementally so a multi-byte character split across reads survives,
    and each decoded piece is handed to ``callback`` as it arrives.
    """

    def __init__(self, limit: int, callback: OutputCallback | None = None):
        self.limit = limit
        self.callback = callback
        self.total_bytes = 0
        self._kept = bytearray()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self.limit - len(self._kept)
        if room > 0:
            kept = chunk[:room]
            self._kept += kept
            if self.callback is not None:
                text = self._decoder.decode(kept)
                if text:
                    self.callback(text)

    def finish(self) -> None:
        if self.callback is not None:
            tail = self._decoder.decode(b"", final=True)
            if tail:
                self.callback(tail)

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self._kept)

    @property
    def text(self) -> str:
        return bytes(self._kept).decode("utf-8", errors="replace")
