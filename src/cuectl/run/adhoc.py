"""``cuectl run``: run one command under an exclusive device lease (the library side).

Acquire (waiting if asked), start the command with the isolation environment and the lock
fds inherited, forward signals, return its exit status, release. Because the child
inherits the locks, the lease lives exactly as long as the command does — and longer if
``cuectl run`` itself is killed: the devices stay leased until the command (and anything
it started that kept the fds) has exited.

Process groups. Non-interactive (stdin is not the terminal we are in the foreground of:
scripts, services, CI), the command gets a process group of its own and SIGINT, SIGTERM and
SIGHUP sent to ``cuectl run`` are forwarded to that whole group. Interactive (a researcher
at a terminal), the command stays in our group instead: a background group could not read
the terminal (SIGTTIN would stop it — a hang for ``pdb`` or an input prompt) and Ctrl-C /
Ctrl-Z must reach it as they would without ``cuectl run``. The terminal already delivers
SIGINT and SIGHUP to the whole group, so then only SIGTERM is forwarded (to the command's
pid) and the other two are merely kept from ending ``cuectl run`` before its command.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Mapping, Sequence

from cuectl import config
from cuectl.errors import CuectlError, InvalidInput, LeaseError
from cuectl.run.lease import KIND_RUN, Lease, LeaseRequest, acquire
from cuectl.run.subreaper import own_children, set_child_subreaper

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# Exit statuses of a shell that could not start the command.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126
#: Seconds leftovers of the command get between SIGTERM and SIGKILL (``reap_leftovers``).
LEFTOVER_GRACE_S = 5.0
# Variables describing a lease or a frame: never inherited from the caller (a `cuectl run`
# inside a frame must describe its own lease — a subset of the frame's devices, see
# cuectl.run.lease.nested — not the frame's).
_LEASE_VARS = ("CUE_GPUS", "CUE_GPU_CORES", "CUE_GPU_UUIDS", "CUE_GPU_MEMORY", "CUE_LEASE_LEVEL")


class CommandNotFound(CuectlError):
    """The command does not exist (exit 127, as a shell)."""

    exit_code = EXIT_NOT_FOUND


class CommandNotExecutable(CuectlError):
    """The command exists but cannot be executed (exit 126, as a shell)."""

    exit_code = EXIT_CANNOT_EXECUTE


def command_label(argv: Sequence[str], limit: int = 80) -> str:
    """Default `gpu leases` label: the command line, shortened (/proc shows it anyway)."""
    text = shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def child_env(lease_env: Mapping[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: ours, less inherited lease variables, plus the lease's."""
    inherited = config.inherited_environ() if base is None else base
    env = {k: v for k, v in inherited.items() if k not in _LEASE_VARS}
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


