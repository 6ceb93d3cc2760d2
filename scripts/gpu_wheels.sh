#!/usr/bin/env bash
# Wheels of pt2-registry's dependencies (torch excluded) for a lent GPU machine: its own torch,
# Python 3.12 (by default), no network. Run here, carry .gpu-wheels/ (ignored by git) with the
# working tree, and there: pip install --no-index --no-deps --target .gpu-deps .gpu-wheels/*.whl
# then PYTHONPATH=.gpu-deps:. python3 scripts/gpu_check.py --device cuda:0 --report $OUT/gpu_check.json
#   PY=3.12 OUT_DIR=.gpu-wheels bash scripts/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-3.12}
out=${OUT_DIR:-.gpu-wheels}
mkdir -p "$out"
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version "$py" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$out" \
  "sqlalchemy>=2.0" "alembic>=1.12" "jsonschema>=4.18" "cryptography>=41" "isal>=1.0" "orjson>=3.9" \
  "boto3>=1.28" "packaging>=23" "click>=8.1" "rich>=13" "httpx>=0.27" "safetensors>=0.4" "urllib3>=1.26"
ls "$out" | wc -l | xargs echo "wheels in $out:"
du -sh "$out"
