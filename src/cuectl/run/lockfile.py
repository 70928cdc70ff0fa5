"""One device lock file: open it safely, lock it, write the holder's record into it; and
who may make lock files in a lock directory, and which lock directories a process trusts.

The primitives under ``cuectl.run.lease.locks`` (which adds lock directories, ``DeviceLock``
and reading records back), kept to ``os``, ``fcntl`` and ``stat`` so that ``cuectl run``'s
quick path (``cuectl.run.quick``) takes and records a lease exactly as every other holder
does, without loading ``json``, ``re`` or ``pathlib`` (each a few ms of its process).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time

from cuectl import config
from cuectl.errors import LeaseError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

# Any user must be able to open a lock file to lock the same device; the flock, not the
# mode, gives exclusivity. The record inside is not secret (pid, label, user).
LOCK_FILE_MODE = 0o666
#: Never follow a symlink planted in the shared directory; never leak an fd into a child;
#: never wait in open(2) for a FIFO planted there (its reader would block until a writer
#: came: any user could hang every lease of the machine, root's too). On a regular file
#: O_NONBLOCK changes nothing.
OPEN_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


# ============================================================================ who may make lock files
#
# A lock file is safe only while nobody but its holder's peers can delete or rename it:
# a user who deletes the file of a device another process holds lets the next comer lock
# a *new* file of the same name and use the device at the same time (issue 35). In a
# sticky directory a file can be removed by its owner and by the directory's owner, so
# lock files must belong to the lock directory's owner (or root), and only they make them:
#
# - a user's own lock directory (she made it, e.g. /dev/shm/cuectl-locks on her
#   workstation): she makes the lock files as she leases, as before;
# - a shared one (root's, or the service account's: CUECTL_SERVICE_USER): root or the
#   owner makes a lock file for every device it sees (``ensure_lock_file``), every other
#   user only opens them — a missing one is an error naming the fix, never a file of hers.
#
# A lock file that belongs to anyone else (made by hand, or by an older cuectl) is taken
# over by root (``fchown``: the same inode, so a holder keeps its lock) and refused by
# everyone else.

#: Lock directories this process has checked (``check_lock_dir``): path text -> owner uid.
_OWNERS: dict[str, int] = {}


def lock_dir_owner(lock_dir: str, *, recheck: bool = False) -> int:
    """The owner of ``lock_dir``, checked (``check_lock_dir``) once per process, or again
    when ``recheck`` (``prepare_lock_dir``, which checks each directory once anyway)."""
    owner = None if recheck else _OWNERS.get(lock_dir)
    if owner is None:
        owner = _OWNERS[lock_dir] = check_lock_dir(lock_dir)
    return owner


def service_uid() -> int | None:
    """The uid of ``CUECTL_SERVICE_USER`` (a name, or a uid for an account without one,
    as a container's); None when unset or unknown."""
    name = config.service_user()
    if not name:
        return None
    import pwd  # here: only a machine with a service account pays for it

    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return int(name) if name.isdigit() else None


def trusted_owners() -> frozenset[int]:
    """Who may own a lock directory this process leases in, and every directory on the
    way to it: root, the service account, and — but for root, which leases for everyone —
    this process's own user (her own lock directory)."""
    euid = os.geteuid()
    found = {0, euid}
    service = service_uid()
    if service is not None:
        found.add(service)
    return frozenset(found)


def shares(owner: int) -> bool:
    """Is a lock directory of ``owner`` shared by several users (root's or the service
    account's), rather than one user's own?"""
    return owner == 0 or owner == service_uid()


def makes_lock_files(owner: int) -> bool:
    """May this process make lock files in a lock directory of ``owner``? Its owner may,
    and root (for the owner); nobody else."""
    euid = os.geteuid()
    return euid == 0 or euid == owner


def check_lock_dir(lock_dir: str) -> int:
    """Check that no other user can swap, empty or take over ``lock_dir``; its owner's uid.

    Root (a root worker, `cuectl run`, ``cuectl.lease()``) leases only in a real directory
    (not a symbolic link) of root's or the service account's, writable by nobody else
    unless sticky, reached through directories and links that only they can change: it
    leases for every user, and a lock directory another user controls lets that user
    break every lease of the machine. Anyone else accepts a directory of root's, the
    service account's or their own (as before: a user's own lock directory). Raises
    ``LeaseError`` naming what is wrong and how to set it up."""
    trusted = trusted_owners()
    if os.geteuid() == 0:
        problem = unsafe_path(lock_dir, trusted)
        if problem is not None:
            raise LeaseError(
                f"lock directory {lock_dir} is not safe for a root cuectl: {problem}", hint=ROOT_SETUP_HINT
            )
    try:
        st = os.stat(lock_dir)
    except OSError as exc:
        raise LeaseError(
            f"cannot use lock directory {lock_dir}: {exc.strerror or exc}",
            hint="set CUECTL_LOCK_DIR or --lock-dir to a local directory",
        ) from None
    problem = dir_problem(lock_dir, st, trusted)
    if problem is None:
        return st.st_uid
    if st.st_uid not in trusted:
        raise LeaseError(
            f"lock directory {lock_dir} belongs to {user_name(st.st_uid)}, who could delete the lock "
            f"file of a device you hold and let another process lease it too",
            hint=USER_SETUP_HINT,
        )
    raise LeaseError(f"lock directory {problem}", hint=f"chmod 1777 {lock_dir}")


ROOT_SETUP_HINT = (
    "root leases only in a directory that root (or CUECTL_SERVICE_USER) owns, on a path no other user "
    "can change: `install -d -m 1777 /run/cuectl/locks` (deploy/systemd/cuectl-tmpfiles.conf), "
    "which every cuectl then uses, or CUECTL_LOCK_DIR / --lock-dir naming such a directory"
)
USER_SETUP_HINT = (
    "one lock directory for every user of a machine is made by root: `sudo install -d -m 1777 "
    "/run/cuectl/locks` (deploy/systemd/cuectl-tmpfiles.conf), which every cuectl then uses; "
    "or set CUECTL_LOCK_DIR / --lock-dir to a directory of your own (docs/leases.md)"
)


def dir_problem(path: str, st: os.stat_result, trusted: frozenset[int]) -> str | None:
    """What lets a user outside ``trusted`` change the directory ``path`` (``st``: its
    stat): its owner, or write access without the sticky bit; None when nothing does."""
    if st.st_uid not in trusted:
        return f"{path} belongs to {user_name(st.st_uid)}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        who = "everyone" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{path} is writable by {who} but not sticky: any of them could delete a held lock file"
    return None


def unsafe_path(lock_dir: str, trusted: frozenset[int]) -> str | None:
    """Why a user outside ``trusted`` could change what ``lock_dir`` names — it is a
    symbolic link, or it or a directory or link on the way belongs to such a user or is
    writable by one without the sticky bit — or None. Walks the path as the kernel
    resolves it (a link on the way, if ``trusted`` owns it, is followed and its target
    checked). A part that does not exist yet is one this process is about to make."""
    path = lock_dir if lock_dir.startswith("/") else os.path.join(os.getcwd(), lock_dir)
    todo = [part for part in reversed(path.split("/")) if part not in ("", ".")]  # a stack: next part last
    here = "/"
    problem = dir_problem(here, os.lstat(here), trusted)
    hops = 0
    while problem is None and todo:
        part = todo.pop()
        if part == "..":
            here = os.path.dirname(here)  # ``here`` has no link left in it: its parent was checked
            continue
        step = os.path.join(here, part)
        try:
            st = os.lstat(step)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"{step} cannot be examined ({exc.strerror or exc})"
        if not stat.S_ISLNK(st.st_mode):
            problem = dir_problem(step, st, trusted)
            here = step
        elif not todo:
            problem = f"it is a symbolic link (to {os.readlink(step)})"
        elif st.st_uid not in trusted:
            problem = f"{step} is a symbolic link of {user_name(st.st_uid)}"
        elif hops >= 40:
            problem = f"{step}: too many levels of symbolic links"
        else:
            hops += 1
            target = os.readlink(step)
            if target.startswith("/"):
                here = "/"
            todo.extend(part for part in reversed(target.split("/")) if part not in ("", "."))
    return problem


def user_name(uid: int) -> str:
    """``alice (uid 1001)``, or ``uid 1001`` for a uid without a name."""
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def open_lock_file(path: str | os.PathLike[str], owner: int | None = None) -> tuple[int, bool]:
    """Open a lock file; returns (fd, writable). ``owner``: its lock directory's owner
    (``lock_dir_owner``; looked up when None).

    The file usually exists (it is never deleted): open it first and create it only when
    missing — an exception per lease costs more than the rest of the open. Only the lock
    directory's owner or root creates one (``makes_lock_files``); anyone else is told who
    does (``missing_lock_file_error``).
    """
    for _ in range(5):
        try:
            return os.open(path, os.O_RDWR | OPEN_FLAGS), True
        except FileNotFoundError:
            pass
        except PermissionError:
            try:
                # Another user's file we may not write (made by a umask-less tool): flock
                # works on a read-only fd, only the record cannot be written.
                return os.open(path, os.O_RDONLY | OPEN_FLAGS), False
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise lock_file_error(path, exc) from None
        except OSError as exc:
            raise lock_file_error(path, exc) from None
        if owner is None:
            owner = lock_dir_owner(os.path.dirname(os.fspath(path)))
        if not makes_lock_files(owner):
            raise missing_lock_file_error(os.fspath(path), owner)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, LOCK_FILE_MODE)
        except FileExistsError:
            continue  # created between the two opens: open it again
        except OSError as exc:
            raise lock_file_error(path, exc) from None
        _hand_over(fd, owner, os.geteuid())
        return fd, True
    raise LeaseError(f"lock file {path} keeps disappearing; is something cleaning the lock directory?")


