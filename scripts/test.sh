#!/usr/bin/env bash
# Run the whole test suite: unit tier, integration tier on SQLite + local files + moto S3, and
# the team tier against a real PostgreSQL and a real S3-compatible server (SeaweedFS), which the
# test fixtures start once per run on free loopback ports, share between the xdist workers and
# stop when the run ends (tests/shared.py). `-m "not slow"` leaves out the longest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh
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
# two workers, as many as the 2-core CI machine has; worksteal keeps both busy to the end
exec .venv/bin/python -m pytest -q -n 2 --dist worksteal "$@"
