"""The PostgreSQL store: the shared SQL of ``store.sql`` on a server, for workers on many hosts.

Selected by ``--db``/``CUECTL_DB=postgresql://…`` (psycopg 3, the ``postgres`` extra).
Connection settings follow libpq: the password comes from ``PGPASSWORD`` or ``~/.pgpass``
(or the URL, discouraged), TLS from ``sslmode``; the ``PG*`` variables apply. ``self.url``
and every message carry the URL with its password replaced by ``***``.

How it differs from SQLite, and why:

- **Claims** lock the layer's first WAITING frame with ``FOR UPDATE SKIP LOCKED`` in one
  autocommit statement: concurrent claimers each take a different frame without waiting
  for one another (SQLite serialises them on its one write lock).
- **Per-job row locks** stand in for SQLite's global write lock where it mattered: every
  transaction that can finish a job or release dependencies (complete, requeue, reap,
  frame actions, kill) first locks its job row (``FOR NO KEY UPDATE``). Without it two
  frames of one layer completing at once could each see the other still RUNNING, and
  neither would release the dependent layer or finish the job. Lock order is always
  job, then frame; claims take no job lock, so dispatch never waits on completions.
- **Wake-ups**: transactions that make frames WAITING send ``NOTIFY cuectl_work``; idle
  workers LISTEN on their one connection and select() on its socket (``notify_fileno``)
  instead of polling fast, so a worker holds a single connection. ``--poll`` stays as the
  safety net.
- **Connection loss**: every method reconnects on a lost connection with back-off
  (0.1 s doubling to 2 s) for up to ``reconnect_s`` (30 s), then raises ``StoreError``.
  Every write is safe to repeat (completions are fenced by attempt, the rest are
  idempotent), except ``submit`` when the connection died during COMMIT: then it says
  that the job may or may not exist rather than submitting it twice. A claim whose
  outcome is unknown is retried; the frame it may have taken is reaped when its lease
  expires (a ``lost`` attempt), so it never runs twice.
- **Behind a transaction pooler** (PgBouncer, ``pool_mode = transaction``; the URL says
  so with ``pgbouncer=true``, stripped before libpq sees it): consecutive transactions may
  run on different server connections, so nothing may live in the session. Statements
  are not prepared (psycopg's automatic preparing would name statements that another
  server connection lacks), no session settings are made (lock and statement timeouts come
  from the role's settings, ``admin doctor`` checks), workers poll instead of LISTENing,
  a report reads on one connection, and acting for another user (``SET ROLE``: ``cuectl
  serve``) is refused. Many workers then share a few server connections.
- **Migrations** are the versions of ``schema`` rendered for PostgreSQL. They run in one
  transaction under an advisory lock, so workers starting together do not race; a newer
  schema is refused untouched. With ``CUECTL_AUTO_MIGRATE=0`` (read by ``open_store``) an
  old schema is an error and ``cuectl admin migrate`` applies the change explicitly.
"""

from __future__ import annotations

import json
import re
import select
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar
from urllib.parse import unquote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row, tuple_row

from cuectl.errors import (
    CuectlError,
    InvalidInput,
    NotFound,
    NotOwner,
    StoreBusy,
    StoreError,
    StoreStalled,
    StoreUnreachable,
)
from cuectl.sched.dialect import POSTGRES
from cuectl.sched.store import caps as capsmod
from cuectl.sched.store import lifecycle, schema
from cuectl.sched.store.base import Actor, ClaimedFrame
from cuectl.sched.store.sql import Row, SQLStore, Tx
from cuectl.sched.usage_sql import Fetch

T = TypeVar("T")
Conn = psycopg.Connection[dict[str, Any]]  # every connection of ours makes dict rows

NOTIFY_CHANNEL = "cuectl_work"
STATEMENT_TIMEOUT_S = 60  # the server cancels any statement of ours that runs longer
# pg_advisory_xact_lock key held while migrating ("CUEC" + 1).
_MIGRATE_LOCK = 0x4355454301
_CLAIM_SQL = f"""
    WITH next AS (
        SELECT id FROM frames WHERE layer_id = ? AND state = 'WAITING' AND (retry_at IS NULL OR retry_at <= ?)
            AND (gpu_oom_bytes IS NULL OR gpu_oom_bytes < ?) AND (avoid_host IS NULL OR avoid_host <> ?)
        ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
    )
    UPDATE frames f SET state = 'RUNNING', attempts = f.attempts + 1, host = ?, worker = ?,
        gpu_uuids = ?, lease_expires = ?, started_at = ?, ended_at = NULL, action = NULL,
        exit_code = NULL, exit_signal = NULL, max_rss_bytes = NULL, cpu_seconds = NULL, gpu_util_mean_pct = NULL,
        gpu_util_max_pct = NULL, gpu_memory_peak_bytes = NULL, gpu_seconds = NULL, gpu_busy_seconds = NULL,
        retry_at = NULL, avoid_host = NULL, log_path = {lifecycle.log_path_sql(POSTGRES, "f")}
    FROM next
    WHERE f.id = next.id
      AND (SELECT paused FROM jobs WHERE id = f.job_id) = 0
      AND NOT EXISTS (SELECT 1 FROM hosts WHERE name = ? AND locked = 1){{caps}}
    RETURNING f.id, f.attempts, f.number, f.frames, f.log_path
"""
_CLAIM_FAST = POSTGRES.positional(_CLAIM_SQL.format(caps=""))

