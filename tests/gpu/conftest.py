"""Fixtures of the GPU tests. Helpers live in ``gpu_support.py``, the NVML double in
``nvml_double.py``; this directory is put on ``sys.path`` so tests can import both."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from gpu_support import StubTools  # noqa: E402


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StubTools:
    """Stub tools in a temp dir that is the only entry of PATH."""
    stubs = StubTools(tmp_path / "stubs")
    monkeypatch.setenv("PATH", str(stubs.bin))
    return stubs


@pytest.fixture(autouse=True)
def _no_fake_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUECTL_FAKE_GPUS of the developer's shell must not change what tests see."""
    monkeypatch.delenv("CUECTL_FAKE_GPUS", raising=False)
