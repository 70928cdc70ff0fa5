"""Names written into the store behind cuectl's back (a store edit, a PostgreSQL owner's own
``UPDATE``: submit refuses them) never reach a terminal raw: terminal control sequences,
a ``\\r\\n`` forging a line and bidi overrides are printed visibly escaped by every view
(term.safe), and rich markup in a name stays text. ``--json`` stays exact JSON."""

from __future__ import annotations

import io
import json
import sqlite3
import time
from pathlib import Path

import pytest

from cuectl.cli import term
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import HostInfo, open_store

GIB = 1024**3
JOB = "j\x1b]0;pwned\x07[bold red]x"
LAYER = "l\x1b[2J"
HOST = "h a\r\nforged"
USER = "u\u202eevil"
RAW = ("\x1b", "\r", "\u202e", "\x07", "\n forged")
ESCAPED = ("j\\x1b]0;pwned\\x07[bold red]x", "l\\x1b[2J", "h a\\r\\nforged")


def _hostile_store(db: Path) -> int:
    """A host running one frame of a two-frame job, then the job's, layer's, host's and
    user's names rewritten in the SQLite file as a hostile writer would. The frame's id."""
    now = time.time()
    db.parent.mkdir(parents=True, exist_ok=True)
    store = open_store(str(db))
    try:
        store.register_host(
            HostInfo(
                name="node",
                cores=8,
                memory_bytes=64 * GIB,
                gpus=[
                    {
                        "index": 0,
                        "uuid": "GPU-a",
                        "vendor": "NVIDIA",
                        "model": "V100",
                        "backend": "fake",
                        "memory_total_bytes": 16 * GIB,
                    }
                ],
            ),
            now=now,
        )
        store.submit(
            spec_from_mapping(
                {"name": "shot", "layers": [{"name": "render", "command": ["true"], "range": "1-2"}]}, user="alice"
            ),
            now=now,
        )
        layer = store.runnable_layers()[0]
        claimed = store.claim_frame(
            layer.layer_id, host="node", worker="node:1", gpu_uuids=["GPU-a"], now=now, lease_s=600.0
        )
        assert claimed is not None
        frame_id = claimed.frame_id
    finally:
        store.close()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE jobs SET name = ?, user = ?", (JOB, USER))
        con.execute("UPDATE layers SET name = ?", (LAYER,))
        con.execute("UPDATE hosts SET name = ?", (HOST,))
        con.execute("UPDATE frames SET host = ? WHERE host IS NOT NULL", (HOST,))
    return frame_id


def _clean(out: str, *, rows: int | None = None) -> None:
    for raw in RAW:
        assert raw not in out, (raw, out)
    if rows is not None:  # no forged line: exactly one line a row (plus the header)
        assert len(out.splitlines()) == rows + 1, out


@pytest.fixture
def hostile(cli, db_path):
    return _hostile_store(db_path)


def test_piped_lists_and_views_escape_control_characters(cli, hostile):
    res = cli("job", "list")
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout, rows=1)
    assert ESCAPED[0] in res.stdout and "u\\u202eevil" in res.stdout

    res = cli("job", "show", "1")
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout)
    assert ESCAPED[0] in res.stdout and ESCAPED[1] in res.stdout

    res = cli("frame", "list")
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout, rows=2)
    assert ESCAPED[1] in res.stdout and ESCAPED[2] in res.stdout

    res = cli("frame", "show", str(hostile))
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout)
    assert ESCAPED[2] in res.stdout

    res = cli("host", "list")
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout, rows=1)
    assert ESCAPED[2] in res.stdout


def test_top_once_escapes_control_characters(cli, hostile):
    res = cli("top", "--once")
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout)
    for text in ESCAPED:
        assert text in res.stdout, res.stdout
    assert "u\\u202eevil" in res.stdout


def test_tables_on_a_terminal_escape_and_never_read_markup(cli, hostile, monkeypatch):
    """The rich path (a terminal): cells escaped, ``[bold red]`` shown as typed."""
    from rich.console import Console

    buf = io.StringIO()
    monkeypatch.setattr(term, "_console", Console(file=buf, width=250, force_terminal=False, highlight=False))
    monkeypatch.setattr(term, "is_terminal", lambda: True)
    for args in (("job", "list"), ("frame", "list"), ("host", "list"), ("job", "show", "1")):
        buf.seek(0)
        buf.truncate()
        res = cli(*args)
        assert res.exit_code == 0, res.stderr
        out = buf.getvalue() + res.stdout
        _clean(out)
        assert any(text in out for text in ESCAPED), (args, out)
    buf.seek(0)
    buf.truncate()
    assert cli("job", "list").exit_code == 0
    assert "[bold red]x" in buf.getvalue()  # as typed: not markup, not dropped


def test_top_live_view_escapes(hostile, db_path):
    from rich.console import Console

    from cuectl.cli.top_cmd import renderable
    from cuectl.top import snapshot

    store = open_store(str(db_path))
    try:
        snap = snapshot(store)
    finally:
        store.close()
    buf = io.StringIO()
    Console(file=buf, width=250, force_terminal=False).print(renderable(snap, "store: \x1b[2J", width=250))
    _clean(buf.getvalue())
    assert ESCAPED[2] in buf.getvalue() and "store: \\x1b[2J" in buf.getvalue()


def test_messages_quoting_names_escape(cli, hostile):
    res = cli("job", "pause", "1")
    assert res.exit_code == 0, res.stderr
    _clean(res.stdout + res.stderr)
    assert "\\x1b" in res.stdout + res.stderr


def test_json_stays_exact(cli, hostile):
    res = cli("job", "list", "--json")
    assert res.exit_code == 0, res.stderr
    assert "\x1b" not in res.stdout and "\u202e" not in res.stdout  # json.dumps escapes them (ensure_ascii)
    doc = json.loads(res.stdout)
    jobs = doc if isinstance(doc, list) else doc["jobs"]
    assert jobs[0]["name"] == JOB and jobs[0]["user"] == USER


def test_safe_escapes_every_listed_control_character():
    for code in (*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)):
        out = term.safe(f"a{chr(code)}b")
        assert chr(code) not in out and out.startswith("a\\") and out.endswith("b"), hex(code)
    assert term.safe("shot010 é 世 [x]") == "shot010 é 世 [x]"
    assert term.safe("\t\n\r\x1b\u202e") == "\\t\\n\\r\\x1b\\u202e"


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_offers_no_raw_control_characters(hostile, db_path, shell):
    """Job names are completion help (zsh, fish) and host names completion values: the help
    is escaped, a value that holds control characters is not offered."""
    import subprocess

    from conftest import cuectl_cmd, subprocess_env

    for line in (f"cuectl --db {db_path} job show ", f"cuectl --db {db_path} host show "):
        words = line.split()
        extra = (
            {"COMP_WORDS": line, "COMP_CWORD": ""}
            if shell == "fish"
            else {"COMP_WORDS": line, "COMP_CWORD": str(len(words))}
        )
        res = subprocess.run(
            cuectl_cmd(),
            capture_output=True,
            text=True,
            timeout=60,
            env=subprocess_env(_CUECTL_COMPLETE=f"{shell}_complete", **extra),
        )
        assert res.returncode == 0, res.stderr
        for raw in ("\x1b", "\r", "\u202e", "\x07", "forged"):
            assert raw not in res.stdout, (line, res.stdout)
        if "job show" in line:
            assert res.stdout.startswith("plain")  # job 1 is offered
            if shell != "bash":
                assert "\\x1b" in res.stdout, res.stdout