# SQLSTATEs after which the connection is gone or not usable yet: reconnect and retry.
_LOST_STATES = ("57P01", "57P02", "57P03", "53300")  # admin/crash shutdown, starting up, too many connections
# The transaction lost a race with another one and was rolled back: run it again.
_RACE_STATES = ("40001", "40P01")  # serialization failure, deadlock detected


# -- URLs and secrets ------------------------------------------------------------------------------
def redact_url(url: str) -> str:
    """The URL with any password (``user:pw@`` or ``?password=``) replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, tail = re.match(r"([^/?#]*)(.*)", rest, re.S).groups()  # type: ignore[union-attr]
    if "@" in authority:
        userinfo, _, hosts = authority.rpartition("@")
        if ":" in userinfo:
            authority = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    tail = re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", tail)
    return f"{scheme}{sep}{authority}{tail}"


def _url_secrets(url: str) -> list[str]:
    """Password spellings found in the URL (raw and percent-decoded), longest first."""
    found: list[str] = []
    rest = url.partition("://")[2]
    authority = re.match(r"[^/?#]*", rest).group(0)  # type: ignore[union-attr]
    if "@" in authority:
        userinfo = authority.rpartition("@")[0]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
    found += re.findall(r"(?i)[?&]password=([^&#]*)", rest)
    out = {s for raw in found for s in (raw, unquote(raw)) if s}
    return sorted(out, key=len, reverse=True)


#: The URL's own parameter (not libpq's) that says a transaction pooler sits in between.
POOLER_PARAM = "pgbouncer"
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def split_pooler(url: str) -> tuple[str, bool]:
    """``(url for libpq, pooled)``: the URL without its ``pgbouncer=`` query parameter
    (libpq refuses parameters it does not know), and whether that said true. The same
    spelling as Prisma's, which users of PgBouncer know; any other value is an error."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, False
    fragment = ""
    if "#" in query:
        query, fragment = query.split("#", 1)
        fragment = "#" + fragment
    kept, pooled = [], False
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name != POOLER_PARAM:
            kept.append(part)
            continue
        value = unquote(value).strip().lower()
        if value not in _TRUE + _FALSE:
            raise InvalidInput(
                f"{POOLER_PARAM}={value!r} in the PostgreSQL URL: expected true or false",
                hint=f"add ?{POOLER_PARAM}=true when workers connect through PgBouncer in "
                "transaction mode (docs/postgres.md)",
            )
        pooled = value in _TRUE
    return base + ("?" + "&".join(kept) if kept else "") + fragment, pooled


def _one_line(text: object) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


