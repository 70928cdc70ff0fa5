"""Checks on a `cli` fixture result shared by the CLI tests (tests/ is on sys.path)."""

from __future__ import annotations


def ok(res, code: int = 0):
    """The result, once its exit code is ``code``."""
    assert res.exit_code == code, res
    return res


def one_error(res) -> str:
    """Bad input: exit 2 and exactly one ``error:`` line, which is returned."""
    assert res.exit_code == 2, res
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res
    return lines[0]
