"""The SQLite store: one file, WAL mode, one short transaction per state change.

Why these settings (DESIGN §3, §5): WAL lets readers (``job list``, idle workers polling
``runnable_layers``) run while one writer commits; ``synchronous=NORMAL`` is durable
across process crashes (only an OS crash can lose the last commits) and measured ~14k
claims/s here; the busy timeout makes contenders wait instead of failing. Writers use
``BEGIN IMMEDIATE`` so a transaction never upgrades from read to write half-way (which
is where SQLite returns SQLITE_BUSY without waiting). That one write lock also serialises
every writer, so the shared SQL's job locks are no-ops here.
"""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar

from cuectl import fsutil
from cuectl.errors import InvalidInput, NotFound, StoreBusy, StoreError, StoreGone
from cuectl.sched import identity
from cuectl.sched import model as m
from cuectl.sched.dialect import SQLITE
from cuectl.sched.store import caps as capsmod
from cuectl.sched.store import lifecycle, schema
from cuectl.sched.store.base import Actor, ClaimedFrame, FrameResult, HostShape, RunnableLayer
from cuectl.sched.store.sql import Row, SQLStore, Tx
from cuectl.sched.usage_sql import Fetch

T = TypeVar("T")
APPLICATION_ID = 0x43554543  # "CUEC": marks the file as ours (PRAGMA application_id)

# One statement = one atomic transaction: the subquery picks the layer's first WAITING
# frame whose retry back-off is over and the UPDATE re-checks it, so two claimers never get
# the same frame; a locked host or a paused job claims nothing; the layer's caps (store/
# caps.py), when it has any, are one more condition. The attempt's log path is set in the
# same statement.
_CLAIM_SQL = (
    "UPDATE frames SET state = 'RUNNING', attempts = attempts + 1, host = ?, worker = ?, gpu_uuids = ?, "
    "lease_expires = ?, started_at = ?, ended_at = NULL, action = NULL, exit_code = NULL, "
    "exit_signal = NULL, max_rss_bytes = NULL, cpu_seconds = NULL, gpu_util_mean_pct = NULL, "
    "gpu_util_max_pct = NULL, gpu_memory_peak_bytes = NULL, gpu_seconds = NULL, gpu_busy_seconds = NULL, "
    f"retry_at = NULL, avoid_host = NULL, log_path = {lifecycle.log_path_sql(SQLITE)} "
    "WHERE id = (SELECT id FROM frames WHERE layer_id = ? AND state = 'WAITING' "
    "AND (retry_at IS NULL OR retry_at <= ?) AND (gpu_oom_bytes IS NULL OR gpu_oom_bytes < ?) "
    "AND (avoid_host IS NULL OR avoid_host <> ?) ORDER BY id LIMIT 1) "
    "AND state = 'WAITING' "
    "AND (SELECT paused FROM jobs WHERE id = frames.job_id) = 0 "
    "AND NOT EXISTS (SELECT 1 FROM hosts WHERE name = ? AND locked = 1){caps} "
    "RETURNING id, attempts, number, frames, log_path"
)
_CLAIM_FAST = _CLAIM_SQL.format(caps="")


#: How long a report waits for the write lock that lines its two readers up on one snapshot
#: (SQLiteStore._begin_pinned) before it reads on one connection instead.
PIN_WAIT_S = 0.2


