"""The web monitor's pages (issue 15): mounted here once they land; ``/`` answers 404 until then."""

from __future__ import annotations

from typing import Any


def mount(app: Any) -> None:
    """Add the monitor's routes to ``app``."""
