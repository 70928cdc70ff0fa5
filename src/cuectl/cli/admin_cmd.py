"""``cuectl admin …``: store maintenance and diagnosis."""

import time
from pathlib import Path
from typing import Optional

import typer

from cuectl.cli import term
from cuectl.cli.migrate_cmd import migrate_cmd
from cuectl.cli.report_cmd import report_cmd
from cuectl.errors import InvalidInput

admin_app = typer.Typer(
    help="Maintenance: reports, reaping, pruning, backups, diagnosis, stale leases, limits, quotas and services.",
    no_args_is_help=True,
)
JSON_OPT = typer.Option(False, "--json", help="Print JSON.")


@admin_app.command("reap")
def reap(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Requeue frames whose worker stopped heartbeating (their lease expired)."""
    ids = ctx.obj.store().reap(now=time.time())
    if as_json:
        term.emit_json({"reaped": ids})
    else:
        term.line(f"reaped {len(ids)} frame(s)" + (": " + ", ".join(map(str, ids)) if ids else ""))


@admin_app.command("prune")
def prune(
    ctx: typer.Context,
    older_than: str = typer.Option(..., "--older-than", help="Delete finished jobs older than this (e.g. 30d)."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List the jobs and log directories that would be deleted; delete nothing."
    ),
    yes: bool = typer.Option(
        False, "--yes", "-y", help="Do not ask before deleting (asked only when stdin and stdout are a terminal)."
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Delete finished jobs (frames, attempts, samples and logs) that ended long ago.

    On a terminal it first asks "delete N jobs? [y/N]" (not with --yes or --dry-run);
    without a terminal (scripts, cron) it deletes without asking. Job and frame ids are
    never reused after a prune."""
    import sys

    from cuectl.admin import prune as do_prune
    from cuectl.admin import prune_preview
    from cuectl.units import parse_duration

    age = parse_duration(older_than, field="--older-than")
    store = ctx.obj.store()
    now = time.time()  # one cutoff: what is listed or confirmed is what gets deleted
    if dry_run:
        preview = prune_preview(store, older_than_s=age, now=now)
        if as_json:
            term.emit_json(preview)
            return
        jobs = preview["jobs"]
        if jobs:
            term.table(
                [
                    "ID",
                    term.Col("NAME", fit="name"),
                    "USER",
                    term.Col("FINISHED", "time"),
                    term.Col("LOG DIR", fit="free"),
                ],
                [[j["id"], j["name"], j["user"], j["finished_at"], j["log_dir"] or "-"] for j in jobs],
            )
        term.line(
            f"would prune {len(jobs)} finished job(s) and {sum(1 for j in jobs if j['log_dir'])} "
            f"log dir(s) (dry run: nothing deleted)"
        )
        return
    if not yes and sys.stdin.isatty() and sys.stdout.isatty():
        count = len(store.prunable_jobs(before=now - age))
        if count and not typer.confirm(f"delete {count} jobs?", default=False, err=True):
            term.error("nothing deleted", "rerun with --yes to skip the question, or --dry-run to see the jobs")
            raise typer.Exit(1)
    result = do_prune(store, older_than_s=age, now=now)
    if as_json:
        term.emit_json(result)
    else:
        term.line(f"pruned {len(result['jobs'])} finished job(s)")


@admin_app.command("backup")
def backup(
    ctx: typer.Context,
    dest: Path = typer.Argument(..., help="New file to write."),
    force: bool = typer.Option(False, "--force", help="Replace DEST if it is an existing regular file (atomically)."),
) -> None:
    """Copy the store consistently while workers keep running (SQLite online backup).

    Refuses (exit 2, nothing written) a DEST that is not a regular file (/dev/null, a
    directory, a link), the live store and its -wal/-shm, and an existing file without --force."""
    store = ctx.obj.store()
    store.backup(dest, force=force)
    term.line(f"backed up {store.url} to {dest}")


@admin_app.command("doctor")
def doctor(
    ctx: typer.Context,
    lock_dir: Optional[Path] = typer.Option(None, "--lock-dir", help="Device lease directory to check."),
    as_json: bool = JSON_OPT,
) -> None:
    """Check the store, GPU backends, the lease directory and hosts; explain what is wrong."""
    from cuectl import config
    from cuectl.admin import doctor as run_doctor

    checks = run_doctor(ctx.obj.store, lock_dir=lock_dir or config.lock_dir())
    if as_json:
        term.emit_json({"checks": [c.to_json() for c in checks]})
    else:
        term.table(["CHECK", "STATUS", "DETAIL"], [[c.name, c.status.upper(), c.detail] for c in checks])
    if any(c.status == "fail" for c in checks):
        raise typer.Exit(1)


@admin_app.command("pg-roles")
def pg_roles() -> None:
    """Print the SQL that sets up per-user roles and row-level security on a PostgreSQL store
    (run it as the tables' owner: cuectl admin pg-roles | psql URL; docs/postgres.md)."""
    from cuectl.sched.store import roles_sql

    term.write_text(roles_sql())


token_app = typer.Typer(help="API tokens for `cuectl serve` (admins only): create, list, revoke.", no_args_is_help=True)
admin_app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    user: str = typer.Argument(..., help="Whose token: what it submits is theirs."),
    role: str = typer.Option("user", "--role", help="admin, user (changes only its own jobs) or viewer."),
    label: Optional[str] = typer.Option(None, "--label", help="A note for `token list`."),
    as_json: bool = JSON_OPT,
) -> None:
    """Create a token; its secret is printed once and never stored (only its SHA-256)."""
    token, secret = ctx.obj.store().create_token(user, role=role, label=label, now=time.time())
    if as_json:
        term.emit_json({**token.to_json(), "secret": secret})
    else:
        term.line(secret)
        term.info(f"token {token.id} for {token.user} ({token.role}): keep it secret, it is not shown again")


