"""The SQLite store: one file, WAL mode, one short transaction per state change.

Why these settings (DESIGN §3, §5): WAL lets readers (``job list``, idle workers polling
``runnable_layers``) run while one writer commits; ``synchronous=NORMAL`` is durable
across process crashes (only an OS crash can lose the last commits) and measured ~14k
claims/s here; the busy timeout makes contenders wait instead of failing. Writers use
``BEGIN IMMEDIATE`` so a transaction never upgrades from read to write half-way (which
is where SQLite returns SQLITE_BUSY without waiting).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from cuectl import fsutil
from cuectl.errors import (Conflict, InvalidInput, NotFound, SchemaTooNew, StoreBusy,
                           StoreError)
from cuectl.sched import model as m
from cuectl.sched import usage_sql
from cuectl.sched.frameset import compact_range
from cuectl.sched.store import (ClaimedFrame, FrameResult, HostInfo, RunnableLayer,
                                Store)
from cuectl.sched.usage_sql import UsageGroup
from cuectl.sched.views import frame_json, host_json, job_json, layer_json

SCHEMA_VERSION = 2
APPLICATION_ID = 0x43554543  # "CUEC": marks the file as ours (PRAGMA application_id)

# Forward-only migrations: MIGRATIONS[i] brings a store from version i to i + 1.
MIGRATIONS: list[str] = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        user TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'PENDING',
        paused INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX jobs_name ON jobs(name);
    CREATE TABLE layers (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        idx INTEGER NOT NULL,
        name TEXT NOT NULL,
        command TEXT NOT NULL,
        range TEXT NOT NULL,
        chunk INTEGER NOT NULL,
        gpus INTEGER NOT NULL,
        gpu_vendor TEXT,
        gpu_models TEXT NOT NULL,
        gpu_memory_min_bytes INTEGER NOT NULL,
        cores REAL NOT NULL,
        memory_bytes INTEGER NOT NULL,
        retries INTEGER NOT NULL,
        timeout_s REAL,
        env TEXT NOT NULL,
        tags TEXT NOT NULL,
        depends TEXT NOT NULL,
        depend_count INTEGER NOT NULL DEFAULT 0,
        UNIQUE (job_id, name)
    );
    CREATE TABLE layer_deps (
        layer_id INTEGER NOT NULL,
        on_layer_id INTEGER NOT NULL,
        PRIMARY KEY (on_layer_id, layer_id)
    ) WITHOUT ROWID;
    CREATE TABLE frames (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
        layer_id INTEGER NOT NULL REFERENCES layers(id) ON DELETE CASCADE,
        number INTEGER NOT NULL,
        frames TEXT NOT NULL,
        state TEXT NOT NULL,
        depend_count INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        host TEXT,
        worker TEXT,
        gpu_uuids TEXT,
        lease_expires REAL,
        action TEXT,
        exit_code INTEGER,
        exit_signal INTEGER,
        started_at REAL,
        ended_at REAL,
        waiting_since REAL,
        max_rss_bytes INTEGER,
        cpu_seconds REAL,
        gpu_util_mean_pct REAL,
        gpu_util_max_pct REAL,
        gpu_memory_peak_bytes INTEGER,
        gpu_seconds REAL,
        gpu_busy_seconds REAL,
        log_path TEXT
    );
    CREATE INDEX frames_layer_state ON frames(layer_id, state, id);
    CREATE INDEX frames_job_state ON frames(job_id, state, id);
    CREATE INDEX frames_running ON frames(state, lease_expires) WHERE state = 'RUNNING';
    CREATE TABLE frame_deps (
        on_frame_id INTEGER NOT NULL,
        frame_id INTEGER NOT NULL,
        PRIMARY KEY (on_frame_id, frame_id)
    ) WITHOUT ROWID;
    CREATE TABLE hosts (
        name TEXT PRIMARY KEY,
        cores REAL NOT NULL,
        memory_bytes INTEGER NOT NULL,
        gpus TEXT NOT NULL,
        tags TEXT NOT NULL DEFAULT '[]',
        locked INTEGER NOT NULL DEFAULT 0,
        registered_at REAL NOT NULL,
        last_heartbeat REAL NOT NULL,
        worker_pid INTEGER,
        version TEXT,
        live TEXT
    );
    CREATE TABLE attempts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        frame_id INTEGER NOT NULL REFERENCES frames(id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        job_id INTEGER NOT NULL,
        host TEXT,
        gpu_uuids TEXT NOT NULL DEFAULT '[]',
        outcome TEXT NOT NULL,
        waiting_since REAL,
        started_at REAL,
        ended_at REAL,
        exit_code INTEGER,
        exit_signal INTEGER,
        timed_out INTEGER NOT NULL DEFAULT 0,
        max_rss_bytes INTEGER,
        cpu_seconds REAL,
        cores REAL,
        usage TEXT,
        UNIQUE (frame_id, attempt)
    );
    CREATE INDEX attempts_ended ON attempts(ended_at);
    """,
    # v2: per-attempt GPU accounting columns (reports read these, not JSON) and the
    # bounded per-device sample series of each attempt.
    """
    ALTER TABLE attempts ADD COLUMN gpu_util_mean_pct REAL;
    ALTER TABLE attempts ADD COLUMN gpu_util_max_pct REAL;
    ALTER TABLE attempts ADD COLUMN gpu_memory_peak_bytes INTEGER;
    ALTER TABLE attempts ADD COLUMN gpu_seconds REAL;
    ALTER TABLE attempts ADD COLUMN gpu_busy_seconds REAL;
    ALTER TABLE attempts ADD COLUMN gpu_models TEXT;
    CREATE INDEX attempts_job ON attempts(job_id);
    CREATE TABLE samples (
        frame_id INTEGER NOT NULL REFERENCES frames(id) ON DELETE CASCADE,
        attempt INTEGER NOT NULL,
        uuid TEXT NOT NULL,
        points TEXT NOT NULL,
        PRIMARY KEY (frame_id, attempt, uuid)
    ) WITHOUT ROWID;
    """,
]

