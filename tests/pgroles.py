"""Per-user PostgreSQL roles as `cuectl admin pg-roles` sets them up, for the tests that
attack row-level security with real login roles (imported through sys.path, like
storedriver.py)."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any, Iterator, Mapping, Sequence

#: Each test role's group: users by default.
GROUPS = {"worker": "cuectl_worker", "boss": "cuectl_admin"}


def sql(url: str, statement: str, params: Sequence[Any] = ()) -> Any:
    """Run one statement (autocommit); its rows, or the row count of a change."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else cur.rowcount


def as_role(pg_url: str, role: str) -> str:
    """The suite's server URL, logging in as ``role`` instead of the superuser."""
    return pg_url.replace("postgres@", f"{role}@", 1)


@contextlib.contextmanager
def login_roles(pg_url: str, who: Sequence[str], *, scripts: Sequence[str] = ()) -> Iterator[Mapping[str, str]]:
    """A store at ``pg_url`` with pg-roles installed (then each of ``scripts``, run as the
    superuser), and a login role per name in ``who`` in its group (``GROUPS``, else
    cuectl_user). Roles are cluster-wide: each name gets a unique suffix; yields
    {name: role}, and drops them afterwards."""
    import psycopg

    from cuectl.sched.store import open_store, roles_sql

    open_store(pg_url).close()  # the schema, owned by the superuser (the migrating role)
    suffix = uuid.uuid4().hex[:6]
    names = {name: f"{name}_{suffix}" for name in who}
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(roles_sql())  # no parameters: the script's own % signs stay as they are
        for script in scripts:
            conn.execute(script)
    for name, role in names.items():
        sql(pg_url, f"CREATE ROLE {role} LOGIN")
        sql(pg_url, f"GRANT {GROUPS.get(name, 'cuectl_user')} TO {role}")
    try:
        yield names
    finally:
        for role in names.values():
            sql(pg_url, f"REASSIGN OWNED BY {role} TO postgres; DROP OWNED BY {role}")
            sql(pg_url, f"DROP ROLE {role}")
