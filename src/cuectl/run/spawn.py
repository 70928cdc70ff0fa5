"""Starting a process with ``posix_spawn`` exactly as ``subprocess.Popen`` would start it.

``subprocess`` spends ~0.25 ms of the parent's CPU a process in Python — encoding every
variable of the environment, building its argument lists, an error pipe — before the same
vfork+exec. ``os.posix_spawn`` does that part in C. Both ways of starting a command use
this: ``cuectl run``'s command (``cuectl.run.child``) and a worker's frames
(``cuectl.run.launch``), where it is most of what a no-op frame costs the worker.

"Exactly" means: every descriptor the parent inherited without close-on-exec closed, but
the ones asked for (``close_fds=True`` with ``pass_fds``); the signals Python ignores
(SIGPIPE, SIGXFSZ) back to their defaults (``restore_signals``); the program searched on
the *child's* ``PATH`` with ``execvpe``'s rules. Where that cannot be done (not glibc 2.29+,
whose ``posix_spawn`` clears close-on-exec of a descriptor dup2'ed onto itself, the way the
kept ones are passed), ``usable()`` says so and callers use ``subprocess``.

The inherited descriptors are kept from the child by marking them close-on-exec in the
parent, all at once with ``close_range(2)`` (Linux 5.11+, glibc 2.34+); elsewhere they are
found by listing /proc/self/fd, ~30 µs of a no-op frame's CPU, and closed in the child.

Kept to ``os``, ``sys`` and ``cuectl.run.libc``: ``cuectl run``'s quick path imports it.
"""

from __future__ import annotations

import os
import sys

try:
    import _signal as _sig  # type: ignore[import-not-found, unused-ignore]  # ``signal`` loads enum (~3 ms)
except ImportError:  # pragma: no cover - other Pythons
    import signal as _sig  # type: ignore[no-redef, unused-ignore]

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from typing import Any, Mapping, Sequence

