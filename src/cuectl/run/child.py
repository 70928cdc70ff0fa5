"""Starting ``cuectl run``'s command, relaying signals to it and reading its exit status.

Shared by both ways a command is run under a lease — ``cuectl.run.adhoc`` (the library
and the typer command) and ``cuectl.run.quick`` (the console script's quick path) — and
kept to ``os``, ``sys`` and the C ``_signal`` module, so that the quick path loads none of
``subprocess``, ``signal`` (its enums), ``shlex`` or ``re``.

The command is started by ``cuectl.run.spawn`` (``posix_spawn``: glibc's is a vfork, and
the arguments and environment are encoded in C), as ``subprocess`` would start it: every
inherited descriptor closed but the lease's lock fds, the signals Python ignores (SIGPIPE,
SIGXFSZ) back to their defaults, a process group of its own when not interactive. Where
that cannot be done exactly (not glibc 2.29+), ``subprocess.Popen`` starts it instead.
"""

from __future__ import annotations

import os
import sys

from cuectl import config
from cuectl.errors import CuectlError
from cuectl.run import spawn
from cuectl.run.procs import become_subreaper, own_children

try:
    import _signal as _sig  # type: ignore[import-not-found, unused-ignore]  # ``signal`` wraps it in enums (~3 ms)
except ImportError:  # pragma: no cover - other Pythons
    import signal as _sig  # type: ignore[no-redef, unused-ignore]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping, Sequence

# Exit statuses of a shell that could not start the command.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126
FORWARDED = (_sig.SIGINT, _sig.SIGTERM, _sig.SIGHUP)
# Variables describing a lease or a frame: never inherited from the caller (a `cuectl run`
# inside a frame must describe its own lease — a subset of the frame's devices, see
# cuectl.run.lease.nested — not the frame's).
LEASE_VARS = ("CUE_GPUS", "CUE_GPU_CORES", "CUE_GPU_UUIDS", "CUE_GPU_MEMORY", "CUE_LEASE_LEVEL")
# Shell-safe characters (``shlex.quote``'s ``[\w@%+=:,./-]`` with ``re.ASCII``).
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-")


class CommandNotFound(CuectlError):
    """The command does not exist (exit 127, as a shell)."""

    exit_code = EXIT_NOT_FOUND


class CommandNotExecutable(CuectlError):
    """The command exists but cannot be executed (exit 126, as a shell)."""

    exit_code = EXIT_CANNOT_EXECUTE


