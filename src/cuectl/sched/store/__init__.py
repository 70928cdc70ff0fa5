"""The store: the ``Store`` interface, its records, and ``open_store``.

Layout: ``base`` (the interface and records), ``lifecycle`` (the frame state machine and
row shapes, pure functions), ``schema`` (one schema, rendered per database), ``sql`` (every
query both databases share), ``sqlite`` and ``postgres`` (connections, errors, the claim
statement and what only one database can do). ``open_store`` is the edge where
configuration (environment variables) is read; no store method reads it.
"""

from __future__ import annotations

from pathlib import Path

from cuectl.sched.store.base import (
    DEVICE_STATES,
    GPU_EVENT_KINDS,
    Actor,
    ClaimedFrame,
    DeviceState,
    FrameResult,
    GpuEvent,
    HostInfo,
    HostShape,
    LiveUsage,
    RunnableLayer,
    Store,
    Token,
)

__all__ = [
    "Actor",
    "ClaimedFrame",
    "FrameResult",
    "DEVICE_STATES",
    "DeviceState",
    "HostInfo",
    "HostShape",
    "GpuEvent",
    "GPU_EVENT_KINDS",
    "LiveUsage",
    "RunnableLayer",
    "Store",
    "Token",
    "open_store",
    "roles_sql",
]


def open_store(
    url: str,
    *,
    create: bool = True,
    busy_timeout_s: float = 5.0,
    migrate: bool | None = None,
    log_dir: Path | str | None = None,
) -> Store:
    """Open the store named by a path, ``sqlite:///path``, ``postgresql://…`` or
    ``unix:/path`` (the socket of ``cuectl serve --socket`` in front of a store only its
    service account may write; a path whose store has such a socket beside it,
    ``<file>.sock``, and that this user may not write, is reached through that socket too).

    ``migrate`` (PostgreSQL only; SQLite always migrates when opened): None follows
    ``CUECTL_AUTO_MIGRATE`` (default on; off makes an old schema an error), True migrates,
    False opens an old schema untouched (for ``cuectl admin migrate``, which then calls
    ``Store.migrate()``). ``log_dir``: where frame logs go; None follows ``CUECTL_LOG_DIR``,
    else ``<file>-logs/`` beside a SQLite store (and its older ``logs/`` still read) or
    under the state directory."""
    from cuectl import config
    from cuectl.errors import InvalidInput
    from cuectl.sched.store import remote

    sock = remote.socket_path(url)
    if sock is not None:  # the store of a service account, through its server (remote.py)
        return remote.connect(sock)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            import psycopg  # noqa: F401  (only to tell a missing extra from other import errors)
        except ImportError as exc:
            raise InvalidInput(
                "PostgreSQL stores need the postgres extra (psycopg 3)", hint="pip install 'cuectl[postgres]'"
            ) from exc
        from cuectl.sched.store.postgres import PostgresStore

        auto = config.auto_migrate() if migrate is None else migrate
        return PostgresStore(
            url,
            create=create,
            busy_timeout_s=busy_timeout_s,
            migrate=auto,
            refuse_old=migrate is None and not auto,
            password=config.take_pg_password(),
            log_dir=Path(log_dir) if log_dir else config.log_root(None),
        )
    if url.startswith("sqlite:///"):
        # SQLAlchemy convention: sqlite:///relative/path, sqlite:////absolute/path.
        path = url[len("sqlite:///") :]
    elif "://" in url:
        raise InvalidInput(f"unsupported store URL {url!r}", hint="use a file path, sqlite:///path or postgresql://…")
    else:
        path = url
    from cuectl.sched.store.sqlite import SQLiteStore

    file = Path(path).expanduser()
    beside = remote.beside(file)
    if beside is not None:  # a store only its service may write: its socket is the way in
        return remote.connect(beside)
    store = SQLiteStore(
        file, create=create, busy_timeout_s=busy_timeout_s, log_dir=Path(log_dir) if log_dir else config.log_root(file)
    )
    legacy = None if log_dir else config.legacy_log_root(file)
    if legacy is not None and legacy != store.log_dir:  # frame logs written before the store had its own
        store.older_log_dirs = (legacy,)
    return store


def roles_sql() -> str:
    """The SQL of per-user roles and row-level security for a PostgreSQL store (roles.sql)."""
    return (Path(__file__).parent / "roles.sql").read_text()
