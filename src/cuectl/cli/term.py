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
    sys.stdout.write(text + "\n")
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
    sys.stderr.write(_stamp(_stamp_messages) + text + "\n")
    sys.stderr.flush()


def error(message: str, hint: str | None = None) -> None:
    stamp = _stamp(_stamp_errors)
    sys.stderr.write(f"{stamp}error: {message}\n")
    if hint:
        sys.stderr.write(f"{stamp}hint: {hint}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    sys.stderr.write(f"{_stamp(_stamp_messages)}warning: {message}\n")
    sys.stderr.flush()


def plain(text: str) -> "Text":
    """``text`` as rich shows it literally: names, commands and anything else from users
    are never read as markup (``shot[bold]010`` stays as typed; ``oops[/]`` cannot crash
    the output). Every string that reaches rich from data goes through here."""
    from rich.text import Text

    return Text(text)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return str(value)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
          footer: str | None = None) -> None:
    """A rich table on a terminal; tab-separated lines with a header row when piped."""
    rows = [[_cell(v) for v in row] for row in rows]
    if is_terminal():
        from rich.table import Table

        t = Table(title=plain(title) if title else None, header_style="bold", box=None, pad_edge=False)
        for col in columns:
            t.add_column(col, overflow="fold")
        for row in rows:
            t.add_row(*(plain(cell) for cell in row))
        console().print(t)
    else:
        out = sys.stdout
        out.write("\t".join(columns) + "\n")
        for row in rows:
            out.write("\t".join(row) + "\n")
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
        buckets = [vals[int(i * step):int((i + 1) * step) or None] for i in range(width)]
        vals = [max((v for v in b if v is not None), default=None) for b in buckets]
    out = []
    for v in vals:
        if v is None:
            out.append(" ")
        else:
            level = min(len(_SPARKS) - 1, max(0, int(round(v / top * (len(_SPARKS) - 1)))))
            out.append(_SPARKS[level])
    return "".join(out)


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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
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
            self._say(f"end    frame {claim.frame_id} {claim.job}/{claim.number:04d}-{claim.layer} "
                      f"{state or 'REPORT PENDING'} ({how}, {ended.ended_at - ended.started_at:.1f}s)")
        for fid, rf in worker.running.items():
            if fid not in self._seen:
                self._seen.add(fid)
                gpus = ",".join(str(d.index) for d in rf.devices) or "-"
                self._say(f"start  frame {fid} {rf.claim.job}/{rf.claim.number:04d}-{rf.claim.layer} "
                          f"attempt {rf.claim.attempt} gpus {gpus}")
        if self._live is not None:
            from rich.console import Group
            from rich.table import Table
            from rich.text import Text

            title = Text(f"{worker.opts.name}: {len(worker.running)} running, {self.done} done, "
                         f"{self.failed} failed" + (" (draining)" if worker.draining else ""), style="bold")
            table = Table(box=None, header_style="bold")
            for col in ("FRAME", "JOB", "ATTEMPT", "GPUS", "ELAPSED"):
                table.add_column(col)
            now = _time.time()
            for fid, rf in sorted(worker.running.items()):
                table.add_row(*(plain(cell) for cell in (
                    f"{fid} {rf.claim.number:04d}-{rf.claim.layer}", rf.claim.job, str(rf.claim.attempt),
                    ",".join(str(d.index) for d in rf.devices) or "-", f"{now - rf.usage.started_at:.0f}s")))
            self._live.update(Group(title, table))
