#!/usr/bin/env bash
# Create .venv and install pt2-registry with its dev/test extras. torch is pinned to 2.13.0
# (CPU) by constraints-dev.txt so this never pulls a multi-GB CUDA build. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.pt2reg-installed
want=$(cat pyproject.toml constraints-dev.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints-dev.txt -e '.[dev]'
  echo "$want" > "$stamp"
fi
