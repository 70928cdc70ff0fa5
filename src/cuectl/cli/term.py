"""The one module that owns terminal output (DESIGN §6).

Rich tables on a terminal, plain tab-separated text when piped, no colour with
``NO_COLOR``; ``--json`` goes to stdout as one document; errors go to stderr as one
``error: …`` line (plus ``hint: …``). Rich is imported lazily: ``--version``/``--help``
and ``--json`` paths must not pay for it.
"""

from __future__ import annotations

import sys

from cuectl import config

# Annotations only, and no ``typing``/``json`` at import: ``cuectl run``'s quick path prints
# through ``info`` in a ~25 ms process. Rich is imported lazily, where it is used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any, Iterable, Sequence

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from cuectl.run.worker import Worker

_console: Console | None = None
_err_console: Console | None = None


def console() -> Console:
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(no_color=config.no_color(), highlight=False, soft_wrap=True)
    return _console


# Terminal control characters, rendered visibly escaped wherever text from the store (or
# anything else from users) is printed for a human: C0 (tab and newline too: inside a cell or
# a name they would forge columns and lines), DEL, C1, and the bidi overrides and isolates
# that reorder what a line shows (U+202A-U+202E, U+2066-U+2069). An ESC-based sequence
# (OSC 0/52, CSI 2J) is harmless once its ESC is ``\x1b``. The table is made on first use.
_SAFE: dict[int, str] = {}


def _safe_table() -> dict[int, str]:
    if not _SAFE:
        named = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
        for code in (*range(0x20), *range(0x7F, 0xA0)):
            _SAFE[code] = named.get(code, f"\\x{code:02x}")
        for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)):
            _SAFE[code] = f"\\u{code:04x}"
    return _SAFE


def safe(text: str) -> str:
    r"""``text`` with its terminal control characters visibly escaped (``\x1b``, ``\r``,
    ``\u202e``), never raw: every text printed for a human passes through here (table
    cells, ``show`` fields, ``line``/``info``/``warn``/``error``, rich ``plain``, `top`).
    Text without any (``str.isprintable``) is returned as it is, at no cost."""
    if text.isprintable():
        return text
    return text.translate(_safe_table())


def is_terminal() -> bool:
    return sys.stdout.isatty()


def emit_json(obj: Any) -> None:
    import json

    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def write_text(text: str) -> None:
    """A document a program reads (CSV, Prometheus text, pre-rendered JSON) to stdout, as is."""
    sys.stdout.write(text)
    sys.stdout.flush()


def line(text: str = "") -> None:
    """Plain text to stdout (ids, messages a script may read)."""
    sys.stdout.write(safe(text) + "\n")
    sys.stdout.flush()


# `cuectl worker` writing to a log (not a terminal) prefixes its stderr lines with the
# time (``stamp_lines``); every other command leaves both off.
_stamp_messages = False
_stamp_errors = False


def stamp_lines(messages: bool, *, errors: bool = False) -> None:
    """Prefix ``info``/``warn`` lines (``messages``) and ``error``/``hint`` lines
    (``errors``) with ``timestamp()`` and a space, for the rest of the process."""
    global _stamp_messages, _stamp_errors
    _stamp_messages, _stamp_errors = messages, errors


def timestamp(at: float | None = None) -> str:
    """ISO 8601 UTC with milliseconds: ``2026-12-03T13:45:01.123Z``."""
    import time as _time

    at = _time.time() if at is None else at
    whole = int(at)
    return _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(whole)) + f".{int((at - whole) * 1000):03d}Z"


def _stamp(on: bool) -> str:
    return timestamp() + " " if on else ""


def info(text: str) -> None:
    """A human-facing message on stderr, so that stdout stays parseable."""
    sys.stderr.write(_stamp(_stamp_messages) + safe(text) + "\n")
    sys.stderr.flush()


