"""This process's children, and becoming their subreaper (Linux), with nothing imported
but ``os`` and ``sys``: ``cuectl run``'s fast path uses these without loading the frame
launcher (``cuectl.run.launch``), which builds on them."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)``: orphaned descendants are re-parented to this
    process instead of init. False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        prctl = _prctl()
        return bool(prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError, TypeError):
        return False


def _prctl() -> Any:
    """libc's ``prctl``, taking five unsigned longs and returning an int (cuectl.run.libc:
    ``import ctypes`` would cost ~3 ms of a ~25 ms ``cuectl run -- true``)."""
    from cuectl.run import libc

    return libc.function("prctl", "LLLLL", "i")


def become_subreaper() -> bool:
    """``launch.become_subreaper()`` where the frame launcher is loaded (it keeps the flag
    its frames look at), else the bare prctl: no need to load it for this."""
    if "cuectl.run.launch" in sys.modules:
        from cuectl.run import launch

        return launch.become_subreaper()
    return set_child_subreaper()


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
        try:  # os.open/os.read: a third of what the io layers of open() cost (~20 µs a frame)
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            data = b""
            while chunk := os.read(fd, 65536):
                data += chunk
            kids.update(int(x) for x in data.split())
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
    return kids
