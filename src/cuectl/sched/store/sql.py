"""Every query SQLite and PostgreSQL share: one ``SQLStore`` holding the store's logic.

Queries are written once with ``?`` placeholders in SQL both databases accept; the
backend's ``Dialect`` renders them. A backend supplies a few hooks:

- ``_write(fn)``: run ``fn(tx)`` in one write transaction (SQLite: ``BEGIN IMMEDIATE``, the
  one write lock; PostgreSQL: a transaction retried on a lost connection);
- ``_read(sql, params)``: one read outside a write transaction;
- ``_reserve_frame_ids(tx, n)``: ids for a submit's frames, known before they are written;
- ``_lock_jobs(tx, jobs, frames)``: serialise with other writers that can finish these jobs
  or release their dependencies (a no-op where one write lock already does that);
- ``_notify(tx)``: wake idle workers when work became runnable (a no-op where they poll);
- ``_bulk_insert(tx, table, columns, rows)``: many rows at once (PostgreSQL: COPY);
- ``claim_frame``: the hot path, one statement per database.

What a state change means (next state, reaped state, submit rows) is decided in
``lifecycle``; this module only reads and writes rows.
"""

from __future__ import annotations

import abc
import functools
import hashlib
import json
import re
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from cuectl.errors import Conflict, InvalidInput, NotFound, NotOwner, SchemaTooNew
from cuectl.sched import fields, services, usage_sql, views
from cuectl.sched import model as m
from cuectl.sched import notify as nt
from cuectl.sched.dialect import Dialect
from cuectl.sched.store import caps as capsmod
from cuectl.sched.store import depends as dep
from cuectl.sched.store import devices as devstates
from cuectl.sched.store import lifecycle, schema
from cuectl.sched.store import notifications as notes
from cuectl.sched.store.base import (
    GPU_EVENT_KINDS,
    LEASE_BUCKETS_S,
    TOKEN_ROLES,
    Actor,
    DeviceState,
    FarmFigures,
    FrameResult,
    GpuEvent,
    HostInfo,
    HostShape,
    LiveUsage,
    RunnableLayer,
    Store,
    Token,
)
from cuectl.sched.store.inlists import IN_BATCH, batches, marks
from cuectl.sched.usage_sql import Fetch, UsageGroup
from cuectl.sched.views import attempt_json, frame_json, frame_name, host_json, job_json, layer_json, samples_json

T = TypeVar("T")
Row = Any  # sqlite3.Row or a psycopg dict row: both are read by column name only

_FRAME_SELECT = """
    SELECT f.*, j.name AS job_name, l.name AS layer_name
    FROM frames f JOIN jobs j ON j.id = f.job_id JOIN layers l ON l.id = f.layer_id
"""
# A frame's name as views.frame_name writes it (``0003-main``, ``-001-main``), or its number alone.
_FRAME_NAME_RE = re.compile(r"(-?[0-9]+)(?:-([A-Za-z0-9_.-]+))?")
# Jobs OpenCue would still list as in the cue: unfinished, or finished (not killed) with DEAD
# frames, which Cuebot keeps PENDING ("Failing") until they are retried or eaten.
_IN_CUE = (
    "(j.state != 'FINISHED' OR (j.killed_at IS NULL AND EXISTS "
    "(SELECT 1 FROM frames fd WHERE fd.job_id = j.id AND fd.state = 'DEAD')))"
)
# How stale the claim path's copy of the limits and quotas tables may be (seconds).
CAPS_TTL_S = 2.0
SETTINGS_TTL_S = 2.0
# The largest id a store can hold (SQLite INTEGER, PostgreSQL BIGINT).
_MAX_ID = 2**63 - 1
# The columns an attempt's record copies from its frame and layer (``_record_attempt``).
_ATTEMPT_SOURCE = (
    "f.state, f.attempts, f.action, f.job_id, f.layer_id, f.host, f.gpu_uuids, f.waiting_since, "
    "f.started_at, l.retries, l.cores, l.retry_delay_s, f.gpu_oom_bytes, l.retry_on_gpu_oom, l.gpus, l.gpu_vendor, "
    "l.gpu_models, l.gpu_memory_min_bytes, l.tags, l.gpu_capability_min, l.gpu_driver_min, l.gpu_cuda_min"
)
_ATTEMPT_COLUMNS = (
    "frame_id",
    "attempt",
    "job_id",
    "host",
    "gpu_uuids",
    "outcome",
    "waiting_since",
    "started_at",
    "ended_at",
    "exit_code",
    "exit_signal",
    "timed_out",
    "max_rss_bytes",
    "cpu_seconds",
    "cores",
    "usage",
    "gpu_util_mean_pct",
    "gpu_util_max_pct",
    "gpu_memory_peak_bytes",
    "gpu_seconds",
    "gpu_busy_seconds",
    "gpu_models",
    "failure_kind",
    "failure",
    "gpu_idle_seconds",
)
# A RUNNING attempt's latest GPU values (``record_live_usage``), cleared when it ends.
#: Does anything wait on frame ? or on its layer ? (any kind of edge): else completing the
#: frame has nothing to release (SQLStore._release_dependents).
_WAITED_ON = (
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM frame_deps WHERE on_frame_id = ?) "
    "OR EXISTS (SELECT 1 FROM layer_deps WHERE on_layer_id = ?) "
    "OR EXISTS (SELECT 1 FROM depend_edges WHERE (on_kind = 'frame' AND on_id = ?) "
    "OR (on_kind IN ('any', 'layer') AND on_id = ?))"
)
_CLEAR_LIVE = "gpu_util_pct = NULL, gpu_memory_used_bytes = NULL, gpu_sampled_at = NULL"
_UPSERT_SAMPLES = (
    "INSERT INTO samples(frame_id, attempt, uuid, points) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (frame_id, attempt, uuid) DO UPDATE SET points = excluded.points"
)
_RECORD_ATTEMPT = (
    f"INSERT INTO attempts({', '.join(_ATTEMPT_COLUMNS)}) VALUES ({', '.join('?' * len(_ATTEMPT_COLUMNS))}) "
    "ON CONFLICT (frame_id, attempt) DO UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in _ATTEMPT_COLUMNS[2:])
)


@functools.lru_cache(maxsize=4096)
def _json_tuple(text: str) -> tuple[str, ...]:
    """A stored JSON list of strings as a tuple. Cached: a farm's layers repeat a handful of
    model and tag lists, and a dispatch pass reads every runnable layer's."""
    return tuple(json.loads(text))


def _attempt_failure(outcome: str, result: FrameResult | None) -> tuple[str | None, str | None]:
    """(failure_kind, failure) of an attempt record: none for one that succeeded or that a
    user ended; "lost" for a worker that went silent."""
    if outcome == "lost":
        return "lost", lifecycle.LOST_FAILURE
    if result is not None and outcome == lifecycle.DEVICE_FAILED:
        return lifecycle.DEVICE_FAILED, lifecycle.failure_text(result)
    if result is None or outcome not in ("failed", "timeout"):
        return None, None
    return result.failure_kind or ("timeout" if result.timed_out else "exit"), lifecycle.failure_text(result)


def _read_settings(read: Callable[[str, Sequence[Any]], Iterable[Row]]) -> dict[str, bool]:
    """Every store setting (meta; ``cuectl admin setting``), defaults for those unset."""
    values = {name: default for name, (default, _) in m.SETTINGS.items()}
    for r in read(f"SELECT key, value FROM meta WHERE key IN ({marks(len(m.SETTINGS))})", tuple(m.SETTINGS)):
        values[r["key"]] = r["value"] == "true"
    return values


