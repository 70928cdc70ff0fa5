"""Issue 35 item 1 on PostgreSQL: there is no receipt; the proof is the role that inserted
the job (``jobs.submitted_by``), and row-level security (``cuectl admin pg-roles``) lets only
that role, a worker or an admin change the job's row. So another user cannot rename a job
whose command uses ``#JOB#`` (nor change its show or shot, or a layer's name): the values a
token expands into are the submitter's (docs/security.md, "Tokens expand only proven values")."""

from __future__ import annotations

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

from pgroles import as_role, login_roles, sql  # noqa: E402  (tests/ is on sys.path)

from cuectl.sched.spec import spec_from_mapping  # noqa: E402
from cuectl.sched.store import open_store  # noqa: E402

NOW = 1_700_000_000.0


@pytest.fixture
def roles(pg_url):
    with login_roles(pg_url, ("alice", "mallory")) as names:
        yield names


def test_another_user_cannot_rename_a_job_or_its_layer(pg_url, roles):
    alice, mallory = roles["alice"], roles["mallory"]
    a = open_store(as_role(pg_url, alice))
    job_id = a.submit(
        spec_from_mapping(
            {
                "name": "render",
                "show": "s",
                "shot": "010",
                "layers": [{"name": "w", "command": ["sh", "-c", "echo #JOB#"]}],
            },
            user=alice,
        ),
        now=NOW,
    )
    a.close()
    hostile = "$(id > /tmp/pwned)"
    url = as_role(pg_url, mallory)
    sql(url, "UPDATE jobs SET name = %s, show = %s, shot = %s WHERE id = %s", (hostile, hostile, hostile, job_id))
    sql(url, "UPDATE layers SET name = %s WHERE job_id = %s", (hostile, job_id))
    assert sql(pg_url, "SELECT name, show, shot FROM jobs WHERE id = %s", (job_id,)) == [("render", "s", "010")]
    assert sql(pg_url, "SELECT name FROM layers WHERE job_id = %s", (job_id,)) == [("w",)]
    # Its owner may (her own job runs as her: nothing is gained).
    sql(as_role(pg_url, alice), "UPDATE jobs SET name = 'renamed' WHERE id = %s", (job_id,))
    assert sql(pg_url, "SELECT name FROM jobs WHERE id = %s", (job_id,)) == [("renamed",)]
