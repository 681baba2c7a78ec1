"""`python -m console.devservers`: private servers per run, stopped by pid, and `make demo`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

import psutil
import pytest

BASE_DIR = Path(__file__).resolve().parents[2]
# Reports what the child sees: the URLs, and the servers devservers recorded for this run.
REPORT = """
import json, os, pathlib, sys
root = pathlib.Path(os.environ["CONSOLE_VAR_DIR"])
record = json.loads((root / "servers.json").read_text())
print(json.dumps({"env": {k: os.environ.get(k) for k in ("DATABASE_URL", "REDIS_URL")},
                  "root": str(root), "servers": record["servers"]}))
import psycopg, redis
psycopg.connect(os.environ["DATABASE_URL"]).execute("SELECT 1")
socket_path = os.environ["REDIS_URL"].removeprefix("redis+socket://")
assert redis.Redis(unix_socket_path=socket_path).ping()
sys.exit(int(sys.argv[1]))
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the servers `make test` gave it."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "CONSOLE_VAR_DIR"}}  # fmt: skip
    return {**env, **extra}


def devservers(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "console.devservers", *args],
        cwd=BASE_DIR, env=env, text=True, stdout=subprocess.PIPE, **kwargs,
    )  # fmt: skip


@pytest.mark.slow
def test_run_starts_private_servers_passes_the_exit_status_and_leaves_nothing(tmp_path):
    process = devservers("run", "--", sys.executable, "-c", REPORT, "3", env=clean_env())
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 3
    report = json.loads(output.strip().splitlines()[-1])
    assert report["env"]["DATABASE_URL"].startswith("postgresql://postgres@/console?host=")
    assert report["env"]["REDIS_URL"].startswith("redis+socket:///")
    assert re.search(r"/var/run-\d+$", report["root"])
    assert {server["name"] for server in report["servers"]} == {"postgres", "redis"}
    for server in report["servers"]:
        assert not psutil.pid_exists(server["pid"]), server
    assert not Path(report["root"]).exists()


@pytest.mark.slow
def test_run_keeps_its_servers_under_the_configured_var_dir(tmp_path):
    # The command's parent is devservers: its run directory is named after that pid.
    probe = (
        "import os, pathlib, sys; print(pathlib.Path(sys.argv[1], f'run-{os.getppid()}').is_dir())"
    )
    env = clean_env(CONSOLE_VAR_DIR=str(tmp_path))
    process = devservers("run", "--", sys.executable, "-c", probe, str(tmp_path), env=env)
    output, _ = process.communicate(timeout=180)
    assert process.returncode == 0
    assert output.strip().splitlines()[-1] == "True"
    assert not list(tmp_path.glob("run-*"))  # removed at the end, as under var/


def test_run_starts_nothing_when_both_urls_are_given():
    env = {
        **os.environ,
        "DATABASE_URL": "postgresql://u@/given?host=/x",
        "REDIS_URL": "redis://given",
    }
    env.pop("CONSOLE_VAR_DIR", None)
    probe = "import os; print(os.environ['DATABASE_URL'], os.environ['REDIS_URL'])"
    process = devservers("run", "--", sys.executable, "-c", probe, env=env, stderr=subprocess.PIPE)
    output, errors = process.communicate(timeout=60)
    assert process.returncode == 0
    assert output.split() == ["postgresql://u@/given?host=/x", "redis://given"]
    assert "ready" not in errors


@pytest.mark.slow
def test_sigterm_stops_the_command_and_both_servers():
    waiting = "import sys, time; print('started', flush=True); time.sleep(600)"
    process = devservers("run", "--", sys.executable, "-c", waiting, env=clean_env())
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    tree = psutil.Process(process.pid).children(recursive=True)
    servers = [p for p in psutil.process_iter(["name", "cmdline"])
               if f"run-{process.pid}" in " ".join(p.info["cmdline"] or [])]  # fmt: skip
    assert len(servers) >= 2  # the postmaster (and its helpers) and Redis
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 128 + signal.SIGTERM
    for leftover in tree + servers:
        assert not leftover.is_running() or leftover.status() == psutil.STATUS_ZOMBIE, leftover
    assert not (BASE_DIR / "var" / f"run-{process.pid}").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_demo_until_ready(var_dir: Path, port: int) -> tuple[subprocess.Popen[str], list[str]]:
    from training.models import ensure_demo_model

    # The demo registers the demo model; the suite's copy (built once per session) is reused
    # rather than built again under this test's own var/.
    models_root = ensure_demo_model().parent
    env = clean_env(CONSOLE_VAR_DIR=str(var_dir), PORT=str(port), MODELS_ROOT=str(models_root))
    process = devservers("demo", env=env, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 240
    for line in process.stdout:
        lines.append(line.rstrip())
        if "Console: http://127.0.0.1:" in line:
            break
        assert time.monotonic() < deadline, "\n".join(lines[-30:])
    else:
        pytest.fail("demo exited early:\n" + "\n".join(lines[-40:]))
    return process, lines


def _stop_demo(process: subprocess.Popen[str]) -> list[psutil.Process]:
    started = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=120)
    assert process.returncode == 0
    return started


