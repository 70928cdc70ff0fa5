"""Store fixtures: every contract test runs against SQLite and against a real PostgreSQL.

The PostgreSQL server is started once per test session from the installed server
binaries (``tests/pgserver.py``); each test gets a database of its own, dropped after it.
Without server binaries (or psycopg) the PostgreSQL cases are skipped with the reason.
"""

from __future__ import annotations

import pytest

from cuectl.sched.store import open_store

# store_url (both backends), pg_server and pg_url are in tests/conftest.py.


@pytest.fixture
def store(store_url: str):
    """A new store of each backend, closed after the test."""
    s = open_store(store_url)
    yield s
    s.close()
