"""Store fixtures: every contract test runs against SQLite and against a real PostgreSQL.

The PostgreSQL server is started once per test session from the installed server
binaries (``tests/pgserver.py``); each test gets a database of its own, dropped after it.
Without server binaries (or psycopg) the PostgreSQL cases are skipped with the reason.
"""

from __future__ import annotations

import uuid

import pytest

from cuectl.sched.store import open_store

# store_url (both backends), pg_server and pg_url are in tests/conftest.py.


@pytest.fixture
def store(store_url: str):
    """A new store of each backend, closed after the test."""
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def roles(pg_url):
    """LOGIN roles on a PostgreSQL store with roles.sql applied: alice and bob are users,
    worker a cuectl_worker, boss a cuectl_admin (names: who -> role)."""
    psycopg = pytest.importorskip("psycopg")
    from cuectl.sched.store import roles_sql

    open_store(pg_url).close()
    suffix = uuid.uuid4().hex[:6]
    names = {who: f"n{who}_{suffix}" for who in ("alice", "bob", "worker", "boss")}

    def sql(statement, params=None):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(statement, params)  # no parameters: the script's own % signs stay

    sql(roles_sql())
    for who, role in names.items():
        sql(f"CREATE ROLE {role} LOGIN")
        sql(f"GRANT {({'worker': 'cuectl_worker', 'boss': 'cuectl_admin'}.get(who, 'cuectl_user'))} TO {role}")
    yield names
    for role in names.values():
        sql(f"REASSIGN OWNED BY {role} TO postgres; DROP OWNED BY {role}")
        sql(f"DROP ROLE {role}")