@pytest.mark.slow
def test_make_demo_serves_the_console_and_stops_everything_on_ctrl_c(tmp_path):
    var_dir = tmp_path / "var"
    port = _free_port()
    process, lines = _run_demo_until_ready(var_dir, port)
    try:
        assert any(line.split()[:1] == ["researcher"] for line in lines), lines
        with urlopen(f"http://127.0.0.1:{port}/accounts/login/", timeout=10) as response:
            assert response.status == 200
        with pytest.raises(HTTPError) as refused:
            urlopen(f"http://127.0.0.1:{port}/api/me", timeout=10)
        assert refused.value.code == 401
        record = json.loads((var_dir / "servers.json").read_text())
        server_pids = [server["pid"] for server in record["servers"]]
        commands = [" ".join(p.cmdline()) for p in psutil.Process(process.pid).children()]
        control = [
            c for c in commands if ("celery" in c and "-Q control" in c) or "celeryd: control@" in c
        ]
        assert len(control) == 1, commands
        # The agent's Celery worker renames its process ("[celeryd: host@<name>...") once up.
        assert sum("host_agent" in c or "celeryd: host@" in c for c in commands) == 1, commands
        # seed_demo registered the demo model for the demo team.
        assert "Model demo v1 registered" in "\n".join(lines)
    finally:
        started = _stop_demo(process)
    assert len(started) >= 4  # Redis, the web server, two workers (and their pool processes)
    for leftover in started:
        assert not leftover.is_running() or leftover.status() == psutil.STATUS_ZOMBIE, leftover
    for pid in server_pids:
        assert not psutil.pid_exists(pid)


@pytest.mark.slow
def test_persistent_services_reuse_their_data_on_the_next_start(tmp_path):
    """What a `make demo` rerun relies on: the same var/ brings back the same database."""
    script = """
import os, sys, psycopg
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as db:
    db.execute("CREATE TABLE IF NOT EXISTS marks (n int)")
    db.execute("INSERT INTO marks VALUES (1)")
    print(db.execute("SELECT count(*) FROM marks").fetchone()[0])
"""
    code = (
        "import os, sys, subprocess\n"
        "from pathlib import Path\n"
        "from console.devservers import PrivateServices\n"
        "services = PrivateServices(Path(sys.argv[1]), persistent=True)\n"
        "env = services.start(dict(os.environ))\n"
        "try:\n"
        "    subprocess.run([sys.executable, '-c', sys.argv[2]], env=env, check=True)\n"
        "finally:\n"
        "    services.stop()\n"
    )
    counts = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "var"), script],
            cwd=BASE_DIR, env=clean_env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        counts.append(done.stdout.split()[-1])
    assert counts == ["1", "2"]


@pytest.mark.slow
def test_servers_and_command_of_a_killed_run_are_stopped_by_the_next_run():
    from console.devservers import reap_abandoned_runs

    waiting = "import time; print('started', flush=True); time.sleep(600)"
    process = devservers("run", "--", sys.executable, "-c", waiting, env=clean_env())
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    run_dir = BASE_DIR / "var" / f"run-{process.pid}"
    record = json.loads((run_dir / "servers.json").read_text())
    left = [psutil.Process(s["pid"]) for s in record["servers"]]
    left.append(psutil.Process(record["command_pgid"]))
    process.kill()  # SIGKILL: no chance to clean up
    process.wait()
    assert all(p.is_running() for p in left)

    reap_abandoned_runs(BASE_DIR / "var")

    for leftover in left:
        # Raises TimeoutExpired if the process is still running.
        with contextlib.suppress(psutil.NoSuchProcess):
            leftover.wait(30)
    assert not run_dir.exists()
