#!/usr/bin/env bash
# Set up and run the whole test suite (installs what it needs into .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,postgres"
# The browser tests (tests/web) drive Debian's Chromium through Playwright (the test extra);
# Playwright's own browser downloads are never used. Install Chromium when it is missing and
# this runs as root (CI); otherwise say how, and let tests/web fail with the same advice.
# CUECTL_CHROMIUM points at another Chromium; CUECTL_SKIP_BROWSER=1 skips those tests.
chromium="${CUECTL_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$chromium" ] && [ "${CUECTL_SKIP_BROWSER:-}" != 1 ]; then
  if [ "$(id -u)" = 0 ] && [ -z "${CUECTL_CHROMIUM:-}" ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing chromium for the browser tests (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "scripts/test.sh: no Chromium at $chromium: tests/web will fail. Install it with" \
         "'sudo apt-get install chromium' (Debian/Ubuntu), point CUECTL_CHROMIUM at a Chromium," \
         "or set CUECTL_SKIP_BROWSER=1 to skip the browser tests." >&2
  fi
fi
# task-spooler is only for bench/bench_worker.py; PostgreSQL server binaries, when
# installed, let the store contract tests run against a real PostgreSQL as well.
# Type-check first (settings and the file list are in pyproject.toml's [tool.mypy]);
# a type error fails the run before any test starts.
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest -q "$@"
