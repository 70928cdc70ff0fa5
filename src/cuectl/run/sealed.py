"""Whether a root worker may use a store: nobody but the store's owner can write it.

A root worker runs what the store says as whichever user the store says, so every byte of
a SQLite store, and of the directories beside it (frame logs, submit receipts), must be
written only by one account: root, or the service account that owns the file and runs
``cuectl serve --socket`` for everyone else (docs/deploy.md, "A machine several people
use"). A store that a group shares, or a directory anyone may write (where a file can be
swapped or planted), is refused with one line saying how to set up the shared mode.
PostgreSQL stores are the server's to guard (roles and row-level security), and a store
behind a socket is its server's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cuectl.errors import InvalidInput
from cuectl.sched.store import Store


class UnsafeStore(InvalidInput):
    """A root worker was pointed at a store that others than its owner can write."""


SETUP_HINT = (
    "a store several users share belongs to root or a service account alone, and users reach it "
    "through `cuectl serve --socket` (docs/deploy.md, 'A machine several people use')"
)


def problems(store: Store) -> list[str]:
    """Each way someone other than the store file's owner (or root) can write the store or
    its directories; empty when there is none, or the store is no local file."""
    path = store.local_path
    if path is None:
        return []
    path = Path(path)
    try:
        owner = os.stat(path).st_uid
    except OSError as exc:
        return [f"{path}: cannot be checked ({exc.strerror})"]
    found: list[str] = []
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        found += _writers(file, owner)
    real = Path(os.path.realpath(path.parent))
    found += _writers(real, owner)
    # Above the store's own directory a root-owned sticky one (/tmp) is fine: others may add
    # entries there but not rename or remove ours. The store's directory itself must not
    # be (anyone could plant its -wal file), nor the logs' or receipts'.
    for directory in _above(path.parent, real):
        found += _writers(directory, owner, sticky_ok=True)
    for extra in (store.log_dir, store.receipt_dir):
        if extra is not None:
            found += _writers(Path(extra), owner)
    return found


def check(store: Store) -> None:
    """Raise ``UnsafeStore`` (one line, the first problem and how many more) when
    ``problems`` finds any."""
    found = problems(store)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UnsafeStore(f"a root worker will not use a store others can write: {found[0]}{more}", hint=SETUP_HINT)


def _above(named: Path, real: Path) -> list[Path]:
    """Every directory above the store's own, as named and as resolved (``real``): whoever
    may rename any of them can swap the store beneath a worker. A symbolic link among them
    is as safe as the directory holding it, which is in the list too."""
    lexical = Path(os.path.abspath(named))
    chain = dict.fromkeys([lexical, *lexical.parents, *real.parents])
    return [d for d in chain if d != real and not os.path.islink(d)]


def _writers(path: Path, owner: int, *, sticky_ok: bool = False) -> list[str]:
    """Why ``path`` can be written by someone other than ``owner`` or root (empty: it cannot)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [f"{path}: cannot be checked ({exc.strerror})"]
    if stat.S_ISLNK(st.st_mode):
        return [f"{path} is a symbolic link (whoever owns its target decides what it is)"]
    if st.st_uid not in (0, owner):
        return [f"{path} belongs to uid {st.st_uid}, not to the store's owner (uid {owner}) or root"]
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o022 or (sticky_ok and st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
        return []
    if mode & 0o002:
        return [f"{path} is mode {mode:o}: every user can write it (chmod o-w {path})"]
    others = group_others(st.st_gid, {owner, st.st_uid})
    if not others:  # the owner's own group (user private groups; root's): nobody else is in it
        return []
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return [f"{path} is mode {mode:o}: its group can write it ({shown}; chmod g-w {path})"]


def group_others(gid: int, owners: set[int]) -> list[str]:
    """The users in group ``gid`` (as a supplementary or primary group) other than root and
    ``owners``: who a group-writable file lets write it."""
    import grp
    import pwd

    try:
        members = set(grp.getgrgid(gid).gr_mem)
    except KeyError:
        members = set()
    members |= {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid}
    uids = {}
    for name in members:
        try:
            uids[name] = pwd.getpwnam(name).pw_uid
        except KeyError:
            uids[name] = -1
    return sorted(name for name, uid in uids.items() if uid != 0 and uid not in owners)
