"""This process's children, and becoming their subreaper (Linux), with nothing imported
but ``os`` and ``sys``: ``cuectl run``'s fast path uses these without loading the frame
launcher (``cuectl.run.launch``), which builds on them."""

from __future__ import annotations

import os
import sys

_PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphaned descendants are re-parented to this
    process instead of init. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
                          ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):
        return False


def own_children(*, all_threads: bool = False) -> set[int]:
    """Direct children of this process (``/proc/PID/task/TID/children``; empty where that
    cannot be read).

    By default only the main thread's: the kernel re-parents orphans to a subreaper's
    main thread while it lives, and the worker starts its frames from it — one small read
    per frame end instead of a directory scan (this runs on the per-frame path)."""
    pid = os.getpid()
    tids = [str(pid)]
    if all_threads:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return set()
    kids: set[int] = set()
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                kids.update(int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue
    return kids
