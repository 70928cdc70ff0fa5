"""Fixtures for tests/cuebot (helpers live in cuebotlib.py beside this file)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from cuebotlib import CuebotServer, start_server  # noqa: E402


@pytest.fixture
def cuebot(db_path: Path) -> Iterator[Any]:
    """Factory: ``cuebot()`` starts a server on the test's store (made if missing); all
    are stopped at the end (their log printed on failure by pytest's capture)."""
    servers: list[CuebotServer] = []

    def start(**kwargs: Any) -> CuebotServer:
        if not db_path.exists():
            from cuectl.sched.store import open_store

            open_store(str(db_path), create=True).close()
        server = start_server(kwargs.pop("db", db_path), **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        sys.stderr.write(server.stop())
