#!/usr/bin/env bash
# Set up and run the whole test suite (installs what it needs into .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "test,postgres"
# task-spooler is only for bench/bench_worker.py; PostgreSQL server binaries, when
# installed, let the store contract tests run against a real PostgreSQL as well.
# Type-check first (settings and the file list are in pyproject.toml's [tool.mypy]);
# a type error fails the run before any test starts.
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest -q "$@"