def _hand_over(fd: int, owner: int, uid: int) -> None:
    """Make the lock file ``fd`` (now of ``uid``) openable by every user and ``owner``'s:
    whatever the umask, other users must open it to lock the same device; and a file of
    root's in the service account's directory, or one a user made, is the owner's."""
    os.fchmod(fd, LOCK_FILE_MODE)
    if uid != owner and os.geteuid() == 0:
        os.fchown(fd, owner, -1)


def ensure_lock_file(path: str, owner: int) -> None:
    """See that the lock file at ``path`` exists and belongs to ``owner`` or root, as far
    as this process may (``makes_lock_files``; only root takes over another user's file).
    Best effort: what is left wrong (a FIFO, a link, a file nobody here may take over) is
    refused, by name, by the lease that would use it."""
    if not makes_lock_files(owner):
        return
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
        except FileNotFoundError:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | OPEN_FLAGS, LOCK_FILE_MODE)
            except FileExistsError:
                continue
            except OSError:
                return
            try:
                _hand_over(fd, owner, os.geteuid())
            finally:
                os.close(fd)
            return
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid in (owner, 0) or os.geteuid() != 0:
                return
            _hand_over(fd, owner, st.st_uid)
            if _same_file(st, path):
                return  # ours now: its maker can no longer remove it
            # It was replaced before we took it over: look at the new one.
        except OSError:
            return
        finally:
            os.close(fd)


