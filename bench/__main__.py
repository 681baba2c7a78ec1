"""Runs the benchmarks: every bench/bench_*.py, or those named on the command line.

    python -m bench                 # all
    python -m bench sandboxes       # bench/bench_sandboxes*.py only

Each benchmark is a script that prints its own figures next to a baseline measured in the same
run (machines here are noisy, so only ratios compare across runs).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    scripts = sorted(here.glob("bench_*.py"))
    if argv:
        scripts = [s for s in scripts if any(s.stem.startswith(f"bench_{a}") for a in argv)]
    failed = []
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        rc = subprocess.call([sys.executable, str(script)], cwd=here.parent)
        if rc != 0:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
