"""Real throwaway OS users for the root-only security tests (docs/security.md).

A root test asks for ``users("alice", "bob")`` and gets accounts that exist on this machine
for the test session (``useradd``, no home directory, no login shell), in one shared group
of their own, deleted at the end. Names carry a per-run suffix so parallel or aborted runs
never meet. Commands run as such a user through ``as_user`` (setpriv: real setuid and
setgroups, no PAM, so nothing is mocked). Imported through sys.path like farmlib.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Sequence

ROOT = os.geteuid() == 0
_SUFFIX = f"{os.getpid() % 100000:05d}"
GROUP = f"cuectl-t{_SUFFIX}"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        """``argv`` as this user (real uid/gid, the shared group as a supplementary group)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        given = kwargs.pop("env", None)
        env = dict(os.environ if given is None else given)
        if given is None or "CUECTL_USER" not in given:
            env.pop("CUECTL_USER", None)  # the caller's label must not leak into this user's commands
        env.update(USER=self.name, LOGNAME=self.name, HOME="/nonexistent")
        return subprocess.run(as_user(self, argv), env=env, **kwargs)


def as_user(user: User, argv: Sequence[str]) -> list[str]:
    return [shutil.which("setpriv") or "setpriv", f"--reuid={user.uid}", f"--regid={user.gid}",
            f"--groups={grp.getgrnam(GROUP).gr_gid}", "--", *argv]


class Users:
    """Creates users on demand, removes every one of them at ``cleanup``."""

    def __init__(self) -> None:
        self._made: dict[str, User] = {}

    def __call__(self, *names: str) -> list[User]:
        return [self.get(n) for n in names]

    def get(self, short: str) -> User:
        if short not in self._made:
            if not _exists_group(GROUP):
                subprocess.run(["groupadd", GROUP], check=True)
            name = f"ct{_SUFFIX}{short}"[:32]
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "-G", GROUP, name],
                           check=True, capture_output=True)
            entry = pwd.getpwnam(name)
            self._made[short] = User(name, entry.pw_uid, entry.pw_gid)
        return self._made[short]

    @property
    def group_gid(self) -> int:
        if not _exists_group(GROUP):
            subprocess.run(["groupadd", GROUP], check=True)
        return grp.getgrnam(GROUP).gr_gid

    def cleanup(self) -> None:
        for user in self._made.values():
            subprocess.run(["pkill", "-KILL", "-u", user.name], capture_output=True)
            subprocess.run(["userdel", user.name], capture_output=True)
        self._made.clear()
        if _exists_group(GROUP):
            subprocess.run(["groupdel", GROUP], capture_output=True)


def _exists_group(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False
