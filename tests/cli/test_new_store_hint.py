"""Admin commands never create a store (a mistyped --db must fail), and on one that does not
exist yet they name the command that creates it, `cuectl admin migrate`, rather than
telling an admin setting up a farm to submit a job first (issue 41 §7)."""

from __future__ import annotations

from pathlib import Path

import pytest


def hint_of(res) -> str:
    """Exit 1 (not found), one ``error:`` line, then the ``hint:`` line, returned."""
    lines = res.stderr.splitlines()
    assert res.exit_code == 1 and len(lines) == 2 and lines[0].startswith("error: "), res
    assert lines[1].startswith("hint: "), res
    return lines[1]


COMMANDS = [("admin", "limit", "set", "nuke", "10"), ("admin", "quota", "set", "user", "alice", "--gpus", "8")]


@pytest.mark.store_file  # asserts that the file was never created
@pytest.mark.parametrize("args", COMMANDS)
def test_sqlite_new_store_names_admin_migrate(cli, db_path: Path, args) -> None:
    res = cli(*args)
    hint = hint_of(res)
    assert "no store at" in res.stderr and "cuectl --db" in hint and "admin migrate" in hint, res
    assert not db_path.exists()  # nothing created
    # ... and the command it names does create it, after which the first one works.
    assert cli("admin", "migrate").exit_code == 0
    assert cli(*args).exit_code == 0


@pytest.mark.parametrize("args", COMMANDS)
def test_postgres_new_store_names_admin_migrate(cli, pg_url: str, args) -> None:
    res = cli("--db", pg_url, *args, db=False)
    hint = hint_of(res)
    assert "no cuectl store in" in res.stderr and "cuectl admin migrate" in hint, res
