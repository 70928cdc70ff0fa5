"""The console script's fast path for `cuectl admin report` (cuectl.cli.entry) behaves as the
typer command does: same output, files, exit codes and errors, for what it answers itself
and for what it hands to the full CLI. Both are real processes; the full path is forced
with ``CUECTL_FULL_CLI=1``. Behaviour only, never timing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from entryprobe import run_entry

from cuectl.cli import entry

WINDOW = ("--since", "2024-03-01T00:00:00Z", "--until", "2024-03-01T01:00:00Z")
GENERATED = re.compile(r'"generated_at": "[^"]*"|(cuectl_report_generated_timestamp_seconds\S*) [0-9.e+]+')


def cuectl(tmp_path: Path, args: list[str], *, full: bool, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """``cuectl ARGS`` as a real process; (the result, "fast" or "typer")."""
    return run_entry(tmp_path, args, full=full, env=env)


def both(tmp_path: Path, args: list[str], *, fast_expected: bool = True, env: dict[str, str] | None = None) -> Any:
    """ARGS both ways: the same exit code, stdout and stderr (the moment a machine format
    was generated aside); one of the results."""
    fast, fast_path = cuectl(tmp_path, args, full=False, env=env)
    full, full_path = cuectl(tmp_path, args, full=True, env=env)
    assert (fast_path, full_path) == ("fast" if fast_expected else "typer", "typer"), (args, fast.stderr)
    assert fast.returncode == full.returncode, (args, fast.stderr, full.stderr)
    assert GENERATED.sub("", fast.stdout) == GENERATED.sub("", full.stdout), args
    assert fast.stderr == full.stderr, args
    return fast


@pytest.mark.parametrize("by", [None, "job", "layer", "user", "project", "show", "host", "gpu-model", "day"])
@pytest.mark.parametrize("fmt", ["table", "csv", "json", "prometheus"])
def test_every_grouping_and_format_prints_the_same(tmp_path, known_store, by, fmt):
    args = ["--db", str(known_store), "admin", "report", *WINDOW, "--format", fmt, *(["--by", by] if by else [])]
    res = both(tmp_path, args)
    assert res.returncode == 0 and res.stdout.strip()


@pytest.mark.parametrize(
    "args",
    [
        ["--by=user", "--json"],
        ["-o", "{out}", "--format", "csv", "--by", "host"],
        ["--output={out}", "--format=prometheus"],
    ],
    ids=lambda a: " ".join(a),
)
def test_option_spellings_and_output_files(tmp_path, known_store, args):
    files = []
    for full in (False, True):
        out = tmp_path / f"report-{full}.txt"
        line = ["--db=" + str(known_store), "admin", "report", *WINDOW, *(a.format(out=out) for a in args)]
        res, path = cuectl(tmp_path, line, full=full)
        assert (res.returncode, res.stderr, path) == (0, "", "typer" if full else "fast")
        files.append(GENERATED.sub("", out.read_text() if out.exists() else res.stdout))
        if out.exists():
            assert res.stdout == ""  # silent on success, for cron
    assert files[0] == files[1] and files[0].strip()


@pytest.mark.parametrize(
    "args",
    [
        ["--by", "nope"],
        ["--format", "xml"],
        ["--json", "--format", "csv"],
        ["--output", "x.txt"],  # a table cannot go to a file
        ["--since", "yesterday-ish"],
        ["--since", "2024-03-02", "--until", "2024-03-01"],
    ],
    ids=lambda a: " ".join(a),
)
def test_bad_input_is_refused_the_same_way(tmp_path, known_store, args):
    res = both(tmp_path, ["--db", str(known_store), "admin", "report", *args])
    assert res.returncode == 2 and res.stderr.startswith("error:") and res.stdout == ""
    assert not (tmp_path / "x.txt").exists()


def test_a_missing_store_is_an_error_and_stays_missing(tmp_path):
    missing = tmp_path / "nope" / "cuectl.db"
    res = both(tmp_path, ["--db", str(missing), "admin", "report"])
    assert res.returncode != 0 and "no store at" in res.stderr
    assert not missing.exists() and not missing.parent.exists()


def test_the_default_store_comes_from_cuectl_db(tmp_path, known_store):
    res = both(tmp_path, ["admin", "report", *WINDOW, "--by", "user"], env={"CUECTL_DB": str(known_store)})
    assert "alice" in res.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["admin", "report", "--help"],
        ["admin", "report", "-h"],
        ["--debug", "admin", "report"],
        ["admin", "report", "--by", "user", "--by", "job"],  # repeated: typer keeps the last
        ["admin", "report", "extra"],
        ["admin", "report", "--since"],
        ["admin", "report", "--since", "-1d"],
        ["admin", "report", "--by", ""],
        ["admin", "report", "-ofile.csv", "--format", "csv"],
        ["admin", "report", "-o=file.csv", "--format", "csv"],
        ["admin", "report", "--json=yes"],
        ["--db", "admin", "report"],
        ["admin", "report", "--db", "x.db"],
        ["admin", "reports"],
        ["report"],
    ],
    ids=lambda a: " ".join(a) or "(none)",
)
def test_the_unusual_is_left_to_typer(args):
    assert entry._parse_report(args) is None


def test_what_the_fast_parser_reads():
    assert entry._parse_report(["admin", "report"]) == (None, {})
    assert entry._parse_report(
        [
            "--db",
            "s.db",
            "admin",
            "report",
            "--since",
            "2d",
            "--until=now",
            "--by",
            "gpu-model",
            "--format",
            "json",
            "-o",
            "r.json",
        ]
    ) == ("s.db", {"since": "2d", "until": "now", "by": "gpu-model", "format_": "json", "output": "r.json"})
    assert entry._parse_report(["--db=s.db", "admin", "report", "--json"]) == ("s.db", {"as_json": True})


@pytest.mark.parametrize(
    "args",
    [
        ["admin", "report", "--help"],
        ["--debug", "admin", "report", "--by", "nope"],
        ["admin", "report", "--by", "user", "--by", "nope"],
    ],
    ids=lambda a: " ".join(a),
)
def test_what_goes_to_typer_is_answered_there(tmp_path, known_store, args):
    res = both(
        tmp_path,
        ["--db", str(known_store), *args] if args[0] != "--debug" else ["--debug", "--db", str(known_store), *args[1:]],
        fast_expected=False,
    )
    assert res.stdout or res.stderr


def test_the_report_is_the_same_json_as_the_library_gives(tmp_path, known_store):
    res, path = cuectl(
        tmp_path, ["--db", str(known_store), "admin", "report", *WINDOW, "--by", "user", "--json"], full=False
    )
    assert path == "fast"
    doc = json.loads(res.stdout)
    assert {row["group"] for row in doc["rows"]} == {"alice", "bob"}
