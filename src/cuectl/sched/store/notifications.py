"""The store side of notifications (docs/notifications.md): one row per event and target,
written in the transaction that finishes the job or kills the frame, and claimed, delivered
and retried by whoever delivers (workers, ``cuectl admin notify deliver``).

Rows: ``(job_id, event, frame_id, target)`` is unique — ``frame_id`` is 0 for the job's own
events (finished, failed), the frame's id for ``dead``. A job that is retried and finishes
again (or a frame that is retried and goes DEAD again) is a new event: its row is re-armed
(created_at, attempts, delivered_at reset), so it is delivered again, once. The same
transaction repeated (a retried write) finds the row with the same ``created_at`` and
leaves it alone.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from cuectl.sched import notify as nt
from cuectl.sched.model import Notify

DEFAULTS_KEY = "notify_defaults"
# Back-off after a failed delivery: 10 s, doubled per failure, at most an hour; after
# MAX_ATTEMPTS failures the row is given up (its error kept, never claimed again).
FIRST_DELAY_S = 10.0
MAX_DELAY_S = 3600.0
MAX_ATTEMPTS = 10
# A given-up row's next_at: never due.
NEVER = 1e18

_INSERT = (
    "INSERT INTO notifications(job_id, event, frame_id, target, created_at, attempts, next_at) "
    "VALUES (?, ?, ?, ?, ?, 0, ?) ON CONFLICT (job_id, event, frame_id, target) DO UPDATE SET "
    "created_at = excluded.created_at, attempts = 0, next_at = excluded.next_at, claimed_by = NULL, "
    "claimed_until = NULL, delivered_at = NULL, error = NULL "
    "WHERE notifications.created_at < excluded.created_at"
)
# On PostgreSQL with roles.sql (``_guarded``): the same row, written by the tables' owner
# after it checked the event and the target.
_GUARDED = "SELECT cuectl_record_notification(?, ?, ?, ?, ?) AS ok"
_HAS_GUARD = (
    "SELECT to_regprocedure('cuectl_record_notification(bigint, text, bigint, text, double precision)') "
    "IS NOT NULL AS ok"
)
DUE = "delivered_at IS NULL AND next_at <= ? AND attempts < ? AND (claimed_until IS NULL OR claimed_until < ?)"


def retry_delay(failures: int) -> float:
    """Seconds before the next try after ``failures`` failed ones (1 = the first)."""
    return min(FIRST_DELAY_S * 2 ** max(0, failures - 1), MAX_DELAY_S)


def farm_defaults(tx: Any) -> tuple[Notify, ...]:
    row = tx.one("SELECT value FROM meta WHERE key = ?", (DEFAULTS_KEY,))
    return nt.from_json(row["value"]) if row else ()


def record(tx: Any, job_id: int, event: str, frame_id: int, now: float, *, worker_only: bool = False) -> int:
    """Record ``event`` of the job (``frame_id`` 0) or of its frame for every target of the
    job's ``notify`` and the farm defaults that asks for it; the caller's transaction is the
    one that made it happen. ``worker_only``: an event only workers record (``gpu_idle``,
    with the GPU event that says so): written directly, as workers may. Returns how many
    rows were written."""
    row = tx.one("SELECT notify FROM jobs WHERE id = ?", (job_id,))
    if row is None:
        return 0
    targets: dict[str, Notify] = {}
    for item in (*nt.from_json(row["notify"]), *farm_defaults(tx)):
        if event in item.on:
            targets.setdefault(nt.target_json(item), item)
    if not targets:
        return 0
    if not worker_only and _guarded(tx):
        return sum(bool(tx.one(_GUARDED, (job_id, event, frame_id, target, now))["ok"]) for target in targets)
    for target in targets:
        tx.run(_INSERT, (job_id, event, frame_id, target, now, now))
    return len(targets)


def _guarded(tx: Any) -> bool:
    """Does this PostgreSQL store have ``cuectl admin pg-roles`` of this version installed?
    Then only workers and admins may write notification rows, and everyone records an event
    through ``cuectl_record_notification`` (roles.sql), which writes a row only for the event
    this transaction made happen and a target the job or the farm asked for: a user's own
    ``job kill`` records its rows without her role being able to write any row she likes.
    (Looked up on each event, rare: a store whose pg-roles is re-run needs no restart.)"""
    if not type(tx.conn).__module__.startswith("psycopg"):
        return False  # SQLite: the file's permissions are the boundary (docs/security.md)
    return bool(tx.one(_HAS_GUARD)["ok"])


def record_finish(tx: Any, job_id: int, now: float) -> None:
    """The job just became FINISHED: ``finished`` when every frame SUCCEEDED or was EATEN
    (and nobody killed it), else ``failed``."""
    row = tx.one("SELECT killed_at, notify FROM jobs WHERE id = ?", (job_id,))
    if row is None or (row["notify"] in (None, "", "[]") and not farm_defaults(tx)):
        return
    dead = tx.one("SELECT 1 AS x FROM frames WHERE job_id = ? AND state = 'DEAD' LIMIT 1", (job_id,))
    event = "failed" if row["killed_at"] is not None or dead else "finished"
    record(tx, job_id, event, 0, now)


def record_dead(tx: Any, job_id: int, frame_id: int, now: float) -> None:
    """A frame just became DEAD."""
    record(tx, job_id, "dead", frame_id, now)


def row_json(row: Any, *, mask: bool = True) -> dict[str, Any]:
    """A notification row as JSON (``admin notify history``); ``mask``: webhook URLs as
    scheme and host only (``nt.masked``) — a deliverer gets them whole."""
    try:
        target = json.loads(row["target"])
    except (TypeError, ValueError):
        target = {"kind": "?", "target": row["target"]}
    return {
        "id": int(row["id"]),
        "job_id": int(row["job_id"]),
        "event": row["event"],
        "frame_id": int(row["frame_id"]) or None,
        "kind": target.get("kind"),
        "target": (
            nt.mask_url(str(target.get("target"))) if mask and target.get("kind") == "webhook" else target.get("target")
        ),
        "created_at": row["created_at"],
        "attempts": int(row["attempts"]),
        "next_at": row["next_at"],
        "claimed_by": row["claimed_by"],
        "claimed_until": row["claimed_until"],
        "delivered_at": row["delivered_at"],
        "error": row["error"],
    }


def entries_json(items: Sequence[Notify]) -> list[dict[str, object]]:
    return [n.to_json() for n in items]
