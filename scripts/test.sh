#!/usr/bin/env bash
# Build the docs site (mkdocs build --strict, ~3 s), then run the whole test suite: unit tier,
# integration tier on SQLite + local files + moto S3, and
# the team tier against a real PostgreSQL and a real S3-compatible server (SeaweedFS), which the
# test fixtures start once per run on free loopback ports, share between the xdist workers and
# stop when the run ends (tests/shared.py). `-m "not slow"` leaves out the longest tests.
#
# Then the torch matrix's second tier: the newest supported torch (2.14.1, in .venv-torch2.14)
# runs the tests whose subject is torch's behaviour (SECOND_TIER below), and the cross-version
# tests (bundles made with one torch verified and run with the other, both ways).
#
#   bash scripts/test.sh                        both tiers (what .ci/run runs)
#   bash scripts/test.sh ARGS...                pytest ARGS under torch 2.13.0 only
#   TIER=torch2.14 bash scripts/test.sh [ARGS]  pytest ARGS (default SECOND_TIER) under torch 2.14.1 only
set -euo pipefail
cd "$(dirname "$0")/.."
SECOND=torch2.14
SECOND_TIER=(
  # the program format torch writes: serde schema, side-effect operators, decoding, canonical zips
  tests/unit/test_program_validation.py tests/unit/test_schema_decoding.py tests/unit/test_torch_adapter.py
  tests/integration/test_format_rules.py tests/integration/test_canonical_programs.py
  # bundling with golden samples, the manifest's program metadata, weights
  tests/unit/test_bundle_api.py tests/unit/test_bundle_cli.py tests/unit/test_portable_metadata.py
  tests/unit/test_mapped_weights.py tests/unit/test_chunking.py tests/unit/test_aoti_weight_chunks.py
  # compatibility: the probe of this torch, the rules, verify
  tests/unit/test_compat_rules.py tests/unit/test_target.py tests/unit/test_device.py
  tests/unit/test_native_choice.py tests/integration/test_cli_runtime.py tests/integration/test_early_checks.py
  # the loader, samples and inputs, shapes, the first-load sandbox, programs exported on a GPU
  tests/unit/test_signature_check.py tests/unit/test_verdicts.py tests/integration/test_loader.py
  tests/integration/test_heldout_shapes.py tests/integration/test_constant_args.py
  tests/integration/test_trust_sandbox.py tests/integration/test_gpu_exports.py
  # bundles crossing torch versions, both ways (drives .venv's torch 2.13.0 as a subprocess)
  tests/integration/test_torch_matrix.py
)
tier_seconds() { echo "test.sh: $1 took $(( SECONDS - $2 )) s" >&2; }
t0=$SECONDS
tier_torch=
if [ -n "${TIER:-}" ] || [ $# -eq 0 ]; then
  # the second tier's torch (a CUDA build, 6 GB from local disk) installs beside the first venv:
  # the two pips share the 2 cores instead of taking turns; its own failure shows in the full
  # call below, which installs whatever is still missing
  bash scripts/setup-venv.sh --torch-only "${TIER:-$SECOND}" & tier_torch=$!
fi
bash scripts/setup-venv.sh
if [ -n "$tier_torch" ]; then
  wait "$tier_torch" || echo "test.sh: installing the second tier's torch failed; trying again" >&2
  bash scripts/setup-venv.sh "${TIER:-$SECOND}"  # then the rest of that venv; nothing once installed
fi
tier_seconds "the venvs" "$t0"
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && ! command -v initdb >/dev/null 2>&1; then
  echo "PostgreSQL server binaries missing; installing Debian's postgresql" >&2
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q postgresql >/dev/null; else sudo apt-get install -y -q postgresql >/dev/null; fi
fi
if ! command -v dot >/dev/null 2>&1; then
  echo "Graphviz dot missing (lineage --dot is rendered by the tests); installing Debian's graphviz" >&2
  if [ "$(id -u)" = 0 ]; then apt-get install -y -q graphviz >/dev/null; else sudo apt-get install -y -q graphviz >/dev/null; fi
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "Chromium missing (the web UI is tested in a headless browser); installing Debian's chromium + chromium-driver" >&2
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get install -y -q chromium chromium-driver >/dev/null \
    || { $sudo_ apt-get update -q >/dev/null && $sudo_ apt-get install -y -q chromium chromium-driver >/dev/null; }
fi
if ! { command -v docker-registry || command -v registry; } >/dev/null 2>&1 || ! command -v skopeo >/dev/null 2>&1; then
  echo "OCI registry or skopeo missing (OCI delivery is tested against the CNCF distribution server and skopeo); installing Debian's docker-registry + skopeo" >&2
  sudo_=""; [ "$(id -u)" = 0 ] || sudo_=sudo
  $sudo_ apt-get install -y -q docker-registry skopeo >/dev/null \
    || { $sudo_ apt-get update -q >/dev/null && $sudo_ apt-get install -y -q docker-registry skopeo >/dev/null; }
fi
# two workers, as many as the 2-core CI machine has; worksteal keeps both busy to the end
if [ -n "${TIER:-}" ]; then
  [ $# -gt 0 ] || set -- "${SECOND_TIER[@]}"
  PT2REG_TORCH_MATRIX=required exec ".venv-$TIER/bin/python" -m pytest -q -n 2 --dist worksteal "$@"
fi
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest -q -n 2 --dist worksteal "$@"
fi
# lint and import order ([tool.ruff] in pyproject; 0.5 s measured, no cache)
t0=$SECONDS status=0
.venv/bin/ruff check --no-cache registry tests scripts benchmarks examples || status=$?
tier_seconds "ruff" "$t0"
# types ([tool.mypy] in pyproject: its strictness and its baseline); no cache kept between runs
t0=$SECONDS
.venv/bin/python -m mypy --cache-dir=/dev/null || status=$(( status ? status : $? ))
tier_seconds "mypy" "$t0"
# the docs site, warnings as errors (~3 s): a command, option or API name the pages cannot render
# fails here (tests/unit/test_docs.py checks that each has a page)
t0=$SECONDS
docs_out=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$docs_out" || status=$(( status ? status : $? ))
rm -rf "$docs_out"
tier_seconds "the docs (mkdocs build --strict)" "$t0"
# the whole suite; the cross-version tests run once, in the second tier
t0=$SECONDS
.venv/bin/python -m pytest -q -n 2 --dist worksteal --ignore=tests/integration/test_torch_matrix.py || status=$(( status ? status : $? ))
tier_seconds "torch 2.13.0 (the whole suite)" "$t0"
t0=$SECONDS
PT2REG_TORCH_MATRIX=required ".venv-$SECOND/bin/python" -m pytest -q -n 2 --dist worksteal "${SECOND_TIER[@]}" \
  || status=$(( status ? status : $? ))
tier_seconds "torch 2.14.1 (the second tier)" "$t0"
exit "$status"
