"""The one module that owns terminal output (DESIGN §6).

Rich tables on a terminal, plain tab-separated text when piped, no colour with
``NO_COLOR``; ``--json`` goes to stdout as one document; errors go to stderr as one
``error: …`` line (plus ``hint: …``). Rich is imported lazily: ``--version``/``--help``
and ``--json`` paths must not pay for it.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

from cuectl import config

_console = None
_err_console = None


def console():
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(no_color=config.no_color(), highlight=False, soft_wrap=True)
    return _console


def is_terminal() -> bool:
    return sys.stdout.isatty()


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")
    sys.stdout.flush()


def line(text: str = "") -> None:
    """Plain text to stdout (ids, messages a script may read)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def info(text: str) -> None:
    """A human-facing message on stderr, so that stdout stays parseable."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def error(message: str, hint: str | None = None) -> None:
    sys.stderr.write(f"error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    sys.stderr.write(f"warning: {message}\n")
    sys.stderr.flush()


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

        t = Table(title=title, header_style="bold", box=None, pad_edge=False)
        for col in columns:
            t.add_column(col, overflow="fold")
        for row in rows:
            t.add_row(*row)
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
