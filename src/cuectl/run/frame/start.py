"""Starting a frame's command: as whom (:class:`RunAs`, the job's user when the worker is
root), in which directory (entered by that user, never by root: ``CannotEnter``), with
stdin /dev/null, stdout and stderr the log, a session of its own and only the lease's
descriptors inherited (``posix_spawn`` through ``cuectl.run.spawn``, else ``subprocess``)."""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from typing import Mapping

from cuectl.errors import InvalidInput
from cuectl.run import spawn

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class RunAs:
    """The account a frame runs as when the worker is root (OpenCue's RQD does the same):
    the submitting user's uid, primary gid and supplementary groups."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def lookup(cls, user: str) -> "RunAs":
        import pwd

        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise InvalidInput(
                f"user {user!r} does not exist on this host; the frame is not run as root instead",
                hint="create the account, or run the worker as an unprivileged user",
            ) from None
        return cls(user, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(user, entry.pw_gid)), entry.pw_dir)

    def popen_kwargs(self) -> dict:
        # Already that account (a root user's own jobs): switching would cost a full fork
        # instead of vfork (~3 ms a frame) for nothing.
        if self.uid == os.geteuid() and self.gid == os.getegid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self) -> dict[str, str]:
        return {"USER": self.user, "LOGNAME": self.user, "HOME": self.home}


_DEV_NULL = -1


def _dev_null() -> int:
    """A read-only /dev/null for frames' stdin, opened once (close-on-exec: the child gets
    it as fd 0 only), instead of an open and close per frame."""
    global _DEV_NULL
    if _DEV_NULL < 0:
        _DEV_NULL = os.open(os.devnull, os.O_RDONLY | _CLOEXEC)
    return _DEV_NULL


class Spawned:
    """A frame started by ``cuectl.run.spawn``: what FrameProcess reads of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


# The worker changes its own directory for the instant a frame is spawned in another one
# (posix_spawn cannot change the child's): whatever else starts processes that inherit
# the directory, or uses relative paths, in another thread holds this lock (notify.py).
CWD_LOCK = threading.Lock()


def _start_child(
    argv: list[str], env: Mapping[str, str], log_fd: int, cwd: str | None, pass_fds: tuple[int, ...], identity: dict
) -> "subprocess.Popen[bytes] | Spawned":
    """Start a frame's command: stdin /dev/null, stdout and stderr ``log_fd``, a session of
    its own, only ``pass_fds`` inherited. ``posix_spawn`` (``cuectl.run.spawn``: ~0.25 ms
    less of the worker's CPU a frame) unless the frame runs as another user, which needs
    the setuid that only ``subprocess`` offers; that user enters ``cwd`` (``_start_entering``)."""
    if not identity and spawn.usable():
        try:
            return Spawned(
                spawn.spawn(
                    argv,
                    env,
                    keep=pass_fds,
                    stdio=(_dev_null(), log_fd, log_fd),
                    cwd=cwd,
                    setsid=True,
                    cwd_lock=CWD_LOCK,
                )
            )
        except spawn.NoWayBack:
            pass  # the worker's own directory is gone: Popen changes only the child's
    if identity and cwd is not None:
        return _start_entering(argv, env, log_fd, cwd, pass_fds, identity)
    return subprocess.Popen(
        argv,
        stdin=_dev_null(),
        stdout=log_fd,
        stderr=log_fd,
        env=dict(env),
        cwd=cwd,
        pass_fds=pass_fds,
        close_fds=True,
        start_new_session=True,
        **identity,
    )


class CannotEnter(InvalidInput):
    """The frame's user may not enter (or there is no) working directory: not started."""


# The step that enters a frame's directory as its user (issue 35): ``subprocess`` changes
# directory in the child *before* it drops to the user, as root, so that any directory on
# the host could be a frame's. The child runs this instead, already as the user: it enters
# the directory with the user's own permissions, says so on fd 0 (a pipe to the worker)
# when it cannot, then gives the command /dev/null as stdin, puts back PWD and OLDPWD as the
# frame's environment had them (``cd`` sets both) and execs it, as subprocess would have.
# $1 the directory, $2 PWD, $3 OLDPWD; one text for each of the four ways the two are set.
_ENTER = 'cd -P -- "$1" 2>/dev/null || {{ echo >&0; exit 125; }}; exec </dev/null; {}; {}; shift 3; exec "$@"'
_ENTER_SCRIPTS = {
    (pwd, old): _ENTER.format("PWD=$2" if pwd else "unset PWD", "OLDPWD=$3" if old else "unset OLDPWD")
    for pwd in (False, True)
    for old in (False, True)
}


def _start_entering(
    argv: list[str], env: Mapping[str, str], log_fd: int, cwd: str, pass_fds: tuple[int, ...], identity: dict
) -> "subprocess.Popen[bytes]":
    """Start a frame as another user in ``cwd``, entered by that user (``_ENTER``): the
    worker waits until it is in (~1 ms of /bin/sh) and raises ``CannotEnter`` when it could
    not get in. No directory of the worker's changes, so ``CWD_LOCK`` is not needed."""
    script = _ENTER_SCRIPTS["PWD" in env, "OLDPWD" in env]
    where = cwd if cwd.startswith("/") else "./" + cwd  # never searched on a CDPATH
    wrapped = ["/bin/sh", "-c", script, "cuectl", where, env.get("PWD", ""), env.get("OLDPWD", ""), *argv]
    report, told = os.pipe()
    try:
        try:
            popen = subprocess.Popen(
                wrapped,
                stdin=told,
                stdout=log_fd,
                stderr=log_fd,
                env=dict(env),
                pass_fds=pass_fds,
                close_fds=True,
                start_new_session=True,
                **identity,
            )
        finally:
            os.close(told)
        refused = os.read(report, 1)  # end of file once it is in the directory (or gone)
    finally:
        os.close(report)
    if not refused:
        return popen
    popen.wait()
    user = identity.get("user")
    try:
        import pwd

        user = pwd.getpwuid(int(user)).pw_name if user is not None else user
    except (KeyError, ValueError, TypeError):
        pass
    if os.path.isdir(cwd):  # it is there, as root sees it: the user may not get in
        raise CannotEnter(f"user {user} may not enter working directory {cwd} (permission denied)")
    raise CannotEnter(f"working directory {cwd} does not exist")
