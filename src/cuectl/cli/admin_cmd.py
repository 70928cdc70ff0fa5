"""``cuectl admin …``: store maintenance and diagnosis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from cuectl.cli import term
from cuectl.cli.migrate_cmd import migrate_cmd
from cuectl.cli.report_cmd import report_cmd

admin_app = typer.Typer(help="Maintenance: reports, reaping, pruning, backups, diagnosis, stale leases.", no_args_is_help=True)
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
def prune(ctx: typer.Context,
          older_than: str = typer.Option(..., "--older-than", help="Delete finished jobs older than this (e.g. 30d)."),
          dry_run: bool = typer.Option(False, "--dry-run", help="List the jobs and log directories that would be "
                                                                "deleted; delete nothing."),
          yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask before deleting (asked only when stdin "
                                                              "and stdout are a terminal)."),
          as_json: bool = JSON_OPT) -> None:
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
            term.table(["ID", "NAME", "USER", "FINISHED", "LOG DIR"],
                       [[j["id"], j["name"], j["user"], j["finished_at"], j["log_dir"] or "-"] for j in jobs])
        term.line(f"would prune {len(jobs)} finished job(s) and {sum(1 for j in jobs if j['log_dir'])} "
                  f"log dir(s) (dry run: nothing deleted)")
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
def backup(ctx: typer.Context, dest: Path = typer.Argument(..., help="New file to write."),
           force: bool = typer.Option(False, "--force", help="Replace DEST if it is an existing regular file "
                                                             "(atomically).")) -> None:
    """Copy the store consistently while workers keep running (SQLite online backup).

    Refuses (exit 2, nothing written) a DEST that is not a regular file (/dev/null, a
    directory, a link), the live store and its -wal/-shm, and an existing file without --force."""
    store = ctx.obj.store()
    store.backup(dest, force=force)
    term.line(f"backed up {store.url} to {dest}")


@admin_app.command("doctor")
def doctor(ctx: typer.Context,
           lock_dir: Optional[Path] = typer.Option(None, "--lock-dir", help="Device lease directory to check."),
           as_json: bool = JSON_OPT) -> None:
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


token_app = typer.Typer(help="API tokens for `cuectl serve` (admins only): create, list, revoke.",
                        no_args_is_help=True)
admin_app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(ctx: typer.Context, user: str = typer.Argument(..., help="Whose token: what it submits is theirs."),
                 role: str = typer.Option("user", "--role", help="admin, user (changes only its own jobs) or viewer."),
                 label: Optional[str] = typer.Option(None, "--label", help="A note for `token list`."),
                 as_json: bool = JSON_OPT) -> None:
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
    term.table(["ID", "USER", "ROLE", "LABEL", "CREATED", "BY", "REVOKED", "LAST USED"],
               [[t["id"], t["user"], t["role"], t["label"] or "-", t["created_at"], t["created_by"],
                 t["revoked_at"] or "-", t["last_used_at"] or "-"] for t in tokens])


@token_app.command("revoke")
def token_revoke(ctx: typer.Context, token_id: int = typer.Argument(..., metavar="ID"),
                 as_json: bool = JSON_OPT) -> None:
    """Revoke a token at once (it stays listed, marked revoked)."""
    token = ctx.obj.store().revoke_token(token_id, now=time.time())
    if as_json:
        term.emit_json(token.to_json())
    else:
        term.line(f"revoked token {token.id} of {token.user}")


lease_app = typer.Typer(help="This machine's device leases: clear a record left by a holder that is gone.",
                        no_args_is_help=True)
admin_app.add_typer(lease_app, name="lease")


@lease_app.command("break")
def lease_break(device: str = typer.Argument(..., metavar="DEVICE",
                                             help="Index or UUID from `cuectl gpu list` (or `cuectl gpu leases`)."),
                lock_dir: Optional[Path] = typer.Option(None, "--lock-dir", metavar="DIR",
                                                        help="Lease lock directory (default: CUECTL_LOCK_DIR)."),
                as_json: bool = JSON_OPT) -> None:
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
        term.line(f"{name}: cleared the stale lease record of {pid} ({who}{since}), which no longer holds it; "
                  f"the device is free")


admin_app.command("report", help="Accounting per job, layer, user, host, GPU model or day: GPU-hours "
                                  "allocated/busy/wasted, efficiency, failures, queue waits.")(report_cmd)


admin_app.command("migrate", help="Apply schema changes to the store now (workers do it themselves unless "
                                   "CUECTL_AUTO_MIGRATE=0).")(migrate_cmd)


def register(app: typer.Typer) -> None:
    app.add_typer(admin_app, name="admin")
