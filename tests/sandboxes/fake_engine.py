"""A stand-in for the docker/podman CLI, for testing the OCI driver's plumbing only.

No container engine runs on this machine, so this script answers the few subcommands the
driver uses (``info``, ``image inspect``, ``run``, ``inspect``, ``kill``, ``rm``) by running
the command directly on the host, in the host directory mounted at /work. It isolates
nothing: it only lets the tests check that the driver builds its command, streams output,
feeds stdin, reads the container state and kills on timeout. The real engines are tested
where one answers (tests/sandboxes/test_oci.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

STATE = Path(os.environ["FAKE_ENGINE_STATE"])
VALUED = {
    "--name", "--network", "--memory", "--memory-swap", "--pids-limit", "--cpus", "--cap-drop",
    "--security-opt", "--user", "--ulimit", "--volume", "--workdir", "--hostname", "--env",
}  # fmt: skip


def run(args: list[str]) -> int:
    options: dict[str, list[str]] = {}
    index = 0
    while args[index] != "--":
        if args[index] in VALUED:
            options.setdefault(args[index], []).append(args[index + 1])
            index += 2
        else:
            options.setdefault(args[index], []).append("")
            index += 1
    image, argv = args[index + 1], args[index + 2 :]
    name = options["--name"][0]
    mounts = dict(reversed(v.split(":")[:2]) for v in options.get("--volume", []))
    workdir = options["--workdir"][0]
    cwd = mounts["/work"] + workdir[len("/work") :]
    env = dict(e.split("=", 1) for e in options.get("--env", []))
    env["PATH"] = "/usr/bin:/bin"
    (STATE / f"{name}.args").write_text(json.dumps([*args[:index], image]))
    child = subprocess.Popen(argv, cwd=cwd, env=env)
    (STATE / f"{name}.pid").write_text(str(child.pid))
    code = child.wait()
    code = 128 - code if code < 0 else code
    state = STATE / f"{name}.state"
    if not state.exists():
        state.write_text(json.dumps({"ExitCode": code, "OOMKilled": False}))
    return code


def main(argv: list[str]) -> int:
    command = argv[0]
    if command == "info":
        print("{}")
        return 0
    if command == "image":
        print("sha256:" + "f" * 64)
        return 0
    if command == "run":
        return run(argv[1:])
    name = argv[-1]
    if command == "inspect":
        state = STATE / f"{name}.state"
        if not state.exists():
            return 1
        print(state.read_text())
        return 0
    if command == "kill":
        pid = int((STATE / f"{name}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        (STATE / f"{name}.state").write_text(json.dumps({"ExitCode": 137, "OOMKilled": False}))
        return 0
    if command == "rm":
        pid_file = STATE / f"{name}.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        (STATE / f"{name}.removed").touch()
        return 0
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