def _setting_value(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise InvalidInput(f"VALUE: {value!r} is not true or false")


class Tx:
    """One open transaction; runs shared (``?``-style) queries in the store's dialect."""

    __slots__ = ("conn", "_render")

    def __init__(self, conn: Any, dialect: Dialect) -> None:
        self.conn = conn
        self._render = dialect.positional

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute; the number of rows changed."""
        return int(self.conn.execute(self._render(sql), params).rowcount)

    def one(self, sql: str, params: Sequence[Any] = ()) -> Row:
        """The first row, or None."""
        return self.conn.execute(self._render(sql), params).fetchone()

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return list(self.conn.execute(self._render(sql), params).fetchall())

    def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.cursor().executemany(self._render(sql), rows)


class SQLStore(Store):
    """The store's logic over the shared SQL; subclasses connect and supply the hooks."""

    dialect: Dialect

    def __init__(self, *, log_dir: Path) -> None:
        self.log_dir = log_dir
        # Layer rows never change after submit: the claim path reads each once.
        self._layer_cache: dict[int, Row] = {}
        # Named limits and quotas, re-read at most every CAPS_TTL_S by the claim path.
        self._caps_read_at = -1e18
        self._limits: dict[str, int] = {}
        self._quotas: dict[tuple[str, str], capsmod.Quota] = {}
        # Store settings (meta; `cuectl admin setting`), re-read at most every SETTINGS_TTL_S.
        self._settings_read_at = -1e18
        self._settings: dict[str, bool] = {}

    # -- hooks -------------------------------------------------------------------------------
    @abc.abstractmethod
    def _write(self, fn: Callable[[Tx], T], *, idempotent: bool = True) -> T:
        """Run ``fn`` in one write transaction. ``idempotent=False``: the backend must not
        repeat it when the outcome of its commit is unknown."""

    @abc.abstractmethod
    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    @abc.abstractmethod
    def _reserve_frame_ids(self, tx: Tx, count: int) -> list[int]:
        """``count`` unused frame ids, ascending."""

    def _lock_jobs(self, tx: Tx, *, jobs: Iterable[int] = (), frames: Iterable[int] = ()) -> None:
        """Lock the given jobs and the jobs of the given frames until commit (see the hooks)."""

    def _notify(self, tx: Tx) -> None:
        """Wake idle workers once this transaction commits."""

    def _record_submitter(self, tx: Tx, job_id: int, spec: m.JobSpec) -> None:
        """Leave the proof of who submitted the job (sched/identity.py); a server that
        records the role itself needs nothing more."""

    def _bulk_insert(self, tx: Tx, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            tx.many(f"INSERT INTO {table}({', '.join(columns)}) VALUES ({marks(len(columns))})", rows)

    @abc.abstractmethod
    def _snapshot(self, fn: Callable[[Fetch], T]) -> T:
        """Run ``fn(fetch)`` on one read snapshot; ``fetch(sql, named params)`` returns tuples."""

    def _snapshot_pair(self, fn: Callable[[Fetch, Fetch | None], T]) -> T:
        """Run ``fn(fetch, aside)`` on one read snapshot, ``aside`` a second reader of that
        same snapshot that another thread may use, or None where the store has none (then
        everything is read through ``fetch``)."""
        return self._snapshot(lambda fetch: fn(fetch, None))

    def _scan_hint(self, fetch: Fetch, in_window: int) -> str:
        """What goes after each scan of ``attempts`` in the accounting queries."""
        return ""

    # -- schema --------------------------------------------------------------------------------
    def _too_new(self, version: int) -> SchemaTooNew:
        return SchemaTooNew(
            f"store {self.url} has schema version {version}, this cuectl knows up to {schema.SCHEMA_VERSION}",
            hint="upgrade cuectl; the store was left untouched",
        )

    def _migrate_from(self, tx: Tx, current: int) -> int:
        """Apply the missing versions; the caller holds the migration lock and read
        ``current`` under it (another process may have migrated meanwhile)."""
        if current > schema.SCHEMA_VERSION:
            raise self._too_new(current)
        for version in range(current, schema.SCHEMA_VERSION):
            for statement in schema.statements(version, self.dialect):
                tx.run(statement)
        tx.run(
            "INSERT INTO meta(key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (str(schema.SCHEMA_VERSION),),
        )
        return current

    # -- jobs ----------------------------------------------------------------------------------
    def submit(self, spec: m.JobSpec, *, now: float) -> int:
        def insert(tx: Tx) -> int:
            nonlocal spec  # each layer's service fills what the layer leaves out (sched/services.py)
            spec = services.apply(spec, tx.all("SELECT * FROM services"))
            self._check_limits_exist(tx, spec)
            job_id = int(
                tx.one(
                    'INSERT INTO jobs(name, "user", priority, paused, created_at, project, max_running, '
                    "max_cores, max_gpus, show, shot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (
                        spec.name,
                        spec.user,
                        spec.priority,
                        int(spec.paused),
                        now,
                        spec.project,
                        spec.max_running,
                        spec.max_cores,
                        spec.max_gpus,
                        spec.show,
                        spec.shot,
                    ),
                )["id"]
            )
            layer_ids = {
                layer.name: int(
                    tx.one(
                        f"INSERT INTO layers({lifecycle.LAYER_INSERT_COLUMNS}) VALUES ({marks(lifecycle.LAYER_INSERT_COUNT)}) "
                        "RETURNING id",
                        lifecycle.layer_row(job_id, idx, layer),
                    )["id"]
                )
                for idx, layer in enumerate(spec.layers)
            }
            self._bulk_insert(
                tx,
                "layer_limits",
                ("name", "layer_id"),
                [(name, layer_ids[layer.name]) for layer in spec.layers for name in layer.limits],
            )
            if spec.notify:
                tx.run("UPDATE jobs SET notify = ? WHERE id = ?", (nt.to_json(spec.notify), job_id))
            self._record_submitter(tx, job_id, spec)
            frame_ids = self._reserve_frame_ids(tx, sum(len(chunks) for chunks in spec.chunks))
            plan = lifecycle.plan_submit(spec, job_id, layer_ids, frame_ids, now)
            self._bulk_insert(tx, "frames", lifecycle.FRAME_COLUMNS, plan.frames)
            depend_ids = [
                int(
                    tx.one(
                        "INSERT INTO depends(type, job_id, layer_id, on_job_id, on_layer_id, on_frame_id, any_frame, "
                        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                        (d.type, job_id, d.layer_id, job_id, d.on_layer_id, d.on_frame_id, int(d.any_frame), now),
                    )["id"]
                )
                for d in plan.depends
            ]
            self._bulk_insert(
                tx,
                "frame_deps",
                ("frame_id", "on_frame_id", "depend_id"),
                [(a, b, depend_ids[i]) for a, b, i in plan.frame_deps],
            )
            self._bulk_insert(
                tx,
                "layer_deps",
                ("layer_id", "on_layer_id", "any_frame", "depend_id"),
                [(a, b, any_frame, depend_ids[i]) for a, b, any_frame, i in plan.layer_deps],
            )
            self._bulk_insert(
                tx,
                "depend_edges",
                ("depend_id", "layer_id", "frame_id", "on_kind", "on_id"),
                [(depend_ids[i], *rest) for i, *rest in plan.edges],
            )
            self._add_spec_depends(tx, spec, job_id, layer_ids, now)
            if not spec.paused:
                self._notify(tx)
            return job_id

        # Not idempotent: a connection lost during COMMIT must not submit the job twice.
        return self._write(insert, idempotent=False)

    def _job_row(self, ref: str | int, read: Callable[[str, Sequence[Any]], list[Row]] | None = None) -> Row:
        """A job by id (ASCII digits) or else by its unique name. Submit refuses purely
        numeric names (sched/spec.py); one written before that rule is still found by
        name when no job has that id, and always by its own id. ``read``: how to query
        (``tx.all`` inside a transaction; default: a read of its own)."""
        read = read or self._read
        text = str(ref).strip()
        job_id = _as_id(text)
        if job_id is not None:
            rows = read("SELECT * FROM jobs WHERE id = ?", (job_id,))
            if rows:
                return rows[0]
        rows = read("SELECT * FROM jobs WHERE name = ? ORDER BY id", (text,))
        if not rows:
            raise NotFound(f"no job {text!r}", hint="see `cuectl job list`")
        if len(rows) > 1:
            ids = ", ".join(str(r["id"]) for r in rows[:10])
            raise Conflict(f"job name {text!r} is not unique (ids {ids})", hint="use the job id")
        return rows[0]

    def _frame_counts(self, where: str, params: Sequence[Any] = ()) -> dict[int, dict[str, int]]:
        """Frames per state of the jobs ``where`` (a condition on jobs j) selects."""
        counts: dict[int, dict[str, int]] = {}
        for row in self._read(
            f"SELECT f.job_id, f.state, COUNT(*) AS n FROM frames f JOIN jobs j ON j.id = f.job_id "
            f"WHERE {where} GROUP BY f.job_id, f.state",
            params,
        ):
            counts.setdefault(row["job_id"], {})[row["state"]] = int(row["n"])
        return counts

    def list_jobs(
        self,
        *,
        include_finished: bool = True,
        user: str | None = None,
        state: str | None = None,
        name: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        newest_first: bool = False,
        show: str | None = None,
        shot: str | None = None,
        ids: Sequence[int] | None = None,
        keep_failed: bool = False,
    ) -> list[dict[str, Any]]:
        where, params = self._job_filter(include_finished, user, state, name, show, shot)
        if keep_failed and not include_finished:
            where = where.replace("j.state != 'FINISHED'", _IN_CUE, 1)
        if ids is not None:
            wanted = sorted({int(i) for i in ids})
            if len(wanted) > IN_BATCH * 2:
                raise InvalidInput(f"ids: at most {IN_BATCH * 2} jobs at once, got {len(wanted)}")
            if not wanted:
                return []
            where += f" AND j.id IN ({marks(len(wanted))})"
            params = [*params, *wanted]
        page = f" LIMIT {int(limit)} OFFSET {int(offset)}" if limit is not None else ""
        order = "id DESC" if newest_first else "id"
        rows = self._read(f"SELECT * FROM jobs j WHERE {where} ORDER BY {order}{page}", params)
        if limit is not None:  # count the page's frames only
            if not rows:
                return []
            where, params = f"j.id IN ({marks(len(rows))})", [r["id"] for r in rows]
        counts = self._frame_counts(where, params)
        jobs = [job_json(r, counts.get(r["id"], {})) for r in rows]
        failed = [j["id"] for j in jobs if j["outcome"] == "FAILED"]
        if failed:
            reasons = self._outcome_reasons(failed)
            for j in jobs:
                j["outcome_reason"] = reasons.get(j["id"], j["outcome_reason"])
        return jobs

    def _outcome_reasons(self, job_ids: Sequence[int]) -> dict[int, str | None]:
        """Why each of these jobs ended FAILED (lifecycle.outcome_reason), from their DEAD
        frames counted by failure: only DEAD frames are read."""
        dead: dict[int, dict[str | None, int]] = {}
        for batch in batches(sorted(set(job_ids))):
            for r in self._read(
                "SELECT job_id, failure, COUNT(*) AS n FROM frames WHERE state = 'DEAD' AND "
                f"job_id IN ({marks(len(batch))}) GROUP BY job_id, failure",
                batch,
            ):
                dead.setdefault(int(r["job_id"]), {})[r["failure"]] = int(r["n"])
        return {job_id: lifecycle.outcome_reason(counts) for job_id, counts in dead.items()}

    def count_jobs(
        self,
        *,
        include_finished: bool = True,
        user: str | None = None,
        state: str | None = None,
        name: str | None = None,
        show: str | None = None,
        shot: str | None = None,
    ) -> int:
        where, params = self._job_filter(include_finished, user, state, name, show, shot)
        return int(self._read(f"SELECT COUNT(*) AS n FROM jobs j WHERE {where}", params)[0]["n"])

    @staticmethod
    def _job_filter(
        include_finished: bool,
        user: str | None,
        state: str | None,
        name: str | None,
        show: str | None = None,
        shot: str | None = None,
    ) -> tuple[str, list[Any]]:
        where, params = ["1 = 1" if include_finished else "j.state != 'FINISHED'"], []
        for column, value in (
            ('j."user"', user),
            ("j.state", state),
            ("j.name", name),
            ("j.show", show),
            ("j.shot", shot),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        return " AND ".join(where), params

    def get_job(self, ref: str | int) -> dict[str, Any]:
        row = self._job_row(ref)
        data = job_json(row, self._frame_counts("j.id = ?", (row["id"],)).get(row["id"], {}))
        if data["outcome"] == "FAILED":
            data["outcome_reason"] = self._outcome_reasons([row["id"]]).get(row["id"])
        data["receipt"] = row["receipt"]
        data["notify"] = [nt.masked(n) for n in nt.from_json(row["notify"])]
        data["layers"] = [
            layer_json(r)
            for r in self._read(
                f"SELECT {lifecycle.LAYER_COLUMNS}, depend_count FROM layers WHERE job_id = ? ORDER BY idx",
                (row["id"],),
            )
        ]
        bigger = [layer["id"] for layer in data["layers"] if layer["retry_on_gpu_oom"] == "bigger"]
        floors: dict[int, int] = {}
        if bigger:  # what their WAITING frames wait for: a device bigger than this (0: any)
            floors = {
                r["layer_id"]: int(r["floor"] or 0)
                for r in self._read(
                    "SELECT layer_id, MIN(COALESCE(gpu_oom_bytes, 0)) AS floor FROM frames "
                    f"WHERE layer_id IN ({marks(len(bigger))}) AND state = 'WAITING' GROUP BY layer_id",
                    bigger,
                )
            }
        for layer in data["layers"]:
            layer["waiting_gpu_oom_bytes"] = floors.get(layer["id"], 0)
        data.update(self.list_depends(row["id"]))
        # DEPEND frames of this job that wait on a DEAD frame (they need a retry). Only asked
        # when the job has DEPEND frames: the query's plan scans the frames index.
        # Likewise those waiting on an EATEN frame (OpenCue's rule: depend.satisfy_on_eaten).
        for key, state in (("dead_dependencies", m.DEAD), ("eaten_dependencies", m.EATEN)):
            data[key] = (
                0
                if not data["frame_counts"].get("DEPEND")
                else int(
                    self._read(
                        "SELECT COUNT(DISTINCT d.frame_id) AS n FROM frame_deps d JOIN frames f ON f.id = d.on_frame_id "
                        "WHERE f.state = ? AND d.frame_id IN (SELECT id FROM frames WHERE job_id = ? AND state = 'DEPEND')",
                        (state, row["id"]),
                    )[0]["n"]
                )
            )
        return data

    # -- ownership -----------------------------------------------------------------------------
    _force_overrides = True  # whether ``force`` may pass a non-owner (where the store cannot stop them)

    def _check_owner(self, jobs: Sequence[Row], force: bool) -> None:
        """``NotOwner`` unless the caller owns every job (the proven submitter where the
        server records one, else the job's user) or is an admin."""
        actor = self.actor()
        # ``force`` passes a non-owner only where nothing could stop them anyway (a member
        # who can write the file); never for a caller a server acts for (the socket, the
        # REST API): the server is the only writer there, and its check the only boundary.
        overrides = self._force_overrides and self.acting is None
        if actor.admin or (force and overrides):
            return
        # Several jobs (a bulk action): all or nothing, naming the first few that are not theirs.
        others = [job for job in jobs if (job["submitted_by"] or job["user"]) != actor.name]
        if not others:
            return
        hint = (
            "add --force to do it anyway (the store file's permissions are the real boundary)"
            if overrides
            else "ask its owner, or an admin" + ("" if self._force_overrides else " (a member of cuectl_admin)")
        )
        named = ", ".join(
            f"job {job['id']} ({job['name']}) belongs to {job['submitted_by'] or job['user']}" for job in others[:5]
        )
        more = f" and {len(others) - 5} more" if len(others) > 5 else ""
        if len(jobs) == 1:
            raise NotOwner(f"{named}, not {actor.name}: only its owner or an admin may change it", hint=hint)
        raise NotOwner(
            f"{len(others)} of {len(jobs)} jobs are not {actor.name}'s ({named}{more}): only their "
            "owner or an admin may change them; nothing changed",
            hint=hint,
        )

    def _owned_job(self, ref: str | int, force: bool) -> int:
        row = self._job_row(ref)
        self._check_owner([row], force)
        return int(row["id"])

    def set_job_paused(self, ref: str | int, paused: bool, *, force: bool = False) -> dict[str, Any]:
        job_id = self._owned_job(ref, force)

        def update(tx: Tx) -> None:
            tx.run("UPDATE jobs SET paused = ? WHERE id = ?", (int(paused), job_id))
            if not paused:
                self._notify(tx)

        self._write(update)
        return self.get_job(job_id)

    def set_job_priority(self, ref: str | int, priority: int, *, force: bool = False) -> dict[str, Any]:
        priority = fields.priority(priority, "priority")  # one range for every caller, not just the CLI
        job_id = self._owned_job(ref, force)
        self._write(lambda tx: tx.run("UPDATE jobs SET priority = ? WHERE id = ?", (priority, job_id)))
        return self.get_job(job_id)

    def kill_job(self, ref: str | int, *, now: float, force: bool = False) -> dict[str, Any]:
        """Eat every unfinished frame; running ones are killed by their worker first."""
        job_id = self._owned_job(ref, force)
        self._kill_ids([job_id], now)
        return self.get_job(job_id)

    def retry_job(self, ref: str | int, *, now: float, force: bool = False) -> dict[str, Any]:
        """Requeue the job's DEAD and EATEN frames (OpenCue: retry dead frames)."""
        job_id = self._owned_job(ref, force)
        self._retry_ids([job_id], now)
        return self.get_job(job_id)

    # -- bulk job actions: one ownership check, one transaction, whatever the number of jobs -----
    def _job_rows(self, refs: Sequence[str | int]) -> list[Row]:
        """Jobs by id or unique name as ``_job_row`` finds them, in the order given without
        repeats; ids are read in batches, names one by one. ``NotFound``/``Conflict`` for
        the first bad reference, before anything changes."""
        texts = [str(ref).strip() for ref in refs]
        by_id: dict[int, Row] = {}
        numeric = sorted({i for i in map(_as_id, texts) if i is not None})
        for batch in batches(numeric):
            for r in self._read(f"SELECT * FROM jobs WHERE id IN ({marks(len(batch))})", batch):
                by_id[int(r["id"])] = r
        rows: dict[int, Row] = {}
        for text in texts:
            job_id = _as_id(text)
            row = by_id.get(job_id) if job_id is not None else None
            if row is None:
                row = self._job_row(text)  # by name (or NotFound / Conflict)
            rows.setdefault(int(row["id"]), row)
        return list(rows.values())

    def _owned_jobs(self, refs: Sequence[str | int], force: bool) -> list[int]:
        rows = self._job_rows(refs)
        self._check_owner(rows, force)
        return [int(r["id"]) for r in rows]

    def _jobs_json(self, ids: Sequence[int]) -> list[dict[str, Any]]:
        """``job list``'s shape of these jobs (frame counts, no layers), in the order given."""
        found: dict[int, dict[str, Any]] = {}
        for batch in batches(sorted(set(ids))):
            where = f"j.id IN ({marks(len(batch))})"
            counts = self._frame_counts(where, batch)
            for r in self._read(f"SELECT * FROM jobs j WHERE {where}", batch):
                found[int(r["id"])] = job_json(r, counts.get(r["id"], {}))
        return [found[i] for i in ids if i in found]

    def _kill_ids(self, ids: Sequence[int], now: float) -> None:
        def kill(tx: Tx) -> None:
            self._lock_jobs(tx, jobs=ids)
            for batch in batches(sorted(ids)):
                inside = marks(len(batch))
                tx.run(f"UPDATE frames SET action = 'eat' WHERE job_id IN ({inside}) AND state = 'RUNNING'", batch)
                tx.run(
                    f"UPDATE frames SET state = 'EATEN', ended_at = ? WHERE job_id IN ({inside}) "
                    "AND state IN ('WAITING', 'DEPEND', 'DEAD')",
                    (now, *batch),
                )
                tx.run(f"UPDATE jobs SET killed_at = ? WHERE id IN ({inside})", (now, *batch))
            self._finish_jobs_if_done(tx, ids, now)

        if ids:
            self._write(kill)

    def _finish_jobs_if_done(self, tx: Tx, ids: Sequence[int], now: float) -> None:
        """``_finish_job_if_done`` for many jobs, set-based (a statement per job cost 3 s for
        1,000 jobs on PostgreSQL); keep the two in step. A job that just FINISHED records
        its notification as there — only jobs with a ``notify`` or farm defaults can have one."""
        live = (
            "EXISTS (SELECT 1 FROM frames WHERE frames.job_id = jobs.id "
            "AND frames.state IN ('WAITING', 'DEPEND', 'RUNNING'))"
        )
        finished: list[int] = []
        for batch in batches(sorted(ids)):
            inside = marks(len(batch))
            tx.run(
                f"UPDATE jobs SET state = 'PENDING', finished_at = NULL WHERE id IN ({inside}) "
                f"AND state != 'PENDING' AND {live}",
                batch,
            )
            finished += [
                int(r["id"])
                for r in tx.all(
                    f"UPDATE jobs SET state = 'FINISHED', finished_at = ? WHERE id IN ({inside}) "
                    f"AND state != 'FINISHED' AND NOT {live} RETURNING id",
                    (now, *batch),
                )
            ]
        if finished and not notes.farm_defaults(tx):
            finished = [
                int(r["id"])
                for batch in batches(finished)
                for r in tx.all(
                    f"SELECT id FROM jobs WHERE id IN ({marks(len(batch))}) AND notify IS NOT NULL "
                    "AND notify NOT IN ('', '[]')",
                    batch,
                )
            ]
        for job_id in finished:
            notes.record_finish(tx, job_id, now)  # in this transaction: recorded once
        if dep.release_jobs(tx, ids, now):  # what waited on these jobs (a kill releases it, as in Cuebot)
            self._notify(tx)

    def _retry_ids(self, ids: Sequence[int], now: float) -> None:
        frames = [
            int(r["id"])
            for batch in batches(sorted(ids))
            for r in self._read(
                f"SELECT id FROM frames WHERE job_id IN ({marks(len(batch))}) AND state IN ('DEAD', 'EATEN') "
                "ORDER BY id",
                batch,
            )
        ]
        if frames:
            self._write(lambda tx: self._apply_actions(tx, frames, "retry", now))

    def kill_jobs(self, refs: Sequence[str | int], *, now: float, force: bool = False) -> list[dict[str, Any]]:
        ids = self._owned_jobs(refs, force)
        self._kill_ids(ids, now)
        return self._jobs_json(ids)

    def retry_jobs(self, refs: Sequence[str | int], *, now: float, force: bool = False) -> list[dict[str, Any]]:
        ids = self._owned_jobs(refs, force)
        self._retry_ids(ids, now)
        return self._jobs_json(ids)

    def set_jobs_paused(self, refs: Sequence[str | int], paused: bool, *, force: bool = False) -> list[dict[str, Any]]:
        ids = self._owned_jobs(refs, force)

        def update(tx: Tx) -> None:
            for batch in batches(sorted(ids)):
                tx.run(f"UPDATE jobs SET paused = ? WHERE id IN ({marks(len(batch))})", (int(paused), *batch))
            if not paused:
                self._notify(tx)

        if ids:
            self._write(update)
        return self._jobs_json(ids)

    def set_jobs_priority(
        self, refs: Sequence[str | int], priority: int, *, force: bool = False
    ) -> list[dict[str, Any]]:
        priority = fields.priority(priority, "priority")
        ids = self._owned_jobs(refs, force)

        def update(tx: Tx) -> None:
            for batch in batches(sorted(ids)):
                tx.run(f"UPDATE jobs SET priority = ? WHERE id IN ({marks(len(batch))})", (priority, *batch))

        if ids:
            self._write(update)
        return self._jobs_json(ids)

    def _finish_job_if_done(self, tx: Tx, job_id: int, now: float) -> None:
        # One read says both whether the job has work left and what it is now: a job with
        # work left is nearly always PENDING already, and then nothing is written (this runs
        # for every frame that ends).
        row = tx.one(
            "SELECT state, EXISTS (SELECT 1 FROM frames WHERE job_id = ? "
            "AND state IN ('WAITING', 'DEPEND', 'RUNNING')) AS unfinished FROM jobs WHERE id = ?",
            (job_id, job_id),
        )
        if row is None:
            return
        if row["unfinished"]:
            if row["state"] != "PENDING":
                tx.run(
                    "UPDATE jobs SET state = 'PENDING', finished_at = NULL WHERE id = ? AND state != 'PENDING'",
                    (job_id,),
                )
        else:
            if tx.run(
                "UPDATE jobs SET state = 'FINISHED', finished_at = ? WHERE id = ? AND state != 'FINISHED'",
                (now, job_id),
            ):
                notes.record_finish(tx, job_id, now)  # in this transaction: recorded once
            # (Also when it was FINISHED already: eating its last DEAD frame makes it releasable.)
            if dep.release_jobs(tx, [job_id], now):
                self._notify(tx)

    # -- frames --------------------------------------------------------------------------------
    def list_frames(
        self,
        *,
        job: str | int | None = None,
        layer: str | None = None,
        state: str | None = None,
        limit: int = 1000,
        after: int | None = None,
        ids: Sequence[int] | None = None,
        changed_since: float | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        where: list[str] = []
        params: list[Any] = []
        if changed_since is not None:
            where.append("(f.state = 'RUNNING' OR f.started_at >= ? OR f.ended_at >= ? OR f.waiting_since >= ?)")
            params.extend([changed_since] * 3)
        if ids is not None:
            wanted = sorted({int(i) for i in ids})
            if len(wanted) > IN_BATCH * 2:
                raise InvalidInput(f"ids: at most {IN_BATCH * 2} frames at once, got {len(wanted)}")
            if not wanted:
                return [], 0
            where.append(f"f.id IN ({marks(len(wanted))})")
            params.extend(wanted)
        if job is not None:
            where.append("f.job_id = ?")
            params.append(self._job_row(job)["id"])
        if layer is not None:
            where.append("l.name = ?")
            params.append(layer)
        if state is not None:
            where.append("f.state = ?")
            params.append(state)
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        total = self._read(f"SELECT COUNT(*) AS n FROM frames f JOIN layers l ON l.id = f.layer_id {clause}", params)[
            0
        ]["n"]
        if after is not None:
            clause = "WHERE " + " AND ".join([*where, "f.id > ?"])
            params.append(after)
        rows = self._read(f"{_FRAME_SELECT} {clause} ORDER BY f.id LIMIT ?", [*params, limit])
        return [frame_json(r) for r in rows], int(total)

    def frame_attempts(self, frame_ids: Sequence[int]) -> dict[int, list[dict[str, Any]]]:
        out: dict[int, list[dict[str, Any]]] = {}
        for batch in batches(sorted(set(int(i) for i in frame_ids))):
            for r in self._read(
                "SELECT frame_id, attempt, host, outcome, started_at, ended_at, exit_code, exit_signal, timed_out, "
                "failure_kind, failure, "
                "gpu_uuids, gpu_util_mean_pct, gpu_util_max_pct, gpu_memory_peak_bytes, gpu_seconds, gpu_idle_seconds "
                f"FROM attempts WHERE frame_id IN ({marks(len(batch))}) ORDER BY frame_id, attempt",
                batch,
            ):
                out.setdefault(int(r["frame_id"]), []).append(attempt_json(r))
        return out

    def get_frame(self, frame_id: int) -> dict[str, Any]:
        rows = self._read(f"{_FRAME_SELECT} WHERE f.id = ?", (frame_id,))
        if not rows:
            raise NotFound(f"no frame {frame_id}", hint="see `cuectl frame list`")
        data = frame_json(rows[0])
        data["log_path"] = rows[0]["log_path"]
        # The series of the latest attempt that has one (a RUNNING attempt's so far), and
        # which attempt that is: its summary in attempt_history goes with these samples.
        series = self._read(
            "SELECT attempt, uuid, points FROM samples WHERE frame_id = ? AND attempt = "
            "(SELECT MAX(attempt) FROM samples WHERE frame_id = ?)",
            (frame_id, frame_id),
        )
        data["samples"] = samples_json({r["uuid"]: json.loads(r["points"]) for r in series})
        data["samples_attempt"] = int(series[0]["attempt"]) if series else None
        data["attempt_history"] = self.frame_attempts([frame_id]).get(frame_id, [])
        # What the workers saw on the devices while it ran (docs/gpu-health.md).
        data["gpu_events"] = [e.to_json() for e in self.gpu_events(frame_id=frame_id, limit=200)]
        return data

    def frame_id(self, ref: str | int) -> int:
        text = str(ref).strip()
        frame_id = _as_id(text)
        if frame_id is not None:
            return frame_id
        # Job names may hold '/', frame names never do (layer names are [A-Za-z0-9_.-]).
        job_ref, slash, name = text.rpartition("/")
        named = _FRAME_NAME_RE.fullmatch(name)
        if not slash or not job_ref.strip() or named is None:
            raise InvalidInput(
                f"frame {text!r}: expected a frame id or JOB/FRAME, the frame named as `job show` "
                "prints it (sweep2/0003-main)",
                hint="see `cuectl frame list`",
            )
        job = self._job_row(job_ref)
        number, layer = int(named.group(1)), named.group(2)
        if abs(number) > _MAX_ID:  # no frame has it, and neither database could compare it
            raise NotFound(
                f"job {job['id']} ({job['name']}) has no frame {name!r}",
                hint=f"see `cuectl frame list --job {job['id']}`",
            )
        rows = self._read(
            "SELECT f.id, f.number, l.name FROM frames f JOIN layers l ON l.id = f.layer_id "
            "WHERE f.job_id = ? AND f.number = ?" + (" AND l.name = ?" if layer else "") + " ORDER BY f.id",
            (job["id"], number, layer) if layer else (job["id"], number),
        )
        if not rows:
            raise NotFound(
                f"job {job['id']} ({job['name']}) has no frame {name!r}",
                hint=f"see `cuectl frame list --job {job['id']}`",
            )
        if len(rows) > 1:
            names = ", ".join(f"{job['name']}/{frame_name(int(r['number']), r['name'])}" for r in rows[:10])
            raise Conflict(f"frame {text!r} is in {len(rows)} layers ({names})", hint="add the layer to the name")
        return int(rows[0]["id"])

    def frame_action(
        self, frame_ids: Sequence[int], action: str, *, now: float, force: bool = False
    ) -> list[dict[str, Any]]:
        return [self.get_frame(i) for i in self._frames_action(frame_ids, action, now=now, force=force)]

    def frames_action(
        self, frame_ids: Sequence[int], action: str, *, now: float, force: bool = False
    ) -> list[dict[str, Any]]:
        """``frame_action`` for many frames: ``frame list``'s shape back, read in batches."""
        ids = self._frames_action(frame_ids, action, now=now, force=force)
        found: dict[int, dict[str, Any]] = {}
        for batch in batches(sorted(ids)):
            for r in self._read(f"{_FRAME_SELECT} WHERE f.id IN ({marks(len(batch))})", batch):
                found[int(r["id"])] = frame_json(r)
        return [found[i] for i in ids if i in found]

    def select_frames(
        self,
        job: str | int,
        *,
        layer: str | None = None,
        state: str | None = None,
        numbers: Iterable[int] | None = None,
    ) -> list[int]:
        """Ids of the job's frames (in dispatch order) of ``layer``, in ``state``, whose
        number (a chunk's first frame) is in ``numbers``; ``NotFound`` for an unknown layer."""
        job_id = int(self._job_row(job)["id"])
        where, params = ["f.job_id = ?"], [job_id]  # type: tuple[list[str], list[Any]]
        if layer is not None:
            if not self._read("SELECT 1 FROM layers WHERE job_id = ? AND name = ?", (job_id, layer)):
                raise NotFound(f"job {job_id} has no layer {layer!r}", hint=f"see `cuectl job show {job_id}`")
            where.append("l.name = ?")
            params.append(layer)
        if state is not None:
            where.append("f.state = ?")
            params.append(state)
        wanted = None if numbers is None else set(numbers)
        return [
            int(r["id"])
            for r in self._read(
                f"SELECT f.id, f.number FROM frames f JOIN layers l ON l.id = f.layer_id WHERE {' AND '.join(where)} "
                "ORDER BY f.id",
                params,
            )
            if wanted is None or int(r["number"]) in wanted
        ]

    def _frames_action(self, frame_ids: Sequence[int], action: str, *, now: float, force: bool) -> list[int]:
        """Check every frame exists and every job is the caller's (all or nothing), then
        apply ``action`` to them all in one transaction; the ids, without repeats."""
        if action not in lifecycle.ACTIONS:
            raise InvalidInput(f"unknown frame action {action!r}")
        ids = list(dict.fromkeys(int(i) for i in frame_ids))
        job_of = {
            int(r["id"]): int(r["job_id"])
            for batch in batches(ids)
            for r in self._read(f"SELECT id, job_id FROM frames WHERE id IN ({marks(len(batch))})", batch)
        }
        missing = [i for i in ids if i not in job_of]
        if missing:
            raise NotFound(f"no frame {missing[0]}", hint="see `cuectl frame list`")
        self._check_owner(
            [
                job
                for batch in batches(sorted(set(job_of.values())))
                for job in self._read(f"SELECT * FROM jobs WHERE id IN ({marks(len(batch))}) ORDER BY id", batch)
            ],
            force,
        )
        if ids:
            self._write(lambda tx: self._apply_actions(tx, ids, action, now))
        return ids

    def _apply_actions(self, tx: Tx, ids: Sequence[int], action: str, now: float) -> None:
        self._lock_jobs(tx, frames=ids)
        if sum(self._apply_action(tx, frame_id, action, now) for frame_id in ids):
            self._notify(tx)

    def _apply_action(self, tx: Tx, frame_id: int, action: str, now: float) -> int:
        """Apply one action; return how many frames became WAITING (to wake workers)."""
        row = tx.one(
            f"SELECT f.state, f.job_id, f.layer_id, f.depend_count FROM frames f WHERE f.id = ?"
            f"{self.dialect.lock_rows}",
            (frame_id,),
        )
        state = row["state"]
        woke = 0
        if state == m.RUNNING:
            # The worker owning it sees the flag on its next heartbeat, kills the process
            # group and reports; the final state is decided in complete_frame, which keeps
            # the failure of a killed attempt: who killed it.
            if action == "kill":
                tx.run(
                    "UPDATE frames SET action = ?, failure = ? WHERE id = ?",
                    (action, lifecycle.killed_by(self.actor().name), frame_id),
                )
            else:
                tx.run("UPDATE frames SET action = ? WHERE id = ?", (action, frame_id))
            return 0
        if action == "retry":
            if state == m.WAITING:  # waiting out a retry back-off: a user's retry means now
                return tx.run("UPDATE frames SET retry_at = NULL WHERE id = ? AND retry_at IS NOT NULL", (frame_id,))
            if state == m.DEPEND:
                return 0
            layer_waits = tx.one("SELECT depend_count FROM layers WHERE id = ?", (row["layer_id"],))["depend_count"]
            new = lifecycle.retried_state(row["depend_count"], layer_waits)
            tx.run(
                "UPDATE frames SET state = ?, waiting_since = ?, ended_at = NULL, action = NULL, retry_at = NULL "
                "WHERE id = ?",
                (new, now, frame_id),
            )
            tx.run("UPDATE jobs SET killed_at = NULL WHERE id = ? AND killed_at IS NOT NULL", (row["job_id"],))
            woke = int(new == m.WAITING)
        elif action == "kill":
            if state in (m.WAITING, m.DEPEND):
                tx.run(
                    "UPDATE frames SET state = 'DEAD', ended_at = ?, failure = ? WHERE id = ?",
                    (now, lifecycle.killed_by(self.actor().name), frame_id),
                )
                notes.record_dead(tx, row["job_id"], frame_id, now)
        elif state != m.EATEN:  # eat
            tx.run("UPDATE frames SET state = 'EATEN', ended_at = ? WHERE id = ?", (now, frame_id))
            if self._satisfy_on_eaten(tx):  # OpenCue's default: dependents keep waiting
                woke = self._release_dependents(tx, frame_id, row["layer_id"], now)
        self._finish_job_if_done(tx, row["job_id"], now)
        return woke

    def _release_dependents(self, tx: Tx, frame_id: int, layer_id: int, now: float) -> int:
        """Satisfy what waited on this frame (and on its layer, if the layer is now done:
        every frame SUCCEEDED, or EATEN where depend.satisfy_on_eaten is set); return how
        many frames became WAITING. The caller holds the job's lock and has decided that
        this frame releases (SUCCEEDED, or EATEN with the setting).

        Dependency rows are deleted as they are satisfied, so a frame that is retried and
        succeeds again never releases anything twice.
        """
        # Most frames are waited on by nothing: one indexed probe then stands in for the
        # three deletes and the scan of the layer below (a third of a completion's cost).
        if tx.one(_WAITED_ON, (frame_id, layer_id, frame_id, layer_id)) is None:
            return 0
        released = {
            int(r["frame_id"]): 1
            for r in tx.all("DELETE FROM frame_deps WHERE on_frame_id = ? RETURNING frame_id", (frame_id,))
        }
        woke = dep.wake_frames(tx, released, now) if released else 0
        woke += dep.release_frame(tx, frame_id, layer_id, now)  # other jobs' edges, any-frame waits
        if tx.one(
            "SELECT 1 FROM frames WHERE layer_id = ? AND state IN ('WAITING', 'DEPEND', 'RUNNING', 'DEAD') LIMIT 1",
            (layer_id,),
        ):
            return woke
        if not self._satisfy_on_eaten(tx) and tx.one(
            "SELECT 1 FROM frames WHERE layer_id = ? AND state = 'EATEN' LIMIT 1", (layer_id,)
        ):
            return woke  # OpenCue: a layer with EATEN frames never completes its dependencies
        layers = {
            int(r["layer_id"]): 1
            for r in tx.all("DELETE FROM layer_deps WHERE on_layer_id = ? RETURNING layer_id", (layer_id,))
        }
        woke += dep.wake_layers(tx, layers, now) if layers else 0
        return woke + dep.release_layer(tx, layer_id, now)

    # -- store settings (meta; `cuectl admin setting`) ------------------------------------------
    def _satisfy_on_eaten(self, tx: Tx) -> bool:
        """depend.satisfy_on_eaten, read in ``tx`` at most every SETTINGS_TTL_S (cached per
        store object: another process's change is seen within that time)."""
        clock = time.monotonic()
        if clock - self._settings_read_at > SETTINGS_TTL_S:
            self._settings = _read_settings(tx.all)
            self._settings_read_at = clock
        return self._settings[m.SATISFY_ON_EATEN]

    def settings(self) -> list[dict[str, Any]]:
        values = _read_settings(self._read)
        return [
            {"name": name, "value": values[name], "default": default, "help": text}
            for name, (default, text) in m.SETTINGS.items()
        ]

    def set_setting(self, name: str, value: str | bool, *, now: float) -> list[dict[str, Any]]:
        if name not in m.SETTINGS:
            raise InvalidInput(
                f"NAME: {name!r} is not a store setting (known: {', '.join(m.SETTINGS)})",
                hint="see `cuectl admin setting list`",
            )
        flag = _setting_value(value)
        self._admin_only(f"setting set {name}", "store settings")

        def change(tx: Tx) -> None:
            tx.run(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (name, "true" if flag else "false"),
            )
            self._settings_read_at = -1e18  # this transaction reads the new value
            if name == m.SATISFY_ON_EATEN and flag and self._release_eaten(tx, now):
                self._notify(tx)

        try:
            self._write(change)
        finally:
            self._settings_read_at = -1e18
        return self.settings()

    def _release_eaten(self, tx: Tx, now: float) -> int:
        """Satisfy what already waits on EATEN frames (depend.satisfy_on_eaten was just set),
        as Cuebot's stale-depend sweep would; return how many frames became WAITING."""
        pending = (
            "FROM frames f WHERE f.state = 'EATEN' AND (EXISTS (SELECT 1 FROM frame_deps d "
            "WHERE d.on_frame_id = f.id) OR EXISTS (SELECT 1 FROM layer_deps d WHERE d.on_layer_id = f.layer_id))"
        )
        jobs = sorted({int(r["job_id"]) for r in tx.all(f"SELECT DISTINCT f.job_id {pending}")})
        if not jobs:
            return 0
        self._lock_jobs(tx, jobs=jobs)
        return sum(
            self._release_dependents(tx, r["id"], r["layer_id"], now)
            for r in tx.all(f"SELECT f.id, f.layer_id {pending} ORDER BY f.id")
        ) + dep.sweep(tx, now, True)

    # -- dependencies of every OpenCue type (store/depends.py) ---------------------------------
    def _layer_id(self, tx: Tx, job: Row, name: str) -> int:
        row = tx.one("SELECT id FROM layers WHERE job_id = ? AND name = ?", (job["id"], name))
        if row is None:
            names = [r["name"] for r in tx.all("SELECT name FROM layers WHERE job_id = ? ORDER BY idx", (job["id"],))]
            raise NotFound(
                f"job {job['id']} ({job['name']}) has no layer {name!r}", hint=f"its layers: {', '.join(names[:20])}"
            )
        return int(row["id"])

    @staticmethod
    def _frame_id(tx: Tx, job: Row, layer: str, layer_id: int, number: int) -> int:
        """The frame of a layer holding frame number ``number`` (its chunk, when chunked)."""
        for fid, numbers in dep.layer_frames(tx, layer_id):
            if number in numbers:
                return fid
        raise NotFound(f"layer {layer!r} of job {job['id']} ({job['name']}) has no frame {number}")

    def _depend_request(
        self,
        tx: Tx,
        job: Row,
        *,
        layer: str | None,
        frame: int | None,
        on_job: Row,
        on_layer: str | None,
        on_frame: int | None,
        how: str,
        kind: str | None,
    ) -> dep.Request:
        """Resolve names to ids and check that the combination is one of OpenCue's types."""
        if frame is not None and layer is None:
            raise InvalidInput("--frame: a frame needs its --layer")
        if on_frame is not None and on_layer is None:
            raise InvalidInput("--on-frame: a frame needs its --on-layer")
        waiter = "frame" if frame is not None else ("layer" if layer is not None else "job")
        target = "frame" if on_frame is not None else ("layer" if on_layer is not None else "job")
        if kind in ("frame-by-frame", "previous-frame"):
            how = "frame" if kind == "frame-by-frame" else "previous"
        derived = "layer-on-sim-frame" if kind == "layer-on-sim-frame" else dep.depend_type(waiter, target, how)
        if how in ("frame", "previous", "any") and (waiter, target) != ("layer", "layer"):
            raise InvalidInput(
                f"{'--any-frame' if how == 'any' else derived}: only a layer waits on a layer that way "
                f"(this is {waiter}-on-{target})"
            )
        if kind is not None and kind != derived:
            raise InvalidInput(
                f"--type {kind}: the options given make a {derived} dependency",
                hint="a job waits with neither --layer nor --frame; a layer with --layer; "
                "a frame with --layer and --frame (likewise --on-*)",
            )
        if derived == "layer-on-sim-frame" and (waiter, target) != ("layer", "frame"):
            raise InvalidInput(
                f"--type layer-on-sim-frame: needs --layer and --on-layer with --on-frame "
                f"(this is {waiter}-on-{target})"
            )
        layer_id = None if layer is None else self._layer_id(tx, job, layer)
        on_layer_id = None if on_layer is None else self._layer_id(tx, on_job, on_layer)
        req = dep.Request(
            type=derived,
            job_id=int(job["id"]),
            on_job_id=int(on_job["id"]),
            layer_id=layer_id,
            frame_id=None
            if frame is None or layer is None or layer_id is None
            else self._frame_id(tx, job, layer, layer_id, frame),
            on_layer_id=on_layer_id,
            on_frame_id=None
            if on_frame is None or on_layer is None or on_layer_id is None
            else self._frame_id(tx, on_job, on_layer, on_layer_id, on_frame),
            any_frame=how == "any",
        )
        same = req.job_id == req.on_job_id and (req.layer_id, req.frame_id) == (req.on_layer_id, req.on_frame_id)
        if (
            same
            and derived != "previous-frame"
            or (derived in ("job-on-job", "layer-on-job", "frame-on-job") and req.job_id == req.on_job_id)
        ):
            raise InvalidInput(f"a {derived} dependency of job {job['id']} on itself would never be met")
        if req.on_job_id != req.job_id and dep.waits_on_job(tx, req.on_job_id, req.job_id):
            raise InvalidInput(
                f"job {on_job['id']} ({on_job['name']}) already waits on job {job['id']} "
                f"({job['name']}): this dependency would make them wait on each other forever"
            )
        return req

    def add_depend(
        self,
        job: str | int,
        *,
        layer: str | None = None,
        frame: int | None = None,
        on_job: str | int | None = None,
        on_layer: str | None = None,
        on_frame: int | None = None,
        how: str = "layer",
        kind: str | None = None,
        now: float,
        force: bool = False,
    ) -> dict[str, Any]:
        """Make a job, one of its layers or one of its frames wait on a job, layer or frame
        (``cuectl job depend``; docs/opencue.md). Only the waiting job's owner or an admin."""
        waiter = self._job_row(job)
        self._check_owner([waiter], force)
        if kind is not None:
            dep.check_type(kind)

        def insert(tx: Tx) -> int:
            target = waiter if on_job is None else self._job_row(on_job, tx.all)
            self._lock_jobs(tx, jobs=[int(waiter["id"]), int(target["id"])])
            req = self._depend_request(
                tx,
                waiter,
                layer=layer,
                frame=frame,
                on_job=target,
                on_layer=on_layer,
                on_frame=on_frame,
                how=how,
                kind=kind,
            )
            depend_id = dep.add(tx, req, now=now, eaten=self._satisfy_on_eaten(tx))
            self._finish_job_if_done(tx, int(waiter["id"]), now)
            return depend_id

        depend_id = self._write(insert, idempotent=False)
        return dep.depend_json(self._read(dep.list_sql("d.id = ?"), (depend_id,))[0])

    def _add_spec_depends(self, tx: Tx, spec: m.JobSpec, job_id: int, layer_ids: Mapping[str, int], now: float) -> None:
        """A submitted job's dependencies on other jobs (``depends:`` naming a ``job``)."""
        wanted = [(None, d) for d in spec.depends] + [
            (layer.name, d) for layer in spec.layers for d in layer.depends if d.job is not None
        ]
        if not wanted:
            return
        job = tx.one("SELECT * FROM jobs WHERE id = ?", (job_id,))
        eaten = self._satisfy_on_eaten(tx)
        for layer, d in wanted:
            assert d.job is not None
            target = self._job_row(d.job, tx.all)
            self._lock_jobs(tx, jobs=[int(target["id"])])
            req = self._depend_request(
                tx, job, layer=layer, frame=None, on_job=target, on_layer=d.on, on_frame=d.frame, how=d.type, kind=None
            )
            dep.add(tx, req, now=now, eaten=eaten)

    def drop_depends(
        self, job: str | int, ids: Sequence[int] | None, *, now: float, force: bool = False
    ) -> list[dict[str, Any]]:
        """Satisfy a job's dependencies by id (None: every one it waits on), as OpenCue's
        dropDepends; return them as they are now."""
        row = self._job_row(job)
        self._check_owner([row], force)
        job_id = int(row["id"])
        if ids is not None:
            mine = {
                int(r["id"])
                for batch in batches(sorted(set(ids)))
                for r in self._read(
                    f"SELECT id FROM depends WHERE job_id = ? AND id IN ({marks(len(batch))})", (job_id, *batch)
                )
            }
            missing = sorted(set(ids) - mine)
            if missing:
                raise NotFound(
                    f"job {job_id} ({row['name']}) has no dependency {', '.join(map(str, missing))}",
                    hint=f"see `cuectl job show {job_id}`",
                )

        def release(tx: Tx) -> None:
            self._lock_jobs(tx, jobs=[job_id])
            if dep.drop(tx, job_id, ids, now):
                self._notify(tx)
            self._finish_job_if_done(tx, job_id, now)

        self._write(release)
        return (
            self.list_depends(job_id)["depends"]
            if ids is None
            else [d for d in self.list_depends(job_id)["depends"] if d["id"] in set(ids)]
        )

    def list_depends(self, job: str | int) -> dict[str, list[dict[str, Any]]]:
        """What a job waits on (``depends``) and what waits on it (``dependents``)."""
        job_id = int(self._job_row(job)["id"])
        return {
            "depends": [dep.depend_json(r) for r in self._read(dep.list_sql("d.job_id = ?"), (job_id,))],
            "dependents": [
                dep.depend_json(r)
                for r in self._read(dep.list_sql("d.on_job_id = ? AND d.job_id != ?"), (job_id, job_id))
            ],
        }

    def sweep_depends(self, *, now: float) -> int:
        """Release dependencies whose target is done but were not released (store/depends.py
        ``sweep``); workers run it with the reaper. Returns how many frames became WAITING."""
        if not self._read("SELECT 1 FROM depend_edges LIMIT 1"):
            return 0  # the common case: no dependency between jobs, no work
        if not self._read(dep.stale_sql(_read_settings(self._read)[m.SATISFY_ON_EATEN]) + " LIMIT 1"):
            return 0  # nothing to release: no write transaction

        def sweep(tx: Tx) -> int:
            woke = dep.sweep(tx, now, self._satisfy_on_eaten(tx))
            if woke:
                self._notify(tx)
            return woke

        return self._write(sweep)

    # -- hosts ---------------------------------------------------------------------------------
    def register_host(self, host: HostInfo, *, now: float) -> None:
        self._write(
            lambda tx: tx.run(
                "INSERT INTO hosts(name, cores, memory_bytes, gpus, tags, registered_at, last_heartbeat, worker_pid, "
                "version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "cores = excluded.cores, memory_bytes = excluded.memory_bytes, gpus = excluded.gpus, "
                "tags = excluded.tags, registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat, "
                "worker_pid = excluded.worker_pid, version = excluded.version",
                (
                    host.name,
                    host.cores,
                    host.memory_bytes,
                    json.dumps(list(host.gpus)),
                    json.dumps(list(host.tags)),
                    now,
                    now,
                    host.worker_pid,
                    host.version,
                ),
            )
        )

    def list_hosts(self, *, now: float, down_after: float) -> list[dict[str, Any]]:
        states = devstates.by_host(self.device_states())
        return [
            devstates.with_states(host_json(r, now=now, down_after=down_after), states.get(r["name"], {}))
            for r in self._read("SELECT * FROM hosts ORDER BY name")
        ]

    def get_host(self, name: str, *, now: float, down_after: float) -> dict[str, Any]:
        rows = self._read("SELECT * FROM hosts WHERE name = ?", (name,))
        if not rows:
            raise NotFound(f"no host {name!r}", hint="see `cuectl host list`")
        data = devstates.with_states(
            host_json(rows[0], now=now, down_after=down_after), {d.uuid: d for d in self.device_states(name)}
        )
        data["running_frames"] = [
            r["id"]
            for r in self._read("SELECT id FROM frames WHERE host = ? AND state = 'RUNNING' ORDER BY id", (name,))
        ]
        return data

    def set_host_locked(self, name: str, locked: bool) -> dict[str, Any]:
        def update(tx: Tx) -> None:
            if tx.run("UPDATE hosts SET locked = ? WHERE name = ?", (int(locked), name)) == 0:
                raise NotFound(f"no host {name!r}", hint="see `cuectl host list`")
            if not locked:
                self._notify(tx)  # its idle worker may claim again

        self._write(update)
        return self.get_host(name, now=time.time(), down_after=float("inf"))

    def sign_off_host(self, name: str, worker_pid: int | None, *, now: float) -> bool:
        # The mark lives in the live column (views.SIGNED_OFF), which the next registration
        # or heartbeat of any worker of this host outdates: no column to add, and a host
        # never reads DOWN while a worker beats for it.
        mark = json.dumps({"at": now, views.SIGNED_OFF: True})
        return bool(
            self._write(
                lambda tx: tx.run(
                    "UPDATE hosts SET last_heartbeat = ?, live = ?, worker_pid = NULL "
                    "WHERE name = ? AND (worker_pid = ? OR (worker_pid IS NULL AND ? IS NULL))",
                    (now, mark, name, worker_pid, worker_pid),
                )
            )
        )

    def host_inventories(self) -> dict[str, tuple[list[Mapping[str, Any]], bool, list[str]]]:
        return {
            r["name"]: (json.loads(r["gpus"]), bool(r["locked"]), json.loads(r["tags"]))
            for r in self._read("SELECT name, gpus, locked, tags FROM hosts")
        }

    # -- worker --------------------------------------------------------------------------------
    def runnable_layers(
        self, *, limit: int = 500, after: tuple[Any, ...] | None = None, host: HostShape | None = None
    ) -> list[RunnableLayer]:
        # Keyset paging in dispatch order: ``after`` is the last page's final layer's
        # ``order_key``, so a worker reads on past any number of layers it cannot run (a
        # fixed window let 200 unrunnable layers starve everything behind them). ``host``
        # leaves out, in SQL, layers that host could never run by size alone, so a queue of
        # such layers costs a pass an index scan rather than a row each.
        page, params = "", []
        if after is not None:
            priority, created_at, job_id, idx = after
            page = (
                "AND (j.priority < ? OR (j.priority = ? AND (j.created_at > ? OR (j.created_at = ? AND "
                "(j.id > ? OR (j.id = ? AND l.idx > ?)))))) "
            )
            params = [priority, priority, created_at, created_at, job_id, job_id, idx]
        if host is not None:
            page += (
                "AND l.gpus <= ? AND (l.gpus = 0 OR l.gpu_memory_min_bytes <= ?) "
                "AND (l.gpus > 0 OR (? = 0 AND l.cores <= ? AND l.memory_bytes <= ?)) "
            )
            # (a GiB of slack: a device satisfies a request its total rounds up to, match.py)
            params += [
                host.gpus,
                host.gpu_memory_max_bytes + (1 << 30),
                int(host.gpu_only),
                host.cores + 1e-9,
                host.memory_bytes,
            ]
        params.append(limit)
        rows = self._read(
            "SELECT l.id, l.job_id, j.name AS job_name, l.name, j.priority, l.gpus, l.gpu_vendor, l.gpu_models, "
            "l.gpu_capability_min, l.gpu_driver_min, l.gpu_cuda_min, l.gpu_share_bytes, "
            'l.gpu_memory_min_bytes, l.cores, l.memory_bytes, l.tags, j."user" AS "user", j.submitted_by, j.receipt, '
            "j.created_at, l.idx, CASE WHEN l.retry_on_gpu_oom IS NULL THEN 0 ELSE (SELECT MIN(COALESCE(fo.gpu_oom_bytes, 0)) "
            "FROM frames fo WHERE fo.layer_id = l.id AND fo.state = 'WAITING') END AS gpu_oom_bytes "
            "FROM layers l JOIN jobs j ON j.id = l.job_id "
            "WHERE j.state = 'PENDING' AND j.paused = 0 AND l.depend_count >= 0 "
            "AND EXISTS (SELECT 1 FROM frames f WHERE f.layer_id = l.id AND f.state = 'WAITING') "
            f"{page}ORDER BY j.priority DESC, j.created_at, j.id, l.idx LIMIT ?",
            params,
        )
        return [
            RunnableLayer(
                layer_id=r["id"],
                job_id=r["job_id"],
                job=r["job_name"],
                layer=r["name"],
                priority=r["priority"],
                gpus=r["gpus"],
                gpu_vendor=r["gpu_vendor"],
                gpu_models=_json_tuple(r["gpu_models"]),
                gpu_memory_min_bytes=r["gpu_memory_min_bytes"],
                cores=r["cores"],
                memory_bytes=r["memory_bytes"],
                tags=_json_tuple(r["tags"]),
                waiting=1,
                gpu_capability_min=r["gpu_capability_min"],
                gpu_driver_min=r["gpu_driver_min"],
                gpu_cuda_min=r["gpu_cuda_min"],
                user=r["user"],
                submitted_by=r["submitted_by"],
                receipt=r["receipt"],
                order_key=(r["priority"], r["created_at"], r["job_id"], r["idx"]),
                gpu_oom_bytes=int(r["gpu_oom_bytes"] or 0),
                gpu_share_bytes=r["gpu_share_bytes"],
            )
            for r in rows
        ]

    def _claim_gpu_bytes(self, layer: Row, host: str, gpu_uuids: Sequence[str]) -> int:
        """What a claim of ``layer`` on ``gpu_uuids`` offers a frame that ran out of GPU
        memory: the smallest total memory of those devices by the host's registered
        inventory (a frame is claimed only if it failed on less; unknown: 0, only frames
        that never ran out). A layer without ``retry_on_gpu_oom: bigger`` never sets the
        bound, so it costs that layer no read."""
        if layer["retry_on_gpu_oom"] != "bigger":
            return _MAX_ID
        rows = self._read("SELECT gpus FROM hosts WHERE name = ?", (host,))
        inventory = {d.get("uuid"): d.get("memory_total_bytes") for d in json.loads(rows[0]["gpus"])} if rows else {}
        sizes = [inventory.get(uuid) for uuid in gpu_uuids]
        if not sizes or any(not isinstance(size, int) for size in sizes):
            return 0
        return min(int(size) for size in sizes if isinstance(size, int))

    def _layer_row(self, layer_id: int) -> Row:
        """The layer (with its job's name and user) for the claim path, read once."""
        row = self._layer_cache.get(layer_id)
        if row is None:
            columns = ", ".join(f"l.{c.strip()}" for c in lifecycle.LAYER_COLUMNS.split(","))
            rows = self._read(
                f'SELECT {columns}, j.name AS job_name, j."user" AS "user", j.submitted_by, j.receipt, '
                "j.project, j.show, j.shot, j.max_running AS job_max_running, j.max_cores AS job_max_cores, "
                "j.max_gpus AS job_max_gpus "
                "FROM layers l JOIN jobs j ON j.id = l.job_id WHERE l.id = ?",
                (layer_id,),
            )
            if not rows:
                raise NotFound(f"no layer {layer_id}")
            row = dict(rows[0])
            # The limits it holds as layer_limits says (rows its owner cannot change after
            # submit, unlike the layer's own copy of the list: roles.sql).
            row["limits"] = json.dumps(
                [
                    r["name"]
                    for r in self._read("SELECT name FROM layer_limits WHERE layer_id = ? ORDER BY name", (layer_id,))
                ]
            )
            if len(self._layer_cache) > 4096:
                self._layer_cache.clear()
            self._layer_cache[layer_id] = row
        return row

    def heartbeat(
        self,
        host: str,
        frame_ids: Iterable[int],
        *,
        now: float,
        lease_s: float,
        live: Mapping[str, Any] | None = None,
        attempts: Mapping[int, int] | None = None,
    ) -> dict[int, str | None]:
        ids = [int(i) for i in frame_ids]

        def beat(tx: Tx) -> list[Row]:
            tx.run(
                "UPDATE hosts SET last_heartbeat = ?, live = COALESCE(CAST(? AS TEXT), live) WHERE name = ?",
                (now, json.dumps(live) if live is not None else None, host),
            )
            if not ids:  # a host runs at most a few hundred frames: one IN list holds them
                return []
            tx.run(
                f"UPDATE frames SET lease_expires = ? WHERE id IN ({marks(len(ids))}) AND host = ? "
                "AND state = 'RUNNING'",
                (now + lease_s, *ids, host),
            )
            return tx.all(f"SELECT id, state, host, action, attempts FROM frames WHERE id IN ({marks(len(ids))})", ids)

        result: dict[int, str | None] = {i: "lost" for i in ids}
        for r in self._write(beat):
            current = attempts is None or attempts.get(r["id"]) == r["attempts"]
            ours = r["state"] == m.RUNNING and r["host"] == host and current
            result[r["id"]] = r["action"] if ours else "lost"
        return result

    def record_live_usage(self, host: str, usage: Sequence[LiveUsage], *, now: float) -> list[int]:
        if not usage:
            return []

        def record(tx: Tx) -> list[int]:
            # No job lock: this changes no state, only columns and rows that RUNNING
            # attempt alone writes; the fence (state, attempt, host) is in the UPDATE itself.
            # Rows in id order, as the reaper locks them: two writers never wait on each other
            # in a cycle.
            written, series = [], []
            for u in sorted(usage, key=lambda u: u.frame_id):
                if tx.run(
                    "UPDATE frames SET gpu_util_pct = ?, gpu_memory_used_bytes = ?, gpu_sampled_at = ? "
                    "WHERE id = ? AND attempts = ? AND host = ? AND state = 'RUNNING'",
                    (u.util_pct, u.memory_used_bytes, u.sampled_at, u.frame_id, u.attempt, host),
                ):
                    written.append(u.frame_id)
                    series += [
                        (u.frame_id, u.attempt, uuid, json.dumps([list(p) for p in points]))
                        for uuid, points in u.samples.items()
                    ]
            if series:
                tx.many(_UPSERT_SAMPLES, series)
            return written

        return self._write(record)

    # -- GPU events (docs/gpu-health.md) ------------------------------------------------------------
    def record_gpu_events(self, host: str, events: Sequence[GpuEvent]) -> int:
        for e in events:
            if e.kind not in GPU_EVENT_KINDS:
                raise InvalidInput(f"unknown GPU event kind {e.kind!r} (one of {', '.join(GPU_EVENT_KINDS)})")
        if not events:
            return 0
        columns = "host, kind, at, device_uuid, device_index, pid, memory_bytes, detail"

        def record(tx: Tx) -> int:
            kept = 0
            for e in events:
                values = (host, e.kind, e.at, e.device_uuid, e.device_index, e.pid, e.memory_bytes, e.detail)
                if e.frame_id is None:
                    kept += tx.run(f"INSERT INTO gpu_events ({columns}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", values)
                else:
                    # The frame's job from the frame itself: an event cannot be filed under
                    # another job, and one for a frame deleted meanwhile is dropped.
                    row = tx.one("SELECT job_id FROM frames WHERE id = ?", (e.frame_id,))
                    if row is None:
                        continue
                    kept += tx.run(
                        f"INSERT INTO gpu_events ({columns}, job_id, frame_id, attempt) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (*values, row["job_id"], e.frame_id, e.attempt),
                    )
                    if e.kind == "idle":  # the owner is told through the job's notifications
                        notes.record(tx, int(row["job_id"]), "gpu_idle", int(e.frame_id), e.at, worker_only=True)
            return kept

        return self._write(record)

    def gpu_events(
        self,
        *,
        frame_id: int | None = None,
        job_id: int | None = None,
        host: str | None = None,
        kinds: Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[GpuEvent]:
        where, params = [], []
        for column, value in (("frame_id", frame_id), ("job_id", job_id), ("host", host)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if kinds:
            where.append(f"kind IN ({marks(len(kinds))})")
            params += list(kinds)
        clause = f"WHERE {' AND '.join(where)} " if where else ""
        rows = self._read(
            "SELECT * FROM (SELECT id, host, kind, at, frame_id, attempt, device_uuid, device_index, pid, "
            f"memory_bytes, detail FROM gpu_events {clause}ORDER BY id DESC LIMIT ?) newest ORDER BY id",
            (*params, max(0, int(limit))),
        )
        return [
            GpuEvent(
                kind=r["kind"],
                at=r["at"],
                device_uuid=r["device_uuid"],
                device_index=r["device_index"],
                pid=r["pid"],
                memory_bytes=r["memory_bytes"],
                detail=r["detail"],
                frame_id=r["frame_id"],
                attempt=r["attempt"],
                host=r["host"],
            )
            for r in rows
        ]

    def gpu_event_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self._read("SELECT kind, detail, COUNT(*) AS n FROM gpu_events GROUP BY kind, detail"):
            kind = str(r["kind"])
            if kind == "xid":
                # "Xid 79: GPU has fallen off the bus" -> xid:79
                code = str(r["detail"] or "").split(":", 1)[0].removeprefix("Xid").strip()
                kind = f"xid:{code or '?'}"
            counts[kind] = counts.get(kind, 0) + int(r["n"])
        return counts

    # -- device states (docs/gpu-health.md; store/devices.py) ---------------------------------------
    def device_states(self, host: str | None = None) -> list[DeviceState]:
        clause, params = ("WHERE host = ? ", (host,)) if host is not None else ("", ())
        return [
            devstates.from_row(r)
            for r in self._read(f"SELECT * FROM device_states {clause}ORDER BY host, uuid", params)
        ]

    def set_device_state(self, host: str, uuid: str, state: str, reason: str | None, *, now: float) -> bool:
        devstates.check_state(state)
        text = devstates.clean_text(reason)
        by = self.actor().name

        def write(tx: Tx) -> bool:
            old = tx.one("SELECT state, reason FROM device_states WHERE host = ? AND uuid = ?", (host, uuid))
            if old is not None and old["state"] == state and old["reason"] == text:
                return False
            self._put_device_state(tx, host, uuid, state, text, now, by, automatic=state != "ok")
            return True

        return bool(self._write(write))

    @staticmethod
    def _put_device_state(
        tx: Tx, host: str, uuid: str, state: str, reason: str | None, now: float, by: str | None, *, automatic: bool
    ) -> None:
        tx.run(
            "INSERT INTO device_states(host, uuid, state, reason, since, by_user, automatic) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (host, uuid) DO UPDATE SET state = excluded.state, "
            "reason = excluded.reason, since = excluded.since, by_user = excluded.by_user, "
            "automatic = excluded.automatic",
            (host, uuid, state, reason, now, by, int(automatic)),
        )

    def drain_device(self, host: str, device: str, *, reason: str, now: float) -> DeviceState:
        text = devstates.person_reason(reason)
        return self._by_hand(host, device, "drained", text, now, "gpu drain")

    def undrain_device(self, host: str, device: str, *, now: float) -> DeviceState:
        return self._by_hand(host, device, "ok", None, now, "gpu undrain")

    def _by_hand(self, host: str, device: str, state: str, reason: str | None, now: float, what: str) -> DeviceState:
        actor = self.actor()
        rows = self._read("SELECT name, gpus, live FROM hosts WHERE name = ?", (host,))
        if not rows:
            raise NotFound(f"no host {host!r}", hint="see `cuectl host list`")
        uuid = devstates.resolve(host, rows[0]["gpus"], device)
        if not actor.admin:
            # The host's owner: the user its worker runs as (it publishes it). Not on
            # PostgreSQL, where only workers and admins may write device states (roles.sql).
            try:
                live = json.loads(rows[0]["live"] or "null")
            except ValueError:
                live = None
            owner = live.get("worker_user") if isinstance(live, dict) and self._force_overrides else None
            if owner is None or owner != actor.name:
                raise NotOwner(
                    f"{what}: only an admin{' or the host’s owner' if self._force_overrides else ''} may drain or "
                    f"undrain a device of host {host}, not {actor.name}",
                    hint="ask an admin" + ("" if self._force_overrides else " (a member of cuectl_admin)"),
                )
        self._write(lambda tx: self._put_device_state(tx, host, uuid, state, reason, now, actor.name, automatic=False))
        return next(s for s in self.device_states(host) if s.uuid == uuid)

    def failed_attempts(self, host: str, since: float) -> list[tuple[int, tuple[str, ...], float]]:
        rows = self._read(
            "SELECT job_id, gpu_uuids, ended_at FROM attempts WHERE ended_at > ? AND host = ? AND outcome = 'failed' "
            "AND failure_kind IN ('exit', 'signal') AND gpu_uuids <> '[]' ORDER BY ended_at",
            (since, host),
        )
        return [(int(r["job_id"]), _json_tuple(r["gpu_uuids"] or "[]"), float(r["ended_at"])) for r in rows]

    def jobs_succeeded_elsewhere(self, job_ids: Sequence[int], host: str, uuid: str) -> set[int]:
        out: set[int] = set()
        for batch in batches(sorted({int(j) for j in job_ids})):
            for r in self._read(
                f"SELECT job_id, host, gpu_uuids FROM attempts WHERE job_id IN ({marks(len(batch))}) "
                "AND outcome = 'succeeded'",
                tuple(batch),
            ):
                if r["host"] != host or uuid not in _json_tuple(r["gpu_uuids"] or "[]"):
                    out.add(int(r["job_id"]))
        return out

    def _running_frame(self, tx: Tx, frame_id: int, attempt: int) -> Row | None:
        """The frame with what its attempt record needs, locked (its job first: the lock order
        of every writer); None unless it is RUNNING ``attempt`` (fencing)."""
        self._lock_jobs(tx, frames=[frame_id])
        row = tx.one(
            f"SELECT {_ATTEMPT_SOURCE} FROM frames f JOIN layers l ON l.id = f.layer_id WHERE f.id = ?"
            f"{self.dialect.lock_rows}",
            (frame_id,),
        )
        if row is None or row["state"] != m.RUNNING or row["attempts"] != attempt:
            return None
        return row

    def complete_frame(self, frame_id: int, attempt: int, result: FrameResult, *, now: float) -> str | None:
        # Safe to repeat after a lost COMMIT: the repeat is fenced and returns None.
        return self._write(lambda tx: self._complete(tx, frame_id, attempt, result, now))

    def _complete(
        self, tx: Tx, frame_id: int, attempt: int, result: FrameResult, now: float, ended_jobs: set[int] | None = None
    ) -> str | None:
        """``complete_frame``'s work, in ``tx``. ``ended_jobs``: collect the frame's job
        there instead of finishing it if done now — the caller does it once per job, after
        all of a transaction's frames (``_finish_jobs_if_done``)."""
        row = self._running_frame(tx, frame_id, attempt)
        if row is None:
            return None  # a stale report from an older attempt changes nothing
        new_state, outcome = lifecycle.next_state(result, row["action"], attempt, row["retries"])
        if new_state == m.DEAD and row["action"] is None and outcome != "killed":
            # Out of retries by the attempt number: unless some attempts did not count (a
            # sick device's), read only on this rare path.
            uncounted = self._uncounted_attempts(tx, frame_id)
            if uncounted:
                new_state, outcome = lifecycle.next_state(result, None, attempt, row["retries"], uncounted)
        usage = dict(result.usage)
        failure = lifecycle.failure_text(result) if outcome in ("failed", "timeout") else None
        gpu_oom_bytes = row["gpu_oom_bytes"]
        if row["retry_on_gpu_oom"] == "bigger" and outcome == "failed" and result.failure_kind == "gpu-oom":
            # Out of GPU memory on a layer that asked for bigger devices: the frame keeps the
            # size it failed on (the largest so far), and its next attempt gets only devices
            # with more; with none in the farm it is DEAD now rather than failing again.
            inventory = tx.all("SELECT gpus FROM hosts WHERE name = ?", (row["host"],))
            failed = lifecycle.failed_device_bytes(
                _json_tuple(row["gpu_uuids"] or "[]"), json.loads(inventory[0]["gpus"]) if inventory else []
            )
            if failed is not None:
                gpu_oom_bytes = max(failed, gpu_oom_bytes or 0)
                hosts = tx.all("SELECT name, gpus, tags, last_heartbeat, live FROM hosts ORDER BY name")
                if new_state == m.WAITING and lifecycle.bigger_gpu_host(row, hosts, gpu_oom_bytes, now) is None:
                    new_state, failure = m.DEAD, f"{lifecycle.no_bigger_gpu(gpu_oom_bytes)}; {failure}"
        # A failed frame's next attempt waits (back-off); a user's retry does not.
        delay = m.retry_delay(row["retry_delay_s"], attempt) if new_state == m.WAITING and failure else 0.0
        retry_at = now + delay if delay > 0 else None
        tx.run(
            f"UPDATE frames SET state = ?, action = NULL, lease_expires = NULL, {_CLEAR_LIVE}, exit_code = ?, "
            "retry_at = ?, failure = CASE WHEN ? THEN ? ELSE failure END, exit_signal = ?, "
            "started_at = COALESCE(?, started_at), ended_at = ?, max_rss_bytes = ?, cpu_seconds = ?, "
            "gpu_util_mean_pct = ?, gpu_util_max_pct = ?, gpu_memory_peak_bytes = ?, gpu_seconds = ?, "
            "gpu_busy_seconds = ?, gpu_oom_bytes = ?, waiting_since = CASE WHEN ? THEN ? ELSE waiting_since END "
            "WHERE id = ?",
            (
                new_state,
                result.exit_code,
                retry_at,
                outcome in ("succeeded", "failed", "timeout"),
                failure,
                result.exit_signal,
                result.started_at,
                result.ended_at or now,
                result.max_rss_bytes,
                result.cpu_seconds,
                usage.get("gpu_util_mean_pct"),
                usage.get("gpu_util_max_pct"),
                usage.get("gpu_memory_peak_bytes"),
                usage.get("gpu_seconds"),
                usage.get("gpu_busy_seconds"),
                gpu_oom_bytes,
                new_state == m.WAITING,
                now,
                frame_id,
            ),
        )
        self._record_attempt(tx, frame_id, attempt, row, outcome, result, now)
        if new_state == m.WAITING and result.failure_kind == "gpu-escape" and row["host"]:
            # Not retried on the host where it escaped its devices, while another is up to take it.
            other = tx.one(
                "SELECT 1 AS x FROM hosts WHERE name <> ? AND last_heartbeat >= ? LIMIT 1",
                (row["host"], now - m.HOST_DOWN_AFTER_S),
            )
            if other is not None:
                tx.run("UPDATE frames SET avoid_host = ? WHERE id = ?", (row["host"], frame_id))
        woke = int(new_state == m.WAITING)
        if new_state in m.RELEASING_STATES or (new_state == m.EATEN and self._satisfy_on_eaten(tx)):
            woke += self._release_dependents(tx, frame_id, row["layer_id"], now)
        elif new_state == m.DEAD:
            notes.record_dead(tx, row["job_id"], frame_id, now)
        if ended_jobs is None:
            self._finish_job_if_done(tx, row["job_id"], now)
        else:
            ended_jobs.add(row["job_id"])
        if woke:
            self._notify(tx)
        return new_state

    def _complete_many(
        self, tx: Tx, reports: Sequence[tuple[int, int, FrameResult]], now: float, defer_job: int | None = None
    ) -> tuple[list[str | None], bool]:
        """``_complete`` for each report in order, and each of their jobs finished if done,
        once (a worker's reports often are frames of one job). ``defer_job``: that job is
        left to the caller, who is about to claim a frame of it (see ``complete_and_claim_many``);
        whether one of the reports was of it."""
        jobs: set[int] = set()
        states = [self._complete(tx, frame_id, attempt, result, now, jobs) for frame_id, attempt, result in reports]
        deferred = defer_job in jobs
        for job_id in sorted(jobs):
            if job_id != defer_job:
                self._finish_job_if_done(tx, job_id, now)
        return states, deferred

    @staticmethod
    def _record_attempt(
        tx: Tx, frame_id: int, attempt: int, row: Row, outcome: str, result: FrameResult | None, now: float
    ) -> None:
        usage = dict(result.usage) if result and result.usage else {}
        samples = usage.pop("samples", None) or {}
        tx.run(
            _RECORD_ATTEMPT,
            (
                frame_id,
                attempt,
                row["job_id"],
                row["host"],
                row["gpu_uuids"] or "[]",
                outcome,
                row["waiting_since"],
                (result.started_at if result and result.started_at else row["started_at"]),
                (result.ended_at if result and result.ended_at else now),
                result.exit_code if result else None,
                result.exit_signal if result else None,
                int(bool(result and result.timed_out)),
                result.max_rss_bytes if result else None,
                result.cpu_seconds if result else None,
                row["cores"],
                json.dumps(usage) if usage else None,
                usage.get("gpu_util_mean_pct"),
                usage.get("gpu_util_max_pct"),
                usage.get("gpu_memory_peak_bytes"),
                usage.get("gpu_seconds"),
                usage.get("gpu_busy_seconds"),
                json.dumps(usage["gpu_models"]) if usage.get("gpu_models") else None,
                *_attempt_failure(outcome, result),
                usage.get("gpu_idle_seconds"),
            ),
        )
        if samples:
            tx.many(
                _UPSERT_SAMPLES, [(frame_id, attempt, uuid, json.dumps(points)) for uuid, points in samples.items()]
            )

    @staticmethod
    def _uncounted_attempts(tx: Tx, frame_id: int) -> int:
        """How many of the frame's attempts do not count against its retries."""
        row = tx.one(
            f"SELECT COUNT(*) AS n FROM attempts WHERE frame_id = ? AND outcome IN "
            f"({marks(len(lifecycle.UNCOUNTED_OUTCOMES))})",
            (frame_id, *lifecycle.UNCOUNTED_OUTCOMES),
        )
        return int(row["n"]) if row is not None else 0

    def requeue_frame(self, frame_id: int, attempt: int, *, now: float, reason: str) -> str | None:
        def requeue(tx: Tx) -> str | None:
            row = self._running_frame(tx, frame_id, attempt)
            if row is None:
                return None
            tx.run(
                f"UPDATE frames SET state = 'WAITING', action = NULL, lease_expires = NULL, {_CLEAR_LIVE}, "
                "waiting_since = ?, ended_at = ? WHERE id = ?",
                (now, now, frame_id),
            )
            self._record_attempt(tx, frame_id, attempt, row, reason, None, now)
            self._notify(tx)
            return m.WAITING

        return self._write(requeue)

    def layer_frame_counts(self, job_id: int) -> dict[int, dict[str, int]]:
        counts: dict[int, dict[str, int]] = {}
        for row in self._read(
            "SELECT layer_id, state, COUNT(*) AS n FROM frames WHERE job_id = ? GROUP BY layer_id, state",
            (int(job_id),),
        ):
            counts.setdefault(int(row["layer_id"]), {})[row["state"]] = int(row["n"])
        return counts

    def running_bookings(self, host: str | None = None) -> list[dict[str, Any]]:
        clause, params = ("AND f.host = ?", (host,)) if host is not None else ("", ())
        rows = self._read(
            'SELECT f.id, f.job_id, j.name AS job_name, j."user" AS job_user, j.show AS job_show, '
            "f.layer_id, l.name AS layer_name, f.number, f.host, f.gpu_uuids, f.attempts, f.started_at, "
            "f.lease_expires, f.max_rss_bytes, f.gpu_memory_used_bytes, f.log_path, "
            "l.cores, l.memory_bytes, l.gpus, l.gpu_memory_min_bytes "
            "FROM frames f JOIN jobs j ON j.id = f.job_id JOIN layers l ON l.id = f.layer_id "
            f"WHERE f.state = 'RUNNING' {clause} ORDER BY f.id",
            params,
        )
        return [{**dict(r), "gpu_uuids": json.loads(r["gpu_uuids"]) if r["gpu_uuids"] else []} for r in rows]

    def running_on_host(self, host: str) -> list[dict[str, Any]]:
        return [
            dict(r)
            for r in self._read(
                "SELECT id, attempts, worker, gpu_uuids, lease_expires FROM frames WHERE host = ? AND state = 'RUNNING'",
                (host,),
            )
        ]

    def reap(self, *, now: float) -> list[int]:
        # Read first: an idle farm must not take a write transaction on every poll.
        if not self._read("SELECT 1 FROM frames WHERE state = 'RUNNING' AND lease_expires < ? LIMIT 1", (now,)):
            return []

        def reap_expired(tx: Tx) -> list[int]:
            expired = [
                r["id"] for r in tx.all("SELECT id FROM frames WHERE state = 'RUNNING' AND lease_expires < ?", (now,))
            ]
            # Re-read under the locks: a heartbeat or a completion may have come in meanwhile,
            # and another host may be reaping the same frames.
            return self._lose_frames(tx, expired, "f.lease_expires < ?", (now,), now)

        return self._write(reap_expired)

    def _lose_frames(self, tx: Tx, ids: Sequence[int], still: str, params: Sequence[Any], now: float) -> list[int]:
        """Mark RUNNING frames ``ids`` lost (those still RUNNING and matching ``still`` once
        locked): requeued, or DEAD/EATEN by their retries and pending action, each with a
        ``lost`` attempt. Returns the ids lost; wakes idle workers if any became WAITING."""
        self._lock_jobs(tx, frames=ids)
        lost, woke = [], 0
        for batch in batches(ids):
            rows = tx.all(
                f"SELECT f.id, {_ATTEMPT_SOURCE} FROM frames f JOIN layers l ON l.id = f.layer_id "
                f"WHERE f.id IN ({marks(len(batch))}) AND f.state = 'RUNNING' AND {still} "
                f"ORDER BY f.id{self.dialect.lock_rows}",
                (*batch, *params),
            )
            for row in rows:
                new = lifecycle.reaped_state(row["action"], row["attempts"], row["retries"])
                if new == m.DEAD and row["action"] is None:
                    uncounted = self._uncounted_attempts(tx, row["id"])
                    new = lifecycle.reaped_state(None, row["attempts"], row["retries"], uncounted)
                tx.run(
                    f"UPDATE frames SET state = ?, action = NULL, lease_expires = NULL, {_CLEAR_LIVE}, "
                    "ended_at = ?, waiting_since = ?, failure = ? WHERE id = ?",
                    (new, now, now, lifecycle.LOST_FAILURE, row["id"]),
                )
                self._record_attempt(tx, row["id"], row["attempts"], row, "lost", None, now)
                woke += int(new == m.WAITING)
                if new == m.EATEN:
                    if self._satisfy_on_eaten(tx):
                        woke += self._release_dependents(tx, row["id"], row["layer_id"], now)
                elif new == m.DEAD:
                    notes.record_dead(tx, row["job_id"], row["id"], now)
                self._finish_job_if_done(tx, row["job_id"], now)
                lost.append(int(row["id"]))
        if woke:
            self._notify(tx)
        return lost

    def running_count(self) -> int:
        return int(self._read("SELECT COUNT(*) AS n FROM frames WHERE state = 'RUNNING'")[0]["n"])

    def has_unfinished_work(self) -> bool:
        return bool(self._read("SELECT 1 FROM frames WHERE state IN ('WAITING', 'DEPEND', 'RUNNING') LIMIT 1"))

    # -- caps: limits and quotas (store/caps.py) -------------------------------------------------
    def _cap_tables(self, *, fresh: bool = False) -> tuple[dict[str, int], dict[tuple[str, str], capsmod.Quota]]:
        """Named limits and quotas. The claim path re-reads them at most every CAPS_TTL_S
        (an admin's change reaches every worker within that); ``fresh`` reads them now."""
        now = time.monotonic()
        if fresh or now - self._caps_read_at > CAPS_TTL_S:
            self._limits = {
                r["name"]: int(r["max_running"]) for r in self._read("SELECT name, max_running FROM limits")
            }
            self._quotas = {
                (r["kind"], r["name"]): capsmod.Quota(r["kind"], r["name"], r["max_gpus"], r["max_cores"])
                for r in self._read("SELECT kind, name, max_gpus, max_cores FROM quotas")
            }
            self._caps_read_at = now
        return self._limits, self._quotas

    def layer_caps(self, layer_id: int, *, fresh: bool = False) -> list[capsmod.Cap]:
        """Every cap a frame of this layer must fit under (empty: claims take the fast path)."""
        limits, quotas = self._cap_tables(fresh=fresh)
        return capsmod.caps_for(self._layer_row(layer_id), limits, quotas)

    def cap_reached(self, layer_id: int) -> str | None:
        """Which cap holds this layer's next frame back right now, or None (pending reasons)."""
        return capsmod.explain(
            self.layer_caps(layer_id, fresh=True),
            lambda sql, params: self._read(f"SELECT ({sql}) AS v", params)[0]["v"],
        )

    def _check_limits_exist(self, tx: Tx, spec: m.JobSpec) -> None:
        names = sorted({n for layer in spec.layers for n in layer.limits})
        if not names:
            return
        known = {r["name"] for r in tx.all(f"SELECT name FROM limits WHERE name IN ({marks(len(names))})", names)}
        missing = [n for n in names if n not in known]
        if missing:
            raise InvalidInput(
                f"limits: no limit named {', '.join(repr(n) for n in missing)}",
                hint="see `cuectl admin limit list`; an admin creates one with `cuectl admin limit set NAME N`",
            )

    def set_limit(self, name: str, max_running: int | None) -> dict[str, Any] | None:
        """Create or change a named limit (None: remove it); admins only."""
        name = capsmod.check_limit(name, max_running)
        self._admin_only("limit set" if max_running is not None else "limit delete", "limits")

        def change(tx: Tx) -> None:
            if max_running is None:
                if tx.one(
                    "SELECT 1 AS x FROM layer_limits ll JOIN frames f ON f.layer_id = ll.layer_id "
                    "WHERE ll.name = ? AND f.state IN ('WAITING', 'DEPEND', 'RUNNING') LIMIT 1",
                    (name,),
                ):
                    raise Conflict(
                        f"limit {name!r} is held by unfinished frames",
                        hint="finish or kill those jobs first, or raise the limit instead",
                    )
                if tx.run("DELETE FROM limits WHERE name = ?", (name,)) == 0:
                    raise NotFound(f"no limit {name!r}", hint="see `cuectl admin limit list`")
                return
            tx.run(
                "INSERT INTO limits(name, max_running) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running",
                (name, max_running),
            )
            self._notify(tx)  # a raised limit may let waiting frames run

        self._write(change)
        self._caps_read_at = -1e18
        if max_running is None:
            return None
        return next(r for r in self.list_limits() if r["name"] == name)

    def list_limits(self) -> list[dict[str, Any]]:
        """Every named limit with how many frames hold it now and how many layers use it."""
        rows = self._read(
            "SELECT li.name, li.max_running, "
            "(SELECT COUNT(*) FROM layer_limits ll JOIN frames f ON f.layer_id = ll.layer_id "
            " WHERE ll.name = li.name AND f.state = 'RUNNING') AS running, "
            "(SELECT COUNT(*) FROM layer_limits ll JOIN frames f ON f.layer_id = ll.layer_id "
            " WHERE ll.name = li.name AND f.state = 'WAITING') AS waiting "
            "FROM limits li ORDER BY li.name"
        )
        return [
            {
                "name": r["name"],
                "max_running": int(r["max_running"]),
                "running": int(r["running"]),
                "waiting": int(r["waiting"]),
            }
            for r in rows
        ]

    def set_quota(
        self, kind: str, name: str, *, max_gpus: int | None, max_cores: float | None, delete: bool = False
    ) -> dict[str, Any] | None:
        """Set a user's or project's GPU and core caps (None: that cap off); ``delete``
        removes the quota. Admins only."""
        name = capsmod.check_quota(kind, name, max_gpus, max_cores, delete=delete)
        self._admin_only("quota delete" if delete else "quota set", "quotas")

        def change(tx: Tx) -> None:
            if delete:
                if tx.run("DELETE FROM quotas WHERE kind = ? AND name = ?", (kind, name)) == 0:
                    raise NotFound(f"no quota for {kind} {name!r}", hint="see `cuectl admin quota list`")
            else:
                tx.run(
                    "INSERT INTO quotas(kind, name, max_gpus, max_cores) VALUES (?, ?, ?, ?) "
                    "ON CONFLICT (kind, name) DO UPDATE SET max_gpus = excluded.max_gpus, "
                    "max_cores = excluded.max_cores",
                    (kind, name, max_gpus, max_cores),
                )
            self._notify(tx)

        self._write(change)
        self._caps_read_at = -1e18
        if delete:
            return None
        return next(q for q in self.list_quotas() if q["kind"] == kind and q["name"] == name)

    def list_quotas(self) -> list[dict[str, Any]]:
        """Every quota with what its user or project runs now (GPUs and cores)."""
        out = []
        for r in self._read("SELECT kind, name, max_gpus, max_cores FROM quotas ORDER BY kind, name"):
            column = '"user"' if r["kind"] == "user" else "project"
            used = self._read(
                "SELECT COALESCE(SUM(l.gpus), 0) AS gpus, COALESCE(SUM(l.cores), 0) AS cores "
                "FROM frames f JOIN jobs j ON j.id = f.job_id JOIN layers l ON l.id = f.layer_id "
                f"WHERE j.{column} = ? AND f.state = 'RUNNING'",
                (r["name"],),
            )[0]
            out.append(
                {
                    **capsmod.Quota(r["kind"], r["name"], r["max_gpus"], r["max_cores"]).to_json(),
                    "gpus_in_use": int(used["gpus"]),
                    "cores_in_use": float(used["cores"]),
                }
            )
        return out

    # -- services (``cuectl admin service``; sched/services.py) ---------------------------------
    def set_service(self, name: str, values: Mapping[str, Any]) -> dict[str, Any]:
        name = services.check_name(name)
        checked = services.to_columns(services.check_values(values))
        self._admin_only("service set", "services")

        def change(tx: Tx) -> None:
            tx.run("INSERT INTO services(name) VALUES (?) ON CONFLICT (name) DO NOTHING", (name,))
            if checked:
                tx.run(
                    f"UPDATE services SET {', '.join(f'{column} = ?' for column in checked)} WHERE name = ?",
                    (*checked.values(), name),
                )

        self._write(change)
        return next(r for r in self.list_services() if r["name"] == name)

    def list_services(self) -> list[dict[str, Any]]:
        return [
            services.row_json(r)
            for r in self._read(f"SELECT name, {', '.join(services.FIELDS)} FROM services ORDER BY name")
        ]

    def delete_service(self, name: str) -> None:
        name = services.check_name(name)
        self._admin_only("service delete", "services")

        def change(tx: Tx) -> None:
            if tx.run("DELETE FROM services WHERE name = ?", (name,)) == 0:
                raise NotFound(f"no service {name!r}", hint="see `cuectl admin service list`")

        self._write(change)

    # -- API tokens ----------------------------------------------------------------------------
    def _admin_only(self, what: str, manage: str = "API tokens") -> Actor:
        actor = self.actor()
        if not actor.admin:
            raise NotOwner(
                f"{what}: only an admin may manage {manage}, not {actor.name}",
                hint="ask an admin (root or the store's owner; PostgreSQL: a member of cuectl_admin)",
            )
        return actor

    def create_token(self, user: str, *, role: str, label: str | None, now: float) -> tuple[Token, str]:
        if role not in TOKEN_ROLES:
            raise InvalidInput(f"--role: {role!r} is not one of {', '.join(TOKEN_ROLES)}")
        if not user or not user.strip() or len(user) > 200 or not user.isprintable():
            raise InvalidInput(f"USER: {user!r} is not a user name")
        actor = self._admin_only("token create")
        secret = "cuectl_" + secrets.token_urlsafe(32)
        row = self._write(
            lambda tx: tx.one(
                'INSERT INTO tokens("user", role, hash, label, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?) '
                "RETURNING *",
                (user, role, _token_hash(secret), label, now, actor.name),
            )
        )
        return _token(row), secret

    def list_tokens(self) -> list[Token]:
        self._admin_only("token list")
        return [_token(r) for r in self._read("SELECT * FROM tokens ORDER BY id")]

    def revoke_token(self, token_id: int, *, now: float) -> Token:
        self._admin_only("token revoke")
        row = self._write(
            lambda tx: tx.one(
                "UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ? RETURNING *", (now, token_id)
            )
        )
        if row is None:
            raise NotFound(f"no token {token_id}", hint="see `cuectl admin token list`")
        return _token(row)

    # An API server authenticates every request: a read, and a write of last_used_at at most
    # this often per token (a write per request would contend with the workers' claims).
    LAST_USED_RESOLUTION_S = 60.0

    def authenticate(self, secret: str, *, now: float) -> Token | None:
        digest = _token_hash(secret)
        rows = self._read("SELECT * FROM tokens WHERE hash = ? AND revoked_at IS NULL", (digest,))
        if not rows:
            return None
        row = rows[0]
        if row["last_used_at"] is None or now - float(row["last_used_at"]) >= self.LAST_USED_RESOLUTION_S:
            updated = self._write(
                lambda tx: tx.one(
                    "UPDATE tokens SET last_used_at = ? WHERE hash = ? AND revoked_at IS NULL RETURNING *",
                    (now, digest),
                )
            )
            if updated is None:  # revoked in between
                return None
            row = updated
        return _token(row)

    # -- accounting and maintenance ------------------------------------------------------------
    def usage_summary(
        self, *, since: float, until: float, by: str | None, with_total: bool = True
    ) -> tuple[list[UsageGroup], UsageGroup | None]:
        """Accounting sums per group over the attempts that ended in [since, until) (see
        ``usage_sql``), read from one snapshot so a worker finishing a frame meanwhile
        cannot make the groups and their waits disagree."""
        usage_sql.check_grouping(by)
        window = {"since": since, "until": until}
        param = self.dialect.param

        def summarise(fetch: Fetch, aside: Fetch | None) -> tuple[list[UsageGroup], UsageGroup | None]:
            in_window = int(
                fetch(
                    f"SELECT COUNT(*) FROM attempts WHERE ended_at >= {param('since')} AND ended_at < {param('until')}",
                    window,
                )[0][0]
            )
            if not in_window:
                return [], (UsageGroup(()) if with_total else None)
            return usage_sql.summarise(
                fetch,
                self.dialect,
                since=since,
                until=until,
                by=by,
                hint=self._scan_hint(fetch, in_window),
                with_total=with_total,
                fetch_aside=aside,
            )

        return self._snapshot_pair(summarise)

    def farm_figures(self) -> FarmFigures:
        held = "gpu_uuids IS NOT NULL AND gpu_uuids <> '[]'"
        duration = "(ended_at - started_at)"
        buckets = ", ".join(
            f"SUM(CASE WHEN {duration} <= {bound!r} THEN 1 ELSE 0 END) AS b{i}"
            for i, bound in enumerate(LEASE_BUCKETS_S)
        )

        def read(fetch: Fetch) -> FarmFigures:
            states = {str(state): int(n) for state, n in fetch("SELECT state, COUNT(*) FROM frames GROUP BY state", {})}
            active = int(fetch("SELECT COUNT(*) FROM jobs WHERE state != 'FINISHED'", {})[0][0])
            depth = [
                (int(job_id), str(job), str(layer), int(n))
                for job_id, job, layer, n in fetch(
                    "SELECT j.id, j.name, l.name, COUNT(*) FROM frames f JOIN layers l ON l.id = f.layer_id "
                    "JOIN jobs j ON j.id = f.job_id WHERE f.state = 'WAITING' GROUP BY j.id, j.name, l.id, l.name "
                    "ORDER BY j.id, l.id",
                    {},
                )
            ]
            running = int(fetch(f"SELECT COUNT(*) FROM frames WHERE state = 'RUNNING' AND {held}", {})[0][0])
            row = fetch(
                f"SELECT COUNT(*), SUM({duration}), {buckets} FROM attempts "
                f"WHERE {held} AND started_at IS NOT NULL AND ended_at IS NOT NULL",
                {},
            )[0]
            count = int(row[0] or 0)
            return FarmFigures(
                frames_by_state=states,
                active_jobs=active,
                queue_depth=depth,
                lease_acquisitions=count + running,
                lease_count=count,
                lease_seconds_sum=float(row[1] or 0.0),
                lease_bucket_counts=[int(v or 0) for v in row[2:]],
            )

        return self._snapshot(read)

    def prune(self, *, before: float) -> list[int]:
        actor = self.actor()
        mine = "" if actor.admin else 'AND COALESCE(submitted_by, "user") = ? '

        def delete(tx: Tx) -> list[int]:
            ids = [
                int(r["id"])
                for r in tx.all(
                    f"SELECT id FROM jobs WHERE state = 'FINISHED' AND finished_at < ? {mine}ORDER BY id",
                    (before,) if actor.admin else (before, actor.name),
                )
            ]
            self._lock_jobs(tx, jobs=ids)
            for batch in batches(ids):
                jobs = f"({marks(len(batch))})"
                frames = f"(SELECT id FROM frames WHERE job_id IN {jobs})"
                layers = f"(SELECT id FROM layers WHERE job_id IN {jobs})"
                # What still waits on a pruned job (it ended with DEAD frames) is released: the
                # job it waited on is gone for good.
                woke = dep.wake(
                    tx,
                    tx.all(
                        f"DELETE FROM depend_edges WHERE ((on_kind = 'frame' AND on_id IN {frames}) OR (on_kind IN "
                        f"('layer', 'any') AND on_id IN {layers}) OR (on_kind = 'job' AND on_id IN {jobs})) AND "
                        f"depend_id NOT IN (SELECT id FROM depends WHERE job_id IN {jobs}) RETURNING layer_id, frame_id",
                        batch * 4,
                    ),
                    time.time(),
                )
                if woke:
                    self._notify(tx)
                for statement, times in (
                    (
                        f"DELETE FROM depend_edges WHERE depend_id IN (SELECT id FROM depends WHERE job_id IN {jobs}) "
                        f"OR frame_id IN {frames} OR layer_id IN {layers}",
                        3,
                    ),
                    (f"DELETE FROM depends WHERE job_id IN {jobs}", 1),
                    (f"DELETE FROM frame_deps WHERE frame_id IN {frames} OR on_frame_id IN {frames}", 2),
                    (f"DELETE FROM layer_deps WHERE layer_id IN (SELECT id FROM layers WHERE job_id IN {jobs})", 1),
                    (f"DELETE FROM attempts WHERE job_id IN {jobs}", 1),
                    (f"DELETE FROM samples WHERE frame_id IN {frames}", 1),
                    (f"DELETE FROM frames WHERE job_id IN {jobs}", 1),
                    (f"DELETE FROM layers WHERE job_id IN {jobs}", 1),
                    (f"DELETE FROM jobs WHERE id IN {jobs}", 1),
                ):
                    tx.run(statement, batch * times)
            return ids

        ids = self._write(delete)
        self._layer_cache.clear()
        return ids

    def prunable_jobs(self, *, before: float) -> list[dict[str, Any]]:
        actor = self.actor()
        mine = "" if actor.admin else 'AND COALESCE(submitted_by, "user") = ? '
        rows = self._read(
            'SELECT id, name, "user" AS "user", finished_at FROM jobs '
            f"WHERE state = 'FINISHED' AND finished_at < ? {mine}ORDER BY id",
            (before,) if actor.admin else (before, actor.name),
        )
        return [
            {"id": int(r["id"]), "name": r["name"], "user": r["user"], "finished_at": r["finished_at"]} for r in rows
        ]

    # -- forgetting a dead host (``cuectl host forget``) ---------------------------------------
    def forget_host(self, name: str, *, now: float, down_after: float, force: bool = False) -> dict[str, Any]:
        actor = self.actor()
        if not actor.admin:
            raise NotOwner(
                f"host forget: only an admin may forget a host, not {actor.name}",
                hint="ask an admin (root or the store's owner; PostgreSQL: a member of cuectl_admin)",
            )

        def forget(tx: Tx) -> dict[str, Any]:
            # The host row first (aliased f for the dialect's lock clause), then its frames'
            # jobs, then the frames: a heartbeat locks the host, then its frames, in that order.
            host = tx.one(f"SELECT * FROM hosts f WHERE f.name = ?{self.dialect.lock_rows}", (name,))
            if host is None:
                raise NotFound(f"no host {name!r}", hint="see `cuectl host list`")
            data = host_json(host, now=now, down_after=down_after)
            running = [
                int(r["id"])
                for r in tx.all("SELECT id FROM frames WHERE host = ? AND state = 'RUNNING' ORDER BY id", (name,))
            ]
            if not force and (data["state"] == "UP" or running):
                why = (
                    f"it is UP (last heartbeat {data['last_heartbeat']})"
                    if data["state"] == "UP"
                    else f"{len(running)} frame(s) are RUNNING on it"
                )
                raise Conflict(
                    f"host {name!r} not forgotten: {why}",
                    hint="stop its worker first, or use --force to forget it anyway "
                    "(its RUNNING frames are requeued as lost)",
                )
            # As ``reap`` does for an expired lease: each frame is lost.
            lost = self._lose_frames(tx, running, "f.host = ?", (name,), now)
            tx.run("DELETE FROM hosts WHERE name = ?", (name,))
            return {
                "name": name,
                "state": data["state"],
                "last_heartbeat": data["last_heartbeat"],
                "gpus": [g.get("uuid") for g in data["gpus"]],
                "requeued": lost,
            }

        # Not repeated after a lost COMMIT: the repeat would find no host and say so.
        return self._write(forget, idempotent=False)

    # -- notifications (store/notifications.py, run/notify.py) ---------------------------------
    def notify_defaults(self) -> list[dict[str, Any]]:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (notes.DEFAULTS_KEY,))
        entries = nt.from_json(rows[0]["value"]) if rows else ()
        if not self.actor().admin:  # webhook URLs often hold a secret: whole for admins only
            return [nt.masked(n) for n in entries]
        return notes.entries_json(entries)

    def set_notify_defaults(self, entries: Sequence[m.Notify]) -> list[dict[str, Any]]:
        checked = nt.entries(list(entries), "notify")
        self._admin_only("notify set" if checked else "notify clear", "the farm's notification defaults")

        def change(tx: Tx) -> None:
            if checked:
                tx.run(
                    "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (notes.DEFAULTS_KEY, nt.to_json(checked)),
                )
            else:
                tx.run("DELETE FROM meta WHERE key = ?", (notes.DEFAULTS_KEY,))

        self._write(change)
        return self.notify_defaults()

    def list_notifications(
        self, *, job: str | int | None = None, pending: bool = False, limit: int = 1000
    ) -> list[dict[str, Any]]:
        where, params = ["1 = 1"], []
        if job is not None:
            where.append("job_id = ?")
            params.append(self._job_row(job)["id"])
        if pending:
            where.append("delivered_at IS NULL")
        rows = self._read(
            f"SELECT * FROM notifications WHERE {' AND '.join(where)} ORDER BY id LIMIT ?", [*params, int(limit)]
        )
        return [notes.row_json(r) for r in rows]

    def claim_notifications(
        self, worker: str, *, now: float, limit: int = 10, lease_s: float = 120.0
    ) -> list[dict[str, Any]]:
        due = (now, notes.MAX_ATTEMPTS, now)
        # Read first: an idle farm must not take a write transaction on every poll.
        if not self._read(f"SELECT 1 AS x FROM notifications WHERE {notes.DUE} LIMIT 1", due):
            return []

        def claim(tx: Tx) -> list[Row]:
            ids = [
                r["id"]
                for r in tx.all(
                    f"SELECT id FROM notifications WHERE {notes.DUE} ORDER BY next_at, id LIMIT ?", (*due, int(limit))
                )
            ]
            got = []
            for nid in ids:  # conditional: a row another deliverer took meanwhile is skipped
                if tx.run(
                    f"UPDATE notifications SET claimed_by = ?, claimed_until = ? WHERE id = ? AND {notes.DUE}",
                    (worker, now + lease_s, nid, *due),
                ):
                    got.append(nid)
            if not got:
                return []
            return tx.all(
                'SELECT n.*, j.name AS job_name, j."user" AS "user", j.submitted_by, j.receipt, j.notify '
                f"FROM notifications n JOIN jobs j ON j.id = n.job_id WHERE n.id IN ({marks(len(got))}) "
                "ORDER BY n.id",
                got,
            )

        out = []
        for r in self._write(claim):
            data = notes.row_json(r, mask=False)
            data.update(
                job=r["job_name"],
                user=r["user"],
                submitted_by=r["submitted_by"],
                receipt=r["receipt"],
                job_notify=notes.entries_json(nt.from_json(r["notify"])),
            )
            out.append(data)
        return out

    def notification_delivered(self, notification_id: int, claimed_by: str, *, now: float) -> bool:
        return bool(
            self._write(
                lambda tx: tx.run(
                    "UPDATE notifications SET delivered_at = ?, claimed_until = NULL, error = NULL "
                    "WHERE id = ? AND claimed_by = ? AND delivered_at IS NULL",
                    (now, notification_id, claimed_by),
                )
            )
        )

    def notification_failed(
        self, notification_id: int, claimed_by: str, error: str, *, now: float, give_up: bool = False
    ) -> bool:
        def fail(tx: Tx) -> bool:
            row = tx.one(
                "SELECT attempts FROM notifications WHERE id = ? AND claimed_by = ? AND delivered_at IS NULL",
                (notification_id, claimed_by),
            )
            if row is None:
                return False
            failures = int(row["attempts"]) + 1
            if give_up or failures >= notes.MAX_ATTEMPTS:
                next_at, text = notes.NEVER, f"gave up after {failures} attempt(s): {error}"
            else:
                next_at, text = now + notes.retry_delay(failures), error
            return bool(
                tx.run(
                    "UPDATE notifications SET attempts = ?, next_at = ?, error = ?, claimed_until = NULL "
                    "WHERE id = ? AND claimed_by = ?",
                    (failures, next_at, text[:2000], notification_id, claimed_by),
                )
            )

        return self._write(fail)

    def release_notifications(self, claimed_by_prefix: str, *, keep: str | None = None) -> int:
        """Claims of a deliverer known dead (a restarted worker's predecessor): due again now."""
        pattern = claimed_by_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return int(
            self._write(
                lambda tx: tx.run(
                    "UPDATE notifications SET claimed_until = NULL WHERE delivered_at IS NULL AND claimed_until IS NOT NULL "
                    "AND claimed_by LIKE ? ESCAPE '\\' AND claimed_by != ?",
                    (pattern, keep or ""),
                )
            )
        )


def _as_id(text: str) -> int | None:
    """``text`` as a job id, or None if it cannot be one. ASCII digits only
    (``str.isdigit()`` is also true of "²", which ``int()`` cannot read), and nothing past a
    64-bit integer, which neither database could even compare."""
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > 19:
        return None
    value = int(text)
    return value if value <= _MAX_ID else None


def _token_hash(secret: str) -> str:
    # Tokens are 256 random bits: a fast hash is enough (nothing to brute-force).
    return hashlib.sha256(secret.encode()).hexdigest()


def _token(row: Row) -> Token:
    return Token(
        id=int(row["id"]),
        user=row["user"],
        role=row["role"],
        label=row["label"],
        created_at=row["created_at"],
        created_by=row["created_by"],
        revoked_at=row["revoked_at"],
        last_used_at=row["last_used_at"],
    )
