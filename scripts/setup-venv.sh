#!/usr/bin/env bash
# Create a venv and install pt2-registry with its dev/test extras. Idempotent (a stamp holds the
# digest of what it was installed from).
#
#   bash scripts/setup-venv.sh             .venv            torch 2.13.0 CPU (constraints-dev.txt)
#   bash scripts/setup-venv.sh torch2.14   .venv-torch2.14  torch 2.14.1 (constraints-torch2.14.txt)
#   bash scripts/setup-venv.sh --torch-only torch2.14        only torch and what it requires, into
#                                                           that venv (scripts/test.sh runs it beside
#                                                           the first: no editable install, so the
#                                                           two never write the same files); the
#                                                           full call after it installs the rest
#
# The first is the development and CI venv: torch 2.13.0 CPU lies on local disk, so this never
# pulls a multi-GB CUDA build. The second is the torch matrix's second tier (scripts/test.sh):
# the newest supported torch, a CUDA build (~5.5 GB) that also lies on local disk.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
torch_only=
if [ "${1:-}" = --torch-only ]; then torch_only=1; shift; fi
tier=${1:-}
if [ -z "$tier" ]; then
  venv=.venv constraints=constraints-dev.txt extra=dev
else
  venv=.venv-$tier constraints=constraints-$tier.txt extra=test   # the tests only: no docs or lint tools
  [ -f "$constraints" ] || { echo "setup-venv.sh: no $constraints for tier '$tier'" >&2; exit 2; }
fi
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
stamp=$venv/.pt2reg-installed
want=$(cat pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)
if [ -n "$torch_only" ]; then
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    "$venv/bin/python" -m pip install --quiet --no-compile --disable-pip-version-check -c "$constraints" torch
  fi
  exit 0
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "$venv/bin/python" -m pip install --quiet --no-compile --disable-pip-version-check -c "$constraints" -e ".[$extra]"
  # pip byte-compiles on one core; compileall on every core (measured on 2 cores: 84-93 s +
  # 35 s instead of 133-149 s). Files it cannot compile (torch ships one in Python 3.12
  # syntax) are skipped, as pip skips them; the rest must be compiled here, since a machine
  # with PYTHONDONTWRITEBYTECODE set would otherwise compile torch again in every process.
  "$venv/bin/python" -m compileall -q -j 0 "$venv"/lib/python*/site-packages >/dev/null 2>&1 || true
  echo "$want" > "$stamp"
fi
