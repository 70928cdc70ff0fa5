"""A worker's SIGTERM drain ends whatever its notifications' servers do (issue 35, item 8):
a real `cuectl worker` delivers webhooks to servers on 127.0.0.1 that accept and never
finish an answer, is told to stop, and exits once each delivery's time limit is over."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest


class Stalling:
    """A server on 127.0.0.1 that reads a request and never finishes its answer:
    ``trickle`` sends a status line and then one header byte every half second, which no
    socket timeout ever sees as silence; otherwise it says nothing at all."""

    def __init__(self, *, trickle: bool) -> None:
        self.trickle = trickle
        self.requests = 0
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                if conn.recv(65536):
                    self.requests += 1
                if self.trickle:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
                while not self.stop.wait(0.5):
                    if self.trickle:
                        conn.sendall(b"a")
            except OSError:
                pass

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def stalling():
    servers = [Stalling(trickle=True), Stalling(trickle=False)]
    yield servers
    for s in servers:
        s.close()


def test_sigterm_drain_ends_although_webhooks_never_answer(farm, stalling):
    """Before: the trickled answer kept its delivery thread reading for good (urllib's
    timeout bounds each read, not the answer), and a draining worker waits for its
    deliveries: it never exited."""
    trickle, silent = stalling
    job = farm.submit(
        {
            "name": "stall",
            "notify": [{"webhook": trickle.url}, {"webhook": silent.url}],
            "layers": [{"name": "l", "command": ["true"]}],
        }
    )
    worker = farm.start_worker(None)
    farm.wait_for(lambda: trickle.requests and silent.requests, timeout=60, what="both webhooks to be called")
    worker.send_signal(signal.SIGTERM)
    started = time.monotonic()
    out, err = worker.communicate(timeout=90)
    took = time.monotonic() - started
    assert worker.returncode == 0, err
    # The silent server: a read timed out (10 s). The trickling one: the try's limit (10 s)
    # and its margin (10 s) from its start, then it is recorded as failed and let go.
    assert took < 40, took
    rows = {
        r["target"]: r
        for r in json.loads(farm.cuectl("admin", "notify", "history", "--job", str(job), "--json").stdout)[
            "notifications"
        ]
    }
    slow, quiet = (rows[s.url.rsplit("/", 1)[0] + "/***"] for s in (trickle, silent))
    assert slow["delivered_at"] is None and slow["attempts"] == 1
    assert slow["error"] == "no result within 10 s (abandoned: it may still complete)", slow
    assert quiet["delivered_at"] is None and quiet["attempts"] == 1 and "timed out" in quiet["error"], quiet
    assert "hook" not in quiet["error"]  # the URL is masked in errors too (it may hold a token)
