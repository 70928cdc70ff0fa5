"""Store fixtures: every contract test runs against SQLite and against a real PostgreSQL.

The PostgreSQL server is started once per test session from the installed server
binaries (``tests/pgserver.py``); each test gets a database of its own, dropped after it.
Without server binaries (or psycopg) the PostgreSQL cases are skipped with the reason.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cuectl.sched.store import open_store

# pg_server, pg_url, pg_pooler and pooled_url are in tests/conftest.py.


#: Every backend the store tests run on; "pgbouncer" is PostgreSQL through PgBouncer in
#: transaction mode (``pgbouncer=true``), where nothing may live in a session.
BACKENDS = ("sqlite", "postgres", "pgbouncer", "socket")


#: The modules whose tests also run through the pooler. Behind it the store differs in how
#: it uses connections (no prepared statements, no session settings, no LISTEN, one
#: reader per report), not in its SQL: the contract suite calls every store method, the
#: notify tests race claimers and completions, the aside tests read reports. Running every
#: store test a third time would cost the suite over a minute and test the same SQL again.
POOLED_MODULES = {
    "test_store_contract",
    "test_device_states",
    "test_notify_store",
    "test_usage_sql_aside",
    "test_bulk_store",
}

#: The modules whose tests also run on "socket": a SQLite store reached through
#: ``cuectl serve --socket`` (``unix:PATH``, sched/store/remote.py) as its owner, so every
#: store method and record crosses the wire both ways. The other modules test SQL.
SOCKET_MODULES = {
    "test_store_contract",
    "test_device_states",
    "test_bulk_store",
    "test_depends_store",
    "test_notify_store",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test that uses a store runs on SQLite and PostgreSQL, and those of
    POOLED_MODULES also through the pooler, except a test marked ``acts_as_user`` (it uses
    ``store.acting_as``: SET ROLE, a session setting), as acting is refused there on
    purpose (test_postgres_pooler.py checks that refusal)."""
    if "store_url" not in metafunc.fixturenames:
        return
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    sessionless = metafunc.definition.get_closest_marker("acts_as_user") is None
    internal = metafunc.definition.get_closest_marker("sql_internals") is not None
    wanted = {
        "pgbouncer": module in POOLED_MODULES and sessionless,
        "socket": module in SOCKET_MODULES and sessionless and not internal,
    }
    metafunc.parametrize("store_url", [b for b in BACKENDS if wanted.get(b, True)], indirect=True)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for a new, empty store of the backend ``request.param`` names."""
    if request.param == "sqlite":
        return str(tmp_path / "s" / "cuectl.db")
    if request.param == "socket":
        return request.getfixturevalue("socket_url")
    return request.getfixturevalue({"postgres": "pg_url", "pgbouncer": "pooled_url"}[request.param])


@pytest.fixture
def socket_url(tmp_path: Path):
    """A new SQLite store served on a Unix socket (tests/storesocket.py); its ``unix:`` URL."""
    import storesocket

    with storesocket.new_served_store(tmp_path / "s" / "cuectl.db") as url:
        yield url


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
        sql(f"GRANT { ({'worker': 'cuectl_worker', 'boss': 'cuectl_admin'}.get(who, 'cuectl_user')) } TO {role}")
    yield names
    for role in names.values():
        sql(f"REASSIGN OWNED BY {role} TO postgres; DROP OWNED BY {role}")
        sql(f"DROP ROLE {role}")