def _same_file(st: os.stat_result, path: str | os.PathLike[str]) -> bool:
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (there.st_dev, there.st_ino)


def makers(owner: int) -> str:
    """Who makes lock files in a shared lock directory of ``owner``, in words."""
    return "root" if owner == 0 else f"{user_name(owner)} or root"


def setup_command(lock_dir: str) -> str:
    """What sets a shared lock directory up: any root cuectl that sees the devices (a root
    worker, `cuectl run`, `admin lease setup`, which waits for no lease)."""
    return f"start the cuectl worker service, or run `sudo cuectl admin lease setup --lock-dir {lock_dir}` once"


def missing_lock_file_error(path: str, owner: int) -> LeaseError:
    return LeaseError(
        f"lock file {path} does not exist yet, and in this shared lock directory only {makers(owner)} "
        f"makes lock files (so that no user can delete one a lease holds): "
        f"{setup_command(os.path.dirname(path))}",
        hint="root makes the lock file of every device it sees (docs/leases.md)",
    )


def untrusted_lock_file_error(path: str, uid: int, owner: int) -> LeaseError:
    if makes_lock_files(owner):  # this user's own directory: she may remove it
        hint = f"remove it while nobody holds it (`fuser -v {path}` lists the holders); cuectl makes a new one"
    else:
        hint = f"a root cuectl takes it over: {setup_command(os.path.dirname(path))}"
    return LeaseError(
        f"lock file {path} belongs to {user_name(uid)}, not to the lock directory's owner "
        f"({user_name(owner)}) or root: its owner could delete it while you hold it, and another "
        "process would lease the device too",
        hint=hint,
    )


def lock_file_error(path: str | os.PathLike[str], exc: OSError) -> LeaseError:
    if exc.errno == errno.ELOOP:
        return LeaseError(
            f"lock file {path} is a symbolic link; refusing to follow it",
            hint="remove it; lock files are plain files created by cuectl",
        )
    return LeaseError(
        f"cannot open lock file {path}: {exc.strerror or exc}",
        hint="its owner can `chmod 666` it; lock files must be openable by every user",
    )