@token_app.command("list")
def token_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Every token (never its secret), revoked ones too."""
    tokens = [t.to_json() for t in ctx.obj.store().list_tokens()]
    if as_json:
        term.emit_json({"tokens": tokens})
        return
    C = term.Col
    term.table(
        [
            "ID",
            "USER",
            "ROLE",
            C("LABEL", fit="free"),
            C("CREATED", "time"),
            "BY",
            C("REVOKED", "time"),
            C("LAST USED", "time"),
        ],
        [
            [
                t["id"],
                t["user"],
                t["role"],
                t["label"] or "-",
                t["created_at"],
                t["created_by"],
                t["revoked_at"] or "-",
                t["last_used_at"] or "-",
            ]
            for t in tokens
        ],
    )


@token_app.command("revoke")
def token_revoke(
    ctx: typer.Context, token_id: int = typer.Argument(..., metavar="ID"), as_json: bool = JSON_OPT
) -> None:
    """Revoke a token at once (it stays listed, marked revoked)."""
    token = ctx.obj.store().revoke_token(token_id, now=time.time())
    if as_json:
        term.emit_json(token.to_json())
    else:
        term.line(f"revoked token {token.id} of {token.user}")


limit_app = typer.Typer(
    help="Named limits (admins change them): at most N running frames, farm-wide, of every "
    "layer that names the limit (a licence pool).",
    no_args_is_help=True,
)
admin_app.add_typer(limit_app, name="limit")


def _limit_rows(limits: list[dict]) -> None:
    term.table(
        ["NAME", "MAX RUNNING", "RUNNING", "WAITING"],
        [[r["name"], r["max_running"], r["running"], r["waiting"]] for r in limits],
    )


@limit_app.command("set")
def limit_set(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="1-100 of A-Z a-z 0-9 _ . -"),
    max_running: int = typer.Argument(..., metavar="N", help="Frames holding it at once (0: none run)."),
    as_json: bool = JSON_OPT,
) -> None:
    """Create a named limit, or change its N (layers hold it with `limits:` or --limit)."""
    from cuectl.sched.store.caps import check_limit

    check_limit(name, max_running)  # bad input: exit 2 before a store is opened (or created)
    row = ctx.obj.store().set_limit(name, max_running)
    if as_json:
        term.emit_json(row)
    else:
        term.line(
            f"limit {row['name']}: at most {row['max_running']} running ({row['running']} now, "
            f"{row['waiting']} waiting)"
        )


@limit_app.command("list")
def limit_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Every named limit, with the frames holding it now and those waiting for it."""
    limits = ctx.obj.store().list_limits()
    if as_json:
        term.emit_json({"limits": limits})
    elif limits:
        _limit_rows(limits)
    else:
        term.info("no limits (an admin creates one with `cuectl admin limit set NAME N`)")