def quote(word: str) -> str:
    """``shlex.quote(word)``, without loading ``re``."""
    if not word:
        return "''"
    if all(c in _SAFE for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"


def command_label(argv: Sequence[str], limit: int = 80) -> str:
    """Default `gpu leases` label: the command line, shortened (/proc shows it anyway)."""
    text = " ".join(quote(word) for word in argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def lease_label(label: str | None) -> str:
    """What a lease is recorded under: ``label`` stripped and cut to 200 characters, else
    the program's name."""
    text = (label or "").strip()[:200]
    if text:
        return text
    argv0 = sys.argv[0] if sys.argv else ""
    return "python" if argv0 in ("", "-c", "-m") else os.path.basename(argv0)


def acquired_message(devices: Sequence[tuple[int, str, str]]) -> str:
    """What ``cuectl run`` says once it holds its lease on ``devices`` (index, model, uuid)."""
    if devices:
        names = ", ".join(f"gpu {index} ({model}, {uuid})" for index, model, uuid in devices)
        return f"cuectl run: leased {names}"
    return "cuectl run: no GPU leased; all GPUs are hidden from the command"


def child_env(lease_env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ours, less inherited lease variables, plus the lease's."""
    inherited = config.inherited_environ() if base is None else base
    env = {k: v for k, v in inherited.items() if k not in LEASE_VARS}
    env.update(lease_env)
    return env


def is_interactive() -> bool:
    """True when stdin is a terminal whose foreground process group is ours."""
    try:
        return os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp()
    except OSError:
        return False


def exit_status(returncode: int) -> int:
    """``Popen.returncode`` -> shell exit status (128 + N for death by signal N)."""
    return 128 - returncode if returncode < 0 else returncode


class Forwarder:
    """Relays signals that reach us to the command; remembers those that come too early.

    Non-interactive, the command has a process group of its own and SIGINT, SIGTERM and
    SIGHUP go to that whole group. Interactive, the terminal already sent SIGINT and SIGHUP
    to the whole (shared) group, so only SIGTERM is passed on, to the command's pid.
    """

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive
        self.pid: int | None = None
        self.early: list[int] = []
        self._saved: dict[int, Any] = {}

    def install(self) -> None:
        for sig in FORWARDED:
            try:
                self._saved[sig] = _sig.signal(sig, self._handle)
            except ValueError:
                return  # not the main thread: handlers cannot be set there; nothing to relay

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            _sig.signal(sig, handler)
        self._saved.clear()

    def attach(self, pid: int) -> None:
        self.pid = pid
        for sig in self.early:
            self._send(sig)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.pid is None:
            self.early.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.pid is not None
        try:
            if not self.interactive:
                os.killpg(self.pid, signum)
            elif signum == _sig.SIGTERM:
                os.kill(self.pid, signum)
        except ProcessLookupError:
            pass


def supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    fds: Callable[[], Sequence[int]],
    *,
    interactive: bool,
    on_start: Callable[[int], None],
    leftovers: Callable[[int, Sequence[int]], None] | None = None,
) -> int:
    """Run a leased command to its end, relaying signals (``Forwarder``); its shell exit
    status. Both ways of ``cuectl run`` (``adhoc.run_leased``, ``quick``) run it so.

    ``fds()``: the lock fds the command inherits, asked for only once it will start (a
    signal that came while acquiring starts nothing: 128 + N). ``on_start(pid)``: it runs
    (name it in the lease records). ``leftovers``: make this process a child subreaper
    first, and once the command exited call ``leftovers(pid, fds)`` if any of its
    descendants are left to us — rarely, so its caller may load what that takes lazily.
    """
    forwarder = Forwarder(interactive)
    forwarder.install()
    try:
        if forwarder.early:  # asked to stop while acquiring: do not start the command at all
            return 128 + forwarder.early[0]
        if leftovers is not None:
            become_subreaper()
        passed = fds()
        proc = start(argv, env, passed, interactive)
        forwarder.attach(proc.pid)
        on_start(proc.pid)
        status = exit_status(proc.wait())
        if leftovers is not None and own_children():
            leftovers(proc.pid, passed)
        return status
    finally:
        forwarder.restore()


class Child:
    """A started command: its pid, and ``wait()`` for its ``Popen``-style return code."""

    def __init__(self, pid: int, popen: Any = None) -> None:
        self.pid = pid
        self._popen = popen

    def wait(self) -> int:
        if self._popen is not None:
            code: int = self._popen.wait()
            return code
        _, status = os.waitpid(self.pid, 0)  # retried on EINTR after our handlers ran (PEP 475)
        return os.waitstatus_to_exitcode(status)


def start(argv: Sequence[str], env: Mapping[str, str], fds: Sequence[int], interactive: bool) -> Child:
    """Start ``argv`` (searched on PATH) with ``env``, keeping only ``fds`` besides 0-2.

    Raises ``CommandNotFound`` (127) or ``CommandNotExecutable`` (126) as a shell would.
    """
    argv = list(argv)
    try:
        if spawn.usable():
            return Child(spawn.spawn(argv, env, keep=fds, setpgroup=not interactive))
        return _popen(argv, env, fds, interactive)
    except FileNotFoundError:
        raise CommandNotFound(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise CommandNotExecutable(f"{argv[0]}: permission denied") from None
    except OSError as exc:
        raise CommandNotExecutable(f"{argv[0]}: cannot execute: {exc.strerror or exc}") from None


def _popen(argv: list[str], env: Mapping[str, str], fds: Sequence[int], interactive: bool) -> Child:
    import subprocess

    group: dict[str, Any] = {}
    if not interactive:
        if sys.version_info >= (3, 11):
            group["process_group"] = 0
        else:  # pragma: no cover - 3.10
            group["preexec_fn"] = os.setpgrp
    proc = subprocess.Popen(argv, env=dict(env), pass_fds=tuple(fds), close_fds=True, **group)
    return Child(proc.pid, proc)
