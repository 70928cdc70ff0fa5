"""``cuectl admin migrate``: apply schema changes to the store explicitly.

Workers and commands migrate an old schema by themselves when they open the store, unless
``CUECTL_AUTO_MIGRATE=0`` — the setting for a shared PostgreSQL whose upgrades an admin
schedules: then an old schema is an error until this command has run (once, from any
host, while old workers may still be running: migrations only add). SQLite stores always
migrate when opened, so for them this reports the version.
"""

import typer

from cuectl.cli import term


def migrate_cmd(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Bring the store's schema up to date and say from which version to which."""
    from cuectl import config
    from cuectl.sched.store import open_store

    # Opened here rather than through ctx.obj.store(): the shared opener would refuse an
    # old schema when CUECTL_AUTO_MIGRATE=0, which is exactly what this command is for.
    store = open_store(ctx.obj.db or config.default_db_url(), busy_timeout_s=config.busy_timeout(), migrate=False)
    try:
        before, after = store.migrate()
        url = store.url  # passwords redacted
    finally:
        store.close()
    if as_json:
        term.emit_json({"store": url, "from_version": before, "to_version": after, "migrated": after != before})
    elif before == after:
        term.line(f"{url}: schema version {after}, up to date")
    else:
        term.line(f"{url}: migrated schema version {before} -> {after}")
