"""Scoring a hand-written sample ("try it on a sample") outside the web process.

A rubric's criteria run reward code: `python_function` imports and calls an installed
function, other kinds start sandboxes or load models. None of that may run inside the web
process, where a crash, a hang, a leaked thread or an import with side effects would hit every
user of the console. So the sample is scored by `python -m rewards score`, the rewards
library's own command and the same `Rubric` code a run uses, in a child process that:

- starts in an empty temporary directory, with only the project on its import path and an
  environment stripped of the console's settings (no SECRET_KEY, DATABASE_URL, REDIS_URL:
  only PATH, HOME, locale and the SANDBOXES_/REWARDS_/HF_ variables pass);
- has an address-space limit and a wall-clock deadline, after which its whole process group is
  killed;
- runs `sandboxed_function` and other code criteria in their sandboxes, as a run does.

`python_function` may name only functions in the TRUSTED_REWARD_FUNCTIONS setting; specs
check that when saved and published (console.registry.specs), and the view checks the stored
version again before scoring, so a version saved before the list changed is not run either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from django.conf import settings

# The child sets its own limits, so no preexec_fn (unsafe in a threaded server) is needed.
_CHILD = (
    "import resource, runpy, sys\n"
    "limit = int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_AS, (limit, limit))\n"
    "sys.argv[0] = 'rewards'\n"
    "runpy.run_module('rewards', run_name='__main__', alter_sys=True)\n"
)
# Variables the child may inherit: enough to find programs, decode text, find model caches
# and configure the sandboxes and rewards libraries; none of the console's own settings.
_INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "XDG_CACHE_HOME")
_INHERITED_PREFIXES = ("SANDBOXES_", "REWARDS_", "HF_", "TRANSFORMERS_")
_MAX_ERROR_CHARS = 2000


class ScoringFailed(Exception):
    """The sample could not be scored; the message is for the person who asked."""


def _child_env(workdir: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name in _INHERITED_ENV or name.startswith(_INHERITED_PREFIXES)
    }
    env.update(
        TMPDIR=workdir,
        PYTHONPATH=str(settings.BASE_DIR),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _result_line(stdout: str) -> dict[str, Any] | None:
    # A trusted function may print to stdout too: the result is the last JSON object line.
    for line in reversed(stdout.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "total" in value:
            return value
    return None


def score_sample(
    spec: dict[str, Any], *, domain: str, prompt: str, completion: str, ground_truth: Any
) -> dict[str, Any]:
    """The rubric's RewardResult for one sample as a dict (total, breakdown, details), plus
    `details_json` for the page; raises ScoringFailed with a readable reason."""
    sample = {
        "domain": domain,
        "prompt": prompt,
        "completion": completion,
        "ground_truth": ground_truth,
    }
    timeout_s = settings.TRY_SAMPLE_TIMEOUT_S
    with tempfile.TemporaryDirectory(prefix="console-try-") as workdir:
        rubric_path = Path(workdir, "rubric.json")
        samples_path = Path(workdir, "samples.jsonl")
        rubric_path.write_text(json.dumps(spec), encoding="utf-8")
        samples_path.write_text(json.dumps(sample) + "\n", encoding="utf-8")
        argv = [
            sys.executable,
            "-c",
            _CHILD,
            str(settings.TRY_SAMPLE_MEMORY_BYTES),
            "score",
            "--rubric",
            str(rubric_path),
            "--samples",
            str(samples_path),
            "--json",
        ]
        child = subprocess.Popen(
            argv,
            cwd=workdir,
            env=_child_env(workdir),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group, killed whole on timeout
        )
        try:
            stdout, stderr = child.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise ScoringFailed(
                f"scoring took longer than {timeout_s} s (TRY_SAMPLE_TIMEOUT_S) and was stopped"
            ) from None
    result = _result_line(stdout) if child.returncode == 0 else None
    if result is None:
        reason = stderr.strip()[-_MAX_ERROR_CHARS:] or f"exit status {child.returncode}"
        raise ScoringFailed(f"the rubric could not score the sample: {reason}")
    result["details_json"] = json.dumps(
        result.get("details", {}), indent=2, ensure_ascii=False, default=str
    )
    return result
