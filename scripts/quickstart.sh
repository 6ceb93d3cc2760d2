#!/usr/bin/env bash
# Quickstart: install, then export a small encoder/decoder model, bundle it, publish it to an
# embedded registry (SQLite + local blob directory under .quickstart/home), pull it pinned by
# digest, verify it against this machine and run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
export PATH="$PWD/.venv/bin:$PATH"
work=.quickstart
rm -rf "$work"
mkdir -p "$work"
export PT2REG_HOME="$PWD/$work/home"

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

step python examples/translator.py "$work"
step pt2reg bundle encoder="$work/encoder.pt2" decoder="$work/decoder.pt2" \
    --sample encoder="$work/encoder_inputs.pt" --sample decoder="$work/decoder_inputs.pt" \
    --meta owner=quickstart -o "$work/translator.pt2b"
step pt2reg inspect "$work/translator.pt2b"
step pt2reg push "$work/translator.pt2b" --name demo/translator --alias staging \
    --dataset "file://$PWD/$work/data" --run-id quickstart-1
digest=$(pt2reg show demo/translator@staging --json | python -c 'import json,sys; print(json.load(sys.stdin)["digest"])')
step pt2reg pull "demo/translator@$digest" -o "$work/pulled.pt2b"
step pt2reg verify "demo/translator@$digest"
step pt2reg run "demo/translator@$digest" --samples
step pt2reg run "demo/translator@$digest" --program encoder --inputs "$work/encoder_inputs.pt" \
    --output "$work/encoder_outputs.pt"
step pt2reg list demo/translator
step pt2reg audit --verify
printf '\nquickstart OK: registry home is %s\n' "$PT2REG_HOME"
