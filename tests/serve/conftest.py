"""Fixtures for the `cuectl serve` tests: real server processes on real stores, driven over
HTTP (apiclient.py beside this file holds the client and helpers). Servers are started once
per module: the tests of a module share one store and must not depend on each other's jobs
(each uses its own names)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # apiclient
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # osusers, pgserver

from apiclient import isolated_env  # noqa: E402


@pytest.fixture(scope="module")
def serve_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve")


@pytest.fixture(scope="module")
def serve_env(serve_dir: Path) -> dict[str, str]:
    return isolated_env(serve_dir)