# -- the store -----------------------------------------------------------------------------------
class PostgresStore(SQLStore):
    dialect = POSTGRES
    _force_overrides = False  # the server enforces ownership (row-level security): --force cannot pass it

    def __init__(
        self,
        url: str,
        *,
        log_dir: Path,
        create: bool = True,
        busy_timeout_s: float = 5.0,
        migrate: bool = True,
        refuse_old: bool = False,
        reconnect_s: float = 30.0,
        password: str | None = None,
    ) -> None:
        """Connect (failing fast: a CLI command should not hang on a down server) and bring
        the schema up to date when ``migrate``; otherwise an old schema is opened as is (for
        ``cuectl admin migrate``, which calls ``migrate()`` itself), or refused when
        ``refuse_old`` (automatic migration turned off). ``password``: PGPASSWORD as
        ``open_store`` took it out of the environment (frames must not find it there)."""
        super().__init__(log_dir=log_dir)
        self.local_path = None
        self.receipt_dir = None  # the server records who submitted (jobs.submitted_by)
        self._copy_allowed: bool | None = None  # COPY works unless row-level security applies to us
        self._clock_offset = 0.0  # the server's clock minus ours, measured at each connect
        self._stalled_until = 0.0  # see stall()
        self._stalled_why = "stopped answering"
        self._dsn, self.pooled = split_pooler(url)
        self._secrets = _url_secrets(url)
        self.url = redact_url(url)
        self.busy_timeout_s = busy_timeout_s
        self.reconnect_s = reconnect_s
        self._conn_kwargs = self._connection_defaults()
        if password is not None and "password" not in conninfo_to_dict(self._dsn):
            self._conn_kwargs["password"] = password
            self._secrets = sorted({*self._secrets, password}, key=len, reverse=True)
        self._conn: Conn | None = None
        self._listening = False  # LISTEN on every connection we open (notify_fileno was asked)
        self._woken = False  # a notification arrived that drain_notifications has not reported
        self._listen_retry_at = 0.0
        try:
            self._conn = self._connect()
        except psycopg.Error as exc:
            raise self._connect_error(exc) from None
        try:
            self._check_schema(create=create, migrate=migrate, refuse_old=refuse_old)
        except BaseException:
            self.close()
            raise

    # -- connections ---------------------------------------------------------------------------
    def _connection_defaults(self) -> dict[str, Any]:
        """libpq parameters we set unless the URL does: a name in pg_stat_activity, a
        connect timeout, keepalives so a silently dead network is noticed in ~1 min, and a
        TCP user timeout so data sent into a server that stopped answering fails in 30 s
        instead of after the kernel's ~15 minutes of retransmissions."""
        try:
            given = conninfo_to_dict(self._dsn)
        except psycopg.Error as exc:
            raise InvalidInput(
                f"invalid PostgreSQL URL {self.url}: {self._scrub(_one_line(exc))}",
                hint="postgresql://user@host:port/dbname?sslmode=require",
            ) from None
        defaults = {
            "application_name": "cuectl",
            "connect_timeout": 10,
            "keepalives": 1,
            "keepalives_idle": 30,
            "keepalives_interval": 10,
            "keepalives_count": 3,
            "tcp_user_timeout": 30_000,
        }
        return {k: v for k, v in defaults.items() if k not in given}

    def _open(self, **extra: Any) -> Conn:
        # Behind a transaction pooler a prepared statement lives on one server connection
        # and our next transaction may run on another: never prepare there.
        unprepared: dict[str, Any] = {"prepare_threshold": None} if self.pooled else {}
        return psycopg.connect(
            self._dsn, autocommit=True, row_factory=dict_row, **{**self._conn_kwargs, **unprepared, **extra}
        )

    def _connect(self, **extra: Any) -> Conn:
        conn = self._open(**extra)
        sent = time.time()
        if self.pooled:
            # Session settings would stay on whichever server connection ran them, for
            # other clients: the timeouts come from the role's settings (docs/postgres.md).
            row = conn.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now").fetchone()
        else:
            # Row-lock waits give up like SQLite's busy timeout does (-> StoreBusy), and no
            # statement of ours runs for a minute: one that does is stuck, not working.
            # The same round trip reads the server's clock: leases and heartbeats are on it.
            row = conn.execute(
                "SELECT set_config('lock_timeout', %s, false), "
                "set_config('statement_timeout', %s, false), "
                "EXTRACT(EPOCH FROM clock_timestamp())::float8 AS now",
                (f"{int(self.busy_timeout_s * 1000)}ms", f"{STATEMENT_TIMEOUT_S * 1000}ms"),
            ).fetchone()
        if row is not None:
            self._clock_offset = float(row["now"]) - (sent + time.time()) / 2
        if self.acting is not None:  # a reconnect while acting for an API user stays that user
            self._set_role(conn, self.acting.name)
        if self._listening:
            try:
                self._listen_on(conn)
            except BaseException:
                conn.close()
                raise
        return conn

    def _set_role(self, conn: Conn, role: str | None) -> None:
        try:
            conn.execute("SELECT set_config('role', %s, false)", (role or "none",))
        except psycopg.errors.InsufficientPrivilege:
            raise NotOwner(
                f"the database role {self._login_role(conn)!r} may not act as {role!r}",
                hint=f'as an admin: GRANT "{role}" TO the API server\'s role (docs/api.md)',
            ) from None
        except psycopg.errors.InvalidParameterValue:
            raise NotOwner(
                f"there is no database role {role!r} to act as",
                hint="create a role named like the user (docs/postgres.md)",
            ) from None

    @staticmethod
    def _login_role(conn: Conn) -> str:
        row = conn.execute("SELECT session_user AS name").fetchone()
        return str(row["name"]) if row else "?"

    def _begin_acting(self, actor: Actor) -> None:
        # SET ROLE: current_user becomes the token's user, so the trigger records them as the
        # submitter and row-level security judges them, not the server's login role.
        if self.pooled:
            # A role set on a pooled server connection would stay there for the next client
            # (a worker, another request) while our next statement ran as the login role.
            raise NotOwner(
                f"cannot act as {actor.name!r} through a transaction pooler ({POOLER_PARAM}=true)",
                hint="connect `cuectl serve` straight to PostgreSQL (docs/postgres.md)",
            )
        if self._conn is not None and not (self._conn.closed or self._conn.broken):
            self._set_role(self._conn, actor.name)

    def _end_acting(self, previous: Actor | None) -> None:
        if self._conn is not None and not (self._conn.closed or self._conn.broken):
            try:
                self._set_role(self._conn, previous.name if previous else None)
            except (psycopg.Error, NotOwner):
                self._drop_connection()  # never leave a connection acting as someone else

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _connect_error(self, exc: psycopg.Error) -> StoreError:
        text = self._scrub(_one_line(exc))
        state = getattr(exc, "sqlstate", None)
        if state == "3D000":
            return StoreError(
                f"cannot open {self.url}: {text}",
                hint="create the database first (createdb, or CREATE DATABASE as an admin)",
            )
        if state in ("28P01", "28000") or "password" in text.lower():
            return StoreError(
                f"cannot log in to {self.url}: {text}",
                hint="set PGPASSWORD or add the password to ~/.pgpass (mode 0600); "
                "avoid putting it in --db, where other users can see it",
            )
        return StoreUnreachable(
            f"cannot connect to PostgreSQL at {self.url}: {text}",
            hint="is the server running and reachable (host, port, sslmode, firewall)?",
        )

    def _kind(self, exc: psycopg.Error, conn: Conn | None) -> str:
        """``lost`` (reconnect and retry), ``race`` (retry the transaction) or ``fatal``."""
        state = getattr(exc, "sqlstate", None)
        if conn is None or conn.broken or conn.closed:
            return "lost"
        if state in _RACE_STATES:
            return "race"
        if state == "0A000" and "cached plan" in str(exc):
            # A newer cuectl added columns while our prepared `SELECT *`s were cached: a
            # fresh connection starts with no prepared statements.
            return "lost"
        if state in _LOST_STATES or (state or "").startswith("08"):
            return "lost"
        if state is None and isinstance(exc, psycopg.OperationalError):
            return "lost"  # raised by the client: the socket broke
        return "fatal"

    def _translate(self, exc: psycopg.Error) -> StoreError:
        state = getattr(exc, "sqlstate", None)
        text = self._scrub(_one_line(exc))
        if state == "55P03":
            return StoreBusy(
                f"store {self.url} is locked by another session (waited {self.busy_timeout_s:g} s)",
                hint="retry; if it persists, look for a long transaction in pg_stat_activity",
            )
        if state == "53100":
            return StoreError(
                f"store {self.url}: the server's disk is full ({text}); nothing was changed",
                hint="free space on the database server, then retry",
            )
        if state == "42501":
            return StoreError(
                f"store {self.url}: permission denied ({text})",
                hint="grant this role access to the cuectl tables (or run `cuectl admin migrate` as their owner)",
            )
        if state in ("42P01", "42703"):
            return StoreError(
                f"store {self.url} does not have the expected cuectl schema: {text}", hint="run `cuectl admin migrate`"
            )
        return StoreError(f"store {self.url}: {text}")

    def _call(self, fn: Callable[[Conn], T], *, tx: bool = True, idempotent: bool = True) -> T:
        """Run ``fn`` (in one transaction when ``tx``), reconnecting with back-off after a
        lost connection for up to ``reconnect_s``. ``idempotent=False``: a connection lost
        during COMMIT is reported instead of retried (the outcome is unknown)."""
        if time.monotonic() < self._stalled_until:
            raise StoreStalled(f"store {self.url} {self._stalled_why}; not asked again for a few seconds")
        self.calling_since = time.monotonic()  # a worker's signal handling may abandon a hung call
        try:
            return self._call_retrying(fn, tx=tx, idempotent=idempotent)
        except StoreStalled:
            self._drop_connection()  # abandoned half-way through the protocol: unusable
            raise
        finally:
            self.calling_since = None

    def stall(self, seconds: float, why: str = "stopped answering") -> None:
        # The calls failed meanwhile say why: the abandoned one's own error may have been
        # caught where nothing reports it (a heartbeat, an idle check).
        self._stalled_until = time.monotonic() + seconds
        self._stalled_why = why

    def _call_retrying(self, fn: Callable[[Conn], T], *, tx: bool, idempotent: bool) -> T:
        deadline: float | None = None
        delay = 0.1
        while True:
            committing = False
            conn = self._conn
            try:
                if conn is None or conn.closed or conn.broken:
                    self._drop_connection()
                    conn = self._conn = self._connect()
                if not tx:
                    return fn(conn)
                with conn.transaction():
                    result = fn(conn)
                    committing = True  # from here on the error can come from COMMIT itself
                return result
            except psycopg.Error as exc:
                kind = self._kind(exc, conn)
                if kind == "fatal":
                    raise self._translate(exc) from None
                if kind == "lost" and committing and not idempotent:
                    self._drop_connection()
                    raise StoreError(
                        f"lost the connection to {self.url} while committing; the change may or may "
                        "not have been stored",
                        hint="check (e.g. `cuectl job list`) before retrying",
                    ) from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.reconnect_s
                if now >= deadline:
                    self._drop_connection()
                    raise StoreUnreachable(
                        f"store {self.url} unreachable for {self.reconnect_s:g} s: {self._scrub(_one_line(exc))}",
                        hint="is the server running and reachable?",
                    ) from None
                if kind == "lost":
                    self._drop_connection()
                time.sleep(min(delay, max(0.0, deadline - now)))
                delay = min(delay * 2, 2.0)

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    # -- hooks of the shared SQL -------------------------------------------------------------------
    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        query = POSTGRES.positional(sql)
        return self._call(lambda conn: conn.execute(query, params).fetchall(), tx=False)

    def _write(self, fn: Callable[[Tx], T], *, idempotent: bool = True) -> T:
        return self._call(lambda conn: fn(Tx(conn, POSTGRES)), idempotent=idempotent)

    def _lock_jobs(self, tx: Tx, *, jobs: Iterable[int] = (), frames: Iterable[int] = ()) -> None:
        """Serialise with every other transaction that can release dependencies of, or
        finish, these jobs (see the module docstring). Sorted: no lock-order deadlocks."""
        job_ids, frame_ids = sorted(set(jobs)), sorted(set(frames))
        if job_ids or frame_ids:
            tx.conn.execute(
                "SELECT id FROM jobs WHERE id = ANY(%s) OR id IN (SELECT job_id FROM frames "
                "WHERE id = ANY(%s)) ORDER BY id FOR NO KEY UPDATE",
                (job_ids, frame_ids),
            ).fetchall()

    def _notify(self, tx: Tx) -> None:
        """Wake idle workers when this transaction commits (PostgreSQL folds duplicates)."""
        tx.conn.execute(f"NOTIFY {NOTIFY_CHANNEL}")

    def clock(self) -> float:
        """The server's clock: every host's heartbeats, leases and reaping are then measured
        on one clock, so a worker whose own clock is off neither looks DOWN nor loses its
        frames to another host's reaper."""
        return time.time() + self._clock_offset

    def actor(self) -> Actor:
        # The server's word: the current role (the login role, or the API user it acts as); admin when it is a superuser, the owner of the
        # tables, or a member of cuectl_admin (docs/postgres.md creates that role).
        row = self._read(
            "SELECT current_user AS name, (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) "
            "OR pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = 'jobs'::regclass), 'MEMBER') "
            "OR COALESCE((SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles "
            "WHERE rolname = 'cuectl_admin'), false) AS admin"
        )[0]
        return Actor(row["name"], bool(row["admin"]))

    def _reserve_frame_ids(self, tx: Tx, count: int) -> list[int]:
        # The sequence is looked up once (in the subquery), not once per row: 5x faster.
        # Sorted, so dispatch order by id is the spec's order.
        return sorted(
            r["id"]
            for r in tx.conn.execute(
                "SELECT nextval(s.seq) AS id FROM (SELECT pg_get_serial_sequence('frames', 'id')::regclass AS seq) s, "
                "generate_series(1, %s)",
                (count,),
            ).fetchall()
        )

    def _bulk_insert(self, tx: Tx, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        if self._copy_allowed is None:
            self._copy_allowed = bool(
                tx.conn.execute(
                    "SELECT NOT c.relrowsecurity OR r.rolsuper OR r.rolbypassrls "
                    "OR pg_has_role(current_user, c.relowner, 'USAGE') AS ok FROM pg_class c, pg_roles r "
                    "WHERE c.oid = 'frames'::regclass AND r.rolname = current_user"
                ).fetchone()["ok"]
            )
        if not self._copy_allowed:  # PostgreSQL refuses COPY FROM under row-level security
            super()._bulk_insert(tx, table, columns, rows)
            return
        # COPY: a 100,000-frame submit in one stream instead of 100,000 statements.
        with tx.conn.cursor().copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def close(self) -> None:
        self._drop_connection()

    # -- schema --------------------------------------------------------------------------------
    def _check_schema(self, *, create: bool, migrate: bool, refuse_old: bool) -> None:
        version = self._call(self._peek_version, tx=False)
        if version > schema.SCHEMA_VERSION:
            raise self._too_new(version)
        if version == 0 and not create:
            raise NotFound(
                f"no cuectl store in {self.url}", hint="create it with `cuectl admin migrate` (or submit a job)"
            )
        if version == schema.SCHEMA_VERSION:
            return
        if migrate:
            self.migrate()
        elif refuse_old:
            raise StoreError(
                f"store {self.url} has schema version {version}, this cuectl needs {schema.SCHEMA_VERSION} "
                "(automatic migration is off: CUECTL_AUTO_MIGRATE=0)",
                hint="run `cuectl admin migrate` once, then restart the workers",
            )

    def _peek_version(self, conn: Conn) -> int:
        """The schema version, 0 for a database without cuectl tables; refuses foreign tables."""
        # Scan pg_class with this statement's snapshot (not to_regclass, whose cached name
        # lookup can miss tables another migrator committed while we waited for its lock),
        # in the schema our CREATE TABLEs go to.
        present = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = ANY(%s)",
            (list(schema.TABLES),),
        ).fetchall()
        names = {r["relname"] for r in present}
        if "meta" not in names:
            if names:
                raise StoreError(
                    f"{self.url} has tables named like cuectl's ({', '.join(sorted(names))}) but is not a cuectl store",
                    hint="use another database, or a schema of its own: ?options=-csearch_path%3Dcuectl",
                )
            return 0
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            raise StoreError(
                f"{self.url} has a table named meta but is not a cuectl store",
                hint="use another database, or a schema of its own: ?options=-csearch_path%3Dcuectl",
            )
        return int(row["value"])

    def schema_version(self) -> int:
        return self._call(self._peek_version, tx=False)

    def migrate(self) -> tuple[int, int]:
        """Apply missing migrations in one transaction; (version before, version after)."""

        def apply(conn: Conn) -> int:
            # Migrations may wait for a concurrent migrator longer than a normal lock wait,
            # and rewriting a large table may take longer than a normal statement.
            conn.execute("SET LOCAL lock_timeout = '120s'")
            conn.execute("SET LOCAL statement_timeout = 0")
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATE_LOCK,))
            return self._migrate_from(Tx(conn, POSTGRES), self._peek_version(conn))

        before = self._call(apply)
        return before, schema.SCHEMA_VERSION

    # -- notifications -----------------------------------------------------------------------------
    # One connection does both the work and the LISTEN, so a worker holds a single
    # connection (CONNECTIONS_PER_WORKER). The server sends a notification only while the
    # session is idle, never inside a transaction; psycopg hands every notification it
    # reads (while fetching a statement's results as much as while we wait) to our
    # handler, which only sets ``_woken``: none is lost, none is reported twice. Between
    # calls the connection is idle, so its socket turns readable when one arrives.
    def notify_fileno(self) -> int | None:
        """The store connection's socket: readable when work may have been queued. The
        first call LISTENs (and every reconnect LISTENs again); while the connection is
        down, reconnects at most once a second and answers None until that works.
        None behind a transaction pooler: a LISTEN there would hold for one transaction on
        one server connection, so workers poll (``--poll``)."""
        if self.pooled:
            return None
        if not self._listening:
            self._listening = True
            conn = self._conn
            if conn is not None and not conn.closed and not conn.broken:
                try:
                    self._listen_on(conn)
                except psycopg.Error:
                    self._drop_connection()  # reconnected (and listening) below or by the next call
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn.fileno()
        self._drop_connection()
        if time.monotonic() < self._listen_retry_at or time.monotonic() < self._stalled_until:
            return None
        self._listen_retry_at = time.monotonic() + 1.0
        try:
            self._conn = self._connect(connect_timeout=5)
        except (psycopg.Error, CuectlError):
            return None
        return self._conn.fileno()

    def _listen_on(self, conn: Conn) -> None:
        conn.add_notify_handler(self._on_notify)
        conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        # Work queued before LISTEN took effect sent its NOTIFY to nobody: wake the caller
        # once, so it looks at the queue again.
        self._woken = True

    def _on_notify(self, notify: psycopg.Notify) -> None:
        self._woken = True

    def drain_notifications(self) -> bool:
        """Consume pending wake-ups without blocking; True if there were any (or the
        connection broke, in which case the caller should look at the queue anyway)."""
        conn = self._conn
        if conn is not None and self._listening and not conn.closed and not conn.broken:
            # Read what the socket holds: notifications land in _on_notify. Not while a
            # statement is in flight (a signal handler interrupting one): report a wake-up.
            if not conn.lock.acquire(blocking=False):
                return True
            try:
                conn.pgconn.consume_input()
                while (pgn := conn.pgconn.notifies()) is not None:
                    if conn.pgconn.notify_handler is not None:
                        conn.pgconn.notify_handler(pgn)
                    else:  # not expected: our handler is registered on every connection
                        self._woken = True
            except psycopg.Error:
                self._woken = True
            finally:
                conn.lock.release()
            if conn.broken:
                self._drop_connection()  # notify_fileno reconnects and LISTENs again
                self._woken = True
        woken, self._woken = self._woken, False
        return woken

    def wait_for_work(self, timeout: float) -> bool:
        """Block up to ``timeout`` s for a wake-up; False at once if LISTEN is unavailable."""
        fd = self.notify_fileno()
        if fd is None:
            return False
        if self.drain_notifications():
            return True
        ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
        return bool(ready) and self.drain_notifications()

    # -- jobs ------------------------------------------------------------------------------------
    # -- the claim (hot path) ----------------------------------------------------------------------
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
        layer = self._layer_row(layer_id)
        # One autocommit statement: SKIP LOCKED makes concurrent claimers take different
        # frames instead of queueing on the same one; a locked host or a paused job claims
        # nothing; the attempt's log path is set in the same statement.
        params = (
            layer_id,
            now,
            self._claim_gpu_bytes(layer, host, gpu_uuids),
            host,
            host,
            worker,
            json.dumps(list(gpu_uuids)),
            now + lease_s,
            now,
            str(log_dir or self.log_dir),
            layer["name"],
            host,
        )
        caps = self.layer_caps(layer_id)
        if not caps:
            row = self._call(lambda conn: conn.execute(_CLAIM_FAST, params).fetchone(), tx=False)
        else:
            # Concurrent statements do not see each other's claims: one advisory lock per
            # cap (sorted) makes capped claims of the same cap take turns (store/caps.py).
            condition, cap_params = capsmod.claim_condition(caps)
            sql = POSTGRES.positional(_CLAIM_SQL.format(caps=f" AND {condition}"))

            def capped(conn: Conn) -> Any:
                for key in capsmod.lock_keys(caps):
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                return conn.execute(sql, (*params, *cap_params)).fetchone()

            row = self._call(capped)
        if row is None:
            return None
        return lifecycle.claimed_frame(
            layer,
            frame_id=row["id"],
            attempt=row["attempts"],
            number=row["number"],
            frames=row["frames"],
            gpu_uuids=gpu_uuids,
            log_path=row["log_path"],
        )

    # -- accounting and maintenance ----------------------------------------------------------------
    def _snapshot(self, fn: Callable[[Fetch], T]) -> T:
        def in_snapshot(conn: Conn) -> T:
            _begin_report_snapshot(conn)
            return fn(_tuple_fetch(conn))

        return self._call(in_snapshot)

    def _snapshot_pair(self, fn: Callable[[Fetch, Fetch | None], T]) -> T:
        """A second connection that imports this one's snapshot (``pg_export_snapshot``),
        for a report's queue waits, read on a thread of their own beside the sums
        (usage_sql.summarise). Held for the one report only; where it cannot be had (the
        server's connections all taken) the report reads on one connection, as before."""

        def in_snapshot(conn: Conn) -> T:
            _begin_report_snapshot(conn)
            if self.pooled:
                # The second client would wait for a server connection while this
                # transaction holds one: with a pool of one, for ever.
                return fn(_tuple_fetch(conn), None)
            row = conn.execute("SELECT pg_export_snapshot() AS id").fetchone()
            snapshot = str(row["id"]) if row is not None else ""
            if not _SNAPSHOT_ID.fullmatch(snapshot):  # it goes into SQL text below
                return fn(_tuple_fetch(conn), None)
            try:
                aside = self._open()
            except psycopg.Error:
                return fn(_tuple_fetch(conn), None)
            try:
                if self.acting is not None:  # reads what the user it acts for may read, no more
                    self._set_role(aside, self.acting.name)
                with aside.transaction():
                    aside.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    aside.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
                    aside.execute(
                        "SELECT set_config('statement_timeout', %s, true)", (f"{STATEMENT_TIMEOUT_S * 1000}ms",)
                    )
                    aside.execute("SET LOCAL jit = off")
                    return fn(_tuple_fetch(conn), _tuple_fetch(aside))
            finally:
                aside.close()

        return self._call(in_snapshot)

    def backup(self, dest: Path, *, force: bool = False) -> None:
        raise InvalidInput(
            "admin backup works on SQLite stores; back up PostgreSQL with pg_dump",
            hint="pg_dump --format=custom --file=cuectl.dump DBNAME",
        )

    # -- doctor --------------------------------------------------------------------------------------
    def integrity_problems(self) -> list[str]:
        """What ``cuectl admin doctor`` can check from a client, one line per finding ([]
        when sound): the schema is the one this cuectl expects (version, tables, columns,
        the submitter trigger), and the rows obey the rules every transaction of ours keeps
        (``_CONSISTENCY``), read in one snapshot so a busy farm gives no false alarms.
        The server's own files are not checked here: ``doctor_checks`` says so."""

        def check(conn: Conn) -> list[str]:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            present = _present_columns(conn)
            problems = self._schema_problems(conn, present)
            for what, sql, needs in _CONSISTENCY:
                if not needs <= present:  # a missing table or column was reported above
                    continue
                rows = conn.execute(sql).fetchall()
                if rows:
                    problems.append(_finding(what, rows))
            return problems

        return self._call(check)

    def _schema_problems(self, conn: Conn, present: set[tuple[str, str | None]]) -> list[str]:
        problems = []
        version = self._peek_version(conn)
        if version != schema.SCHEMA_VERSION:
            fix = (
                "run `cuectl admin migrate`"
                if version < schema.SCHEMA_VERSION
                else "a newer cuectl migrated it: upgrade this one"
            )
            problems.append(f"schema version {version}, this cuectl expects {schema.SCHEMA_VERSION} ({fix})")
        for table, columns in _expected_columns().items():
            if (table, None) not in present:
                problems.append(f"table {table} is missing (run `cuectl admin migrate` as the tables' owner)")
                continue
            missing = sorted(c for c in columns if (table, c) not in present)
            if missing:
                problems.append(
                    f"table {table} lacks column(s) {', '.join(missing)} that schema version "
                    f"{schema.SCHEMA_VERSION} has"
                )
        trigger = conn.execute(
            "SELECT tgenabled FROM pg_trigger WHERE tgname = 'jobs_submitter' AND tgrelid = to_regclass('jobs')"
        ).fetchone()
        if (("jobs", None) in present) and (trigger is None or trigger["tgenabled"] == "D"):
            problems.append(
                "trigger jobs_submitter is missing or disabled: the server no longer records who "
                "submitted each job (jobs.submitted_by), which ownership checks rely on"
            )
        return problems

    def doctor_checks(self) -> list[tuple[str, str, str]]:
        """PostgreSQL-only lines for ``cuectl admin doctor`` beside ``integrity_problems``:
        ``(name, status, detail)`` for the connection budget, and what was not checked."""
        return [
            self._connection_check(),
            (
                "store checks skipped",
                "ok",
                "not checked from a client: the server's files, pages and indexes (run pg_amcheck on the "
                "server); dependency counters against the dependencies still unmet; the roles and "
                "row-level security of `cuectl admin pg-roles`",
            ),
        ]

    def _connection_check(self) -> tuple[str, str, str]:
        """Connections the server allows against what the registered workers may open:
        one each (their work and LISTEN share it) plus ``CONNECTION_HEADROOM``."""
        name = "store connections"
        try:
            row = self._read(_CONNECTIONS_SQL)[0]
        except StoreError as exc:
            return name, "warn", f"could not read the server's connection settings: {exc.message}"
        limit = int(row["max"]) - int(row["su_reserved"]) - int(row["reserved"])
        where = "max_connections"
        if int(row["db_limit"]) >= 0 and int(row["db_limit"]) < limit:
            limit, where = int(row["db_limit"]), "the database's CONNECTION LIMIT"
        hosts = int(row["hosts"])
        if self.pooled:
            return self._pooled_check(name, row, limit, where)
        need = hosts * CONNECTIONS_PER_WORKER + CONNECTION_HEADROOM
        detail = (
            f"{limit} allowed for non-superusers ({where}; max_connections {row['max']}), {row['used']} in "
            f"use; {hosts} registered host(s) x {CONNECTIONS_PER_WORKER} per worker + "
            f"{CONNECTION_HEADROOM} for commands and `cuectl serve` = {need}"
        )
        if need > limit:
            return (
                name,
                "warn",
                (
                    detail + ": workers will be refused connections (raise max_connections, "
                    f"or let workers share connections through PgBouncer in transaction "
                    f"mode, {POOLER_PARAM}=true in their URL: docs/postgres.md)"
                ),
            )
        return name, "ok", detail

    @staticmethod
    def _pooled_check(name: str, row: Row, limit: int, where: str) -> tuple[str, str, str]:
        """Behind a transaction pooler the workers share its server connections, so their
        number is not the budget; what our sessions no longer set must come from the role."""
        detail = (
            f"through a transaction pooler ({POOLER_PARAM}=true): {row['hosts']} registered host(s) share "
            f"its server connections, which its pool size bounds; {limit} allowed for non-superusers "
            f"({where}; max_connections {row['max']}), {row['used']} in use"
        )
        unset = [k for k in ("lock_timeout", "statement_timeout") if str(row[k]).strip() in ("0", "")]
        if unset:
            return (
                name,
                "warn",
                (
                    detail + f"; {' and '.join(unset)} not set for this role, so a stuck lock or statement waits "
                    "for ever (ALTER ROLE … IN DATABASE … SET lock_timeout = '5s', statement_timeout = '60s')"
                ),
            )
        return (
            name,
            "ok",
            detail + f"; lock_timeout {row['lock_timeout']}, statement_timeout {row['statement_timeout']}",
        )