def _tuple_fetch(conn: sqlite3.Connection) -> Fetch:
    def fetch(sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        cur = conn.cursor()
        cur.row_factory = None  # plain tuples: the accounting queries return 10^5 rows
        return cur.execute(sql, params).fetchall()

    return fetch


class SQLiteStore(SQLStore):
    dialect = SQLITE

    def __init__(
        self, path: str | Path, *, create: bool = True, busy_timeout_s: float = 5.0, log_dir: Path | None = None
    ) -> None:
        self.path = Path(path).expanduser()
        super().__init__(log_dir=log_dir or self.path.parent / f"{self.path.name}-logs")  # (config.log_root)
        self.url = str(self.path)
        self.local_path = self.path
        self.receipt_dir = self.path.parent / identity.SPOOL
        self.busy_timeout_s = busy_timeout_s
        # The last dispatch read (see runnable_layers), and what it depends on: this
        # connection's writes other than claims, counted.
        self._queue_writes = 0
        self._runnable_cache: tuple[tuple[Any, ...], list[RunnableLayer]] | None = None
        self._check_location(create)
        self._identity = self._file_identity()  # the file we open; see _check_same_file
        try:
            self.conn = sqlite3.connect(
                str(self.path), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            self.conn.row_factory = sqlite3.Row
            self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._configure_and_migrate()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_dev, info.st_ino

    def _check_same_file(self) -> None:
        """A store deleted or replaced under us (the connection would go on writing to the
        unlinked file, unseen by anyone): stop with one clear error instead."""
        now = self._file_identity()
        if now != self._identity:
            what = "deleted" if now is None else "replaced by another file"
            raise StoreGone(
                f"store {self.path} was {what} while in use; nothing more is written to it",
                hint="restore it (or point --db at the right store) and start again",
            )

    # -- opening -------------------------------------------------------------------------------
    def _check_location(self, create: bool) -> None:
        try:
            self._check_location_unguarded(create)
        except PermissionError:
            raise self._permission_denied() from None

    def _check_location_unguarded(self, create: bool) -> None:
        if self.path.is_dir():
            raise InvalidInput(f"store path {self.path} is a directory")
        net = fsutil.is_network_fs(self.path.parent)
        if net:
            raise StoreError(
                f"store {self.path} is on a network filesystem ({net}); SQLite locking is not safe there",
                hint="use PostgreSQL for workers on several hosts: --db postgresql://…",
            )
        if not self.path.exists():
            if not create:
                raise NotFound(
                    f"no store at {self.path}",
                    hint=f"create it with `cuectl --db {self.path} admin migrate` (or submit a job), or pass --db",
                )
            fsutil.ensure_private_dir(self.path.parent)
            fsutil.create_private_file(self.path)
        elif not os.access(self.path, os.R_OK | os.W_OK):
            # Every command writes (WAL readers too): say so now, not as "readonly database".
            raise self._permission_denied()
        elif self.path.stat().st_size == 0 and not self._being_created():
            # SQLite would take an empty file for a new database and fill it: a store
            # truncated by accident must not come back silently empty.
            raise StoreError(
                f"{self.path} is empty (0 bytes): not a cuectl store; it was left untouched",
                hint="restore it from `cuectl admin backup`, or delete it to start a new store",
            )

    def _being_created(self, wait_s: float = 3.0) -> bool:
        """Whether an empty store file is one another process has just created and is
        initialising (a worker and a submit started together on a new path): wait a little
        for it to fill. An empty file that was not created a moment ago is not waited for."""
        try:
            if time.time() - self.path.stat().st_mtime > 5.0:
                return False
        except OSError:
            return False
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(0.05)
            try:
                if self.path.stat().st_size > 0:
                    return True
            except OSError:
                return False
        return False

    def _permission_denied(self) -> StoreError:
        """``permission denied: PATH (group G can write it)`` for a user outside the store's
        group: who may use it, and how to get access (docs/security.md)."""
        who, group = fsutil.who_can_write(self.path)
        hint = (
            f"ask an admin to add you to group {group} (then log in again), or use a store of your own: "
            "--db ~/my-queue.db"
            if group
            else "use a store of your own: --db ~/my-queue.db"
        )
        return StoreError(f"permission denied: {self.path} ({who})", hint=hint)

    def _configure_and_migrate(self) -> None:
        conn = self.conn
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables and "meta" not in tables):
            raise StoreError(
                f"{self.path} is a SQLite database but not a cuectl store",
                hint="pass --db with a new or existing cuectl store",
            )
        if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        version = self.schema_version() if "meta" in tables else 0
        if version > schema.SCHEMA_VERSION:
            raise self._too_new(version)
        if version < schema.SCHEMA_VERSION:
            self._write(self._migrate)

    def _migrate(self, tx: Tx) -> None:
        # Re-read under the write lock: another process may have migrated meanwhile.
        self._migrate_from(
            tx, self.schema_version() if tx.one("SELECT 1 FROM sqlite_master WHERE name = 'meta'") else 0
        )
        tx.run(f"PRAGMA application_id = {APPLICATION_ID}")

    def schema_version(self) -> int:
        row = self.conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.conn.close()

    # -- hooks of the shared SQL ---------------------------------------------------------------
    def _write(self, fn: Callable[[Tx], T], *, idempotent: bool = True, claiming: bool = False) -> T:
        """One write transaction, taken with the write lock up front (BEGIN IMMEDIATE).
        ``claiming``: it only claims frames and records their ends, which makes no layer
        runnable that was not (what does calls ``_notify``): the dispatch read stays valid."""
        self._check_same_file()
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        try:
            result = fn(Tx(self.conn, SQLITE))
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
        finally:
            if not claiming:
                self._queue_writes += 1
        return result

    def _notify(self, tx: Tx) -> None:
        self._queue_writes += 1  # work became runnable: the next dispatch read looks again

    def _rollback_quietly(self) -> None:
        # After SQLITE_FULL / I/O errors SQLite may already have rolled back on its own.
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self._check_same_file()
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None

    def _reserve_frame_ids(self, tx: Tx, count: int) -> list[int]:
        # We hold the write lock: the ids after the largest ever used (AUTOINCREMENT's
        # sqlite_sequence, so pruned frames' ids are not reused) are ours.
        row = tx.one(
            "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'frames'), 0), "
            "COALESCE((SELECT MAX(id) FROM frames), 0)) + 1 AS first"
        )
        first = int(row["first"])
        return list(range(first, first + count))

    def actor(self) -> Actor:
        # The OS account behind this process (never CUECTL_USER: a label); an admin is root
        # or whoever owns the store file. An API server acting for a token's user says who.
        if self.acting is not None:
            return self.acting
        uid = os.getuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        try:
            owner = os.stat(self.path).st_uid
        except OSError:
            owner = -1
        return Actor(name, uid == 0 or uid == owner)

    def _record_submitter(self, tx: Tx, job_id: int, spec: m.JobSpec) -> None:
        # Any writer of the file could set the user label: the receipt's owner, set by the
        # kernel, is the proof (sched/identity.py). We hold the write lock; should the
        # transaction fail, the receipt names a job id that is never committed.
        digests = {
            layer.name: identity.layer_digest(
                job_id=job_id,
                user=spec.user,
                layer=layer.name,
                command=layer.command,
                env=dict(layer.env),
                frame_range=layer.range,
                chunk=layer.chunk,
                cwd=layer.cwd,
                job_name=spec.name,
                show=spec.show,
                shot=spec.shot,
            )
            for layer in spec.layers
        }
        try:
            spool = identity.ensure_spool(self.path.parent)
            name = identity.write_receipt(
                spool,
                job_id=job_id,
                user=spec.user,
                digests=digests,
                owner=spec.user if self.acting is not None else None,
                notify_commands=[n.target for n in spec.notify if n.kind == "command"],
            )
        except OSError as exc:
            raise StoreError(
                f"cannot write the submit receipt in {self.path.parent / identity.SPOOL}: {exc.strerror or exc}",
                hint="check that you may write the store's directory",
            ) from None
        tx.run("UPDATE jobs SET receipt = ? WHERE id = ?", (name, job_id))

    def _translate(self, exc: sqlite3.DatabaseError) -> StoreError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StoreBusy(
                f"store {self.path} is locked by another process (waited {self.busy_timeout_s:g} s)",
                hint="retry; if it persists, look for a process holding a long transaction",
            )
        if "not a database" in text or "malformed" in text:
            return StoreError(
                f"{self.path} is not a usable cuectl store: {text}",
                hint="restore it from `cuectl admin backup`, or pass --db with another store",
            )
        if "full" in text:
            return StoreError(
                f"store {self.path}: disk full ({text}); nothing was changed", hint="free space, then retry"
            )
        if "disk I/O error" in text:
            return StoreError(
                f"store {self.path}: write failed ({text}: disk full, a file size limit, or a "
                "failing disk); the transaction was rolled back",
                hint="free space or raise the limit, then retry; `cuectl admin doctor` checks the file",
            )
        if "readonly" in text or "unable to open" in text:
            return StoreError(f"store {self.path} cannot be written: {text}", hint="check the file permissions")
        return StoreError(f"store {self.path}: {text}")

    # -- the claim (hot path) ------------------------------------------------------------------
    def runnable_layers(
        self, *, limit: int = 500, after: tuple[Any, ...] | None = None, host: HostShape | None = None
    ) -> list[RunnableLayer]:
        # A worker makes this read every pass, on a busy one every frame (~0.1 ms of its
        # ~1.3 ms). Its answer changes only when another connection commits, which
        # ``PRAGMA data_version`` tells for the price of a statement, or when this one makes
        # work runnable (``_notify``) or writes anything but claims and frame ends. So it is
        # kept while neither happens. A layer the list names that has nothing left to claim
        # (its last frame taken here) costs one empty claim, which drops the list.
        self._check_same_file()
        try:
            version = self.conn.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        key = (limit, after, host, version, self._queue_writes)
        cached = self._runnable_cache
        if cached is not None and cached[0] == key:
            return list(cached[1])
        layers = super().runnable_layers(limit=limit, after=after, host=host)
        self._runnable_cache = (key, layers)
        return list(layers)

    def claim_frame(
        self,
        layer_id: int,
        *,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str],
        now: float,
        lease_s: float,
        log_dir: Path | str | None = None,
    ) -> ClaimedFrame | None:
        layer, sql, params = self._claim_statement(layer_id, host, worker, gpu_uuids, now, lease_s, log_dir)
        try:
            row = self.conn.execute(sql, params).fetchone()  # one statement: its own transaction
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        if row is None:
            self._queue_writes += 1  # the dispatch read named a layer with nothing to claim here now
        return self._claimed(layer, row, gpu_uuids)

    def complete_and_claim(
        self,
        reports: Sequence[tuple[int, int, FrameResult]],
        layer_id: int,
        *,
        reported_at: float,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str],
        now: float,
        lease_s: float,
        log_dir: Path | str | None = None,
    ) -> tuple[list[str | None], ClaimedFrame | None]:
        states, claims = self.complete_and_claim_many(
            reports,
            layer_id,
            1,
            reported_at=reported_at,
            host=host,
            worker=worker,
            gpu_uuids=gpu_uuids,
            now=now,
            lease_s=lease_s,
            log_dir=log_dir,
        )
        return states, (claims[0] if claims else None)

    def complete_and_claim_many(
        self,
        reports: Sequence[tuple[int, int, FrameResult]],
        layer_id: int,
        count: int,
        *,
        reported_at: float,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str] = (),
        now: float,
        lease_s: float,
        log_dir: Path | str | None = None,
    ) -> tuple[list[str | None], list[ClaimedFrame]]:
        # One transaction: a no-op frame's completion and claim write mostly the same pages
        # (its layer's and job's index entries), which two commits wrote to the WAL twice;
        # and a claim outside one costs a commit of its own (~0.25 ms, as much as the
        # statement's work many times over). Each claim sees the ones before it, so the
        # layer's caps hold.
        layer, sql, params = self._claim_statement(layer_id, host, worker, gpu_uuids, now, lease_s, log_dir)

        def all_of_it(tx: Tx) -> tuple[list[str | None], list[Any]]:
            # A report of the claimed layer's own job is the usual case (a worker going
            # through a job's frames): whether that job is done is asked after the claims,
            # and only if none was made. A frame of it claimed here is RUNNING, so the job
            # has work left, and it was PENDING already (it had a WAITING frame): asking
            # would change nothing. One statement less a frame.
            states, deferred = self._complete_many(tx, reports, reported_at, defer_job=layer["job_id"])
            rows: list[Any] = []
            while len(rows) < count and (row := self.conn.execute(sql, params).fetchone()) is not None:
                rows.append(row)
            if deferred and not rows:
                self._finish_job_if_done(tx, layer["job_id"], reported_at)
            return states, rows

        states, rows = self._write(all_of_it, claiming=True)
        if len(rows) < count:
            self._queue_writes += 1  # as in claim_frame
        return states, [claim for row in rows if (claim := self._claimed(layer, row, gpu_uuids)) is not None]

    def _claim_statement(
        self,
        layer_id: int,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str],
        now: float,
        lease_s: float,
        log_dir: Path | str | None,
    ) -> tuple[Row, str, tuple[Any, ...]]:
        """The layer's row, and the UPDATE ... RETURNING that claims its next frame."""
        layer = self._layer_row(layer_id)
        condition, cap_params = capsmod.claim_condition(self.layer_caps(layer_id))
        sql = _CLAIM_SQL.format(caps=f" AND {condition}") if condition else _CLAIM_FAST
        return (
            layer,
            sql,
            (
                host,
                worker,
                json.dumps(list(gpu_uuids)),
                now + lease_s,
                now,
                str(log_dir or self.log_dir),
                layer["name"],
                layer_id,
                now,
                self._claim_gpu_bytes(layer, host, gpu_uuids),
                host,
                host,
                *cap_params,
            ),
        )

    @staticmethod
    def _claimed(layer: Row, row: Any, gpu_uuids: Sequence[str]) -> ClaimedFrame | None:
        if row is None:
            return None
        return lifecycle.claimed_frame(
            layer, frame_id=row[0], attempt=row[1], number=row[2], frames=row[3], gpu_uuids=gpu_uuids, log_path=row[4]
        )

    # -- accounting and maintenance ------------------------------------------------------------
    def _snapshot(self, fn: Callable[[Fetch], T]) -> T:
        try:
            self.conn.execute("BEGIN")  # deferred: a WAL read snapshot, no write lock
            try:
                return fn(_tuple_fetch(self.conn))
            finally:
                self.conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None

    def _snapshot_pair(self, fn: Callable[[Fetch, Fetch | None], T]) -> T:
        """A second connection on the very snapshot of this one, for a report's queue waits
        (read on a thread of their own beside the sums: usage_sql.summarise). The two
        snapshots are the same because a third connection holds the write lock while both
        begin, so no commit can fall between them. A store whose write lock stays taken
        for longer than a moment is read on this connection alone, as before."""
        self._check_same_file()  # the second connection opens the path: it must still be our file
        try:
            aside = sqlite3.connect(
                str(self.path), timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.DatabaseError:
            return super()._snapshot_pair(fn)
        try:
            if not self._begin_pinned(aside):
                return super()._snapshot_pair(fn)
            try:
                return fn(_tuple_fetch(self.conn), _tuple_fetch(aside))
            finally:
                try:
                    aside.execute("COMMIT")
                finally:
                    self.conn.execute("COMMIT")  # whatever became of the second one
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        finally:
            aside.close()

    def _begin_pinned(self, aside: sqlite3.Connection) -> bool:
        """Begin read transactions on this connection and ``aside`` at one snapshot; False
        (nothing begun) when the write lock could not be had within PIN_WAIT_S."""
        pin = sqlite3.connect(str(self.path), timeout=PIN_WAIT_S, isolation_level=None)
        try:
            try:
                pin.execute("BEGIN IMMEDIATE")  # writes nothing: it only keeps commits out
            except sqlite3.OperationalError:
                return False
            begun: list[sqlite3.Connection] = []
            try:
                for conn in (self.conn, aside):
                    conn.execute("BEGIN")
                    begun.append(conn)
                    conn.execute("SELECT COUNT(*) FROM meta").fetchall()  # the read snapshot starts here
            except BaseException:
                for conn in begun:
                    conn.execute("ROLLBACK")
                raise
            finally:
                pin.execute("ROLLBACK")
            return True
        finally:
            pin.close()

    def _scan_hint(self, fetch: Fetch, in_window: int) -> str:
        # A window holding most of the table is cheaper as a table scan than as an index
        # range, which costs a random lookup per row.
        total = fetch("SELECT COUNT(*) FROM attempts", {})[0][0]
        return "NOT INDEXED" if in_window * 4 > total else ""

    def backup(self, dest: Path, *, force: bool = False) -> None:
        """An online, consistent copy (SQLite's backup API), safe while workers run.

        Refused before anything is written (``InvalidInput``): a ``dest`` that exists and is
        not a regular file (a device such as /dev/null, a directory, a symbolic link), the
        live store or its ``-wal``/``-shm``/``-journal`` under any name, and an existing
        file unless ``force``. The copy goes to a new temporary file beside ``dest``
        (``O_EXCL``: nothing else is touched), then is linked into place — atomically
        refusing a file that appeared meanwhile — or, with ``force``, renamed over it.
        """
        dest = Path(dest)
        self._check_backup_target(dest, force)
        tmp: Path | None = None
        try:
            tmp = fsutil.create_unique_file(dest.parent, f".{dest.name}.", ".partial")
            target = sqlite3.connect(str(tmp))
            try:
                self.conn.backup(target)
            finally:
                target.close()
            if force:
                os.replace(tmp, dest)
            else:
                try:
                    os.link(tmp, dest)
                except FileExistsError:
                    raise InvalidInput(
                        f"backup target {dest} already exists; nothing was written", hint="pass --force to replace it"
                    ) from None
                tmp.unlink()
            tmp = None
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc) from None
        except OSError as exc:
            raise StoreError(f"cannot write backup {dest}: {exc.strerror or exc}") from None
        finally:
            if tmp is not None:
                tmp.unlink(missing_ok=True)

    def _check_backup_target(self, dest: Path, force: bool) -> None:
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise InvalidInput(f"backup target {dest}: {exc.strerror or exc}") from None
        live = [self.path] + [self.path.with_name(self.path.name + s) for s in ("-wal", "-shm", "-journal")]
        real = os.path.realpath(dest)
        for path in live:
            same = real == os.path.realpath(path)
            if not same and st is not None:
                try:
                    other = os.stat(path)
                    same = (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)
                except OSError:
                    pass
            if same:
                raise InvalidInput(
                    f"backup target {dest} is the live store or one of its files ({path}); nothing was written",
                    hint="back up to a new file, e.g. cuectl-backup.db",
                )
        if st is None:
            return
        if not stat.S_ISREG(st.st_mode):
            raise InvalidInput(
                f"backup target {dest} exists and is not a regular file ({_file_kind(st.st_mode)}); "
                "nothing was written",
                hint="give the path of a new file",
            )
        if not force:
            raise InvalidInput(
                f"backup target {dest} already exists; nothing was written", hint="pass --force to replace it"
            )

    def integrity_problems(self) -> list[str]:
        """``PRAGMA integrity_check``: an empty list when the file is sound."""
        rows = [r[0] for r in self._read("PRAGMA integrity_check")]
        return [] if rows == ["ok"] else rows


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"
