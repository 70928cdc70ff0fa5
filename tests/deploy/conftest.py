"""Deployment tests: deploy/ (Dockerfile, kustomize base and overlays, systemd units) and
the docs that walk through them. Helpers live in deploylib.py, put on sys.path here."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
