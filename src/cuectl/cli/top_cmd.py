"""``cuectl top``: a live view of hosts, their GPUs and who holds each, running frames with
live GPU values, and waiting jobs with their pending reasons (``cuectl.top.snapshot``).

On a terminal it redraws every ``--interval`` seconds (rich Live); ``q`` quits, Ctrl-C too,
and the terminal's mode is restored either way. ``--once`` (and any stdout that is not a
terminal) prints one plain snapshot; ``--json`` prints it as JSON. Everything from the store
reaches rich as ``Text`` (never markup).
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer

from cuectl.cli import term

if TYPE_CHECKING:
    from rich.console import RenderableType

Section = tuple[str, list[term.Col], list[list[Any]]]  # cells: str, or term.Cell (a coloured bar)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _util(device: dict[str, Any]) -> str:
    """A device's utilisation; once its last sample is too old to be current, how old it is."""
    from cuectl.units import format_duration

    if (
        device["utilization_pct"] is None
        and device.get("sample_age_s") is not None
        and device.get("memory_used_bytes") is None
    ):
        return f"{format_duration(device['sample_age_s'])} ago"
    return _pct(device["utilization_pct"])


def _bar(value: float | None, width: int = 10) -> str:
    if value is None:
        return " " * width
    filled = max(0, min(width, int(round(value / 100.0 * width))))
    return "█" * filled + "·" * (width - filled)


def _memory(used: int | None, total: int | None) -> str:
    from cuectl.units import format_bytes

    if used is None and total is None:
        return "-"
    if total is None:
        return format_bytes(used)
    return f"{format_bytes(used) if used is not None else '?'} / {format_bytes(total)}"


def _holder(holder: dict[str, Any] | None) -> str:
    if holder is None:
        return "free"
    kind = holder["kind"]
    if kind == "frame":
        return f"frame {holder['frame_id']} {holder['label']}"
    if kind == "foreign":
        return "other process (not cuectl)"
    who = ", ".join(str(x) for x in (holder.get("label"), holder.get("user")) if x)
    pid = f" pid {holder['pid']}" if holder.get("pid") is not None else ""
    name = {"run": "cuectl run", "worker": "worker", "api": "cuectl.lease()"}.get(kind, kind)
    return f"{name}{pid}" + (f" ({who})" if who else "")


def _owner(p: dict[str, Any]) -> str:
    """Whose a process on a GPU is: ``frame 12 (job shot)``, a lease's holder, or ``foreign``."""
    if p["owner"] == "foreign":
        return "foreign (not run by cuectl)"
    return p.get("holder") or p["owner"]


def header(snap: dict[str, Any], *, short: bool = False) -> str:
    """The summary line; ``short``: its time as the tables show times (the live view)."""
    t = snap["totals"]
    at = term.short_time(snap["at"]) if short else snap["at"]
    return (
        f"cuectl top  {at}  hosts {t['hosts_up']}/{t['hosts']} up  "
        f"gpus {t['gpus_held']}/{t['gpus']} held  running {t['running']}  "
        f"waiting {t['waiting_frames']} frames in {t['waiting_jobs']} job{'' if t['waiting_jobs'] == 1 else 's'}"
    )


def sections(snap: dict[str, Any]) -> list[Section]:
    """The view as (title, columns, rows of strings): the one source for both renderings."""
    from cuectl.units import format_duration

    hosts: list[list[Any]] = []
    for h in snap["hosts"]:
        state = h["state"] + (" locked" if h["locked"] else "")
        if not h["devices"]:
            hosts.append([h["name"], state, "-", "no GPU", "", "-", "-", "-"])
        for i, d in enumerate(h["devices"]):
            hosts.append(
                [
                    h["name"] if i == 0 else "",
                    state if i == 0 else "",
                    "-" if d["index"] is None else str(d["index"]),
                    d["model"] or "?",
                    term.Cell(_bar(d["utilization_pct"]), term.util_colour(d["utilization_pct"])),
                    _util(d),
                    _memory(d["memory_used_bytes"], d["memory_total_bytes"]),
                    _holder(d["holder"]) + (" (held idle)" if d.get("held_idle") else ""),
                ]
            )
    frames = [
        [
            f"{f['id']} {f['name']}",
            f["job"],
            f["host"] or "-",
            str(len(f["gpu_uuids"])),
            _pct(f["gpu_util_pct"]),
            _memory(f["gpu_memory_used_bytes"], None),
            format_duration(f["elapsed_s"]),
            str(f["attempts"]),
        ]
        for f in snap["frames"]
    ]
    processes = [
        [
            h["name"],
            "-" if d["index"] is None else str(d["index"]),
            str(p["pid"]),
            p["user"] or "?",
            _memory(p["memory_bytes"], None),
            _owner(p),
        ]
        for h in snap["hosts"]
        for d in h["devices"]
        for p in d.get("processes") or []
    ]
    waiting = [
        [
            f"{w['id']} {w['name']}",
            w["user"],
            str(w["priority"]),
            str(w["waiting"]) + (f" (+{w['depend']} depend)" if w["depend"] else ""),
            ("paused" if w["paused"] else "") or (w["pending_reason"] or "-"),
        ]
        for w in snap["waiting"]
    ]
    # On a narrow terminal free text (holders, reasons) is cut first, then the columns with
    # a ``drop`` go, highest first: a name is never cut to keep a reason whole.
    C = term.Col
    return [
        (
            "Hosts and GPUs",
            [
                C("HOST", fit="name"),
                C("STATE", "state"),
                C("GPU"),
                C("MODEL", fit="name", drop=2),
                C("", drop=3),
                C("UTIL", "util"),
                C("MEMORY", drop=1),
                C("HELD BY", fit="free"),
            ],
            hosts,
        ),
        (
            f"Running frames ({snap['totals']['running']})",
            [
                C("FRAME", fit="name"),
                C("JOB", fit="name"),
                C("HOST", fit="name"),
                C("GPUS", drop=2),
                C("UTIL", "util"),
                C("MEMORY", drop=1),
                C("ELAPSED"),
                C("ATTEMPT", drop=3),
            ],
            frames,
        ),
        *(
            [
                (
                    "GPU processes",
                    [
                        C("HOST", fit="name"),
                        C("GPU"),
                        C("PID"),
                        C("USER", fit="name"),
                        C("MEMORY"),
                        C("OWNER", fit="free"),
                    ],
                    processes,
                )
            ]
            if processes
            else []
        ),
        (
            f"Waiting jobs ({len(snap['waiting'])})",
            [C("JOB", fit="name"), C("USER", fit="name"), C("PRI", drop=1), C("WAITING"), C("REASON", fit="free")],
            waiting,
        ),
    ]


