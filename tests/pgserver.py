"""A throwaway PostgreSQL server for the tests, started from the installed server binaries.

``shared_server()`` starts one server per test process (initdb + pg_ctl in a fresh temp
dir, trust authentication, listening on 127.0.0.1 on a free port and on a private unix
socket) and stops it with ``pg_ctl -m immediate`` when the process exits. Tests get an
isolated database each from ``create_database()``.

initdb refuses to run as root, so as root the server runs as an unprivileged system user
(``cuectl-pg``, created here with useradd if missing; ``nobody`` when useradd is not
available). Durability is switched off (fsync, synchronous_commit, full_page_writes): the
data is thrown away and the suite runs faster.

When no server binaries (or no psycopg) exist, ``shared_server()`` raises
``PgUnavailable`` with the reason, and fixtures turn that into a visible ``pytest.skip``.
Binaries are looked up in ``$PG_BINDIR``, ``pg_config --bindir``, the newest
``/usr/lib/postgresql/*/bin`` and ``$PATH``.

Imported by conftests and tests through sys.path (pytest runs with --import-mode=importlib).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from pathlib import Path

SERVER_USER = "cuectl-pg"
# A role that must authenticate with a password (scram-sha-256 over TCP), so tests can
# check .pgpass / PGPASSWORD handling and that passwords never leak into messages.
PASSWORD_ROLE = "cuectl_pw"
PASSWORD = "s3cret-Pa55word"


class PgUnavailable(Exception):
    """No PostgreSQL server can be started here; the message says why."""


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10).stdout
            candidates.append(Path(out.strip()))
        except (OSError, subprocess.SubprocessError):
            pass

    def version_key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in p.parent.name.split(".") if x.isdigit())

    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version_key, reverse=True)
    candidates.append(Path("/usr/local/pgsql/bin"))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).parent)
    for c in candidates:
        if all((c / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return c
    return None


def _server_account() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run it as ourselves (not root)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(SERVER_USER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd:
            # Idempotent across parallel test processes: "already exists" is fine.
            subprocess.run(
                [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SERVER_USER],
                capture_output=True,
                timeout=30,
            )
        try:
            pw = pwd.getpwnam(SERVER_USER)
        except KeyError:
            pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    """One running server in its own temp dir; ``url()`` names a database on it."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.account = _server_account()
        # mkdtemp in /tmp (world-traversable), not pytest's root-only tmp dir: the server
        # account must be able to reach its data directory.
        self.base = Path(tempfile.mkdtemp(prefix="cuectl-pg-"))
        self.data = self.base / "data"
        self.sock = self.base / "sock"
        self.log = self.base / "server.log"
        self.port = 0
        self.sock.mkdir()
        if self.account:
            for p in (self.base, self.sock):
                os.chown(p, *self.account)
        self._initdb()

    # -- running server tools as the server account ---------------------------------------
    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        kwargs: dict = {}
        if self.account:
            kwargs = {"user": self.account[0], "group": self.account[1], "extra_groups": []}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        res = subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            cwd=self.base,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
        if res.returncode != 0:
            log = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise PgUnavailable(
                f"{args[0]} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}"
                + (f"\nserver log:\n{log}" if log else "")
            )
        return res

    def _initdb(self) -> None:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            timeout=120,
        )
        hba = self.data / "pg_hba.conf"
        # First match wins: the password role must authenticate even though the rest is trust.
        hba.write_text(f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())

    def _configure(self, port: int) -> None:
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(port),
            "unix_socket_directories": f"'{self.sock}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "password_encryption": "'scram-sha-256'",
        }
        conf = self.data / "postgresql.auto.conf"
        conf.write_text("".join(f"{k} = {v}\n" for k, v in settings.items()))

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        last: PgUnavailable | None = None
        for _ in range(3):  # a free port can be taken between probing and binding
            self.port = _free_port()
            self._configure(self.port)
            try:
                self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", timeout=90)
                break
            except PgUnavailable as exc:
                last = exc
        else:
            raise last or PgUnavailable("pg_ctl start failed")
        self._admin(f"CREATE ROLE {PASSWORD_ROLE} LOGIN CREATEDB PASSWORD '{PASSWORD}'")

    def restart(self) -> None:
        """Fast shutdown and start: every client connection is cut."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-m", "fast", "restart", timeout=90
        )

    def stop_server(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "fast", "stop", timeout=90)

    def start_server(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start", timeout=90)

    def stop(self) -> None:
        """Stop (immediate: the data is thrown away) and remove the directory."""
        try:
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop", timeout=60)
        except (PgUnavailable, OSError, subprocess.SubprocessError):
            pass
        shutil.rmtree(self.base, ignore_errors=True)

    # -- databases -----------------------------------------------------------------------------
    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create_database(self, owner: str = "postgres") -> str:
        """A new, empty database with a unique name (one per test: isolation)."""
        name = f"t_{uuid.uuid4().hex[:16]}"
        self._admin(f"CREATE DATABASE {name} OWNER {owner}")
        return name

    def drop_database(self, name: str) -> None:
        # FORCE: a test may leave connections behind (a subprocess, a LISTEN connection).
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


_lock = threading.Lock()
_server: PgServer | None = None
_failure: str | None = None


def shared_server() -> PgServer:
    """The process's one server, started on first use; raises PgUnavailable with a reason."""
    global _server, _failure
    with _lock:
        if _server is not None:
            return _server
        if _failure is not None:
            raise PgUnavailable(_failure)
        try:
            import psycopg  # noqa: F401
        except ImportError:
            _failure = "psycopg is not installed (pip install 'cuectl[postgres]')"
            raise PgUnavailable(_failure) from None
        bindir = find_bindir()
        if bindir is None:
            _failure = (
                "no PostgreSQL server binaries (initdb, pg_ctl, postgres) found; "
                "set PG_BINDIR or install the postgresql server package"
            )
            raise PgUnavailable(_failure)
        try:
            server = PgServer(bindir)
            atexit.register(server.stop)
            server.start()
        except (PgUnavailable, OSError, subprocess.SubprocessError) as exc:
            _failure = f"could not start a PostgreSQL server from {bindir}: {exc}"
            raise PgUnavailable(_failure) from None
        _server = server
        return server