_LAYER_COLS = ("id, job_id, idx, name, command, range, chunk, gpus, gpu_vendor, gpu_models, "
               "gpu_memory_min_bytes, cores, memory_bytes, retries, timeout_s, env, tags, depends")
_FRAME_SELECT = """
    SELECT f.*, j.name AS job_name, l.name AS layer_name
    FROM frames f JOIN jobs j ON j.id = f.job_id JOIN layers l ON l.id = f.layer_id
"""
_OPEN_STATES = (m.WAITING, m.DEPEND, m.RUNNING)
# A stored chunk was validated at submit time; re-reading it must not depend on this
# process's CUECTL_FRAME_LIMIT (a worker may run with a smaller one than the submitter).
_STORED_CHUNK_LIMIT = 2**31


class SQLiteStore(Store):
    def __init__(self, path: str | Path, *, create: bool = True, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path).expanduser()
        self.url = str(self.path)
        self.busy_timeout_s = busy_timeout_s
        self._layer_cache: dict[int, sqlite3.Row] = {}
        self._check_location(create)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=busy_timeout_s,
                                        isolation_level=None, check_same_thread=False)
            self.conn.row_factory = sqlite3.Row
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._configure_and_migrate()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None

    # -- opening -------------------------------------------------------------------------
    def _check_location(self, create: bool) -> None:
        if self.path.is_dir():
            raise InvalidInput(f"store path {self.path} is a directory")
        net = fsutil.is_network_fs(self.path.parent)
        if net:
            raise StoreError(f"store {self.path} is on a network filesystem ({net}); SQLite locking is not safe there",
                             hint="use PostgreSQL for workers on several hosts: --db postgresql://…")
        if not self.path.exists():
            if not create:
                raise NotFound(f"no store at {self.path}", hint="submit a job first, or pass --db")
            fsutil.ensure_private_dir(self.path.parent)
            fsutil.create_private_file(self.path)

    def _configure_and_migrate(self) -> None:
        conn = self.conn
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables and "meta" not in tables):
            raise StoreError(f"{self.path} is a SQLite database but not a cuectl store",
                             hint="pass --db with a new or existing cuectl store")
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        version = self.schema_version() if "meta" in tables else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"store {self.path} has schema version {version}, this cuectl knows up to {SCHEMA_VERSION}",
                               hint="upgrade cuectl; the store was left untouched")
        if version < SCHEMA_VERSION:
            self._migrate(version)

    def _migrate(self, current: int) -> None:
        with self._write() as conn:
            # Re-read under the write lock: another process may have migrated meanwhile.
            has_meta = conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone()
            current = self.schema_version() if has_meta else 0
            for version in range(current, SCHEMA_VERSION):
                for statement in _split_sql(MIGRATIONS[version]):
                    conn.execute(statement)
            conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                         (str(SCHEMA_VERSION),))
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def schema_version(self) -> int:
        row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.conn.close()

    # -- transactions ----------------------------------------------------------------------
    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken with the write lock up front (BEGIN IMMEDIATE)."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        try:
            yield self.conn
        except sqlite3.DatabaseError as exc:
            self._rollback_quietly()
            raise self._translate(exc) from None
        except BaseException:
            self._rollback_quietly()
            raise
        try:
            self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            self._rollback_quietly()
            raise self._translate(exc) from None

    def _rollback_quietly(self) -> None:
        # After SQLITE_FULL / I/O errors SQLite may already have rolled back on its own.
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None

    def _fetch_tuples(self, sql: str, params: Mapping[str, Any]) -> list[tuple]:
        cur = self.conn.cursor()
        cur.row_factory = None  # plain tuples: the accounting queries return 10^5 rows
        return cur.execute(sql, params).fetchall()

    def _translate(self, exc: sqlite3.DatabaseError) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreBusy(f"store {self.path} is locked by another process (waited {self.busy_timeout_s:g} s)",
                             hint="retry; if it persists, look for a process holding a long transaction")
        if "not a database" in text or "malformed" in text:
            return StoreError(f"{self.path} is not a usable cuectl store: {text}",
                              hint="restore it from `cuectl admin backup`, or pass --db with another store")
        if "full" in text:
            return StoreError(f"store {self.path}: disk full ({text}); nothing was changed",
                              hint="free space, then retry")
        if "disk I/O error" in text:
            return StoreError(f"store {self.path}: write failed ({text}: disk full, a file size limit, or a "
                              "failing disk); the transaction was rolled back",
                              hint="free space or raise the limit, then retry; `cuectl admin doctor` checks the file")
        if "readonly" in text or "unable to open" in text:
            return StoreError(f"store {self.path} cannot be written: {text}", hint="check the file permissions")
        return StoreError(f"store {self.path}: {text}")

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, spec: m.JobSpec, *, now: float) -> int:
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO jobs(name, user, priority, paused, created_at) VALUES (?, ?, ?, ?, ?)",
                (spec.name, spec.user, spec.priority, int(spec.paused), now))
            job_id = int(cur.lastrowid)
            layer_ids: dict[str, int] = {}
            for idx, layer in enumerate(spec.layers):
                layer_ids[layer.name] = self._insert_layer(conn, job_id, idx, layer)
            frame_ids = {name: self._insert_frames(conn, job_id, layer_ids[name], layer, chunks, now)
                         for (name, layer, chunks) in zip(layer_ids, spec.layers, spec.chunks)}
            self._insert_dependencies(conn, spec, layer_ids, frame_ids)
        return job_id

    @staticmethod
    def _insert_layer(conn: sqlite3.Connection, job_id: int, idx: int, layer: m.LayerSpec) -> int:
        command = layer.command if isinstance(layer.command, str) else list(layer.command)
        cur = conn.execute(
            f"INSERT INTO layers({_LAYER_COLS.replace('id, ', '', 1)}, depend_count) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (job_id, idx, layer.name, json.dumps(command), layer.range, layer.chunk, layer.gpus,
             layer.gpu_vendor, json.dumps(list(layer.gpu_models)), layer.gpu_memory_min_bytes,
             layer.cores, layer.memory_bytes, layer.retries, layer.timeout_s,
             json.dumps(dict(layer.env)), json.dumps(list(layer.tags)),
             json.dumps([{"layer": d.on, "type": d.type} for d in layer.depends]),
             sum(1 for d in layer.depends if d.type == "layer")))
        return int(cur.lastrowid)

    @staticmethod
    def _insert_frames(conn: sqlite3.Connection, job_id: int, layer_id: int, layer: m.LayerSpec,
                       chunks: Sequence[Sequence[int]], now: float) -> dict[int, int]:
        """Insert the layer's frames in dispatch order; return frame number -> frame id."""
        state = m.DEPEND if layer.depends else m.WAITING
        first = conn.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM frames").fetchone()[0]
        # Explicit ids (we hold the write lock) let us map numbers to ids without a
        # per-row round trip, which keeps a 100,000-frame submit close to raw executemany.
        rows = [(first + i, job_id, layer_id, chunk[0],
                 compact_range(chunk) if len(chunk) > 1 else str(chunk[0]), state, now)
                for i, chunk in enumerate(chunks)]
        conn.executemany(
            "INSERT INTO frames(id, job_id, layer_id, number, frames, state, waiting_since) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
        by_number: dict[int, int] = {}
        for (frame_id, _, _, _, _, _, _), chunk in zip(rows, chunks):
            for n in chunk:
                by_number.setdefault(n, frame_id)
        return by_number

    @staticmethod
    def _insert_dependencies(conn: sqlite3.Connection, spec: m.JobSpec, layer_ids: Mapping[str, int],
                             frame_ids: Mapping[str, Mapping[int, int]]) -> None:
        for layer in spec.layers:
            for dep in layer.depends:
                if dep.type == "layer":
                    conn.execute("INSERT OR IGNORE INTO layer_deps(layer_id, on_layer_id) VALUES (?, ?)",
                                 (layer_ids[layer.name], layer_ids[dep.on]))
                    continue
                # Frame-by-frame: each of our frames waits for the frames of `dep.on` that
                # hold the same frame numbers (several, when the chunkings differ).
                pairs = {(mine, frame_ids[dep.on][n])
                         for n, mine in frame_ids[layer.name].items() if n in frame_ids[dep.on]}
                conn.executemany("INSERT OR IGNORE INTO frame_deps(frame_id, on_frame_id) VALUES (?, ?)",
                                 sorted(pairs))
        conn.execute(
            "UPDATE frames SET depend_count = (SELECT COUNT(*) FROM frame_deps d WHERE d.frame_id = frames.id) "
            "WHERE id IN (SELECT frame_id FROM frame_deps) ")
        # Frames whose layer waits on nothing at layer level and that have no frame deps
        # (e.g. a frame number with no counterpart) are runnable at once.
        conn.execute(
            "UPDATE frames SET state = 'WAITING' WHERE state = 'DEPEND' AND depend_count = 0 "
            "AND job_id = ? AND layer_id IN (SELECT id FROM layers WHERE job_id = ? AND depend_count = 0)",
            (conn.execute("SELECT MAX(id) FROM jobs").fetchone()[0],) * 2)

    def _job_row(self, ref: str | int) -> sqlite3.Row:
        text = str(ref).strip()
        if text.isdigit():
            row = self._read("SELECT * FROM jobs WHERE id = ?", (int(text),))
            if row:
                return row[0]
        rows = self._read("SELECT * FROM jobs WHERE name = ? ORDER BY id", (text,))
        if not rows:
            raise NotFound(f"no job {text!r}", hint="see `cuectl job list`")
        if len(rows) > 1:
            ids = ", ".join(str(r["id"]) for r in rows[:10])
            raise Conflict(f"job name {text!r} is not unique (ids {ids})", hint="use the job id")
        return rows[0]

    def _frame_counts(self, job_ids: Sequence[int]) -> dict[int, dict[str, int]]:
        counts: dict[int, dict[str, int]] = {j: {} for j in job_ids}
        if not job_ids:
            return counts
        marks = ",".join("?" * len(job_ids))
        for row in self._read(f"SELECT job_id, state, COUNT(*) FROM frames WHERE job_id IN ({marks}) "
                              "GROUP BY job_id, state", list(job_ids)):
            counts[row[0]][row[1]] = row[2]
        return counts

    def _layers(self, job_id: int) -> list[sqlite3.Row]:
        return self._read(f"SELECT {_LAYER_COLS}, depend_count FROM layers WHERE job_id = ? ORDER BY idx", (job_id,))

    def list_jobs(self, *, include_finished: bool = True) -> list[dict[str, Any]]:
        where = "" if include_finished else "WHERE state != 'FINISHED'"
        rows = self._read(f"SELECT * FROM jobs {where} ORDER BY id")
        counts = self._frame_counts([r["id"] for r in rows])
        return [job_json(r, counts[r["id"]]) for r in rows]

    def get_job(self, ref: str | int) -> dict[str, Any]:
        row = self._job_row(ref)
        data = job_json(row, self._frame_counts([row["id"]])[row["id"]])
        data["layers"] = [layer_json(l) for l in self._layers(row["id"])]
        data["dead_dependencies"] = self._dead_dependencies(row["id"])
        return data

    def _dead_dependencies(self, job_id: int) -> int:
        """DEPEND frames of this job that wait on a DEAD frame (they need a retry)."""
        row = self._read(
            "SELECT COUNT(DISTINCT d.frame_id) FROM frame_deps d JOIN frames f ON f.id = d.on_frame_id "
            "WHERE f.state = 'DEAD' AND d.frame_id IN (SELECT id FROM frames WHERE job_id = ? AND state = 'DEPEND')",
            (job_id,))
        return int(row[0][0])

    def set_job_paused(self, ref: str | int, paused: bool) -> dict[str, Any]:
        job_id = self._job_row(ref)["id"]
        with self._write() as conn:
            conn.execute("UPDATE jobs SET paused = ? WHERE id = ?", (int(paused), job_id))
        return self.get_job(job_id)

    def set_job_priority(self, ref: str | int, priority: int) -> dict[str, Any]:
        job_id = self._job_row(ref)["id"]
        with self._write() as conn:
            conn.execute("UPDATE jobs SET priority = ? WHERE id = ?", (priority, job_id))
        return self.get_job(job_id)

    def kill_job(self, ref: str | int, *, now: float) -> dict[str, Any]:
        """Eat every unfinished frame; running ones are killed by their worker first."""
        job_id = self._job_row(ref)["id"]
        with self._write() as conn:
            conn.execute("UPDATE frames SET action = 'eat' WHERE job_id = ? AND state = 'RUNNING'", (job_id,))
            conn.execute("UPDATE frames SET state = 'EATEN', ended_at = ? WHERE job_id = ? "
                         "AND state IN ('WAITING', 'DEPEND', 'DEAD')", (now, job_id))
            self._finish_job_if_done(conn, job_id, now)
        return self.get_job(job_id)

    def retry_job(self, ref: str | int, *, now: float) -> dict[str, Any]:
        """Requeue the job's DEAD and EATEN frames (OpenCue: retry dead frames)."""
        job_id = self._job_row(ref)["id"]
        ids = [r[0] for r in self._read("SELECT id FROM frames WHERE job_id = ? AND state IN ('DEAD', 'EATEN')",
                                        (job_id,))]
        if ids:
            self.frame_action(ids, "retry", now=now)
        return self.get_job(job_id)

    @staticmethod
    def _finish_job_if_done(conn: sqlite3.Connection, job_id: int, now: float) -> None:
        open_frame = conn.execute(
            "SELECT 1 FROM frames WHERE job_id = ? AND state IN ('WAITING', 'DEPEND', 'RUNNING') LIMIT 1",
            (job_id,)).fetchone()
        if open_frame:
            conn.execute("UPDATE jobs SET state = 'PENDING', finished_at = NULL WHERE id = ? AND state != 'PENDING'",
                         (job_id,))
        else:
            conn.execute("UPDATE jobs SET state = 'FINISHED', finished_at = ? WHERE id = ? AND state != 'FINISHED'",
                         (now, job_id))

    # -- frames ----------------------------------------------------------------------------
    def list_frames(self, *, job: str | int | None = None, layer: str | None = None,
                    state: str | None = None, limit: int = 1000) -> tuple[list[dict[str, Any]], int]:
        where, params = [], []
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
        total = self._read(f"SELECT COUNT(*) FROM frames f JOIN layers l ON l.id = f.layer_id {clause}", params)[0][0]
        rows = self._read(f"{_FRAME_SELECT} {clause} ORDER BY f.id LIMIT ?", [*params, limit])
        return [frame_json(r) for r in rows], int(total)

    def get_frame(self, frame_id: int) -> dict[str, Any]:
        rows = self._read(f"{_FRAME_SELECT} WHERE f.id = ?", (frame_id,))
        if not rows:
            raise NotFound(f"no frame {frame_id}", hint="see `cuectl frame list`")
        data = frame_json(rows[0])
        data["log_path"] = rows[0]["log_path"]
        data["samples"] = {r["uuid"]: json.loads(r["points"]) for r in self._read(
            "SELECT uuid, points FROM samples WHERE frame_id = ? AND attempt = "
            "(SELECT MAX(attempt) FROM samples WHERE frame_id = ?)", (frame_id, frame_id))}
        data["attempt_history"] = [dict(r) for r in self._read(
            "SELECT attempt, host, outcome, started_at, ended_at, exit_code, exit_signal, timed_out "
            "FROM attempts WHERE frame_id = ? ORDER BY attempt", (frame_id,))]
        return data

    def frame_action(self, frame_ids: Sequence[int], action: str, *, now: float) -> list[dict[str, Any]]:
        if action not in ("retry", "kill", "eat"):
            raise InvalidInput(f"unknown frame action {action!r}")
        ids = list(dict.fromkeys(int(i) for i in frame_ids))
        missing = [i for i in ids if not self._read("SELECT 1 FROM frames WHERE id = ?", (i,))]
        if missing:
            raise NotFound(f"no frame {missing[0]}", hint="see `cuectl frame list`")
        with self._write() as conn:
            for frame_id in ids:
                self._apply_action(conn, frame_id, action, now)
        return [self.get_frame(i) for i in ids]

    def _apply_action(self, conn: sqlite3.Connection, frame_id: int, action: str, now: float) -> None:
        row = conn.execute("SELECT state, job_id, layer_id, depend_count FROM frames WHERE id = ?",
                           (frame_id,)).fetchone()
        state = row["state"]
        if state == m.RUNNING:
            # The worker owning it sees the flag on its next heartbeat, kills the process
            # group and reports; the final state is decided in complete_frame.
            conn.execute("UPDATE frames SET action = ? WHERE id = ?", (action, frame_id))
            return
        if action == "retry":
            if state in (m.WAITING, m.DEPEND):
                return
            layer_blocked = conn.execute("SELECT depend_count FROM layers WHERE id = ?",
                                         (row["layer_id"],)).fetchone()[0]
            new = m.DEPEND if (row["depend_count"] or layer_blocked) else m.WAITING
            conn.execute("UPDATE frames SET state = ?, waiting_since = ?, ended_at = NULL, action = NULL "
                         "WHERE id = ?", (new, now, frame_id))
        elif action == "kill":
            if state in (m.WAITING, m.DEPEND):
                conn.execute("UPDATE frames SET state = 'DEAD', ended_at = ? WHERE id = ?", (now, frame_id))
        elif action == "eat":
            if state != m.EATEN:
                conn.execute("UPDATE frames SET state = 'EATEN', ended_at = ? WHERE id = ?", (now, frame_id))
                self._release_dependents(conn, frame_id, row["layer_id"], now)
        self._finish_job_if_done(conn, row["job_id"], now)

    def _release_dependents(self, conn: sqlite3.Connection, frame_id: int, layer_id: int, now: float) -> None:
        """Satisfy what waited on this frame (and on its layer, if the layer is now done).

        Dependency rows are deleted as they are satisfied, so a frame that is retried and
        succeeds again never releases anything twice.
        """
        released = [r[0] for r in conn.execute(
            "DELETE FROM frame_deps WHERE on_frame_id = ? RETURNING frame_id", (frame_id,))]
        if released:
            conn.executemany("UPDATE frames SET depend_count = depend_count - 1 WHERE id = ?",
                             [(i,) for i in released])
            marks = ",".join("?" * len(released))
            conn.execute(
                f"UPDATE frames SET state = 'WAITING', waiting_since = ? WHERE id IN ({marks}) "
                "AND state = 'DEPEND' AND depend_count = 0 "
                "AND (SELECT depend_count FROM layers WHERE id = frames.layer_id) = 0", (now, *released))
        layer_open = conn.execute(
            "SELECT 1 FROM frames WHERE layer_id = ? AND state IN ('WAITING', 'DEPEND', 'RUNNING', 'DEAD') LIMIT 1",
            (layer_id,)).fetchone()
        if layer_open:
            return
        dependents = [r[0] for r in conn.execute(
            "DELETE FROM layer_deps WHERE on_layer_id = ? RETURNING layer_id", (layer_id,))]
        for dep_layer in dependents:
            conn.execute("UPDATE layers SET depend_count = depend_count - 1 WHERE id = ?", (dep_layer,))
            conn.execute(
                "UPDATE frames SET state = 'WAITING', waiting_since = ? WHERE layer_id = ? AND state = 'DEPEND' "
                "AND depend_count = 0 AND (SELECT depend_count FROM layers WHERE id = ?) = 0",
                (now, dep_layer, dep_layer))

    # -- hosts -----------------------------------------------------------------------------
    def register_host(self, host: HostInfo, *, now: float) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO hosts(name, cores, memory_bytes, gpus, tags, registered_at, last_heartbeat, worker_pid, version) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET cores = excluded.cores, "
                "memory_bytes = excluded.memory_bytes, gpus = excluded.gpus, tags = excluded.tags, "
                "registered_at = excluded.registered_at, last_heartbeat = excluded.last_heartbeat, "
                "worker_pid = excluded.worker_pid, version = excluded.version",
                (host.name, host.cores, host.memory_bytes, json.dumps(list(host.gpus)), json.dumps(list(host.tags)),
                 now, now, host.worker_pid, host.version))

    def list_hosts(self, *, now: float, down_after: float) -> list[dict[str, Any]]:
        return [host_json(r, now=now, down_after=down_after) for r in self._read("SELECT * FROM hosts ORDER BY name")]

    def get_host(self, name: str, *, now: float, down_after: float) -> dict[str, Any]:
        rows = self._read("SELECT * FROM hosts WHERE name = ?", (name,))
        if not rows:
            raise NotFound(f"no host {name!r}", hint="see `cuectl host list`")
        data = host_json(rows[0], now=now, down_after=down_after)
        data["running_frames"] = [r[0] for r in self._read(
            "SELECT id FROM frames WHERE host = ? AND state = 'RUNNING' ORDER BY id", (name,))]
        return data

    def set_host_locked(self, name: str, locked: bool) -> dict[str, Any]:
        with self._write() as conn:
            cur = conn.execute("UPDATE hosts SET locked = ? WHERE name = ?", (int(locked), name))
            if cur.rowcount == 0:
                raise NotFound(f"no host {name!r}", hint="see `cuectl host list`")
        return self.get_host(name, now=time.time(), down_after=float("inf"))

    def host_inventories(self) -> dict[str, tuple[list[Mapping[str, Any]], bool, list[str]]]:
        return {r["name"]: (json.loads(r["gpus"]), bool(r["locked"]), json.loads(r["tags"]))
                for r in self._read("SELECT name, gpus, locked, tags FROM hosts")}

    # -- worker ----------------------------------------------------------------------------
    def runnable_layers(self, *, limit: int = 200) -> list[RunnableLayer]:
        rows = self._read(
            "SELECT l.id, l.job_id, j.name AS job_name, l.name, j.priority, l.gpus, l.gpu_vendor, l.gpu_models, "
            "l.gpu_memory_min_bytes, l.cores, l.memory_bytes, l.tags, j.user "
            "FROM layers l JOIN jobs j ON j.id = l.job_id "
            "WHERE j.state = 'PENDING' AND j.paused = 0 AND l.depend_count >= 0 "
            "AND EXISTS (SELECT 1 FROM frames f WHERE f.layer_id = l.id AND f.state = 'WAITING') "
            "ORDER BY j.priority DESC, j.created_at, j.id, l.idx LIMIT ?", (limit,))
        return [RunnableLayer(layer_id=r[0], job_id=r[1], job=r[2], layer=r[3], priority=r[4], gpus=r[5],
                              gpu_vendor=r[6], gpu_models=tuple(json.loads(r[7])), gpu_memory_min_bytes=r[8],
                              cores=r[9], memory_bytes=r[10], tags=tuple(json.loads(r[11])), waiting=1,
                              user=r[12])
                for r in rows]

    def _layer_row(self, layer_id: int) -> sqlite3.Row:
        """Layer rows never change after submit: cache them for the claim path."""
        row = self._layer_cache.get(layer_id)
        if row is None:
            row = self._read(f"SELECT {_LAYER_COLS}, (SELECT name FROM jobs WHERE id = layers.job_id) AS job_name, "
                             "(SELECT user FROM jobs WHERE id = layers.job_id) AS user FROM layers WHERE id = ?",
                             (layer_id,))[0]
            if len(self._layer_cache) > 4096:
                self._layer_cache.clear()
            self._layer_cache[layer_id] = row
        return row

    def claim_frame(self, layer_id: int, *, host: str, worker: str, gpu_uuids: Sequence[str],
                    now: float, lease_s: float, log_dir: str | None = None) -> ClaimedFrame | None:
        layer = self._layer_row(layer_id)
        log_base = str(Path(log_dir) if log_dir else self.path.parent / "logs")
        try:
            # One statement = one atomic transaction: the subquery picks the layer's first
            # WAITING frame and the UPDATE re-checks it, so two claimers never get the same
            # frame; a locked host or a paused job claims nothing. The log path
            # <log dir>/<job id>/<NNNN>-<layer>.<attempt>.log is set in the same statement
            # (layer names are validated to [A-Za-z0-9_.-]: they cannot leave the log dir).
            row = self.conn.execute(
                "UPDATE frames SET state = 'RUNNING', attempts = attempts + 1, host = ?, worker = ?, gpu_uuids = ?, "
                "lease_expires = ?, started_at = ?, ended_at = NULL, action = NULL, exit_code = NULL, "
                "exit_signal = NULL, max_rss_bytes = NULL, cpu_seconds = NULL, gpu_util_mean_pct = NULL, "
                "gpu_util_max_pct = NULL, gpu_memory_peak_bytes = NULL, gpu_seconds = NULL, gpu_busy_seconds = NULL, "
                "log_path = ? || '/' || job_id || '/' || printf('%04d-', number) || ? || '.' || (attempts + 1) || '.log' "
                "WHERE id = (SELECT id FROM frames WHERE layer_id = ? AND state = 'WAITING' ORDER BY id LIMIT 1) "
                "AND state = 'WAITING' "
                "AND (SELECT paused FROM jobs WHERE id = frames.job_id) = 0 "
                "AND NOT EXISTS (SELECT 1 FROM hosts WHERE name = ? AND locked = 1) "
                "RETURNING id, attempts, number, frames, log_path",
                (host, worker, json.dumps(list(gpu_uuids)), now + lease_s, now, log_base, layer["name"],
                 layer_id, host)).fetchone()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        if row is None:
            return None
        from cuectl.sched.frameset import parse_frameset

        command = json.loads(layer["command"])
        return ClaimedFrame(
            frame_id=int(row[0]), job_id=layer["job_id"], job=layer["job_name"], user=layer["user"],
            layer_id=layer_id, layer=layer["name"], number=int(row[2]),
            frames=tuple(parse_frameset(row[3], limit=_STORED_CHUNK_LIMIT)), attempt=int(row[1]),
            command=command if isinstance(command, str) else tuple(command), layer_range=layer["range"],
            chunk=layer["chunk"], cores=layer["cores"], memory_bytes=layer["memory_bytes"], gpus=layer["gpus"],
            gpu_memory_min_bytes=layer["gpu_memory_min_bytes"], gpu_uuids=tuple(gpu_uuids),
            timeout_s=layer["timeout_s"], env=json.loads(layer["env"]), retries=layer["retries"],
            log_path=row[4])

    def heartbeat(self, host: str, frame_ids: Iterable[int], *, now: float, lease_s: float,
                  live: Mapping[str, Any] | None = None, attempts: Mapping[int, int] | None = None
                  ) -> dict[int, str | None]:
        ids = list(frame_ids)
        with self._write() as conn:
            conn.execute("UPDATE hosts SET last_heartbeat = ?, live = COALESCE(?, live) WHERE name = ?",
                         (now, json.dumps(live) if live is not None else None, host))
            if ids:
                marks = ",".join("?" * len(ids))
                conn.execute(f"UPDATE frames SET lease_expires = ? WHERE id IN ({marks}) AND host = ? "
                             "AND state = 'RUNNING'", (now + lease_s, *ids, host))
                rows = conn.execute(f"SELECT id, state, host, action, attempts FROM frames WHERE id IN ({marks})",
                                    ids).fetchall()
            else:
                rows = []
        result: dict[int, str | None] = {i: "lost" for i in ids}
        for r in rows:
            current = attempts is None or attempts.get(r["id"]) == r["attempts"]
            ours = r["state"] == m.RUNNING and r["host"] == host and current
            result[r["id"]] = r["action"] if ours else "lost"
        return result

    def complete_frame(self, frame_id: int, attempt: int, result: FrameResult, *, now: float) -> str | None:
        with self._write() as conn:
            row = conn.execute(
                "SELECT f.state, f.attempts, f.action, f.job_id, f.layer_id, f.host, f.gpu_uuids, f.waiting_since, "
                "f.started_at, l.retries, l.cores FROM frames f JOIN layers l ON l.id = f.layer_id WHERE f.id = ?",
                (frame_id,)).fetchone()
            if row is None or row["state"] != m.RUNNING or row["attempts"] != attempt:
                return None  # fencing: a stale report from an older attempt changes nothing
            new_state, outcome = _next_state(result, row["action"], attempt, row["retries"])
            usage = dict(result.usage)
            conn.execute(
                "UPDATE frames SET state = ?, action = NULL, lease_expires = NULL, exit_code = ?, exit_signal = ?, "
                "started_at = COALESCE(?, started_at), ended_at = ?, max_rss_bytes = ?, cpu_seconds = ?, "
                "gpu_util_mean_pct = ?, gpu_util_max_pct = ?, gpu_memory_peak_bytes = ?, gpu_seconds = ?, "
                "gpu_busy_seconds = ?, waiting_since = CASE WHEN ? = 'WAITING' THEN ? ELSE waiting_since END "
                "WHERE id = ?",
                (new_state, result.exit_code, result.exit_signal, result.started_at, result.ended_at or now,
                 result.max_rss_bytes, result.cpu_seconds, usage.get("gpu_util_mean_pct"),
                 usage.get("gpu_util_max_pct"), usage.get("gpu_memory_peak_bytes"), usage.get("gpu_seconds"),
                 usage.get("gpu_busy_seconds"), new_state, now, frame_id))
            self._record_attempt(conn, frame_id, attempt, row, outcome, result, now)
            if new_state in m.RELEASING_STATES:
                self._release_dependents(conn, frame_id, row["layer_id"], now)
            self._finish_job_if_done(conn, row["job_id"], now)
        return new_state

    @staticmethod
    def _record_attempt(conn: sqlite3.Connection, frame_id: int, attempt: int, row: Mapping[str, Any],
                        outcome: str, result: FrameResult | None, now: float) -> None:
        usage = dict(result.usage) if result and result.usage else {}
        samples = usage.pop("samples", None) or {}
        conn.execute(
            "INSERT OR REPLACE INTO attempts(frame_id, attempt, job_id, host, gpu_uuids, outcome, waiting_since, "
            "started_at, ended_at, exit_code, exit_signal, timed_out, max_rss_bytes, cpu_seconds, cores, usage, "
            "gpu_util_mean_pct, gpu_util_max_pct, gpu_memory_peak_bytes, gpu_seconds, gpu_busy_seconds, gpu_models) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (frame_id, attempt, row["job_id"], row["host"], row["gpu_uuids"] or "[]", outcome, row["waiting_since"],
             (result.started_at if result and result.started_at else row["started_at"]),
             (result.ended_at if result and result.ended_at else now),
             result.exit_code if result else None, result.exit_signal if result else None,
             int(bool(result and result.timed_out)), result.max_rss_bytes if result else None,
             result.cpu_seconds if result else None, row["cores"], json.dumps(usage) if usage else None,
             usage.get("gpu_util_mean_pct"), usage.get("gpu_util_max_pct"), usage.get("gpu_memory_peak_bytes"),
             usage.get("gpu_seconds"), usage.get("gpu_busy_seconds"),
             json.dumps(usage["gpu_models"]) if usage.get("gpu_models") else None))
        if samples:
            conn.executemany("INSERT OR REPLACE INTO samples(frame_id, attempt, uuid, points) VALUES (?, ?, ?, ?)",
                             [(frame_id, attempt, uuid, json.dumps(points)) for uuid, points in samples.items()])

    def requeue_frame(self, frame_id: int, attempt: int, *, now: float, reason: str) -> str | None:
        with self._write() as conn:
            row = conn.execute(
                "SELECT f.state, f.attempts, f.job_id, f.host, f.gpu_uuids, f.waiting_since, f.started_at, l.cores "
                "FROM frames f JOIN layers l ON l.id = f.layer_id WHERE f.id = ?", (frame_id,)).fetchone()
            if row is None or row["state"] != m.RUNNING or row["attempts"] != attempt:
                return None
            conn.execute("UPDATE frames SET state = 'WAITING', action = NULL, lease_expires = NULL, "
                         "waiting_since = ?, ended_at = ? WHERE id = ?", (now, now, frame_id))
            self._record_attempt(conn, frame_id, attempt, row, reason, None, now)
        return m.WAITING

    def running_on_host(self, host: str) -> list[dict[str, Any]]:
        return [dict(r) for r in self._read(
            "SELECT id, attempts, worker, gpu_uuids, lease_expires FROM frames WHERE host = ? AND state = 'RUNNING'",
            (host,))]

    def reap(self, *, now: float) -> list[int]:
        # Read first: an idle farm must not take the write lock on every poll.
        if not self._read("SELECT 1 FROM frames WHERE state = 'RUNNING' AND lease_expires < ? LIMIT 1", (now,)):
            return []
        reaped: list[int] = []
        with self._write() as conn:
            rows = conn.execute(
                "SELECT f.id, f.attempts, f.job_id, f.layer_id, f.host, f.gpu_uuids, f.waiting_since, f.started_at, "
                "f.action, l.retries, l.cores FROM frames f JOIN layers l ON l.id = f.layer_id "
                "WHERE f.state = 'RUNNING' AND f.lease_expires < ?", (now,)).fetchall()
            for row in rows:
                action = row["action"]
                if action == "eat":
                    new = m.EATEN
                elif action == "kill":
                    new = m.DEAD
                elif action == "retry" or row["attempts"] <= row["retries"]:
                    new = m.WAITING
                else:
                    new = m.DEAD
                conn.execute("UPDATE frames SET state = ?, action = NULL, lease_expires = NULL, ended_at = ?, "
                             "waiting_since = ? WHERE id = ?", (new, now, now, row["id"]))
                self._record_attempt(conn, row["id"], row["attempts"], row, "lost", None, now)
                if new == m.EATEN:
                    self._release_dependents(conn, row["id"], row["layer_id"], now)
                self._finish_job_if_done(conn, row["job_id"], now)
                reaped.append(int(row["id"]))
        return reaped

    # -- accounting and maintenance ----------------------------------------------------------
    def usage_summary(self, *, since: float, until: float, by: str | None,
                      with_total: bool = True) -> tuple[list[UsageGroup], UsageGroup | None]:
        """Accounting sums per group over the attempts that ended in [since, until) (see
        ``usage_sql``), read from one snapshot so a worker finishing a frame meanwhile
        cannot make the groups and their waits disagree."""
        usage_sql.check_grouping(by)
        try:
            self.conn.execute("BEGIN")  # deferred: a WAL read snapshot, no write lock
            try:
                in_window = self.conn.execute("SELECT COUNT(*) FROM attempts WHERE ended_at >= ? AND ended_at < ?",
                                              (since, until)).fetchone()[0]
                if not in_window:
                    return [], (UsageGroup(()) if with_total else None)
                # A window holding most of the table is cheaper as a table scan than as an
                # index range, which costs a random lookup per row.
                total = self.conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
                hint = "NOT INDEXED" if in_window * 4 > total else ""
                return usage_sql.summarise(self._fetch_tuples, usage_sql.SQLITE, since=since, until=until, by=by,
                                           hint=hint, with_total=with_total)
            finally:
                self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None

    def prune(self, *, before: float) -> list[int]:
        """Delete FINISHED jobs that finished before ``before`` (with frames, attempts,
        samples); return their ids so the caller can remove their log directories."""
        with self._write() as conn:
            ids = [r[0] for r in conn.execute(
                "SELECT id FROM jobs WHERE state = 'FINISHED' AND finished_at < ?", (before,))]
            for job_id in ids:
                conn.execute("DELETE FROM frame_deps WHERE frame_id IN (SELECT id FROM frames WHERE job_id = ?) "
                             "OR on_frame_id IN (SELECT id FROM frames WHERE job_id = ?)", (job_id, job_id))
                conn.execute("DELETE FROM layer_deps WHERE layer_id IN (SELECT id FROM layers WHERE job_id = ?)",
                             (job_id,))
                conn.execute("DELETE FROM attempts WHERE job_id = ?", (job_id,))
                conn.execute("DELETE FROM samples WHERE frame_id IN (SELECT id FROM frames WHERE job_id = ?)",
                             (job_id,))
                conn.execute("DELETE FROM frames WHERE job_id = ?", (job_id,))
                conn.execute("DELETE FROM layers WHERE job_id = ?", (job_id,))
                conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        self._layer_cache.clear()
        return ids

    def backup(self, dest: str | Path) -> None:
        """An online, consistent copy (SQLite's backup API), safe while workers run."""
        dest = Path(dest)
        tmp = dest.with_name(dest.name + ".partial")
        try:
            tmp.unlink(missing_ok=True)
            fsutil.create_private_file(tmp)
            target = sqlite3.connect(str(tmp))
            try:
                self.conn.backup(target)
            finally:
                target.close()
            os.replace(tmp, dest)
        except sqlite3.DatabaseError as exc:
            tmp.unlink(missing_ok=True)
            raise self._translate(exc) from None
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot write backup {dest}: {exc.strerror or exc}") from None

    def integrity_problems(self) -> list[str]:
        """``PRAGMA integrity_check``: an empty list when the file is sound."""
        rows = [r[0] for r in self._read("PRAGMA integrity_check")]
        return [] if rows == ["ok"] else rows

    def running_count(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM frames WHERE state = 'RUNNING'")[0][0])

    def has_unfinished_work(self) -> bool:
        return bool(self._read("SELECT 1 FROM frames WHERE state IN ('WAITING', 'DEPEND', 'RUNNING') LIMIT 1"))

    def frame_states(self, frame_ids: Sequence[int]) -> dict[int, str]:
        if not frame_ids:
            return {}
        marks = ",".join("?" * len(frame_ids))
        return {r[0]: r[1] for r in self._read(f"SELECT id, state FROM frames WHERE id IN ({marks})", list(frame_ids))}


def _next_state(result: FrameResult, action: str | None, attempt: int, retries: int) -> tuple[str, str]:
    """The frame's state after an attempt ends, and the attempt's outcome label."""
    if action == "eat":
        return m.EATEN, "eaten"
    if action == "kill":
        return m.DEAD, "killed"
    if action == "retry":
        return m.WAITING, "retried"
    if result.exit_code == 0 and not result.timed_out:
        return m.SUCCEEDED, "succeeded"
    outcome = "timeout" if result.timed_out else "failed"
    return (m.WAITING if attempt <= retries else m.DEAD), outcome


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]
