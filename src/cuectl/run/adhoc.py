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
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from cuectl import config
from cuectl.errors import InvalidInput, LeaseError
from cuectl.run.child import acquired_message as child_message
from cuectl.run.child import child_env, command_label, is_interactive, supervise
from cuectl.run.lease import KIND_RUN, Lease, LeaseRequest, acquire

#: Seconds leftovers of the command get between SIGTERM and SIGKILL (``reap_leftovers``).
LEFTOVER_GRACE_S = 5.0


def run_leased(
    argv: Sequence[str],
    held: Lease,
    *,
    interactive: bool | None = None,
    base_env: Mapping[str, str] | None = None,
    reap_leftovers: bool = False,
) -> int:
    """Run ``argv`` under ``held`` (the child inherits its locks); return the exit status.

    ``reap_leftovers`` (``cuectl run`` itself; it makes this process a child subreaper):
    once the command exited, processes it left behind that still hold the lease — in its
    process group, or escaped with ``setsid``/a double fork but keeping the lock fds — are
    TERMed, KILLed after a grace period and reaped, so the devices are free when we return.
    """
    mode = is_interactive() if interactive is None else interactive

    def leftovers(pid: int, fds: Sequence[int]) -> None:
        reap_leftovers_of(pid, fds, interactive=mode)

    return supervise(
        argv,
        child_env(held.env, base_env),
        lambda: held.fds,
        interactive=mode,
        on_start=held.set_holder_pid,
        leftovers=leftovers if reap_leftovers else None,
    )


def reap_leftovers_of(pid: int, fds: Sequence[int], *, interactive: bool) -> None:
    """After the command ``pid`` exited: TERM, then KILL, and reap what it left behind that
    still holds the lease — its process group (not interactive), or anything that kept the
    lock ``fds`` — so that the devices are free when ``cuectl run`` returns. Called by
    ``child.supervise`` only when some are left (the usual end leaves none: no launch load)."""
    from cuectl.run import launch

    group = None if interactive else pid
    ids = launch.file_ids(fds)
    launch.kill_leftovers(lambda p, pgid, sid: pgid == group or launch.holds_file(p, ids), grace=LEFTOVER_GRACE_S)


def run_command(
    command: Sequence[str],
    *,
    gpus: int | None = None,
    gpu_vendor: str | None = None,
    gpu_models: Sequence[str] = (),
    gpu_memory_min: str | None = None,
    gpu_memory_free_min: str | None = None,
    gpu_capability_min: str | None = None,
    gpu_driver_min: str | None = None,
    gpu_cuda_min: str | None = None,
    devices: Sequence[str] | None = None,
    gpu_share: str | None = None,
    wait: bool = True,
    timeout: str | None = None,
    label: str | None = None,
    lock_dir: str | Path | None = None,
    say: Callable[[str], None],
) -> int:
    """``cuectl run``, flags as given on the command line: validate them into a request
    (named as the flags in messages), lease, run ``command``, release; its exit status.

    Both ways into ``cuectl run`` call this — the typer command (``cuectl.cli.lease_cmds``)
    and the console script's fast path (``cuectl.cli.entry``) — so they cannot drift
    apart. ``say`` prints the human-facing lines (``cuectl.cli.term.info``). Raises what
    ``run_with_lease`` raises.
    """
    from cuectl.run.lease.request import make_request
    from cuectl.sched.fields import flag_label

    request = make_request(
        gpus,
        gpu_vendor=gpu_vendor,
        gpu_models=gpu_models,
        gpu_memory_min=gpu_memory_min,
        gpu_memory_free_min=gpu_memory_free_min,
        gpu_capability_min=gpu_capability_min,
        gpu_driver_min=gpu_driver_min,
        gpu_cuda_min=gpu_cuda_min,
        devices=devices,
        gpu_share=gpu_share,
        field_label=flag_label,
    )

    quick_key = _quick_key() if lock_dir is None else None
    import warnings

    from cuectl.run.lease.acquire import LeaseWarning

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", LeaseWarning)

        def acquired(held: Lease) -> None:
            if quick_key is not None:
                _save_quick(quick_key, held)
            for w in said:
                if issubclass(w.category, LeaseWarning):
                    say(f"warning: {w.message}")  # (a GPU held through another lock directory)
            said.clear()
            say(acquired_message(held))

        def waiting(reason: LeaseError) -> None:
            say(f"cuectl run: waiting — {reason.message}")

        return run_with_lease(
            command,
            request,
            wait=wait,
            timeout=timeout,
            label=label,
            lock_dir=lock_dir,
            on_acquired=acquired,
            on_wait=waiting,
            reap_leftovers=True,
        )


def _quick_key() -> tuple[object, ...] | None:
    """The device part of the quick path's cache key (``cuectl.run.quick``), taken before
    this run discovers; None where the quick path never runs (inside a frame, not Linux)."""
    from cuectl.run import quick

    if not sys.platform.startswith("linux") or "CUE_FRAME_ID" in os.environ or config.run_cache_file() is None:
        return None
    return quick.device_key()


def _save_quick(devices: tuple[object, ...], held: Lease) -> None:
    """Leave what this run found out for the next one's quick path: the grants of
    ``--gpus 1`` and ``--gpus 0`` on this host's devices, as ``acquire`` makes them."""
    from cuectl.run import quick
    from cuectl.run.lease.acquire import quick_plan

    name = config.lock_dir_name()
    if name is None or str(held.lock_dir) != str(Path(name)):
        return  # not the directory the quick path would use
    quick.save(quick.fingerprint(name, devices), quick_plan(held.lock_dir, fake_file=config.fake_gpus_file()))


def acquired_message(held: Lease) -> str:
    """What ``cuectl run`` says once it holds its lease."""
    text = child_message([(d.index, d.model, d.uuid) for d in held.devices])
    share = held.env.get("CUE_GPU_SHARE_BYTES")
    if share is not None:
        from cuectl.units import format_bytes

        text += f", a share of {format_bytes(int(share))}"
    return text


def run_with_lease(
    argv: Sequence[str],
    request: LeaseRequest,
    *,
    wait: bool = True,
    timeout: float | str | None = None,
    label: str | None = None,
    lock_dir: str | Path | None = None,
    backend: str = "auto",
    fake_file: str | Path | None = None,
    on_acquired: Callable[[Lease], None] | None = None,
    on_wait: Callable[[LeaseError], None] | None = None,
    interactive: bool | None = None,
    reap_leftovers: bool = False,
) -> int:
    """Acquire ``request``, run ``argv`` with the isolation env, release; the exit status.

    ``timeout`` bounds the wait for the lease, not the command. Lease errors raise
    (``DevicesBusy`` with ``wait=False``, ``LeaseTimeout``, ...); a command that cannot be
    started raises ``CommandNotFound`` (127) / ``CommandNotExecutable`` (126).
    ``reap_leftovers``: see ``run_leased`` (``cuectl run`` sets it).
    """
    if not argv:
        raise InvalidInput("no command given", hint="usage: cuectl run [OPTIONS] -- COMMAND [ARGS...]")
    held = acquire(
        request,
        wait=wait,
        timeout=timeout,
        label=label or command_label(argv),
        lock_dir=lock_dir,
        backend=backend,
        fake_file=fake_file,
        kind=KIND_RUN,
        on_wait=on_wait,
    )
    with held:
        if on_acquired is not None:
            on_acquired(held)
        return run_leased(argv, held, interactive=interactive, reap_leftovers=reap_leftovers)
