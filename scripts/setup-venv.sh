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
  .venv/bin/python -m pip install --quiet --no-compile --disable-pip-version-check -c constraints-dev.txt -e '.[dev]'
  # pip byte-compiles on one core; compileall on every core (measured on 2 cores: 84-93 s +
  # 35 s instead of 133-149 s). Files it cannot compile (torch ships one in Python 3.12
  # syntax) are skipped, as pip skips them; the rest must be compiled here, since a machine
  # with PYTHONDONTWRITEBYTECODE set would otherwise compile torch again in every process.
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
