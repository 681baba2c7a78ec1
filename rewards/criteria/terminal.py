"""Terminal and tool tasks: a check script run in the episode's own sandbox afterwards."""

from __future__ import annotations

import os
import re
import threading
from typing import Any, ClassVar

from rewards.registry import Criterion, register
from rewards.sandboxing import tail
from rewards.types import CriterionError, Outcome, Sample

# Restoring snapshots is bounded separately from the rubric's code pool.
_RESTORE_SLOTS = threading.BoundedSemaphore(max(1, os.cpu_count() or 1))
_SCORE_LINE = re.compile(r"^\s*score\s*[:=]\s*([-+]?\d+(?:\.\d+)?)\s*$", re.I | re.M)


@register
class CheckScript(Criterion):
    """Runs a check script in the sandbox the agent worked in and scores what it finds.

    The episode's sandbox comes from the sample's metadata: ``sandbox`` (a live
    `sandboxes.Sandbox`, still open) or ``sandbox_snapshot`` (a `sandboxes.Snapshot` or the
    path of a saved one, restored into a fresh sandbox). ``script`` is run with
    ``interpreter`` (default ``["sh", "-c"]``; ``["python3", "-I", "-c"]`` for Python)
    passed on the command line, never as a file the agent could have replaced. It checks
    files and their contents, or inspects a command's output. A sandbox kills every process
    at the end of each run, so a service the agent wrote is started by the check itself and
    queried over loopback (the episode's sandbox needs ``network="loopback"``).

    ``score_from``: ``exit_code`` (default; 1 when the script exits 0) or ``stdout`` (the last
    ``score: <number>`` line, clipped to [0, 1]). The script's output tail is in ``details``.
    """

    kind = "check_script"
    summary = "A check script run in the episode's sandbox after the agent finished."
    blocking = True
    default_timeout_s = 30.0
    params_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["script"],
        "properties": {
            "script": {"type": "string", "minLength": 1},
            "interpreter": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
            },
            "score_from": {"type": "string", "enum": ["exit_code", "stdout"]},
            "cwd": {"type": "string", "minLength": 1},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }

    def evaluate(self, sample: Sample) -> Outcome:
        from sandboxes import Sandbox, SandboxError

        live = sample.metadata.get("sandbox")
        snapshot = sample.metadata.get("sandbox_snapshot")
        # The check must end before the rubric's deadline for it.
        timeout = max(1.0, self.context.timeout_s * 0.9)
        try:
            if isinstance(live, Sandbox):
                return self._check(live, timeout)
            if snapshot is not None:
                with _RESTORE_SLOTS, Sandbox.restore(snapshot) as restored:
                    return self._check(restored, timeout)
        except (SandboxError, OSError, ValueError) as exc:
            raise CriterionError(f"sandbox failure: {exc}") from exc
        raise CriterionError(
            "no episode sandbox: put a live Sandbox in metadata['sandbox'] or a snapshot in "
            "metadata['sandbox_snapshot']"
        )

    def _check(self, sandbox: Any, timeout: float) -> Outcome:
        argv = [*self.params.get("interpreter", ["sh", "-c"]), self.params["script"]]
        # The sandbox kills every process of the check when the run ends (or times out).
        result = sandbox.run(
            argv, timeout=timeout, cwd=self.params.get("cwd"), env=self.params.get("env")
        )
        details: dict[str, Any] = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "stdout": tail(result.stdout, 1500),
            "stderr": tail(result.stderr, 1500),
        }
        if self.params.get("score_from") == "stdout":
            if not result.ok:
                return Outcome(0.0, details)
            found = _SCORE_LINE.findall(result.stdout)
            if not found:
                return Outcome(0.0, {**details, "reason": "no 'score: <number>' line"})
            return Outcome(min(1.0, max(0.0, float(found[-1]))), details)
        return Outcome(1.0 if result.ok else 0.0, details)
