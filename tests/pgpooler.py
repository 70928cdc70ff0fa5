"""A throwaway PgBouncer in transaction mode in front of the suite's PostgreSQL server
(tests/pgserver.py), started from the installed ``pgbouncer`` binary (Debian's package).

``shared_pooler(server)`` starts one per test process, listening on 127.0.0.1 on a free
port, with a small pool (``POOL_SIZE`` server connections per database) so that clients
really share server connections: anything a store leaves in a session (a prepared
statement, a setting, a role, a LISTEN) then reaches another client or is missing on the
next transaction. ``url(dbname)`` names a database through it, with ``pgbouncer=true``.
``start_pooler(server, pool_size=…)`` starts a private one (stopped by its ``stop()``).

PgBouncer refuses to run as root, so as root it runs as the server's account, like
PostgreSQL itself. Without the binary ``PoolerUnavailable`` says so, and fixtures turn that
into a visible skip (a failure under CI=true: scripts/test.sh installs it).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pgserver

POOL_SIZE = 2


class PoolerUnavailable(Exception):
    """No PgBouncer can be started here; the message says why."""


def find_pgbouncer() -> str | None:
    found = shutil.which("pgbouncer")
    if found:
        return found
    for candidate in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


class Pooler:
    def __init__(
        self, server: pgserver.PgServer, binary: str, *, pool_size: int, users: tuple[str, ...] = ("postgres",)
    ) -> None:
        self.server = server
        self.port = pgserver._free_port()
        self.base = Path(tempfile.mkdtemp(prefix="cuectl-pgbouncer-"))
        self.log = self.base / "pgbouncer.log"
        auth_file = self.base / "users.txt"
        # auth_type trust still wants each user listed.
        auth_file.write_text("".join(f'"{name}" ""\n' for name in users))
        ini = self.base / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server.port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {auth_file}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 1000\n"
            # A client waiting for a server connection fails after 20 s instead of hanging a test.
            "query_wait_timeout = 20\n"
            f"logfile = {self.log}\npidfile = {self.base / 'pgbouncer.pid'}\n"
        )
        kwargs: dict = {}
        account = server.account
        if account:
            os.chown(self.base, *account)
            for path in (auth_file, ini):
                os.chown(path, *account)
            kwargs = {"user": account[0], "group": account[1], "extra_groups": []}
        # It logs to stderr as well as to its logfile: a pipe nobody drains would fill and
        # stop it mid-write, so stderr goes to a file too.
        with open(self.base / "stderr.txt", "wb") as err:
            self.proc = subprocess.Popen([binary, str(ini)], stdout=subprocess.DEVNULL, stderr=err, **kwargs)
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = (self.base / "stderr.txt").read_text(errors="replace")[-1500:]
                log = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
                raise PoolerUnavailable(f"pgbouncer exited {self.proc.returncode}: {err.strip()} {log.strip()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise PoolerUnavailable("pgbouncer did not listen within 20 s")

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}?pgbouncer=true"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)


def start_pooler(
    server: pgserver.PgServer, *, pool_size: int = POOL_SIZE, users: tuple[str, ...] = ("postgres",)
) -> Pooler:
    binary = find_pgbouncer()
    if binary is None:
        raise PoolerUnavailable("no pgbouncer binary found (Debian: apt-get install pgbouncer)")
    return Pooler(server, binary, pool_size=pool_size, users=users)


_lock = threading.Lock()
_pooler: Pooler | None = None


def shared_pooler(server: pgserver.PgServer) -> Pooler:
    """The process's one pooler in front of ``server``, started on first use."""
    global _pooler
    with _lock:
        if _pooler is None:
            _pooler = start_pooler(server)
            atexit.register(_pooler.stop)
        return _pooler