class _Forwarder:
    """Relays signals that reach us to the command; remembers those that come too early."""

    def __init__(self, interactive: bool) -> None:
        self.interactive = interactive
        self.proc: subprocess.Popen | None = None
        self.early: list[int] = []
        self._saved: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; nothing to relay
        for sig in FORWARDED:
            self._saved[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._saved.clear()

    def attach(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        for sig in self.early:
            self._send(sig)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.proc is None:
            self.early.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.proc is not None
        try:
            if not self.interactive:
                os.killpg(self.proc.pid, signum)
            elif signum == signal.SIGTERM:
                os.kill(self.proc.pid, signum)
            # Interactive SIGINT/SIGHUP came from the terminal to the whole group: the
            # command has it already; sending it again would hit it twice.
        except ProcessLookupError:
            pass


def _spawn(argv: Sequence[str], env: Mapping[str, str], fds: Sequence[int], interactive: bool) -> subprocess.Popen:
    group: dict[str, object] = {}
    if not interactive:
        if sys.version_info >= (3, 11):
            group["process_group"] = 0
        else:  # pragma: no cover - 3.10
            group["preexec_fn"] = os.setpgrp
    try:
        return subprocess.Popen(list(argv), env=dict(env), pass_fds=tuple(fds), close_fds=True, **group)  # type: ignore[call-overload]
    except FileNotFoundError:
        raise CommandNotFound(f"{argv[0]}: command not found") from None
    except PermissionError:
        raise CommandNotExecutable(f"{argv[0]}: permission denied") from None
    except OSError as exc:
        raise CommandNotExecutable(f"{argv[0]}: cannot execute: {exc.strerror or exc}") from None


def _become_subreaper() -> None:
    """``launch.become_subreaper()`` where the frame launcher is loaded (it keeps the
    flag its frames look at), else the bare prctl: no need to load it for this."""
    if "cuectl.run.launch" in sys.modules:
        from cuectl.run import launch

        launch.become_subreaper()
    else:
        set_child_subreaper()


def run_leased(argv: Sequence[str], held: Lease, *, interactive: bool | None = None,
               base_env: Mapping[str, str] | None = None, reap_leftovers: bool = False) -> int:
    """Run ``argv`` under ``held`` (the child inherits its locks); return the exit status.

    ``reap_leftovers`` (``cuectl run`` itself; it makes this process a child subreaper):
    once the command exited, processes it left behind that still hold the lease — in its
    process group, or escaped with ``setsid``/a double fork but keeping the lock fds — are
    TERMed, KILLed after a grace period and reaped, so the devices are free when we return.
    """
    mode = is_interactive() if interactive is None else interactive
    forwarder = _Forwarder(mode)
    forwarder.install()
    try:
        if forwarder.early:  # asked to stop while acquiring: do not start the command at all
            return 128 + forwarder.early[0]
        if reap_leftovers:
            _become_subreaper()
        fds = held.fds
        proc = _spawn(argv, child_env(held.env, base_env), fds, mode)
        forwarder.attach(proc)
        held.set_holder_pid(proc.pid)
        status = exit_status(proc.wait())
        if reap_leftovers and own_children():  # none left (the usual end): launch need not load
            from cuectl.run import launch

            group = None if mode else proc.pid
            ids = launch.file_ids(fds)
            launch.kill_leftovers(lambda pid, pgid, sid: pgid == group or launch.holds_file(pid, ids),
                                  grace=LEFTOVER_GRACE_S)
        return status
    finally:
        forwarder.restore()


def run_command(command: Sequence[str], *, gpus: int | None = None, gpu_vendor: str | None = None,
                gpu_models: Sequence[str] = (), gpu_memory_min: str | None = None,
                gpu_memory_free_min: str | None = None, devices: Sequence[str] | None = None, wait: bool = True,
                timeout: str | None = None, label: str | None = None, lock_dir: str | Path | None = None,
                say: Callable[[str], None]) -> int:
    """``cuectl run``, flags as given on the command line: validate them into a request
    (named as the flags in messages), lease, run ``command``, release; its exit status.

    Both ways into ``cuectl run`` call this — the typer command (``cuectl.cli.lease_cmds``)
    and the console script's fast path (``cuectl.cli.entry``) — so they cannot drift
    apart. ``say`` prints the human-facing lines (``cuectl.cli.term.info``). Raises what
    ``run_with_lease`` raises.
    """
    from cuectl.run.lease.request import make_request
    from cuectl.sched.fields import flag_label

    request = make_request(gpus, gpu_vendor=gpu_vendor, gpu_models=gpu_models, gpu_memory_min=gpu_memory_min,
                           gpu_memory_free_min=gpu_memory_free_min, devices=devices, field_label=flag_label)

    def acquired(held: Lease) -> None:
        say(acquired_message(held))

    def waiting(reason: LeaseError) -> None:
        say(f"cuectl run: waiting — {reason.message}")

    return run_with_lease(command, request, wait=wait, timeout=timeout, label=label, lock_dir=lock_dir,
                          on_acquired=acquired, on_wait=waiting, reap_leftovers=True)


def acquired_message(held: Lease) -> str:
    """What ``cuectl run`` says once it holds its lease."""
    if held.devices:
        names = ", ".join(f"gpu {d.index} ({d.model}, {d.uuid})" for d in held.devices)
        return f"cuectl run: leased {names}"
    return "cuectl run: no GPU leased; all GPUs are hidden from the command"


def run_with_lease(argv: Sequence[str], request: LeaseRequest, *, wait: bool = True,
                   timeout: float | str | None = None, label: str | None = None,
                   lock_dir: str | Path | None = None, backend: str = "auto", fake_file: str | Path | None = None,
                   on_acquired: Callable[[Lease], None] | None = None,
                   on_wait: Callable[[LeaseError], None] | None = None,
                   interactive: bool | None = None, reap_leftovers: bool = False) -> int:
    """Acquire ``request``, run ``argv`` with the isolation env, release; the exit status.

    ``timeout`` bounds the wait for the lease, not the command. Lease errors raise
    (``DevicesBusy`` with ``wait=False``, ``LeaseTimeout``, ...); a command that cannot be
    started raises ``CommandNotFound`` (127) / ``CommandNotExecutable`` (126).
    ``reap_leftovers``: see ``run_leased`` (``cuectl run`` sets it).
    """
    if not argv:
        raise InvalidInput("no command given", hint="usage: cuectl run [OPTIONS] -- COMMAND [ARGS...]")
    held = acquire(request, wait=wait, timeout=timeout, label=label or command_label(argv), lock_dir=lock_dir,
                   backend=backend, fake_file=fake_file, kind=KIND_RUN, on_wait=on_wait)
    with held:
        if on_acquired is not None:
            on_acquired(held)
        return run_leased(argv, held, interactive=interactive, reap_leftovers=reap_leftovers)
