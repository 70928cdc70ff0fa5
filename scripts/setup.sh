#!/usr/bin/env bash
# Create .venv (Python 3.10+) and install cuectl into it, with the extras named in $1
# (e.g. "test,postgres"). Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
spec="."
[ -n "$extras" ] && spec=".[${extras}]"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e "$spec"
