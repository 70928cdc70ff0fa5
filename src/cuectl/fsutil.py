"""Filesystem facts the store and the lease directory need: network filesystems, modes."""

from __future__ import annotations

import os
from pathlib import Path

# Filesystems whose POSIX/flock locks are not reliable across hosts (or at all): a SQLite
# file or a lease directory there could let two hosts believe they hold the same lock.
NETWORK_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "fuse.sshfs", "lustre", "gpfs", "ceph",
    "fuse.glusterfs", "glusterfs", "afs", "beegfs", "fuse.s3fs", "fuse.gcsfuse", "davfs",
})


def filesystem_type(path: Path, mounts_file: Path = Path("/proc/mounts")) -> str | None:
    """The type of the filesystem holding ``path`` (Linux ``/proc/mounts``), else None."""
    try:
        target = Path(path).resolve()
        while not target.exists() and target != target.parent:
            target = target.parent
        lines = mounts_file.read_text().splitlines()
    except OSError:
        return None
    best, best_type = "", None
    for row in lines:
        parts = row.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        inside = str(target) == mount_point or str(target).startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, parts[2]
    return best_type


def is_network_fs(path: Path, mounts_file: Path = Path("/proc/mounts")) -> str | None:
    """The network filesystem type under ``path``, or None when it is local (or unknown)."""
    fstype = filesystem_type(path, mounts_file)
    return fstype if fstype in NETWORK_FS_TYPES else None


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) readable by owner and group only (DESIGN §3)."""
    if path.is_dir():
        return
    old = os.umask(0o007)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o770)
    finally:
        os.umask(old)


def create_private_file(path: Path) -> None:
    """Create ``path`` with mode 0660 if it does not exist (sqlite copies it to -wal/-shm)."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o660)
    except FileExistsError:
        return
    os.close(fd)
