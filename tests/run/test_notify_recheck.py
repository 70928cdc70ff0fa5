"""A deliverer checks each notification's target again, whatever the stored row says, and
no delivery outlives its time limit (issue 35, item 8; docs/notifications.md). Rows are
written straight into a real SQLite store, as a hand-edited store (or a role that could
write rows) would; a real Deliverer delivers them. Network: 127.0.0.1 only."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import sqlite3
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from cuectl.errors import InvalidInput
from cuectl.run import launch, notify
from cuectl.sched import notify as nt
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import notifications as notes
from cuectl.sched.store import open_store


@pytest.fixture
def store(tmp_path: Path) -> Iterator:
    s = open_store(str(tmp_path / "q.db"))
    yield s
    s.close()


def add_rows(store, tmp_path: Path, targets: list[tuple[str, str]]) -> int:
    """A job, and one due ``finished`` row per (kind, target), written into the file directly."""
    job = store.submit(
        spec_from_mapping({"name": "j", "layers": [{"name": "l", "command": ["true"]}]}, user="alice"), now=1.0
    )
    with sqlite3.connect(tmp_path / "q.db") as db:
        for kind, target in targets:
            db.execute(
                "INSERT INTO notifications(job_id, event, frame_id, target, created_at, attempts, next_at) "
                "VALUES (?, 'finished', 0, ?, 1, 0, 1)",
                (job, json.dumps({"kind": kind, "target": target}, sort_keys=True, separators=(",", ":"))),
            )
    return job


def deliver(store) -> tuple[tuple[int, int], dict[str, dict]]:
    """One `admin notify deliver` pass: (delivered, failed) and the rows by (whole) target."""
    counts = notify.Deliverer(store, deliverer_id="t:1").run_once(store.clock())
    return counts, {
        r["target"]: r for r in (notes.row_json(row, mask=False) for row in store._read("SELECT * FROM notifications"))
    }


class Listener:
    """A TCP port on 127.0.0.1 that accepts nothing itself: ``connected()`` says whether
    anyone knocked (an ftp:// delivery would)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    def connected(self) -> bool:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True


class FifoWatch:
    """Whether anyone opened ``path`` (a FIFO) for reading: a writer's non-blocking open
    succeeds only then, and lets that reader go on (it reads end of file)."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path, self.opened, self.stop = path, False, threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.wait(0.01):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO  # no reader
                continue
            self.opened = True
            os.close(fd)

    def close(self) -> bool:
        self.stop.set()
        self.thread.join(5)
        return self.opened


def test_a_webhook_row_that_is_no_http_url_is_never_opened(store, tmp_path):
    """Before: urllib opened file:// (a FIFO hung the delivery thread for good, and with it
    a worker's drain), ftp:// and data: URLs, and a path was no error until urlopen."""
    fifo = FifoWatch(tmp_path / "fifo")
    ftp = Listener()
    targets = [
        f"file://{fifo.path}",
        str(fifo.path),
        f"ftp://127.0.0.1:{ftp.port}/x",
        "data:,hello",
        "gopher://127.0.0.1/",
        "http://127.0.0.1:9/a\x01b",
    ]
    add_rows(store, tmp_path, [("webhook", t) for t in targets])
    started = time.monotonic()
    (delivered, failed), rows = deliver(store)
    assert time.monotonic() - started < 5
    assert not fifo.close(), "the FIFO was opened"
    assert not ftp.connected(), "something connected to the ftp:// port"
    assert (delivered, failed) == (0, len(targets))
    for target in targets:
        error = rows[target]["error"]
        assert "refused at delivery" in error and "is not an http:// or https:// URL" in error, error
        assert "gave up" in error  # never due again: the row cannot change
    assert all(r["next_at"] == notes.NEVER for r in rows.values())


class Redirecting:
    """An HTTP server on 127.0.0.1: POST /to-ftp answers 302 to ftp://…, /to-here 302 to
    /landed on itself; it records the paths it was asked for."""

    def __init__(self, ftp_port: int) -> None:
        self.paths: list[str] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                me.paths.append(self.path)
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/landed":
                    self.send_response(200)
                else:
                    self.send_response(302)
                    self.send_header(
                        "Location", f"ftp://127.0.0.1:{ftp_port}/x" if self.path == "/to-ftp" else "/landed"
                    )
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = _answer  # noqa: N815 - http.server's names

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_redirect_to_another_scheme_is_not_followed(store, tmp_path):
    """urllib follows a redirect to ftp:// (not file://); a redirect to http(s) still works."""
    ftp = Listener()
    server = Redirecting(ftp.port)
    try:
        add_rows(store, tmp_path, [("webhook", f"{server.base}/to-ftp"), ("webhook", f"{server.base}/to-here")])
        (delivered, failed), rows = deliver(store)
    finally:
        server.close()
    assert not ftp.connected(), "the redirect to ftp:// was followed"
    assert (delivered, failed) == (1, 1)
    refused = rows[f"{server.base}/to-ftp"]
    assert refused["delivered_at"] is None and "HTTP 302" in refused["error"]
    assert "not followed (only http:// and https://)" in refused["error"]
    assert rows[f"{server.base}/to-here"]["delivered_at"] is not None
    # (the two deliveries run at once, in either order; the redirect follows its own)
    assert sorted(server.paths) == ["/landed", "/to-ftp", "/to-here"]
    assert server.paths.index("/to-here") < server.paths.index("/landed")


@pytest.mark.parametrize(
    "address",
    [
        "lead@studio.example\nBcc: spy@evil.example",
        "a@b.example\r\nBcc: c@d.example",
        "a@b.example\rBcc: c@d.example",
        "a@b.example\x85Bcc: c@d.example",
        "a\x7f@b.example",
        "a@b.example\u2028Bcc: c@d.example",
    ],
)
def test_an_email_address_that_would_add_a_header_is_refused(store, tmp_path, monkeypatch, address):
    """Before: the address went into the To: line that `sendmail -t` reads recipients from,
    so a row's `\\nBcc: …` mailed someone else."""
    mailbox = tmp_path / "mailbox"
    sendmail = tmp_path / "sendmail"
    sendmail.write_text(f"#!/bin/sh\ncat >> {mailbox}\n")
    sendmail.chmod(0o755)
    monkeypatch.setenv("CUECTL_SENDMAIL", str(sendmail))
    add_rows(store, tmp_path, [("email", address), ("email", "fine@studio.example")])
    (delivered, failed), rows = deliver(store)
    assert (delivered, failed) == (1, 1)
    assert mailbox.read_text().count("\nSubject: ") == 1 and "Bcc" not in mailbox.read_text()
    assert "refused at delivery" in rows[address]["error"] and "not an email address" in rows[address]["error"]
    with pytest.raises(InvalidInput, match="not an email address"):  # nor is it taken at submit
        nt.check_target("email", address, "--notify-email")


def test_submit_refuses_a_control_character_in_an_address_with_one_error_line(cli):
    res = cli("submit", "--name", "x", "--notify-email", "a\x7f@b.example", "--", "true")
    assert res.exit_code == 2
    assert res.stderr.startswith("error: --notify-email: ") and res.stderr.count("\n") == 1, res.stderr
    res = cli("submit", "--name", "x", "--notify-webhook", "http://h.example/\x1b[2J", "--", "true")
    assert res.exit_code == 2 and res.stderr.startswith("error: --notify-webhook: "), res.stderr


def test_a_hook_whose_leftovers_hold_its_output_cannot_hold_the_deliverer(store, tmp_path, monkeypatch):
    """The hook exits at once, leaving a process in a session of its own that keeps its
    stdout: the try times out and is recorded, the deliverer holds nothing in flight (a
    worker's drain waits for that). Before: after killing the hook's group it read the
    output to the end, as long as the leftover lived."""
    monkeypatch.setattr(notify, "COMMAND_TIMEOUT_S", 1.0)
    pidfile = tmp_path / "leftover.pid"
    add_rows(store, tmp_path, [("command", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & exit 0")])
    deliverer = notify.Deliverer(store, deliverer_id="t:1")
    started = time.monotonic()
    try:
        assert deliverer.run_once(store.clock()) == (0, 1)
        assert time.monotonic() - started < 15
        assert deliverer.inflight == {}
        [row] = store.list_notifications()
        assert row["error"] == "command timed out after 1 s", row
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


def test_an_overdue_delivery_is_recorded_and_let_go(store, tmp_path, monkeypatch):
    """A try still running past its kind's limit (a webhook whose server trickles an answer,
    a name lookup that hangs) counts as failed; its thread is left behind."""
    release = threading.Event()
    monkeypatch.setattr(notify, "_LIMIT_S", {**notify._LIMIT_S, "webhook": 0.2})
    monkeypatch.setattr(notify, "_MARGIN_S", 0.1)
    monkeypatch.setattr(notify, "_post", lambda url, body, row: release.wait(30) and None)
    add_rows(store, tmp_path, [("webhook", "http://127.0.0.1:9/slow")])
    deliverer = notify.Deliverer(store, deliverer_id="t:1")
    try:
        deliverer.step(store.clock(), force=True)
        assert len(deliverer.inflight) == 1
        time.sleep(0.5)
        deliverer.step(store.clock(), claim=False)  # as a draining worker's loop does
        assert deliverer.inflight == {}
        [row] = store.list_notifications()
        assert row["delivered_at"] is None
        assert row["error"] == "no result within 0.2 s (abandoned: it may still complete)"
    finally:
        release.set()


# -- as root: a hook enters its directory only as its user ----------------------------------------
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")


@ROOT_ONLY
def test_a_hook_enters_its_directory_as_its_user(os_users):
    """Before: subprocess changed into the user's home directory as root, then dropped to
    the user, so a home (the passwd entry's) in a directory she may not enter was entered."""
    (alice,) = os_users("alice")
    top = Path(tempfile.mkdtemp(prefix="cuectl-hookdir-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        (top / "open").mkdir(mode=0o755)
        (top / "shut").mkdir(mode=0o700)  # root's
        run_as = launch.RunAs.lookup(alice.name)
        for where, expect in (("open", str(top / "open")), ("shut", "/")):
            code, out = notify._run_child(
                ["/bin/sh", "-c", "pwd; id -u"],
                stdin=b"",
                env={"PATH": os.defpath},
                timeout=10,
                run_as=run_as,
                cwd=str(top / where),
            )
            assert code == 0 and out.split() == [expect, str(alice.uid)], (where, out)
    finally:
        import shutil

        shutil.rmtree(top, ignore_errors=True)