# What subprocess resets in the child (``restore_signals``): Python ignores these.
RESTORED = tuple(getattr(_sig, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(_sig, name))
_DEFAULT_PATH = "/bin:/usr/bin"  # ``os.defpath``, as execvpe and subprocess fall back to it

_USABLE: bool | None = None


def usable() -> bool:
    """Can ``posix_spawn`` start a process exactly as ``subprocess`` would here? glibc 2.29+
    clears close-on-exec of a descriptor dup2'ed onto itself (how kept fds are passed)."""
    global _USABLE
    if _USABLE is None:
        _USABLE = False
        if sys.platform.startswith("linux") and hasattr(os, "posix_spawn"):
            try:
                name, _, version = (os.confstr("CS_GNU_LIBC_VERSION") or "").partition(" ")
                major, minor = (int(x) for x in version.split(".")[:2])
                _USABLE = name == "glibc" and (major, minor) >= (2, 29)
            except (ValueError, OSError):
                pass
    return _USABLE


def open_fds() -> list[int]:
    """This process's open descriptors."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except (OSError, ValueError):
        return list(range(3, 256))


# close_range(2)'s flag: mark the range close-on-exec instead of closing it (Linux 5.11+).
_CLOSE_RANGE_CLOEXEC = 4
# libc's close_range, made on first use; False: this system has none that takes the flag.
_CLOSE_RANGE: Any = None


def _close_range() -> Any:
    """libc's ``close_range(unsigned, unsigned, int)``, or False where libc lacks it."""
    global _CLOSE_RANGE
    if _CLOSE_RANGE is None:
        _CLOSE_RANGE = False
        try:
            from cuectl.run import libc

            _CLOSE_RANGE = libc.function("close_range", "IIi", "i")
        except (ImportError, AttributeError, OSError):  # no such function (glibc < 2.34), no ctypes
            pass
    return _CLOSE_RANGE


def _all_close_on_exec() -> bool:
    """Mark every descriptor above 2 close-on-exec, in one system call; whether it could be.
    Python opens its own close-on-exec (PEP 446), so this changes only descriptors this
    process inherited or a library opened without the flag, which no child may get but
    through ``keep`` (the file actions clear the flag on those, in the child only)."""
    close_range = _close_range()
    if close_range is False:
        return False
    if close_range(3, 0xFFFFFFFF, _CLOSE_RANGE_CLOEXEC) == 0:
        return True
    global _CLOSE_RANGE
    _CLOSE_RANGE = False  # ENOSYS, or EINVAL for the flag (Linux < 5.11): list them from now on
    return False


def fd_actions(keep: Sequence[int]) -> list[tuple[int, ...]]:
    """File actions that leave the child ``keep`` (close-on-exec cleared) and no other
    descriptor above 2 that would otherwise survive the exec: those inherited without
    close-on-exec (a CI runner's pipe, a library's device node). Where it can, this marks
    them close-on-exec here (:func:`_all_close_on_exec`), else each gets a close action:
    Python's own are all close-on-exec already (PEP 446), so listing them is all
    ``close_fds`` costs then."""
    kept = set(keep)
    actions: list[tuple[int, ...]] = [(os.POSIX_SPAWN_DUP2, fd, fd) for fd in sorted(kept)]
    if _all_close_on_exec():
        return actions
    for fd in open_fds():
        if fd > 2 and fd not in kept:
            try:
                if os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:
                pass  # closed meanwhile (the listing's own fd)
    return actions


def resolve(program: str, env: Mapping[str, str]) -> str:
    """The file ``execvpe(program, ..., env)`` would run: ``program`` itself when it names a
    path, else the first executable regular file of that name on ``env``'s ``PATH`` (as
    ``subprocess`` searches it, not the parent's).

    Raises what the exec would have: ``FileNotFoundError`` when there is none, or
    ``PermissionError`` when the only candidates cannot be executed.
    """
    if "/" in program:
        return program
    path = env.get("PATH")
    denied = False
    for entry in (_DEFAULT_PATH if path is None else path).split(os.pathsep):
        candidate = os.path.join(entry, program) if entry else program
        try:
            st = os.stat(candidate)
        except (OSError, ValueError):
            continue  # not there (ENOENT, ENOTDIR, a too long name): the next entry
        # execve refuses a directory or a file without the execute bit with EACCES, and
        # execvpe then keeps searching and reports EACCES only if nothing else runs.
        if (st.st_mode & 0o170000) == 0o100000 and os.access(candidate, os.X_OK):
            return candidate
        denied = True
    if denied:
        raise PermissionError(13, os.strerror(13), program)
    raise FileNotFoundError(2, os.strerror(2), program)


class NoWayBack(OSError):
    """This process's own directory cannot be opened, so it could not come back to it after
    spawning in another one: start the process some other way (``subprocess``)."""


# O_PATH: a directory we may not read (a worker started in one) can still be returned to.
_HOME_FLAGS = os.O_RDONLY | getattr(os, "O_PATH", 0) | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    keep: Sequence[int] = (),
    stdio: tuple[int, int, int] | None = None,
    cwd: str | None = None,
    setsid: bool = False,
    setpgroup: bool = False,
    cwd_lock: threading.Lock | None = None,
) -> int:
    """Start ``argv`` (the program searched on ``env``'s PATH) with ``env``; its pid.

    ``keep``: descriptors besides 0-2 that stay open. ``stdio``: descriptors that become
    the child's 0, 1 and 2 (else it shares ours). ``setsid``/``setpgroup``: a session or a
    process group of its own. ``cwd``: where it runs. ``posix_spawn`` has no way to change
    the child's directory, so this process changes its own around the spawn, under
    ``cwd_lock``, and goes back by a descriptor of the directory it was in; anything else
    in this process that starts processes or uses relative paths while a ``cwd`` spawn may
    run must hold the same lock.

    Raises ``OSError`` as ``subprocess.Popen`` would: ``FileNotFoundError`` naming the
    program or ``cwd``, ``PermissionError``, ``OSError`` with the exec's errno; and
    ``NoWayBack`` (nothing started) when our own directory cannot be opened.
    """
    if stdio is not None:
        actions = [
            (os.POSIX_SPAWN_DUP2, stdio[0], 0),
            (os.POSIX_SPAWN_DUP2, stdio[1], 1),
            (os.POSIX_SPAWN_DUP2, stdio[2], 2),
            *fd_actions(keep),
        ]
    else:
        actions = fd_actions(keep)
    options: dict[str, Any] = {"setsid": True} if setsid else ({"setpgroup": 0} if setpgroup else {})
    if cwd is None:
        return _spawn(argv, env, actions, options)
    if cwd_lock is None:
        raise ValueError("spawn: cwd needs cwd_lock")
    with cwd_lock:
        try:  # opened each time: the process may have changed its directory since the last
            home = os.open(".", _HOME_FLAGS)
        except OSError as exc:
            raise NoWayBack(exc.errno, exc.strerror) from None
        try:
            os.chdir(cwd)  # FileNotFoundError/PermissionError naming cwd, as Popen's child reports it
            try:
                return _spawn(argv, env, actions, options)
            finally:
                os.fchdir(home)
        finally:
            os.close(home)


def _spawn(argv: Sequence[str], env: Mapping[str, str], actions: list[tuple[Any, ...]], options: dict[str, Any]) -> int:
    try:
        if "/" not in argv[0] and env.get("PATH") == os.environ.get("PATH"):
            # glibc's posix_spawnp searches the PATH *we* have, in the child, with execvpe's
            # rules: when the child's is the same (the usual case), no stat calls here.
            return os.posix_spawnp(argv[0], list(argv), env, file_actions=actions, setsigdef=RESTORED, **options)
        return os.posix_spawn(
            resolve(argv[0], env), list(argv), env, file_actions=actions, setsigdef=RESTORED, **options
        )
    except OSError as exc:
        # glibc reports the exec's errno naming the resolved file; Popen names the program.
        raise OSError(exc.errno, exc.strerror, argv[0]) from None