def held_file_size(fd: int, path: str | os.PathLike[str], owner: int) -> int | None:
    """The size of the lock file ``fd`` we just locked, once it is known to guard the
    device: still the file at ``path`` (None when it was unlinked or replaced meanwhile:
    lock again), a regular file, and ``owner``'s or root's (root takes over anyone else's;
    anyone else refuses it). One ``fstat`` and one ``stat`` in the usual case."""
    mine = os.fstat(fd)
    if not stat.S_ISREG(mine.st_mode):
        raise LeaseError(
            f"lock file {path} is not a regular file; refusing it",
            hint="remove it; lock files are plain files created by cuectl",
        )
    if mine.st_uid != owner and mine.st_uid != 0:
        if os.geteuid() != 0:
            raise untrusted_lock_file_error(os.fspath(path), mine.st_uid, owner)
        _hand_over(fd, owner, mine.st_uid)  # before the check below: then nobody else can remove it
    return mine.st_size if _same_file(mine, path) else None


def lock_now(path: str | os.PathLike[str]) -> tuple[int, bool, int] | None:
    """Take the exclusive lock of the file at ``path`` without waiting: (fd, writable, the
    file's size when locked), or None when someone else holds it. The fd is close-on-exec."""
    owner = lock_dir_owner(os.path.dirname(os.fspath(path)))
    while True:
        fd, writable = open_lock_file(path, owner)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            size = held_file_size(fd, path, owner)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if size is not None:
            return fd, writable, size
        # Locked a file that someone unlinked meanwhile: it guards nothing. Try again.
        os.close(fd)


def new_record(uuid: str, index: int, *, pid: int, holder: str, kind: str, label: str | None) -> dict[str, Any]:
    """The record a holder writes into a device's lock file once it holds it (shown by
    `gpu leases`; ``since`` is now)."""
    global _IDENTITY
    if _IDENTITY is None:
        _IDENTITY = (config.current_user(), config.hostname())
    user, host = _IDENTITY
    return {
        "uuid": uuid,
        "index": index,
        "pid": pid,
        "holder": holder,
        "kind": kind,
        "label": label,
        "user": user,
        "host": host,
        "since": time.time(),
    }


_IDENTITY: tuple[str, str] | None = None


def fresh_record(
    uuid: str, index: int, *, pid: int, holder: str, kind: str, label: str | None
) -> tuple[dict[str, Any], bytes]:
    """``new_record`` and its ``encode_record`` bytes. A holder writes the same record but
    for ``since`` into every lock it takes (``cuectl.lease()`` in a loop, a worker's
    frames): the rest is encoded once per process, which halves the encoding's cost."""
    record = new_record(uuid, index, pid=pid, holder=holder, kind=kind, label=label)
    key = (uuid, index, pid, holder, kind, label)
    # Exact ints only: True == 1 would otherwise find the head written for 1.
    keyed = type(index) is int and type(pid) is int
    head = _FRESH.get(key) if keyed else None
    if head is None:
        head = encode_record({k: v for k, v in record.items() if k != "since"})[:-1] + b',"since":'
        if keyed:
            if len(_FRESH) >= 256:
                _FRESH.clear()
            _FRESH[key] = head
    return record, head + float.__repr__(record["since"]).encode() + b"}"


#: (uuid, index, pid, holder, kind, label) -> their record's encoding up to ``since``.
_FRESH: dict[tuple[Any, ...], bytes] = {}