@limit_app.command("delete")
def limit_delete(ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"), as_json: bool = JSON_OPT) -> None:
    """Remove a named limit. Refused (exit 1) while unfinished frames hold it."""
    ctx.obj.store().set_limit(name, None)
    if as_json:
        term.emit_json({"name": name, "deleted": True})
    else:
        term.line(f"deleted limit {name}")


quota_app = typer.Typer(
    help="Quotas (admins change them): the GPUs and cores a user's or a project's running "
    "frames may hold at once, farm-wide.",
    no_args_is_help=True,
)
admin_app.add_typer(quota_app, name="quota")
KIND_ARG = typer.Argument(..., metavar="user|project", help="Whose quota: a user's or a project's.")


def _cap(value: float | None, used: float) -> str:
    return f"{used:g}/{value:g}" if value is not None else f"{used:g}/-"


@quota_app.command("set")
def quota_set(
    ctx: typer.Context,
    kind: str = KIND_ARG,
    name: str = typer.Argument(..., metavar="NAME", help="The user name, or the project name."),
    gpus: Optional[int] = typer.Option(None, "--gpus", metavar="N", help="GPUs its running frames may hold at once."),
    cores: Optional[float] = typer.Option(
        None, "--cores", metavar="N", help="Cores its running frames may hold at once."
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Set a quota: --gpus and/or --cores. It replaces the quota as a whole: a cap not given
    is off (give both to keep both)."""
    from cuectl.sched.store.caps import check_quota

    check_quota(kind, name, gpus, cores)  # bad input: exit 2 before a store is opened (or created)
    row = ctx.obj.store().set_quota(kind, name, max_gpus=gpus, max_cores=cores)
    if as_json:
        term.emit_json(row)
        return
    caps = [
        f"{row['max_gpus']} GPUs" if row["max_gpus"] is not None else None,
        f"{row['max_cores']:g} cores" if row["max_cores"] is not None else None,
    ]
    term.line(
        f"quota of {row['kind']} {row['name']}: at most {' and '.join(c for c in caps if c)} running "
        f"({row['gpus_in_use']} GPUs, {row['cores_in_use']:g} cores now)"
    )


@quota_app.command("list")
def quota_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Every quota, with what its user or project holds now (in use/cap; - : no cap)."""
    quotas = ctx.obj.store().list_quotas()
    if as_json:
        term.emit_json({"quotas": quotas})
    elif quotas:
        term.table(
            ["KIND", "NAME", "GPUS", "CORES"],
            [
                [q["kind"], q["name"], _cap(q["max_gpus"], q["gpus_in_use"]), _cap(q["max_cores"], q["cores_in_use"])]
                for q in quotas
            ],
        )
    else:
        term.info("no quotas (an admin sets one with `cuectl admin quota set user|project NAME --gpus N`)")


@quota_app.command("delete")
def quota_delete(
    ctx: typer.Context, kind: str = KIND_ARG, name: str = typer.Argument(..., metavar="NAME"), as_json: bool = JSON_OPT
) -> None:
    """Remove a user's or a project's quota."""
    ctx.obj.store().set_quota(kind, name, max_gpus=None, max_cores=None, delete=True)
    if as_json:
        term.emit_json({"kind": kind, "name": name, "deleted": True})
    else:
        term.line(f"deleted the quota of {kind} {name}")


service_app = typer.Typer(
    help="Services (admins change them): named resource defaults (cores, memory, GPUs, GPU "
    "memory, tags, timeout) for the layers that name them with `service:`; the service "
    "`default` serves layers that name none.",
    no_args_is_help=True,
)
admin_app.add_typer(service_app, name="service")
_CLEARS = "; none: the service gives none"


def _service_text(row: dict) -> str:
    from cuectl.units import format_bytes, format_duration

    parts = []
    if row["cores"] is not None:
        parts.append(f"cores {row['cores']:g}")
    if row["memory_bytes"] is not None:
        parts.append(f"memory {format_bytes(row['memory_bytes'])}")
    if row["gpus"] is not None:
        parts.append(f"gpus {row['gpus']}")
    if row["gpu_memory_min_bytes"] is not None:
        parts.append(f"gpu memory {format_bytes(row['gpu_memory_min_bytes'])}")
    if row["tags"] is not None:
        parts.append(f"tags {','.join(row['tags']) or '-'}")
    if row["timeout_s"] is not None:
        parts.append(f"timeout {format_duration(row['timeout_s'])}")
    for key, what in (("gpu_capability_min", "compute"), ("gpu_driver_min", "driver"), ("gpu_cuda_min", "CUDA")):
        if row.get(key) is not None:
            parts.append(f"{what} >= {row[key]}")
    return ", ".join(parts) or "no defaults"


@service_app.command("set")
def service_set(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME", help="1-100 of A-Z a-z 0-9 _ . -"),
    cores: Optional[str] = typer.Option(None, "--cores", metavar="N", help="Cores per frame" + _CLEARS),
    memory: Optional[str] = typer.Option(
        None, "--memory", metavar="SIZE", help="Host memory per frame, e.g. 8G" + _CLEARS
    ),
    gpus: Optional[str] = typer.Option(None, "--gpus", metavar="N", help="Devices per frame" + _CLEARS),
    gpu_memory: Optional[str] = typer.Option(
        None,
        "--gpu-memory",
        metavar="SIZE",
        help="Memory per device (gpu_memory_min), e.g. 24G; applies to layers with GPUs" + _CLEARS,
    ),
    tags: Optional[str] = typer.Option(None, "--tags", metavar="A,B", help="Host tags, comma separated" + _CLEARS),
    timeout: Optional[str] = typer.Option(
        None, "--timeout", metavar="DURATION", help="Per-frame timeout, e.g. 2h" + _CLEARS
    ),
    gpu_capability_min: Optional[str] = typer.Option(
        None, "--gpu-capability-min", metavar="X.Y", help="CUDA compute capability per device, at least" + _CLEARS
    ),
    gpu_driver_min: Optional[str] = typer.Option(
        None, "--gpu-driver-min", metavar="VERSION", help="Driver version per device, at least" + _CLEARS
    ),
    gpu_cuda_min: Optional[str] = typer.Option(
        None, "--gpu-cuda-min", metavar="X.Y", help="The driver's CUDA version, at least" + _CLEARS
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Create a service, or change it: options not given keep their value; `none` clears one.

    A layer naming it (`service: NAME`, `--service NAME`) takes each value it does not set
    itself when the job is submitted; jobs already submitted keep theirs."""
    from cuectl.sched import services

    name = services.check_name(name)  # bad input: exit 2 before a store is opened (or created)
    values = services.parse_options(
        {
            "cores": cores,
            "memory_bytes": memory,
            "gpus": gpus,
            "gpu_memory_min_bytes": gpu_memory,
            "tags": tags,
            "timeout_s": timeout,
            "gpu_capability_min": gpu_capability_min,
            "gpu_driver_min": gpu_driver_min,
            "gpu_cuda_min": gpu_cuda_min,
        }
    )
    row = ctx.obj.store().set_service(name, values)
    if as_json:
        term.emit_json(row)
    else:
        term.line(f"service {row['name']}: {_service_text(row)}")


@service_app.command("list")
def service_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Every service and the defaults it gives (- : none for that field)."""
    from cuectl.units import format_bytes, format_duration

    rows = ctx.obj.store().list_services()
    if as_json:
        term.emit_json({"services": rows})
    elif rows:
        term.table(
            ["NAME", "CORES", "MEMORY", "GPUS", "GPU MEMORY", "TAGS", "TIMEOUT"],
            [
                [
                    r["name"],
                    "-" if r["cores"] is None else f"{r['cores']:g}",
                    format_bytes(r["memory_bytes"]),
                    "-" if r["gpus"] is None else r["gpus"],
                    format_bytes(r["gpu_memory_min_bytes"]),
                    "-" if not r["tags"] else ",".join(r["tags"]),
                    format_duration(r["timeout_s"]),
                ]
                for r in rows
            ],
        )
    else:
        term.info("no services (an admin creates one with `cuectl admin service set NAME --cores N ...`)")


@service_app.command("delete")
def service_delete(
    ctx: typer.Context, name: str = typer.Argument(..., metavar="NAME"), as_json: bool = JSON_OPT
) -> None:
    """Remove a service (jobs already submitted keep the values they took from it)."""
    from cuectl.sched import services

    name = services.check_name(name)
    ctx.obj.store().delete_service(name)
    if as_json:
        term.emit_json({"name": name, "deleted": True})
    else:
        term.line(f"deleted service {name}")


lease_app = typer.Typer(
    help="This machine's device leases: make their lock files, clear a record left by a holder that is gone.",
    no_args_is_help=True,
)
admin_app.add_typer(lease_app, name="lease")


@lease_app.command("break")
def lease_break(
    device: str = typer.Argument(
        ..., metavar="DEVICE", help="Index or UUID from `cuectl gpu list` (or `cuectl gpu leases`)."
    ),
    lock_dir: Optional[Path] = typer.Option(
        None, "--lock-dir", metavar="DIR", help="Lease lock directory (default: CUECTL_LOCK_DIR)."
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Clear the stale lease record of DEVICE (its holder died without releasing).

    Refuses (exit 1) while the device is leased: a live holder is never broken. The lock
    file stays; only the record `gpu leases` reads is cleared (docs/leases.md)."""
    from cuectl import config
    from cuectl.admin import break_lease
    from cuectl.gpu import discover

    found = break_lease(device, lock_dir=lock_dir or config.lock_dir(), devices=discover().devices)
    if as_json:
        term.emit_json(found.to_json())
        return
    name = f"gpu {'?' if found.index is None else found.index} ({found.uuid})"
    if not found.cleared:
        term.line(f"{name}: no lease record to clear; the device is free")
    elif found.record is None:
        term.line(f"{name}: cleared an unreadable lease record; the device is free")
    else:
        r = found.record
        who = ", ".join(str(x) for x in (r.holder, r.kind, r.user) if x)
        since = f", since {r.to_json()['since']}" if r.since is not None else ""
        pid = "an unknown pid" if r.pid is None else f"pid {r.pid}"
        term.line(
            f"{name}: cleared the stale lease record of {pid} ({who}{since}), which no longer holds it; "
            f"the device is free"
        )


@lease_app.command("setup")
def lease_setup(
    lock_dir: Optional[Path] = typer.Option(
        None, "--lock-dir", metavar="DIR", help="Lease lock directory (default: CUECTL_LOCK_DIR)."
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Make the lock file of every device of this machine (as root, or the lock directory's owner).

    In a shared lock directory only root or its owner makes lock files, so that no user can
    delete one a lease holds; other users' leases only open them. A worker service running
    as another account runs this as root before it starts. Waits for no lease; exit 1 if a
    lock file is left unusable (docs/leases.md)."""
    from cuectl import config
    from cuectl.admin import setup_lock_files
    from cuectl.gpu import discover
    from cuectl.run import lockfile

    done = setup_lock_files(lock_dir or config.lock_dir(), discover().devices)
    if as_json:
        term.emit_json(done.to_json())
    else:
        ready = sum(1 for f in done.files if f.problem is None)
        term.line(
            f"lock directory {done.lock_dir} ({lockfile.user_name(done.owner_uid)}, mode {done.mode:o}): "
            f"{ready} of {len(done.files)} lock file(s) ready"
        )
        if done.files:
            term.table(
                ["GPU", "UUID", "LOCK FILE", "STATE"],
                [[str(f.index), f.uuid, str(f.lock_file), f.problem or "ready"] for f in done.files],
            )
    if not done.ready:
        raise typer.Exit(1)


notify_app = typer.Typer(
    help="Notifications: the farm's defaults (admins set them; every job gets them) and "
    "their delivery (docs/notifications.md).",
    no_args_is_help=True,
)
admin_app.add_typer(notify_app, name="notify")


def _notify_targets(entries: list[dict]) -> list[list[str]]:
    return [
        [
            next(k for k in ("command", "webhook", "email") if k in e),
            ",".join(e["on"]),
            str(next(e[k] for k in ("command", "webhook", "email") if k in e)),
        ]
        for e in entries
    ]


@notify_app.command("set")
def notify_set(
    ctx: typer.Context,
    command: list[str] = typer.Option([], "--command", metavar="CMD", help="A shell command (repeatable)."),
    webhook: list[str] = typer.Option([], "--webhook", metavar="URL", help="An http(s) URL (repeatable)."),
    email: list[str] = typer.Option([], "--email", metavar="ADDR", help="An address (repeatable)."),
    on: list[str] = typer.Option(
        [], "--on", metavar="EVENT", help="finished, failed, dead (repeatable; default finished, failed)."
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Replace the farm's notification defaults: every job also notifies these targets."""
    from cuectl.sched import notify as nt

    entries = nt.from_flags(commands=command, webhooks=webhook, emails=email, on=on)
    if not entries:
        raise InvalidInput("give --command, --webhook or --email (`cuectl admin notify clear` removes them)")
    rows = ctx.obj.store().set_notify_defaults(entries)
    if as_json:
        term.emit_json({"notify_defaults": rows})
    else:
        term.table(["KIND", "ON", "TARGET"], _notify_targets(rows))


@notify_app.command("list")
def notify_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """The farm's notification defaults."""
    rows = ctx.obj.store().notify_defaults()
    if as_json:
        term.emit_json({"notify_defaults": rows})
    elif rows:
        term.table(["KIND", "ON", "TARGET"], _notify_targets(rows))
    else:
        term.info("no farm notification defaults (an admin sets them with `cuectl admin notify set`)")


@notify_app.command("clear")
def notify_clear(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Remove the farm's notification defaults."""
    ctx.obj.store().set_notify_defaults([])
    if as_json:
        term.emit_json({"notify_defaults": []})
    else:
        term.line("farm notification defaults cleared")


@notify_app.command("history")
def notify_history(
    ctx: typer.Context,
    job: Optional[str] = typer.Option(None, "--job", metavar="JOB"),
    pending: bool = typer.Option(False, "--pending", help="Only those not delivered yet."),
    limit: int = typer.Option(1000, "--limit", metavar="N"),
    as_json: bool = JSON_OPT,
) -> None:
    """Recorded notifications: what was (or is still to be) delivered, tries and errors."""
    from cuectl.sched.views import iso

    rows = ctx.obj.store().list_notifications(job=job, pending=pending, limit=limit)
    for r in rows:  # ISO times, as every --json; a given-up row is never due (null)
        for key in ("created_at", "next_at", "claimed_until", "delivered_at"):
            r[key] = iso(r[key]) if r[key] is not None and r[key] < 1e15 else None
    if as_json:
        term.emit_json({"notifications": rows})
        return
    if not rows:
        term.info("no notifications recorded")
        return
    C = term.Col
    term.table(
        [
            "ID",
            "JOB",
            "EVENT",
            "FRAME",
            "KIND",
            C("TARGET", fit="name"),
            "TRIES",
            C("DELIVERED", "time"),
            C("ERROR", fit="free"),
        ],
        [
            [
                r["id"],
                r["job_id"],
                r["event"],
                r["frame_id"] or "-",
                r["kind"],
                r["target"],
                r["attempts"],
                r["delivered_at"] or "-",
                r["error"] or "",
            ]
            for r in rows
        ],
    )


@notify_app.command("deliver")
def notify_deliver(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Deliver what is due now, once (for cron, or a store without workers running)."""
    import os

    from cuectl import config
    from cuectl.run.notify import Deliverer

    store = ctx.obj.store()
    # As root, hooks run as each job's proven user (never as root), as a root worker runs them.
    deliverer = Deliverer(
        store,
        deliverer_id=f"admin@{config.hostname()}:{os.getpid()}",
        run_as_submitter=os.geteuid() == 0,
        warn=term.warn,
    )
    delivered, failed = deliverer.run_once(store.clock())
    if as_json:
        term.emit_json({"delivered": delivered, "failed": failed})
    else:
        term.line(f"{delivered} notification(s) delivered, {failed} failed")
    if failed:
        raise typer.Exit(1)


setting_app = typer.Typer(
    help="Store settings (admins change them), e.g. depend.satisfy_on_eaten (docs/opencue.md).", no_args_is_help=True
)
admin_app.add_typer(setting_app, name="setting")


def _setting_rows(rows: list[dict]) -> list[list[str]]:
    return [[r["name"], str(r["value"]).lower(), str(r["default"]).lower(), r["help"]] for r in rows]


@setting_app.command("list")
def setting_list(ctx: typer.Context, as_json: bool = JSON_OPT) -> None:
    """Every store setting, its value and its default."""
    rows = ctx.obj.store().settings()
    if as_json:
        term.emit_json({"settings": rows})
    else:
        term.table(["NAME", "VALUE", "DEFAULT", "MEANING"], _setting_rows(rows))


@setting_app.command("set")
def setting_set(
    ctx: typer.Context,
    name: str = typer.Argument(..., metavar="NAME"),
    value: str = typer.Argument(..., metavar="VALUE", help="true or false."),
    as_json: bool = JSON_OPT,
) -> None:
    """Set a store setting (admins only). Turning depend.satisfy_on_eaten on releases what
    already waits on eaten frames."""
    rows = ctx.obj.store().set_setting(name, value, now=time.time())
    if as_json:
        term.emit_json({"settings": rows})
    else:
        term.table(["NAME", "VALUE", "DEFAULT", "MEANING"], _setting_rows(rows))


admin_app.command(
    "report",
    help="Accounting per job, layer, user, project, show, host, GPU model or day: GPU-hours "
    "allocated/busy/wasted, efficiency, failures, queue waits.",
)(report_cmd)


admin_app.command(
    "migrate", help="Apply schema changes to the store now (workers do it themselves unless CUECTL_AUTO_MIGRATE=0)."
)(migrate_cmd)


def register(app: typer.Typer) -> None:
    app.add_typer(admin_app, name="admin")
