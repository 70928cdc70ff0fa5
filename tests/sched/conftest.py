"""Store fixtures: every contract test runs against SQLite and against a real PostgreSQL.

The PostgreSQL server is started once per test session from the installed server
binaries (``tests/pgserver.py``); each test gets a database of its own, dropped after it.
Without server binaries (or psycopg) the PostgreSQL cases are skipped with the reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cuectl.sched.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgserver  # noqa: E402

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(scope="session")
def pg_server() -> pgserver.PgServer:
    try:
        return pgserver.shared_server()
    except pgserver.PgUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


@pytest.fixture
def pg_url(pg_server: pgserver.PgServer):
    """A fresh, empty database on the session's server (isolation per test)."""
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for a new, empty store of each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "s" / "cuectl.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(store_url: str):
    """A new store of each backend, closed after the test."""
    s = open_store(store_url)
    yield s
    s.close()
