"""Driving a store as a worker would, for tests that need frames to finish without one."""

from __future__ import annotations

import time
from pathlib import Path

from cuectl.sched.store import FrameResult, open_store


def finish_all(db: Path | str, exit_code: int = 0, *, ago: float = 0.0) -> None:
    """Claim and complete every runnable frame through the store API, each with ``exit_code``;
    ``ago``: claimed that many seconds in the past and ended half-way since (inside a
    report's recent window, not at its edge)."""
    store = open_store(str(db))
    try:
        while True:
            claimed = None
            for layer in store.runnable_layers():
                claimed = store.claim_frame(layer.layer_id, host="h", worker="h-w", gpu_uuids=[],
                                            now=time.time() - ago, lease_s=60.0 + ago)
                if claimed:
                    break
            if claimed is None:
                return
            start, end = time.time() - ago, time.time() - ago / 2
            store.complete_frame(claimed.frame_id, claimed.attempt,
                                 FrameResult(exit_code=exit_code, started_at=start, ended_at=end), now=end)
    finally:
        store.close()


def pg_roles(store, *names: str) -> None:
    """Roles a store may act as (``Store.acting_as``): created NOLOGIN on a PostgreSQL store,
    with the table rights a user's role has; nothing to do on SQLite (the actor is taken as
    given)."""
    if store.local_path is not None:
        return
    import psycopg

    with psycopg.connect(store._dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') "
                         f"THEN CREATE ROLE {name} NOLOGIN; END IF; END $$")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}")
            conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {name}")
