"""Devices out of service for leases (docs/gpu-health.md): ``cuectl run`` and
``cuectl.lease()`` never take a device its worker has drained or found lost.

Leases are local (kernel locks, no store), so the worker keeps beside its locks what it
keeps out of service: ``<lock dir>/out-of-service/<uuid>``, one file per device, holding
the reason. It writes the files its own devices need and removes them when the devices
come back (``publish``). A lease reads them (``read``) and treats those devices as busy.

Only files and a directory owned by a trusted owner count (``lockfile.trusted_owners``:
root, the service account, the reader herself): in a shared lock directory (mode 1777)
another user could otherwise keep everybody off a device by making such a file. Quick
paths only ask whether the directory has any entry (``any_present``) and leave a lease to
the full path when it has.
"""

from __future__ import annotations

import os
import stat

DIRNAME = "out-of-service"
_MAX_BYTES = 4096


def _trusted(st: os.stat_result) -> bool:
    from cuectl.run.lockfile import trusted_owners

    return st.st_uid in trusted_owners()


def any_present(lock_dir: str | os.PathLike[str]) -> bool:
    """Is any device of this lock directory out of service (a cheap look, no parsing)?"""
    try:
        return bool(os.listdir(os.path.join(lock_dir, DIRNAME)))
    except OSError:
        return False


def read(lock_dir: str | os.PathLike[str]) -> dict[str, str]:
    """uuid -> why, for the devices out of service (those trusted files say so)."""
    where = os.path.join(lock_dir, DIRNAME)
    try:
        st = os.stat(where, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or not _trusted(st):
            return {}
        names = os.listdir(where)
    except OSError:
        return {}
    out: dict[str, str] = {}
    for name in names:
        if name.startswith("."):
            continue
        try:
            fd = os.open(os.path.join(where, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and _trusted(st):
                text = os.read(fd, _MAX_BYTES).decode("utf-8", "replace")
                out[name] = " ".join("".join(c if c.isprintable() else " " for c in text).split())[:200]
        except OSError:
            pass
        finally:
            os.close(fd)
    return out


def publish(lock_dir: str | os.PathLike[str], owned: set[str] | frozenset[str], out: dict[str, str]) -> bool:
    """Make the directory say ``out`` (uuid -> why) for the devices in ``owned`` (this
    worker's): files written for those out, removed for the others. Best effort (False:
    the directory could not be made or is not trustworthy; leases then do not know)."""
    where = os.path.join(lock_dir, DIRNAME)
    try:
        os.mkdir(where, 0o755)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = os.stat(where, follow_symlinks=False)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False  # someone else's: never written into
    ok = True
    for uuid in owned:
        if "/" in uuid or uuid.startswith("."):
            continue
        path = os.path.join(where, uuid)
        try:
            if uuid in out:
                tmp = os.path.join(where, f".{uuid}.{os.getpid()}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                try:
                    os.write(fd, out[uuid].encode("utf-8")[:_MAX_BYTES])
                finally:
                    os.close(fd)
                os.replace(tmp, path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            ok = False
    return ok
