"""Filesystem facts the store and the lease directory need: network filesystems, modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Filesystems whose POSIX/flock locks are not reliable across hosts (or at all): a SQLite
# file or a lease directory there could let two hosts believe they hold the same lock.
NETWORK_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "fuse.sshfs",
        "lustre",
        "gpfs",
        "ceph",
        "fuse.glusterfs",
        "glusterfs",
        "afs",
        "beegfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "davfs",
    }
)


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
    """Create ``path`` (and parents) readable by owner and group only (DESIGN §3).

    In a setgid directory (a group's shared queue) the new directories inherit the group
    and the setgid bit (the kernel does that) and are made ``2770`` whatever the umask, so
    every member can create the store's ``-wal``/``-shm`` files there."""
    if path.is_dir():
        return
    old = os.umask(0o007)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o770)
    finally:
        os.umask(old)
    try:
        if path.parent.stat().st_mode & stat.S_ISGID:
            os.chmod(path, 0o2770)
    except OSError:
        pass


def in_group_dir(path: Path) -> bool:
    """Whether ``path``'s directory is setgid: files made there belong to its group, which
    is how cuectl recognises a store shared by a group (docs/security.md)."""
    try:
        return bool(os.stat(path.parent).st_mode & stat.S_ISGID)
    except OSError:
        return False


def create_private_file(path: Path) -> None:
    """Create ``path`` with mode 0660 minus the umask if it does not exist; in a setgid
    directory exactly ``0660`` (group-writable whatever the umask: a group store that other
    members cannot write is useless). SQLite gives ``-wal``/``-shm`` the database's mode."""
    try:
        _create_exclusive(path)
    except FileExistsError:
        return


def _create_exclusive(path: Path) -> None:
    """Create ``path`` (never replacing or following anything) with the modes above;
    FileExistsError if anything is there."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0), 0o660)
    try:
        if in_group_dir(path):
            os.fchmod(fd, 0o660)
    finally:
        os.close(fd)


def create_unique_file(directory: Path, prefix: str, suffix: str) -> Path:
    """A new file ``<prefix><random><suffix>`` in ``directory``, created exclusively (it
    never replaces or follows anything), with the modes of :func:`create_private_file`."""
    import secrets

    for _ in range(100):
        path = Path(directory) / f"{prefix}{secrets.token_hex(6)}{suffix}"
        try:
            _create_exclusive(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"cannot create a temporary file in {directory}")


def who_can_write(path: Path) -> tuple[str, str | None]:
    """Who may write ``path``, as far as this user can see: ("group G can write it", G),
    else ("only its owner U can write it", None). When ``path`` cannot be looked at, the
    deepest directory above it that can is described instead."""
    import grp
    import pwd

    target = Path(path)
    while True:
        try:
            st = os.stat(target)
            break
        except OSError:
            if target.parent == target:
                return "it cannot be looked at", None
            target = target.parent
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    if st.st_mode & stat.S_IWGRP:
        return f"group {group} can write it", group
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    return f"only its owner {owner} can write it", None


def store_permission_problems(path: Path) -> list[str]:
    """What keeps the users meant to share a SQLite store from using it, each with its fix.

    A store in a setgid directory is a group's store (docs/security.md): the directory must
    be group-writable (SQLite creates ``-wal``/``-shm`` there) and the database and its
    ``-wal``/``-shm`` must belong to the directory's group and be group-writable — else
    other members get "attempt to write a readonly database". Any store: nothing may be
    accessible to every user."""
    import grp

    path = Path(path)
    problems: list[str] = []
    try:
        dir_st = os.stat(path.parent)
    except OSError:
        return problems
    files = [path] + [path.with_name(path.name + s) for s in ("-wal", "-shm")]
    present = []
    for file in files:
        try:
            present.append((file, os.stat(file)))
        except OSError:
            continue
    for file, st in present:
        if st.st_mode & 0o007:
            problems.append(
                f"{file} is mode {stat.S_IMODE(st.st_mode):o}: every user can get at it (chmod o-rwx {file})"
            )
    if not dir_st.st_mode & stat.S_ISGID:
        return problems
    try:
        group = grp.getgrgid(dir_st.st_gid).gr_name
    except KeyError:
        group = str(dir_st.st_gid)
    if dir_st.st_mode & 0o070 != 0o070:
        problems.append(
            f"group store: directory {path.parent} is mode {stat.S_IMODE(dir_st.st_mode):o}, so members "
            f"of {group} cannot create the store's -wal/-shm files (chmod g+rwx {path.parent})"
        )
    for file, st in present:
        if st.st_gid != dir_st.st_gid:
            problems.append(f"group store: {file} belongs to another group than {group} (chgrp {group} {file})")
        if st.st_mode & 0o060 != 0o060:
            problems.append(
                f"group store: {file} is mode {stat.S_IMODE(st.st_mode):o}, so other members of {group} "
                f'get "attempt to write a readonly database" (chmod g+rw {file})'
            )
    return problems
