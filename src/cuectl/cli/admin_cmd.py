"""``cuectl admin …``: store maintenance and diagnosis."""

from __future__ import annotations

import time

import typer

from cuectl.cli import term

admin_app = typer.Typer(help="Maintenance: reap lost frames, diagnose the installation.", no_args_is_help=True)


@admin_app.command("reap")
def reap(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Requeue frames whose worker stopped heartbeating (their lease expired)."""
    ids = ctx.obj.store().reap(now=time.time())
    if as_json:
        term.emit_json({"reaped": ids})
    else:
        term.line(f"reaped {len(ids)} frame(s)" + (": " + ", ".join(map(str, ids)) if ids else ""))


def register(app: typer.Typer) -> None:
    app.add_typer(admin_app, name="admin")
