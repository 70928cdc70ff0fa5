"""``cuectl worker``: run frames on this host until stopped (or idle)."""

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from cuectl.cli import term
from cuectl.config import LOCK_DIR_DEFAULT
from cuectl.errors import CuectlError, InvalidInput

if TYPE_CHECKING:
    from datetime import datetime


def _refuse_unsupported_platform() -> None:
    """The worker needs POSIX (fcntl.flock device leases, process groups, signals): say so
    in one line on Windows instead of failing on ``import fcntl`` somewhere inside."""
    problem = "Windows" if os.name == "nt" else None
    if problem is None:
        try:
            import fcntl  # noqa: F401
        except ImportError:
            problem = "a system without fcntl"
    if problem:
        raise CuectlError(
            f"cuectl worker cannot run on {problem}: its device leases are POSIX file locks "
            "(fcntl.flock) and frames run in POSIX process groups",
            hint="run the worker on Linux or macOS (on Windows: inside WSL 2 or a Linux container)",
        )


def worker(
    ctx: typer.Context,
    name: Optional[str] = typer.Option(
        None,
        "--name",
        help="Host name to register as (default: the fake GPU file's host, else this machine's hostname).",
    ),
    until_idle: bool = typer.Option(
        False, "--until-idle", help="Exit 0 once nothing this host could run is waiting or running."
    ),
    max_frames: Optional[int] = typer.Option(None, "--max-frames", help="Run at most N frames, then exit."),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between looks at the queue when idle."),
    sample_interval: float = typer.Option(10.0, "--sample-interval", help="Seconds between GPU samples per frame."),
    lease_timeout: float = typer.Option(
        60.0, "--lease-timeout", help="Seconds a silent worker's frames stay claimed before they are requeued."
    ),
    gpu_only: bool = typer.Option(False, "--gpu-only", help="Run only frames that ask for GPUs."),
    lock_dir: Optional[Path] = typer.Option(
        None, "--lock-dir", help=f"Host-local device lease directory (default: {LOCK_DIR_DEFAULT})."
    ),
    tag: List[str] = typer.Option(
        [], "--tag", help="Tag this host (layers with tags run only on hosts with all of them)."
    ),
    cores: Optional[float] = typer.Option(None, "--cores", help="CPU slots for CPU frames (default: all cores)."),
    backend: str = typer.Option("auto", "--backend", help="GPU backend: auto, nvml, smi, apple, amd, fake."),
    allow_user: List[str] = typer.Option(
        [], "--allow-user", help="Run only jobs submitted by this user (repeatable; default: anyone's)."
    ),
    run_as_submitter: Optional[bool] = typer.Option(
        None,
        "--run-as-submitter/--run-as-worker-user",
        help="Run each frame as the user who submitted it (default: yes when the worker runs as root).",
    ),
    log_limit: Optional[str] = typer.Option(
        None,
        "--log-limit",
        help="Bytes each frame attempt's log may keep "
        "(head and tail; e.g. 512M; default "
        "$CUECTL_LOG_LIMIT or 1G; a layer's "
        "log_limit wins).",
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not print frame starts and ends."),
    timestamps: Optional[bool] = typer.Option(
        None,
        "--timestamps/--no-timestamps",
        help="Start every output line with the UTC time (default: when stderr is not a terminal).",
    ),
    rediscover_interval: float = typer.Option(
        300.0,
        "--rediscover-interval",
        help="Seconds between looks for GPUs that vanished or appeared (0: only on SIGHUP).",
    ),
    probe: bool = typer.Option(
        False,
        "--probe",
        help="Do not run a worker: exit 0 if this machine's worker "
        "--name is alive (its heartbeat file is fresh), else 1. "
        "For liveness/readiness probes.",
    ),
    ready: bool = typer.Option(
        False, "--ready", help="With --probe: also require that the worker reached its store within --max-age."
    ),
    max_age: float = typer.Option(
        60.0, "--max-age", help="With --probe: seconds the heartbeat may be old (keep it above --poll)."
    ),
    devices: List[str] = typer.Option(
        [],
        "--devices",
        help="Use only these GPUs: indices or UUIDs as `cuectl gpu list` shows them (comma list or repeated).",
    ),
    exclude_devices: List[str] = typer.Option(
        [], "--exclude-devices", help="Never use these GPUs (e.g. the display GPU): indices or UUIDs."
    ),
    nimby_memory: Optional[str] = typer.Option(
        None,
        "--nimby-memory",
        help="Start no frame on a GPU that a program not run by cuectl uses more than this memory of (e.g. 1G).",
    ),
    nimby_util: Optional[float] = typer.Option(
        None,
        "--nimby-util",
        help="Start no frame on a GPU that a program not run by cuectl keeps busier than this percentage.",
    ),
    available: Optional[str] = typer.Option(
        None,
        "--available",
        help='When to take new frames, e.g. "Mon-Fri 19:00-08:00, Sat-Sun" (local time; default: always).',
    ),
    reservation_timeout: float = typer.Option(
        1800.0,
        "--reservation-timeout",
        help="Seconds the highest-priority GPU frame that does not fit yet "
        "may hold the free GPUs it could use (0: no reservations).",
    ),
    gpu_xid_drain: List[str] = typer.Option(
        [],
        "--gpu-xid-drain",
        metavar="XID",
        help="Also drain a GPU on these Xid codes, besides the critical ones (48,63,64,74,79,92,94,95; "
        "docs/gpu-health.md). Comma list or repeated.",
    ),
    gpu_suspect_jobs: int = typer.Option(
        3,
        "--gpu-suspect-jobs",
        metavar="K",
        help="Drain a GPU on which K different jobs failed while they succeeded on other GPUs (0: never).",
    ),
    gpu_escape: str = typer.Option(
        "warn",
        "--gpu-escape",
        metavar="warn|kill",
        help="A frame's process on a GPU it was not given, for layers that set no gpu_escape: "
        "warn, or kill (failure gpu-escape).",
    ),
    gpu_idle_limit: Optional[str] = typer.Option(
        None,
        "--gpu-idle-limit",
        metavar="DUR",
        help="Flag frames whose every GPU stays under --gpu-idle-util this long (e.g. 30m), for layers that set none.",
    ),
    gpu_idle_action: str = typer.Option(
        "warn", "--gpu-idle-action", metavar="warn|kill", help="What an idle frame gets: warn, or kill (gpu-idle)."
    ),
    gpu_idle_util: float = typer.Option(
        5.0, "--gpu-idle-util", metavar="PCT", help="Utilisation under which a held GPU counts as idle."
    ),
) -> None:
    """Run frames on this host: register, claim what fits, lease devices, report."""
    _refuse_unsupported_platform()
    from cuectl.run.libc import set_undumpable

    # Before the store is opened: its password (PGPASSWORD, ~/.pgpass, the URL) must not
    # be readable through /proc/PID/mem by the frames, which run as this user (issue 35).
    set_undumpable()
    if probe:
        from cuectl.run.service import probe as probe_worker

        if max_age <= 0:
            raise InvalidInput("--max-age must be greater than 0")
        term.line(probe_worker(name, max_age=max_age, ready=ready))
        return
    if ready:
        raise InvalidInput("--ready goes with --probe")
    from cuectl.run.service import build_worker, discover_gpus, heartbeat_path, run_worker, wait_for_store

    if poll <= 0 or sample_interval <= 0 or lease_timeout <= 0:
        raise InvalidInput("--poll, --sample-interval and --lease-timeout must be greater than 0")
    if max_frames is not None and max_frames < 1:
        raise InvalidInput("--max-frames must be 1 or more")
    if cores is not None and cores <= 0:
        raise InvalidInput("--cores must be greater than 0")
    if rediscover_interval < 0:
        raise InvalidInput("--rediscover-interval must be 0 (only on SIGHUP) or more")
    if reservation_timeout < 0:
        raise InvalidInput("--reservation-timeout must be 0 (no reservations) or more")
    from cuectl.run.worker.gpuwatch import farm_policy

    gpu_policy = farm_policy(
        escape=gpu_escape, idle_limit=gpu_idle_limit, idle_action=gpu_idle_action, idle_util=gpu_idle_util
    )
    if gpu_suspect_jobs < 0:
        raise InvalidInput("--gpu-suspect-jobs must be 0 (never) or more")
    from cuectl.run.worker.health import xid_codes

    extra_xids = xid_codes(gpu_xid_drain, "--gpu-xid-drain")
    if nimby_util is not None and not 0 <= nimby_util <= 100:
        raise InvalidInput("--nimby-util must be a percentage from 0 to 100")
    nimby_bytes = None
    if nimby_memory is not None:
        from cuectl.sched.fields import size_bytes

        nimby_bytes = size_bytes(nimby_memory, "--nimby-memory")
    schedule = None
    if available is not None:
        from cuectl.run.hostschedule import parse_schedule

        schedule = parse_schedule(available, field="--available")
    limit = None
    if log_limit is not None:
        from cuectl.sched.fields import log_limit_bytes

        limit = log_limit_bytes(log_limit, "--log-limit")
    state = ctx.obj
    # A service or a log file (not a terminal): every line gets the time. The `error:` line
    # of a worker that never started keeps the plain form every command uses.
    stamped = (not sys.stderr.isatty()) if timestamps is None else timestamps
    term.stamp_lines(stamped)
    # GPUs first: a --backend that finds none is refused before the store is opened (or created).
    discovery = discover_gpus(backend)
    selected = list(devices) if devices else None
    if selected is not None or exclude_devices:
        from cuectl.run.devicefilter import select_inventory

        select_inventory(discovery.devices, selected, exclude_devices)  # a bad name: exit 2 before the store
    # A service waits for an unreachable store server; a batch run (--until-idle: tests,
    # CI, cron) fails at once with the error instead of hanging.
    store = (
        state.store(create=True)
        if until_idle
        else wait_for_store(
            lambda: state.store(create=True), warn=term.warn, heartbeat=heartbeat_path(name), reached=term.info
        )
    )
    w, discovery = build_worker(
        store,
        name=name,
        until_idle=until_idle,
        max_frames=max_frames,
        poll=poll,
        sample_interval=sample_interval,
        lease_timeout=lease_timeout,
        gpu_only=gpu_only,
        lock_dir=lock_dir,
        tags=tag,
        cores=cores,
        backend=backend,
        allowed_users=allow_user,
        run_as_submitter=run_as_submitter,
        log_limit=limit,
        discovery=discovery,
        rediscover_interval=rediscover_interval,
        devices=selected,
        exclude_devices=exclude_devices,
        nimby_memory=nimby_bytes,
        nimby_util=nimby_util,
        available=schedule,
        reservation_timeout=reservation_timeout,
        gpu_xid_drain=extra_xids,
        gpu_suspect_jobs=gpu_suspect_jobs,
        gpu_policy=gpu_policy,
    )
    w.warn = term.warn
    w.say = term.info
    for message in discovery.warnings():
        term.warn(message)
    from cuectl.run.lease import other_lock_dirs_in_use

    for other in other_lock_dirs_in_use(w.opts.lock_dir, warn=term.warn):
        term.warn(
            f"lock directory {other} is also in use on this machine: its leases and this worker's "
            f"({w.opts.lock_dir}) do not see each other, so a GPU could be used twice; use one"
        )
    if not quiet:
        devs = ", ".join(f"{d.index}:{d.model}" for d in w.devices)
        found = (
            f"{devs} (found by {', '.join(discovery.found_by())})"
            if devs
            else f"no GPUs (tried {', '.join(b.name for b in discovery.backends) or 'nothing'})"
        )
        term.info(f"worker {w.opts.name}: {found}; {w.opts.cores:g} CPU slots; store {store.url}")
        if schedule is not None:
            term.info(
                f"takes new frames only {schedule.describe()} (local time)"
                + ("" if schedule.is_open(_local_now()) else f"; now {schedule.closed_reason(_local_now())}")
            )
    term.stamp_lines(stamped, errors=stamped)  # started: from here on, errors are log lines too
    # In a terminal, SIGHUP means the terminal went away: drain as on SIGTERM. A service
    # (systemd, a container: no terminal) is sent SIGHUP to look for its GPUs again.
    hangup_stops = sys.stderr.isatty()
    if quiet:
        code = run_worker(w, hangup_stops=hangup_stops)
    else:
        with term.WorkerProgress(live=sys.stderr.isatty()) as progress:
            code = run_worker(w, on_iteration=progress, hangup_stops=hangup_stops)
    raise typer.Exit(code)


def _local_now() -> "datetime":
    from datetime import datetime

    return datetime.now()


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
