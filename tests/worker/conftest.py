"""Fixtures for the worker tests (helpers live in farmlib.py beside this file)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from farmlib import Farm  # noqa: E402


@pytest.fixture
def farm(tmp_path: Path):
    f = Farm(tmp_path)
    yield f
    f.cleanup()
