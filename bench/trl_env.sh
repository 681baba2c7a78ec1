#!/usr/bin/env bash
# The peer's environment for bench/bench_trl.py: TRL (and datasets, accelerate) in their own
# virtual environment under var/trl-venv, never in the project's dependencies. It sees the
# project's .venv packages through a .pth file and installs under the project's versions as
# constraints, so torch and transformers are the very same builds on both sides of the
# comparison (and nothing large is downloaded again).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || scripts/bootstrap.sh
venv=var/trl-venv
if [ ! -x "$venv/bin/python" ]; then
  python3.11 -m venv "$venv" 2>/dev/null || .venv/bin/python -m venv --without-pip "$venv"
fi
project_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
peer_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$project_site" >"$peer_site/project-venv.pth"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
.venv/bin/python -m pip freeze --exclude-editable >"$constraints"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" \
  "trl==${TRL_VERSION:-1.16.0}" datasets accelerate
"$venv/bin/python" -c 'import trl, torch, transformers; print("trl", trl.__version__, "torch", torch.__version__, "transformers", transformers.__version__)'
