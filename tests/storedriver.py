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
                claimed = store.claim_frame(
                    layer.layer_id, host="h", worker="h-w", gpu_uuids=[], now=time.time() - ago, lease_s=60.0 + ago
                )
                if claimed:
                    break
            if claimed is None:
                return
            start, end = time.time() - ago, time.time() - ago / 2
            store.complete_frame(
                claimed.frame_id,
                claimed.attempt,
                FrameResult(exit_code=exit_code, started_at=start, ended_at=end),
                now=end,
            )
    finally:
        store.close()


def run_job(
    store, job_id: int, *, now: float, layer: str | None = None, code: int = 0, duration: float = 0.0
) -> list[str | None]:
    """Claim and complete every WAITING frame of one job (or one of its layers) on an open
    store, each with exit ``code``, ``duration`` seconds after ``now``; the new states."""
    states = []
    for lay in store.runnable_layers():
        if lay.job_id != job_id or (layer is not None and lay.layer != layer):
            continue
        while (
            c := store.claim_frame(lay.layer_id, host="h", worker="h:1", gpu_uuids=[], now=now, lease_s=60)
        ) is not None:
            states.append(
                store.complete_frame(
                    c.frame_id,
                    c.attempt,
                    FrameResult(exit_code=code, started_at=now, ended_at=now + duration),
                    now=now + duration,
                )
            )
    return states


def pg_roles(store, *names: str) -> None:
    """Roles a store may act as (``Store.acting_as``): created NOLOGIN on a PostgreSQL store,
    with the table rights a user's role has; nothing to do on SQLite (the actor is taken as
    given)."""
    if store.local_path is not None:
        return
    import psycopg

    with psycopg.connect(store._dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(
                f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') "
                f"THEN CREATE ROLE {name} NOLOGIN; END IF; END $$"
            )
            conn.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {name}")
            conn.execute(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {name}")
