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
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
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
    return [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={user.uid}",
        f"--regid={user.gid}",
        f"--groups={grp.getgrnam(GROUP).gr_gid}",
        "--",
        *runnable(argv),
    ]


# -- what another uid can execute ---------------------------------------------------------
# A clone may sit where no other user can enter (a `mktemp -d` is 0700, so is root's home),
# and so may the interpreter (pyenv under /root): the users these tests switch to could then
# execute neither `.venv/bin/cuectl` nor the probe scripts. The first run as another user
# lays out a copy of the repository and of the virtualenv in a 0755 directory of its own
# (hard links where the filesystem allows: a fraction of a second), on an interpreter of
# the same version that every user can execute, and ``runnable`` points command lines there.
REPO = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)
_runtime: Path | None = None


def runnable(argv: Sequence[str]) -> list[str]:
    """``argv`` with every path into this repository or its virtualenv moved to the copy
    that every user can reach (made on first use)."""
    top = runtime()
    moves = ((str(VENV), str(top / "venv")), (str(REPO), str(top / "repo")))
    out = []
    for arg in map(str, argv):
        for old, new in moves:
            if arg == old or arg.startswith(old + os.sep):
                arg = new + arg[len(old) :]
                break
        out.append(arg)
    return out


def runtime() -> Path:
    """The directory holding ``repo/`` and ``venv/`` for other users (made once a process)."""
    global _runtime
    if _runtime is None:
        top = Path(tempfile.mkdtemp(prefix="cuectl-runtime-", dir="/tmp"))
        os.chmod(top, 0o755)
        # Only what another user runs: the package, the script and the tests' helpers (an
        # untracked file elsewhere in the clone, a private store say, is not copied out).
        for part in ("src", "bin", "tests"):
            _mirror(REPO / part, top / "repo" / part, skip={"__pycache__", ".hypothesis"})
        os.chmod(top / "repo", 0o755)
        _make_venv(top / "venv", top / "repo")
        _runtime = top
    return _runtime


def remove_runtime() -> None:
    global _runtime
    if _runtime is not None:
        shutil.rmtree(_runtime, ignore_errors=True)
        _runtime = None


def _world_can_run(path: Path) -> bool:
    """Can a user who is neither owner nor group member execute ``path``?"""
    real = path.resolve()
    if not real.is_file() or not os.stat(real).st_mode & stat.S_IXOTH:
        return False
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in real.parents)


def _interpreter() -> Path:
    """This Python's version, at a path every user can execute: the venv's own base
    interpreter when it is reachable, else the system's python3.X of the same version
    (compiled packages in the venv are built for that X.Y)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    candidates = [base, *(Path(d) / f"python{version}" for d in ("/usr/local/bin", "/usr/bin", "/bin"))]
    for c in candidates:
        if _world_can_run(c):
            return c
    raise RuntimeError(
        f"the tests that run as other users need a Python {version} that every user can execute: "
        f"{base} is under a directory they cannot enter, and no python{version} is in /usr/bin "
        f"(install the distribution's python{version})"
    )


def _make_venv(dest: Path, repo: Path) -> None:
    python = _interpreter()
    _mirror(VENV, dest, skip={"__pycache__"})
    _rewrite(
        dest / "pyvenv.cfg",
        f"home = {python.parent}\ninclude-system-site-packages = false\n"
        f"version = {sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}\n",
    )
    bindir = dest / "bin"
    for name in ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        (bindir / name).unlink(missing_ok=True)
        (bindir / name).symlink_to(python)
    # The editable install points at the clone's src/: point it at the copy.
    site = Path(sysconfig.get_path("purelib", vars={"base": str(dest), "platbase": str(dest)}))
    for pth in site.glob("__editable__*cuectl*.pth"):
        _rewrite(pth, f"{repo / 'src'}\n")
    # bin/cuectl is a plain script whose first line names the clone's interpreter.
    script = (repo / "bin" / "cuectl").read_text()
    _rewrite(bindir / "cuectl", f"#!{bindir / 'python'}\n" + script.split("\n", 1)[1], mode=0o755)


def _rewrite(path: Path, text: str, mode: int = 0o644) -> None:
    path.unlink(missing_ok=True)  # a hard link: never write through it into the original
    path.write_text(text)
    os.chmod(path, mode)


def _mirror(src: Path, dest: Path, skip: set[str]) -> None:
    """``src`` under ``dest``, readable by all: hard links for files every user may read
    already, copies (made readable) for the rest and across filesystems; links as links."""
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in skip]
        here = dest / Path(root).relative_to(src)
        here.mkdir(parents=True, exist_ok=True)
        os.chmod(here, 0o755)
        for name in files + [d for d in dirs if (Path(root) / d).is_symlink()]:
            s, d = Path(root) / name, here / name
            if s.is_symlink():
                d.symlink_to(os.readlink(s))
                continue
            mode = os.stat(s).st_mode
            if mode & stat.S_IROTH:
                try:
                    os.link(s, d)
                    continue
                except OSError:
                    pass
            shutil.copyfile(s, d)
            os.chmod(d, 0o755 if mode & stat.S_IXUSR else 0o644)


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
            subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "-G", GROUP, name],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(name)
            self._made[short] = User(name, entry.pw_uid, entry.pw_gid)
        return self._made[short]

    @property
    def group_gid(self) -> int:
        if not _exists_group(GROUP):
            subprocess.run(["groupadd", GROUP], check=True)
        return grp.getgrnam(GROUP).gr_gid

    def cleanup(self) -> None:
        remove_runtime()
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