def plain_text(snap: dict[str, Any]) -> str:
    """Aligned plain text (``--once``, pipes, logs): no colour, no control sequences."""
    out = [header(snap)]
    for title, columns, rows in sections(snap):
        out += ["", title]
        if not rows:
            out.append("  (none)")
            continue
        # Store text (names, holders, reasons) with its control characters escaped (term.safe).
        texts = [
            [c.name for c in columns],
            *([term.safe(v if isinstance(v, str) else v.text) for v in row] for row in rows),
        ]
        widths = [max(len(r[i]) for r in texts) for i in range(len(columns))]
        for row in texts:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return "\n".join(out) + "\n"


def renderable(snap: dict[str, Any] | None, problem: str | None = None, *, width: int = 80) -> RenderableType:
    """The live view for a terminal ``width`` cells wide: each table fits it (term.fitted_table)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = []
    if snap is not None:
        # Wrapped between words (the console soft-wraps, which the screen would crop).
        parts.append(Text(header(snap, short=True) + "   (q quits)", style="bold", no_wrap=False, overflow="fold"))
    if problem:
        parts.append(Text(term.safe(problem), style="red", no_wrap=False, overflow="fold"))
    for title, columns, rows in sections(snap) if snap is not None else []:
        parts.append(Text(""))
        if not rows:
            parts.append(Text(f"{title}: none", style="bold"))
            continue
        parts.append(term.fitted_table(columns, rows, width=width, title=title, title_left=True))
    return Group(*parts)


class _Keys:
    """stdin in cbreak mode (keys arrive one at a time, unechoed; Ctrl-C still signals),
    restored on exit. A no-op when stdin is not a terminal."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self._saved: Any = None

    def __enter__(self) -> "_Keys":
        try:
            if sys.stdin is not None and sys.stdin.isatty():
                import termios
                import tty

                fd = sys.stdin.fileno()
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd)
                self.fd = fd
        except (OSError, ValueError, ImportError):
            self.fd = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None and self._saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    def wait_for_quit(self, seconds: float) -> bool:
        """Wait up to ``seconds``; True if ``q`` was pressed."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.fd is None:
                time.sleep(left)
                return False
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                data = os.read(self.fd, 64)
                if not data or b"q" in data or b"Q" in data:
                    return True
        return False


def live_loop(take: Callable[[], dict[str, Any]], interval: float) -> None:
    from rich.live import Live

    from cuectl.errors import StoreError

    with (
        _Keys() as keys,
        Live(
            console=term.console(), auto_refresh=False, screen=True, redirect_stdout=False, redirect_stderr=False
        ) as live,
    ):
        snap: dict[str, Any] | None = None
        while True:
            problem = None
            try:
                snap = take()
            except StoreError as exc:  # ride out a busy or unreachable store; show the last view
                problem = f"store: {exc.message} (retrying)"
            live.update(renderable(snap, problem, width=live.console.width), refresh=True)
            if keys.wait_for_quit(interval):
                return


def top_cmd(
    ctx: typer.Context,
    interval: float = typer.Option(1.0, "--interval", "-n", min=0.1, metavar="SEC", help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="Print one plain snapshot and exit (also when piped)."),
    as_json: bool = typer.Option(False, "--json", help="Print one snapshot as JSON (see docs/accounting.md)."),
    lock_dir: Optional[Path] = typer.Option(
        None, "--lock-dir", metavar="DIR", help="Local lease lock directory, for who holds this host's devices."
    ),
) -> None:
    """Live view: hosts and GPUs (util, memory, who holds each), running frames, waiting jobs. `q` quits."""
    from cuectl.top import snapshot

    store = ctx.obj.store()

    def take() -> dict[str, Any]:
        return snapshot(store, lock_dir=lock_dir)

    if as_json:
        term.emit_json(take())
        return
    if once or not term.is_terminal():
        term.write_text(plain_text(take()))
        return
    try:
        live_loop(take, interval)
    except KeyboardInterrupt:
        return  # Ctrl-C is how many people leave a top: not an error


def register(app: typer.Typer) -> None:
    app.command("top")(top_cmd)
