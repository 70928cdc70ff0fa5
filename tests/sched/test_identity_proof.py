"""What proves a job's user (sched/identity.py), at the level of one proof."""

from __future__ import annotations

from pathlib import Path

from cuectl.sched import identity


def test_submitted_by_in_a_sqlite_file_is_no_proof(tmp_path: Path) -> None:
    """PostgreSQL records the inserting role in ``submitted_by`` (a trigger; nobody can set
    it). In a SQLite file the column is whatever its writer put there: with a spool (a
    SQLite store) only the receipt counts, so ``submitted_by='root'`` on a job labelled
    root proves nothing."""
    spool = tmp_path / "receipts"
    spool.mkdir()
    problem = identity.proof_problem(user="root", job_id=1, submitted_by="root", receipt=None, spool=spool)
    assert problem is not None and "no receipt" in problem
    # PostgreSQL (no spool): the server's record is the proof.
    assert identity.proof_problem(user="root", job_id=1, submitted_by="root", receipt=None, spool=None) is None
