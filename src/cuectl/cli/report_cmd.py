"""``cuectl admin report``: accounting per job, layer, user, project, show, host, GPU model or day
(DESIGN §6, §9; figures explained in docs/accounting.md). The options only: what is printed
is ``cuectl.cli.report_view``'s (which the console script's fast path calls too), the
figures themselves are computed in the library."""

from typing import Optional

import typer

from cuectl.cli import report_view


def report_cmd(
    ctx: typer.Context,
    since: str = typer.Option(
        "7d",
        "--since",
        metavar="WHEN",
        help="Start of the window: a duration ago (7d, 12h) or an ISO date/timestamp (UTC).",
    ),
    until: Optional[str] = typer.Option(
        None, "--until", metavar="WHEN", help="End of the window (exclusive), as --since; default: now."
    ),
    by: str = typer.Option(
        "job",
        "--by",
        metavar="job|layer|user|project|show|host|gpu-model|day",
        help="Group rows by this (project, show: jobs without one are the group -).",
    ),
    format_: str = typer.Option("table", "--format", metavar="table|csv|json|prometheus", help="Output format."),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", metavar="FILE", help="Write to FILE atomically (temp file + rename) instead of stdout."
    ),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
) -> None:
    """GPU and CPU accounting over a time window: frames, failures, GPU-hours allocated,
    busy and wasted, efficiency, peak memory, queue waits (attempts that ended in it)."""
    report_view.show_report(
        ctx.obj.store, since=since, until=until, by=by, format_=format_, output=output, as_json=as_json
    )
