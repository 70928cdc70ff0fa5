"""Driving a store as a worker would, for tests that need frames to finish without one."""

from __future__ import annotations

import time
from pathlib import Path

from cuectl.sched.store import FrameResult, open_store


def finish_all(db: Path | str, exit_code: int = 0) -> None:
    """Claim and complete every runnable frame through the store API, each with ``exit_code``."""
    store = open_store(str(db))
    try:
        while True:
            claimed = None
            for layer in store.runnable_layers():
                claimed = store.claim_frame(layer.layer_id, host="h", worker="h-w", gpu_uuids=[], now=time.time(),
                                            lease_s=60.0)
                if claimed:
                    break
            if claimed is None:
                return
            now = time.time()
            store.complete_frame(claimed.frame_id, claimed.attempt,
                                 FrameResult(exit_code=exit_code, started_at=now, ended_at=now), now=now)
    finally:
        store.close()
