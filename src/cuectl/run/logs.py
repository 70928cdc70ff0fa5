"""Reading frame logs (``cuectl frame log [--follow]``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cuectl.errors import NotFound
from cuectl.sched import model as m
from cuectl.sched.store import Store


def stream_log(store: Store, frame_id: int, *, follow: bool = False, poll_s: float = 0.5,
               out=None) -> None:
    """Copy the frame's latest log to ``out``; with ``follow``, keep going while it runs."""
    out = out or sys.stdout
    frame = store.get_frame(frame_id)
    path = frame.get("log_path")
    if not path:
        raise NotFound(f"frame {frame_id} has no log yet (state {frame['state']})")
    log = Path(path)
    if not log.exists():
        raise NotFound(f"log {log} of frame {frame_id} does not exist on this machine",
                       hint="logs live on the worker host unless CUECTL_LOG_DIR is a shared directory")
    with log.open("r", errors="replace") as fh:
        while True:
            chunk = fh.read(65536)
            if chunk:
                out.write(chunk)
                out.flush()
                continue
            if not follow:
                return
            current = store.get_frame(frame_id)
            if current["state"] != m.RUNNING or current.get("log_path") != path:
                rest = fh.read()
                if rest:
                    out.write(rest)
                    out.flush()
                return
            time.sleep(poll_s)
