"""Command line for debugging a spec by hand.

    python -m sandboxes run --spec spec.json [--stdin FILE] [--file PATH=HOSTFILE ...] -- CMD ...
    python -m sandboxes check     # which defences this machine provides
    python -m sandboxes reap      # remove what dead owners left behind

``run`` prints the ExecResult as JSON and exits with the command's exit code (or 2 when
the spec is invalid, 3 when the sandbox cannot start).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sandboxes.errors import SandboxError, SandboxSpecError
from sandboxes.sandbox import Sandbox
from sandboxes.spec import DEFENCES, SandboxSpec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sandboxes", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run one command in a sandbox and print the result")
    run.add_argument("--spec", type=Path, help="JSON file with SandboxSpec fields")
    run.add_argument("--stdin", type=Path, help="file fed to the command's stdin")
    run.add_argument("--timeout", type=float, help="overrides the spec's timeout_s")
    run.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH=HOSTFILE",
        help="copy HOSTFILE into the sandbox at PATH (relative to /work)",
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    commands.add_parser("check", help="print the defences this machine provides")
    commands.add_parser("reap", help="remove cgroups and work dirs of dead owners")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check":
        from sandboxes.cgroups import manager

        missing = manager().missing
        report = {
            "cgroup_version": manager().version,
            "defences": {d: ("missing: " + missing[d]) if d in missing else "ok" for d in DEFENCES},
        }
        print(json.dumps(report, indent=2))
        return 0
    if args.command == "reap":
        from sandboxes.janitor import reap_stale

        print(json.dumps({"reaped": reap_stale()}))
        return 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        print("error: give the command after --", file=sys.stderr)
        return 2
    try:
        data = json.loads(args.spec.read_text()) if args.spec else {}
        spec = SandboxSpec.from_dict(data)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    files = {}
    for item in args.file:
        path, sep, host = item.partition("=")
        if not sep:
            print(f"error: --file wants PATH=HOSTFILE, got {item!r}", file=sys.stderr)
            return 2
        files[path] = Path(host).read_bytes()
    stdin = args.stdin.read_bytes() if args.stdin else None
    try:
        with Sandbox(spec) as sandbox:
            sandbox.write_files(files)
            result = sandbox.run(command, stdin=stdin, timeout=args.timeout)
    except SandboxSpecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    print(json.dumps(result.to_dict(), indent=2))
    return result.exit_code if result.exit_code is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