def error(message: str, hint: str | None = None) -> None:
    stamp = _stamp(_stamp_errors)
    sys.stderr.write(f"{stamp}error: {safe(message)}\n")
    if hint:
        sys.stderr.write(f"{stamp}hint: {safe(hint)}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    sys.stderr.write(f"{_stamp(_stamp_messages)}warning: {safe(message)}\n")
    sys.stderr.flush()


def plain(text: str) -> "Text":
    """``text`` as rich shows it literally: names, commands and anything else from users
    are never read as markup (``shot[bold]010`` stays as typed; ``oops[/]`` cannot crash
    the output), and its control characters are escaped (``safe``). Every string that
    reaches rich from data goes through here."""
    from rich.text import Text

    return Text(safe(text))


class Col:
    """A table column: its header, how its cells look on a terminal, and what gives way
    when the terminal is too narrow. Piped output uses only the header (cells as they are).
    (A plain class: ``typing.NamedTuple`` would import ``typing`` on the quick paths.)"""

    __slots__ = ("name", "kind", "fit", "drop")

    def __init__(self, name: str, kind: str = "text", fit: str = "keep", drop: int = 0) -> None:
        self.name = name
        #: "text"; "time": an ISO 8601 time, shortened (``short_time``); "state": coloured by
        #: its first word (``state_style``); "util": coloured by its leading percentage.
        self.kind = kind
        #: "keep": elided only as a last resort; "name": elided in the middle with … after
        #: the free text; "free": free text (pending reasons, holders), cut at the end with …,
        #: the first to give way.
        self.fit = fit
        #: 0: always shown; otherwise hidden on a narrow terminal, the highest number first.
        self.drop = drop


class Cell:
    """A cell with its own style on a terminal (``text`` alone when piped)."""

    __slots__ = ("text", "style")

    def __init__(self, text: str, style: str | None = None) -> None:
        self.text = text
        self.style = style


def _cell(value: Any) -> str:
    """A cell's text, control characters escaped (``safe``): tables and ``fields``, on a
    terminal and piped alike."""
    if value is None:
        return "-"
    if isinstance(value, Cell):
        return safe(value.text)
    return safe(str(value))


def _column(col: str | Col) -> Col:
    return col if isinstance(col, Col) else Col(col)


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_RECENT_S = 183 * 86400  # ls(1)'s "recent": half a year either side of now


def short_time(value: str | float | None, *, now: float | None = None) -> str:
    """A time as a table on a terminal shows it, in local time as ls(1) and ps(1) do:
    today's as ``21:34:34``, within half a year as ``Dec 05``, else ``2025-12-05``.
    ``value`` is an ISO 8601 time (what the store's rows carry) or seconds since the epoch;
    anything else is returned as it is."""
    import time as _time

    if value is None:
        return "-"
    at: float
    if isinstance(value, (int, float)):
        at = float(value)
    else:
        from datetime import datetime

        try:
            # Python 3.10's fromisoformat takes no "Z" (the store's times end in it).
            at = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return value
    now = _time.time() if now is None else now
    local, today = _time.localtime(at), _time.localtime(now)
    if local[:3] == today[:3]:
        return _time.strftime("%H:%M:%S", local)
    if abs(now - at) < _RECENT_S:
        return f"{_MONTHS[local.tm_mon - 1]} {local.tm_mday:02d}"
    return _time.strftime("%Y-%m-%d", local)


# SUCCEEDED, RUNNING and DEAD in the colours CueGUI gives them; a finished job's bad
# outcomes as DEAD; hosts as UP/DOWN read (docs/terminal.md).
_STATE_STYLES = {
    "SUCCEEDED": "green",
    "RUNNING": "yellow",
    "DEAD": "red",
    "FAILED": "red",
    "KILLED": "red",
    "UP": "green",
    "DOWN": "red",
}


def state_style(text: str) -> str | None:
    """The colour of a state cell, by its first word (``FAILED (paused)`` is FAILED)."""
    return _STATE_STYLES.get(text.split(" ", 1)[0])


def util_style(text: str) -> str | None:
    """The colour of a utilisation cell (``42%``, ``42% 3.0 GiB``) by its leading
    percentage, with nvitop's thresholds: light green below 10 %, moderate yellow below
    75 %, heavy red from 75 %."""
    head = text.split("%", 1)[0] if "%" in text else ""
    try:
        pct = float(head)
    except ValueError:
        return None
    return util_colour(pct)


def util_colour(pct: float | None) -> str | None:
    if pct is None:
        return None
    return "green" if pct < 10 else "yellow" if pct < 75 else "red"


_GAP = 2  # rich puts one space each side of a cell: two between columns, none at the edges
# How far each kind of elidable column gives way: to the first floor before any column is
# hidden, to the second once the hideable ones are gone.
_FLOORS = {"free": (24, 12), "name": (16, 8)}


def fit_widths(columns: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> list[int | None]:
    """Each column's width for a terminal ``width`` cells wide (None: hidden), so that a
    table never wraps: free text is elided first, then columns are hidden (the highest
    ``drop`` first), then free text and names go further, and only then anything else."""
    from rich.cells import cell_len

    natural = [max([cell_len(col.name), *(cell_len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    hideable = sorted((i for i, col in enumerate(columns) if col.drop), key=lambda i: (-columns[i].drop, -i))
    shown = list(range(len(columns)))

    def squeeze(widths: list[int], fit: str | None, floor: int | None) -> bool:
        """Narrow the widest of the columns of ``fit`` (all when None) one cell at a time
        down to ``floor`` until the table fits; whether it fits."""
        while sum(widths[i] for i in shown) + _GAP * (len(shown) - 1) > width:
            can = [
                i
                for i in shown
                if (fit is None or columns[i].fit == fit)
                and widths[i] > min(natural[i], floor if floor is not None else _FLOORS[columns[i].fit][0])
            ]
            if not can:
                return False
            widest = max(can, key=lambda i: (widths[i], i))
            widths[widest] -= 1
        return True

    while True:
        widths = list(natural)
        if squeeze(widths, "free", _FLOORS["free"][0]) or squeeze(widths, "name", _FLOORS["name"][0]):
            break
        if not hideable:
            _ = (
                squeeze(widths, "free", _FLOORS["free"][1])
                or squeeze(widths, "name", _FLOORS["name"][1])
                or squeeze(widths, None, 1)
            )
            break
        shown.remove(hideable.pop(0))
    return [widths[i] if i in shown else None for i in range(len(columns))]


def elide_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, its middle replaced by ``…``: names differ at
    both ends (``shot010-comp-v003``, ``0001-render-left``), so both ends stay."""
    from rich.cells import cell_len

    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    room = width - 1
    head, tail = "", ""
    for ch in text:  # the head takes the odd cell
        if cell_len(head + ch) > (room + 1) // 2:
            break
        head += ch
    for ch in reversed(text[len(head) :]):
        if cell_len(head + tail + ch) > room:
            break
        tail = ch + tail
    return head + "…" + tail


def _styled(col: Col, text: str, cell: Any) -> Text:
    from rich.text import Text

    style = (
        cell.style
        if isinstance(cell, Cell)
        else (state_style(text) if col.kind == "state" else util_style(text) if col.kind == "util" else None)
    )
    return Text(text, style=style or "")


def fitted_table(
    columns: Sequence[str | Col],
    rows: Iterable[Sequence[Any]],
    *,
    width: int,
    title: str | None = None,
    title_left: bool = False,
) -> Any:
    """A rich ``Table`` that fits ``width`` cells: one line a row, no word ever split
    (``fit_widths``), times shortened, states and utilisation coloured (none with
    ``NO_COLOR``: the console drops them). Cells are never read as markup."""
    from rich.table import Table

    cols = [_column(c) for c in columns]
    raw = [list(row) for row in rows]
    texts = [
        [
            short_time(v) if col.kind == "time" and isinstance(v, (str, float, int)) and v != "" else _cell(v)
            for col, v in zip(cols, row)
        ]
        for row in raw
    ]
    widths = fit_widths(cols, texts, width)
    table = Table(
        title=plain(title) if title else None,
        title_justify="left" if title_left else "center",
        title_style="bold" if title_left else None,
        header_style="bold",
        box=None,
        pad_edge=False,
    )
    keep = [i for i, w in enumerate(widths) if w is not None]
    for i in keep:
        table.add_column(cols[i].name, width=widths[i], no_wrap=True, overflow="ellipsis")
    for row, text in zip(raw, texts):
        table.add_row(
            *(
                _styled(cols[i], elide_middle(text[i], widths[i] or 0) if cols[i].fit == "name" else text[i], row[i])
                for i in keep
            )
        )
    return table


def table(
    columns: Sequence[str | Col], rows: Iterable[Sequence[Any]], *, title: str | None = None, footer: str | None = None
) -> None:
    """A table that fits the terminal (``fitted_table``); piped, tab-separated lines with a
    header row, every cell whole (full times and names: what scripts read)."""
    if is_terminal():
        out = console()
        out.print(fitted_table(columns, rows, width=out.width, title=title))
    else:
        stream = sys.stdout
        stream.write("\t".join(_column(c).name for c in columns) + "\n")
        for row in rows:
            stream.write("\t".join(_cell(v) for v in row) + "\n")
    if footer:
        info(footer)
    sys.stdout.flush()


def fields(pairs: Sequence[tuple[str, Any]]) -> None:
    """``key: value`` lines for ``show`` commands."""
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        line(f"{key.ljust(width)}  {_cell(value)}")


_SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], *, top: float = 100.0, width: int = 60) -> str:
    """Utilisation as a one-line bar chart (``▁▃█``); gaps (unknown values) as spaces.
    Long series are resampled to ``width`` by taking each bucket's maximum (peaks show)."""
    vals = list(values)
    if len(vals) > width:
        step = len(vals) / width
        buckets = [vals[int(i * step) : int((i + 1) * step) or None] for i in range(width)]
        vals = [max((v for v in b if v is not None), default=None) for b in buckets]
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            level = min(len(_SPARKS) - 1, max(0, int(round(v / top * (len(_SPARKS) - 1)))))
            out.append(_SPARKS[level])
    return "".join(out)


def _number(number: Any) -> str:
    """A frame number as frame names show it (``0007``); one that is not an integer (a
    hostile store row, refused at launch) as it is."""
    return f"{number:04d}" if type(number) is int else str(number)


class WorkerProgress:
    """What `cuectl worker` shows while it works.

    On a terminal: a live table of running frames (rich) with finished frames printed
    above it; otherwise one plain line per frame start and end, for logs and journald.
    """

    def __init__(self, *, live: bool) -> None:
        self._live: Live | None = None
        self._console: Console | None = None
        self._use_live = live
        self._seen: set[int] = set()
        self.done = 0
        self.failed = 0

    def __enter__(self) -> "WorkerProgress":
        if self._use_live:
            from rich.console import Console
            from rich.live import Live

            self._console = Console(stderr=True, no_color=config.no_color(), highlight=False)
            self._live = Live(console=self._console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)

    def _say(self, text: str) -> None:
        if self._live is not None and self._console is not None:
            self._console.print(plain(text))
        else:
            info(text)

    def __call__(self, worker: Worker) -> None:
        import time as _time

        for claim, ended, state in worker.stats.ended:
            self._seen.discard(claim.frame_id)
            ok = state == "SUCCEEDED"
            self.done += ok
            self.failed += not ok
            how = f"exit {ended.exit_code}" if ended.exit_signal is None else f"signal {ended.exit_signal}"
            if ended.timed_out:
                how = "timed out"
            self._say(
                f"end    frame {claim.frame_id} {claim.job}/{_number(claim.number)}-{claim.layer} "
                f"{state or 'REPORT PENDING'} ({how}, {ended.ended_at - ended.started_at:.1f}s)"
            )
        for fid, rf in worker.running.items():
            if fid not in self._seen:
                self._seen.add(fid)
                gpus = ",".join(str(d.index) for d in rf.devices) or "-"
                self._say(
                    f"start  frame {fid} {rf.claim.job}/{_number(rf.claim.number)}-{rf.claim.layer} "
                    f"attempt {rf.claim.attempt} gpus {gpus}"
                )
        if self._live is not None:
            from rich.console import Group
            from rich.text import Text

            title = Text(
                safe(
                    f"{worker.opts.name}: {len(worker.running)} running, {self.done} done, "
                    f"{self.failed} failed" + (" (draining)" if worker.draining else "")
                ),
                style="bold",
                no_wrap=False,
                overflow="fold",
            )
            now = _time.time()
            rows = [
                [
                    f"{fid} {_number(rf.claim.number)}-{rf.claim.layer}",
                    rf.claim.job,
                    str(rf.claim.attempt),
                    ",".join(str(d.index) for d in rf.devices) or "-",
                    f"{now - rf.usage.started_at:.0f}s",
                ]
                for fid, rf in sorted(worker.running.items())
            ]
            width = self._console.width if self._console is not None else 80
            table = fitted_table(
                [Col("FRAME", fit="name"), Col("JOB", fit="name"), Col("ATTEMPT", drop=1), "GPUS", "ELAPSED"],
                rows,
                width=width,
            )
            self._live.update(Group(title, table))
