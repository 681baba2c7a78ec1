"""How a run is steered from outside: the `Control` protocol and two plain implementations.

`training.run` calls ``control.poll(step)`` once before every step (``step`` is the number
of the step about to run). The answer, a `ControlDecision`, can ask the run to

- **preempt**: save a checkpoint, then return with status ``"preempted"`` (the scheduler
  re-queues the job, which resumes from that checkpoint);
- **cancel**: stop at once with status ``"cancelled"`` (no checkpoint);
- apply **overrides** from this step on: domain weights, KL coefficient, sampling
  temperature. Each override that changes something becomes an event in the sink.

The console's control reads what operators and the scheduler decided; the CLI uses
`FileControl` (edit a JSON file to steer a running job) combined with SIGTERM/SIGINT handling
(`SignalControl`), like Slurm's grace period before a kill.
"""

from __future__ import annotations

import json
import math
import signal
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "Control",
    "ControlDecision",
    "FileControl",
    "Overrides",
    "SignalControl",
    "StaticControl",
]


@dataclass(frozen=True)
class Overrides:
    """Live changes; ``None`` means "leave as it is"."""

    domain_weights: dict[str, float] | None = None
    kl_coef: float | None = None
    temperature: float | None = None

    def is_empty(self) -> bool:
        return self.domain_weights is None and self.kl_coef is None and self.temperature is None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Overrides:
        """Validates plain data (from a file, the database or an API call)."""
        if not data:
            return cls()
        unknown = sorted(set(data) - {"domain_weights", "kl_coef", "temperature"})
        if unknown:
            raise ValueError(f"unknown override(s): {', '.join(unknown)}")
        weights = data.get("domain_weights")
        if weights is not None:
            if not isinstance(weights, Mapping) or not weights:
                raise ValueError("domain_weights: must be a non-empty object {domain: weight}")
            for name, weight in weights.items():
                if not _non_negative(weight):
                    raise ValueError(f"domain_weights.{name}: must be a number >= 0")
            weights = {str(k): float(v) for k, v in weights.items()}
        kl_coef = data.get("kl_coef")
        if kl_coef is not None and not _non_negative(kl_coef):
            raise ValueError("kl_coef: must be a number >= 0")
        temperature = data.get("temperature")
        if temperature is not None and not _non_negative(temperature):
            raise ValueError("temperature: must be a number >= 0")
        return cls(
            domain_weights=weights,
            kl_coef=None if kl_coef is None else float(kl_coef),
            temperature=None if temperature is None else float(temperature),
        )

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.domain_weights is not None:
            data["domain_weights"] = dict(self.domain_weights)
        if self.kl_coef is not None:
            data["kl_coef"] = self.kl_coef
        if self.temperature is not None:
            data["temperature"] = self.temperature
        return data


def _non_negative(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class ControlDecision:
    preempt: bool = False
    cancel: bool = False
    overrides: Overrides = field(default_factory=Overrides)
    reason: str = ""


@runtime_checkable
class Control(Protocol):
    def poll(self, step: int) -> ControlDecision: ...


class StaticControl:
    """Decisions fixed in advance: preempt or cancel before a given step, overrides from given
    steps on. ``StaticControl()`` never interrupts (a plain run)."""

    def __init__(
        self,
        preempt_at: int | None = None,
        cancel_at: int | None = None,
        overrides_at: Mapping[int, Overrides | Mapping[str, Any]] | None = None,
    ) -> None:
        self.preempt_at = preempt_at
        self.cancel_at = cancel_at
        self.overrides_at = {
            step: value if isinstance(value, Overrides) else Overrides.from_dict(value)
            for step, value in (overrides_at or {}).items()
        }
        self.polled: list[int] = []

    def poll(self, step: int) -> ControlDecision:
        self.polled.append(step)
        return ControlDecision(
            preempt=self.preempt_at is not None and step >= self.preempt_at,
            cancel=self.cancel_at is not None and step >= self.cancel_at,
            overrides=self.overrides_at.get(step, Overrides()),
            reason="static",
        )


class FileControl:
    """Reads a JSON file, when it changed, at each poll::

        {"preempt": false, "cancel": false,
         "overrides": {"domain_weights": {"arithmetic": 2.0}, "kl_coef": 0.01}}

    A missing file means "carry on". A file that does not parse or validate is ignored (the
    previous decision stands) and the problem is kept in ``last_error`` — a typo in a live edit
    must not stop a run. Overrides are handed out once per change of the file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.last_error: str | None = None
        self._last_stat: tuple[int, int] | None = None
        self._decision = ControlDecision()

    def poll(self, step: int) -> ControlDecision:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return ControlDecision(preempt=self._decision.preempt, cancel=self._decision.cancel)
        signature = (stat.st_mtime_ns, stat.st_size)
        if signature == self._last_stat:
            return ControlDecision(preempt=self._decision.preempt, cancel=self._decision.cancel)
        self._last_stat = signature
        try:
            data = json.loads(self.path.read_text() or "{}")
            if not isinstance(data, dict):
                raise ValueError("the control file must hold a JSON object")
            unknown = sorted(set(data) - {"preempt", "cancel", "overrides"})
            if unknown:
                raise ValueError(f"unknown key(s): {', '.join(unknown)}")
            decision = ControlDecision(
                preempt=bool(data.get("preempt", False)),
                cancel=bool(data.get("cancel", False)),
                overrides=Overrides.from_dict(data.get("overrides")),
                reason=f"file {self.path}",
            )
        except (ValueError, OSError) as exc:
            self.last_error = str(exc)
            return ControlDecision(preempt=self._decision.preempt, cancel=self._decision.cancel)
        self.last_error = None
        self._decision = decision
        return decision


class SignalControl:
    """Turns SIGTERM / SIGINT into a preempt request (checkpoint, then stop), then asks the
    wrapped control. Install from the main thread; `restore` puts the old handlers back."""

    def __init__(self, inner: Control | None = None, signals: tuple[int, ...] | None = None):
        self.inner = inner
        self.requested = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        for signum in signals or (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C means "now"
        self.signal_name = signal.Signals(signum).name
        self.requested.set()

    def poll(self, step: int) -> ControlDecision:
        decision = self.inner.poll(step) if self.inner is not None else ControlDecision()
        if self.requested.is_set():
            return ControlDecision(
                preempt=True,
                cancel=decision.cancel,
                overrides=decision.overrides,
                reason=f"signal {self.signal_name}",
            )
        return decision

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