# -- doctor: what a sound store never holds ---------------------------------------------------------
#: Each worker keeps one connection, for its work and its LISTEN (``notify_fileno``).
CONNECTIONS_PER_WORKER = 1
#: Beside the workers: CLI commands, cron's reports, `cuectl serve` (one per request thread).
CONNECTION_HEADROOM = 10
_CONNECTIONS_SQL = """
    SELECT current_setting('max_connections')::int AS max,
           current_setting('superuser_reserved_connections')::int AS su_reserved,
           COALESCE(NULLIF(current_setting('reserved_connections', true), ''), '0')::int AS reserved,
           (SELECT COUNT(*) FROM pg_stat_activity WHERE backend_type = 'client backend') AS used,
           (SELECT datconnlimit FROM pg_database WHERE datname = current_database()) AS db_limit,
           (SELECT COUNT(*) FROM hosts) AS hosts,
           current_setting('lock_timeout') AS lock_timeout,
           current_setting('statement_timeout') AS statement_timeout
"""
#: (what is wrong, a query returning the offending rows as (n, id, note), the (table, column)s
#: it reads). ``n`` is the total count; at most ``_SHOWN`` rows come back.
_SHOWN = 5
_CONSISTENCY: tuple[tuple[str, str, frozenset[tuple[str, str | None]]], ...] = tuple(
    (
        what,
        f"SELECT COUNT(*) OVER () AS n, id, {note} AS note FROM {source} ORDER BY id LIMIT {_SHOWN}",
        frozenset((t, c) for t, cs in needs.items() for c in (None, *cs)),
    )
    for what, note, source, needs in (
        (
            "RUNNING frames without a host or lease expiry (the reaper never requeues them)",
            "NULL",
            "frames WHERE state = 'RUNNING' AND (host IS NULL OR lease_expires IS NULL)",
            {"frames": ("state", "host", "lease_expires")},
        ),
        (
            "RUNNING frames on hosts that are not registered (no worker heartbeats them there)",
            "host",
            "frames f WHERE state = 'RUNNING' AND host IS NOT NULL AND NOT EXISTS "
            "(SELECT 1 FROM hosts h WHERE h.name = f.host)",
            {"frames": ("state", "host"), "hosts": ("name",)},
        ),
        (
            "attempts whose frame is missing",
            "'frame ' || frame_id",
            "attempts a WHERE NOT EXISTS (SELECT 1 FROM frames f WHERE f.id = a.frame_id)",
            {"attempts": ("frame_id",), "frames": ("id",)},
        ),
        (
            "frames whose layer is missing",
            "'layer ' || layer_id",
            "frames f WHERE NOT EXISTS (SELECT 1 FROM layers l WHERE l.id = f.layer_id)",
            {"frames": ("layer_id",), "layers": ("id",)},
        ),
        (
            "frames whose job is missing",
            "'job ' || job_id",
            "frames f WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = f.job_id)",
            {"frames": ("job_id",), "jobs": ("id",)},
        ),
        (
            "layers whose job is missing",
            "'job ' || job_id",
            "layers l WHERE NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = l.job_id)",
            {"layers": ("job_id",), "jobs": ("id",)},
        ),
        (
            "FINISHED jobs with frames still WAITING, DEPEND or RUNNING",
            "NULL",
            "jobs j WHERE state = 'FINISHED' AND EXISTS (SELECT 1 FROM frames f WHERE f.job_id = j.id "
            "AND f.state IN ('WAITING', 'DEPEND', 'RUNNING'))",
            {"jobs": ("state",), "frames": ("job_id", "state")},
        ),
    )
)


