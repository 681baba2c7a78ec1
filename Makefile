# The two commands a fresh machine needs: `make demo` and `make test`. Both install what they
# need into .venv first (scripts/bootstrap.sh, a no-op when nothing changed).
PY := .venv/bin/python
SERVICES := $(PY) -m console.devservers

.PHONY: demo test test-fast bench lint format venv clean-var lock

venv:
	@scripts/bootstrap.sh

## Sets up, starts PostgreSQL, Redis, the ASGI server and Celery workers, seeds a demo team.
demo: venv
	$(SERVICES) demo

## Sets up and runs the whole test suite against private PostgreSQL and Redis.
test: venv
	$(SERVICES) run -- $(PY) -m pytest $(PYTEST_ARGS)

## The suite without tests marked slow or e2e (for quick local loops; CI runs `make test`).
test-fast: venv
	$(SERVICES) run -- $(PY) -m pytest -m "not slow and not e2e" $(PYTEST_ARGS)

## Benchmarks: each prints its figures next to a baseline measured in the same run.
bench: venv
	$(PY) -m bench $(BENCH_ARGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy console training rewards sandboxes

## Deletes the demo's database and Redis data under var/ (refuses while a demo is running).
clean-var:
	$(SERVICES) clean-demo

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## Re-resolves requirements.lock (pinned versions with hashes) from pyproject.toml; bootstrap
## installs exactly the lock, and tests/test_lock.py checks the environment against it.
lock: venv
	$(PY) scripts/lock.py