def _quote(text: str) -> str:
    """``text`` as a JSON string, exactly as ``json.dumps`` writes it (ASCII only: other
    characters as ``\\uXXXX``, beyond the BMP as a surrogate pair)."""
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return '"' + text + '"'  # the usual label or uuid
    out = []
    for char in text:
        code = ord(char)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 | (code >> 10):04x}\\u{0xDC00 | (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return '"' + "".join(out) + '"'


def probe_held(path: str | os.PathLike[str]) -> bool:
    """Is the lock at ``path`` held? A shared non-blocking lock attempt, released at once.

    The attempt is the only answer that is right for every holder (any user, any pid
    namespace). It holds a shared lock for a few microseconds, during which a concurrent
    non-blocking acquirer of that *free* device would see it busy; the acquisition path
    therefore never probes a device's lock, only reporting does (and the quick path of
    `cuectl run` probes wait-queue tickets, as ``WaitQueue`` does).
    """
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # unreadable (another user's 0600 file): we could not lock it either
    return probe_fd(fd)


def probe_fd(fd: int) -> bool:
    """``probe_held``'s attempt on ``fd`` (opened read-only by the caller, who judges a file
    it cannot open: ``WaitQueue`` counts such a ticket as dead); closes ``fd``."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def encode_record(record: Mapping[str, Any]) -> bytes:
    """``record`` as compact JSON, the bytes ``json.dumps(record, separators=(",", ":"))``
    gives for the values a record holds (text, int, float, bool, None)."""
    parts = []
    for key, value in record.items():
        kind = type(value)
        if kind is str:
            text = _quoted(value)
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float:
            text = float.__repr__(value)
        elif value is None:
            text = "null"
        elif kind is bool:
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):  # subclasses (an IntEnum): as json writes them
            text = float.__repr__(value) if isinstance(value, float) else int.__repr__(value)
        else:
            text = _quoted(str(value))
        parts.append(_quoted(key) + ":" + text)
    return ("{" + ",".join(parts) + "}").encode()


def _quoted(text: str) -> str:
    """``_quote`` remembered: a process writes the same keys, uuids, user and labels into
    every record (``cuectl.lease()`` in a loop: a third of its encoding time otherwise)."""
    found = _QUOTED.get(text)
    if found is None:
        found = _quote(text)
        if len(_QUOTED) >= 1024:
            _QUOTED.clear()
        _QUOTED[text] = found
    return found


_QUOTED: dict[str, str] = {}


def write_record(fd: int, data: bytes, *, old_size: int | None = None) -> None:
    """Put ``data`` in the locked file ``fd``. Best effort: the record is informational, and
    a full /dev/shm must not fail the lease."""
    try:
        # Write then trim (not trim then write): a reader never sees an empty file for a
        # lock whose record is being replaced, at worst a torn one, which it re-reads.
        # ``old_size``: what the file held when we locked it (usually 0: release clears
        # it); nothing longer to trim then.
        os.pwrite(fd, data, 0)
        if old_size is None or old_size > len(data):
            os.ftruncate(fd, len(data))
    except OSError:
        pass


def unlock(fd: int, *, shared: bool, writable: bool) -> None:
    """Close a lock's fd. Not ``shared`` with a child: clear the record and unlock first
    (also for copies a plain ``fork()`` child inherited unasked). Shared: only close ours;
    ``LOCK_UN`` would unlock the child too."""
    try:
        if not shared:
            if writable:
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        pass
    finally:
        os.close(fd)


# ============================================================================ other lock directories


def held_elsewhere(lock_dir: str, names: "list[str] | tuple[str, ...]") -> list[tuple[str, str, int]]:
    """The lock files of ``names`` (base names, ``GPU-….lock``) held right now through another
    lock directory of this machine (one the registry of ``config.lock_dir_registry`` notes):
    ``(name, that directory, holder pid)`` for each. Leases there and here do not see each
    other, so each such device is now used twice. Judged by the holder's record (a live
    pid), never by a probe, which would make a concurrent acquirer there see it busy; a
    directory inside this one or holding it (nested leases of a frame) is not another."""
    registry = config.lock_dir_registry_name()
    try:
        entries = os.listdir(registry)
    except OSError:
        return []
    mine = os.path.realpath(lock_dir)
    found = []
    for entry in entries:
        try:
            other = read_registry_entry(os.path.join(registry, entry)) or ""
        except OSError:
            continue
        if not other.startswith("/") or _related(os.path.realpath(other), mine):
            continue
        for name in names:
            pid = _live_holder(os.path.join(other, name))
            if pid:
                found.append((name, other, pid))
    return found


def read_registry_entry(path: str) -> str | None:
    """The lock directory a registry entry names, as written (stripped); None when the entry
    is not a regular file. The registry is writable by every user: a link there is not
    followed and a FIFO does not block the open (``OPEN_FLAGS``), so nothing planted there
    can hang the reader. Raises ``OSError``."""
    fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.fsdecode(os.pread(fd, 4096, 0)).strip()
    finally:
        os.close(fd)


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _live_holder(path: str) -> int:
    """The pid a lock file's record names when that process lives, else 0."""
    try:
        fd = os.open(path, os.O_RDONLY | OPEN_FLAGS)
    except OSError:
        return 0
    try:
        data = os.pread(fd, 4096, 0)
    except OSError:
        return 0
    finally:
        os.close(fd)
    if not data:
        return 0  # released cleanly: the record is cleared
    import json  # only here: a record of another directory's lease is rare

    try:
        pid = json.loads(data).get("pid")
    except (ValueError, AttributeError):
        return 0
    if not isinstance(pid, int) or pid <= 0:
        return 0
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return 0
    except OSError:
        pass  # another user's live process
    return pid


def elsewhere_warning(uuid: str, other: str, pid: int, lock_dir: str) -> str:
    """What every lease path says of a device it leased that another lock directory holds."""
    return (
        f"GPU {uuid} is also leased through another lock directory, {other} (pid {pid}): its leases "
        f"and this one's ({lock_dir}) do not see each other, so the GPU is now used twice; use one "
        "lock directory on a machine (CUECTL_LOCK_DIR)"
    )