def _finding(what: str, rows: Sequence[Row]) -> str:
    """``attempts whose frame is missing: 2 (id 7: frame 99; id 8: frame 99)``."""
    total = int(rows[0]["n"])
    shown = "; ".join(f"id {r['id']}" + (f": {r['note']}" if r["note"] is not None else "") for r in rows)
    more = f"; {total - len(rows)} more" if total > len(rows) else ""
    return f"{what}: {total} ({shown}{more})"


def _present_columns(conn: Conn) -> set[tuple[str, str | None]]:
    """``(table, column)`` of our schema's tables as the server has them, and ``(table, None)``
    for each table itself."""
    rows = conn.execute(
        "SELECT c.relname AS t, a.attname AS c FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname = ANY(%s)",
        (list(schema.TABLES),),
    ).fetchall()
    return {(r["t"], r["c"]) for r in rows} | {(r["t"], None) for r in rows}


def _expected_columns() -> dict[str, set[str]]:
    """Every table and column of the current schema version, read from the migration
    scripts themselves (``CREATE TABLE`` bodies and ``ADD COLUMN``), so it cannot drift."""
    tables: dict[str, set[str]] = {}
    for script in schema.MIGRATIONS:
        for match in re.finditer(r"CREATE TABLE (\w+) \(", script):
            columns = tables.setdefault(match.group(1), set())
            for part in _top_level_parts(script, match.end()):
                word = part.split(None, 1)[0].strip('"') if part.split() else ""
                if word and word.upper() not in ("UNIQUE", "PRIMARY", "FOREIGN", "CHECK", "CONSTRAINT"):
                    columns.add(word)
        for match in re.finditer(r'ALTER TABLE (\w+) ADD COLUMN "?(\w+)"?', script):
            tables.setdefault(match.group(1), set()).add(match.group(2))
    return tables


def _top_level_parts(text: str, start: int) -> list[str]:
    """The comma-separated parts of the parenthesised list that opens just before ``start``."""
    parts, depth, begin = [], 0, start
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif ch in ",)" and depth == 0:
            parts.append(text[begin:i].strip())
            begin = i + 1
            if ch == ")":
                break
    return parts


# What pg_export_snapshot returns: hexadecimal numbers and dashes (e.g. 00000003-0000001B-1).
_SNAPSHOT_ID = re.compile(r"[0-9A-Fa-f]+(-[0-9A-Fa-f]+)+")


def _begin_report_snapshot(conn: Conn) -> None:
    """The accounting reads' transaction: one snapshot, read only, without JIT."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    # The accounting sums look expensive to the planner (JSON functions, a subplan per
    # failed attempt), so PostgreSQL would JIT-compile them, which costs more than it
    # saves here: the --by user sums query took 630 ms with JIT and 160 ms without,
    # for 100,000 attempts.
    conn.execute("SET LOCAL jit = off")


def _tuple_fetch(conn: Conn) -> Fetch:
    cur = conn.cursor(row_factory=tuple_row)  # plain tuples: up to 10^5 rows of waits
    return lambda sql, params: cur.execute(sql, params).fetchall()
