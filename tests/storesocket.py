"""A real ``cuectl serve --socket`` server in a thread of the test process, for tests that
reach a store through its socket (``unix:PATH``): the same app, uvicorn and peer-credential
protocol as the command, started in a fraction of a second."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def serving(db_url: str, sock: Path, *, frame_limit: int | None = None) -> Iterator[str]:
    """Serve the store ``db_url`` on the Unix socket ``sock``; yield its ``unix:`` URL."""
    import uvicorn

    from cuectl.serve.app import Settings, create_app
    from cuectl.serve.server import _peer_protocol

    app = create_app(Settings(db_url=db_url, cache_s=0, frame_limit=frame_limit))
    config = uvicorn.Config(
        app,
        uds=str(sock),
        http=_peer_protocol(),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
    thread = threading.Thread(target=server.run, name="store-socket", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not _answers(sock):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the store server on {sock} did not start")
        time.sleep(0.01)
    try:
        yield f"unix:{sock}"
    finally:
        server.should_exit = True
        thread.join(10)


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def new_served_store(db_path: Path) -> Iterator[str]:
    """Make a SQLite store at ``db_path`` (as the service does; users reach it through the
    socket) and serve it on a socket in a short directory of its own; yields its URL."""
    from cuectl.sched.store import open_store

    open_store(str(db_path), create=True).close()
    short = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))  # a socket's path is at most 107 bytes
    try:
        with serving(str(db_path), short / "api.sock") as url:
            yield url
    finally:
        shutil.rmtree(short, ignore_errors=True)
