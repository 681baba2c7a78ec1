"""The RL core: run specs, rollout engines, algorithms, the DeepSpeed trainer and the run loop.

No Django here (docs/ARCHITECTURE.md, the import rule). The public surface::

    from training import RunSpec, run, JsonlSink, StaticControl
    outcome = run(RunSpec.from_dict(spec), sink, control)

Names are imported lazily so that ``import training.demo`` (or the spec alone) does not pay
for DeepSpeed.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RunSpec": "training.spec",
    "SpecError": "training.spec",
    "DomainSpec": "training.spec",
    "Sink": "training.sink",
    "JsonlSink": "training.sink",
    "ListSink": "training.sink",
    "NullSink": "training.sink",
    "QueueingSink": "training.sink",
    "SinkError": "training.sink",
    "Control": "training.control",
    "ControlDecision": "training.control",
    "Overrides": "training.control",
    "StaticControl": "training.control",
    "FileControl": "training.control",
    "SignalControl": "training.control",
    "Trajectory": "training.trajectory",
    "trajectory_json_schema": "training.trajectory",
    "run": "training.loop",
    "RunOutcome": "training.loop",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'training' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
