"""`cuectl serve --db postgresql://…` on a real server (started by the suite,
tests/pgserver.py) with a role per user (`cuectl admin pg-roles`): the API server SETs ROLE
to the token's user, so the database records who submitted and its row-level security
judges who changes what; a login role that was not granted the user cannot act for them."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from apiclient import Server, check_problem, create_token, job_spec, layer_spec

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

import pgserver  # noqa: E402

API = "/api/v1"


def sql(url: str, query: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture(scope="module")
def pg(serve_dir: Path, serve_env: dict[str, str]):
    from cuectl.sched.store import open_store, roles_sql

    try:
        server = pgserver.shared_server()
    except pgserver.PgUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
    name = server.create_database()
    url = server.url(name)  # the superuser: it may SET ROLE to anyone
    open_store(url).close()  # the schema, owned by the superuser
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(roles_sql())  # what `cuectl admin pg-roles | psql` does
    suffix = uuid.uuid4().hex[:6]
    roles = {who: f"{who}_{suffix}" for who in ("alice", "bob", "boss", "api")}
    for who, role in roles.items():
        sql(url, f"CREATE ROLE {role} LOGIN")
        sql(url, f"GRANT {'cuectl_admin' if who in ('boss', 'api') else 'cuectl_user'} TO {role}")
    tokens = {
        who: create_token(url, role, "admin" if who == "boss" else "user", env=serve_env)
        for who, role in roles.items()
        if who != "api"
    }
    api_server = Server(url, env=serve_env, log=serve_dir / "server.log", extra=("--cache", "0"))
    yield {
        "url": url,
        "roles": roles,
        "tokens": tokens,
        "server": api_server,
        "pg": server,
        "env": serve_env,
        "dir": serve_dir,
    }
    api_server.stop()
    server.drop_database(name)
    for role in roles.values():
        sql(server.url(), f"DROP ROLE IF EXISTS {role}")


def test_the_server_records_the_tokens_user_as_the_submitter(pg):
    alice = pg["server"].api.with_token(pg["tokens"]["alice"])
    resp = alice.post(f"{API}/jobs", job_spec("pg-hers", layer_spec("l", range="1-2", gpus=1, gpu_vendor="NVIDIA")))
    assert resp.status == 201, resp
    job = resp.json()
    role = pg["roles"]["alice"]
    assert job["user"] == role and job["submitted_by"] == role
    assert sql(pg["url"], 'SELECT submitted_by, "user" FROM jobs WHERE id = %s', (job["id"],)) == [(role, role)]
    assert resp.headers["Location"] == f"{API}/jobs/{job['id']}"
    assert alice.ok("GET", f"{API}/jobs/{job['id']}/frames")["total"] == 2
    assert alice.ok("GET", f"{API}/whoami")["user"] == role


def test_a_user_changes_only_their_jobs_and_an_admin_anyones(pg):
    api = pg["server"].api
    alice, bob, boss = (api.with_token(pg["tokens"][who]) for who in ("alice", "bob", "boss"))
    job_id = alice.post(f"{API}/jobs", job_spec("pg-kill", layer_spec("l", range="1-3"))).json()["id"]
    frame_id = alice.ok("GET", f"{API}/jobs/{job_id}/frames")["frames"][0]["id"]
    for path, body in (
        (f"{API}/jobs/{job_id}/kill", None),
        (f"{API}/jobs/{job_id}/pause", None),
        (f"{API}/jobs/{job_id}/priority", {"priority": 9}),
        (f"{API}/frames/{frame_id}/eat", None),
    ):
        problem = check_problem(bob.post(path, body), 403)
        assert f"belongs to {pg['roles']['alice']}, not {pg['roles']['bob']}" in problem["detail"], problem
    assert sql(pg["url"], "SELECT state, paused, priority FROM jobs WHERE id = %s", (job_id,)) == [
        ("PENDING", False, 0)
    ]
    killed = alice.ok("POST", f"{API}/jobs/{job_id}/kill")
    assert killed["state"] == "FINISHED" and killed["frame_counts"] == {"EATEN": 3}
    # A member of cuectl_admin changes anyone's job.
    other = alice.post(f"{API}/jobs", job_spec("pg-admin")).json()["id"]
    assert boss.ok("POST", f"{API}/jobs/{other}/priority", {"priority": 4})["priority"] == 4
    assert sql(pg["url"], "SELECT priority, submitted_by FROM jobs WHERE id = %s", (other,)) == [
        (4, pg["roles"]["alice"])
    ]


def test_a_login_role_not_granted_the_user_cannot_act_for_them(pg):
    """The API server logs in as a role of its own (a cuectl_admin member, to read tokens)
    that was not granted alice's role: it cannot SET ROLE to her, so it cannot submit as
    her — the database, not the API, says so — until an admin grants it."""
    url = pg["url"].replace("postgres@", f"{pg['roles']['api']}@", 1)
    server = Server(url, env=pg["env"], log=pg["dir"] / "limited.log", extra=("--cache", "0"))
    try:
        alice = server.api.with_token(pg["tokens"]["alice"])
        assert alice.ok("GET", f"{API}/whoami")["user"] == pg["roles"]["alice"]
        before = alice.ok("GET", f"{API}/jobs")["total"]
        problem = check_problem(alice.post(f"{API}/jobs", job_spec("pg-refused")), 403)
        assert f"may not act as '{pg['roles']['alice']}'" in problem["detail"], problem
        assert "GRANT" in problem["detail"] + problem.get("hint", ""), problem
        assert alice.ok("GET", f"{API}/jobs")["total"] == before
        assert sql(pg["url"], "SELECT COUNT(*) FROM jobs WHERE name = 'pg-refused'") == [(0,)]
        sql(pg["url"], f"GRANT {pg['roles']['alice']} TO {pg['roles']['api']}")
        resp = alice.post(f"{API}/jobs", job_spec("pg-granted"))
        assert resp.status == 201, resp
        assert sql(pg["url"], "SELECT submitted_by FROM jobs WHERE id = %s", (resp.json()["id"],)) == [
            (pg["roles"]["alice"],)
        ]
        out = server.output()
        assert "Traceback" not in out and "unexpected error" not in out, out[-3000:]
    finally:
        server.stop()


def test_a_nul_in_a_name_or_filter_is_a_400_not_a_database_error(pg):
    """Issue 35 item 14: PostgreSQL cannot take a NUL in a text parameter (psycopg raises), so
    a NUL in a job or host name or a filter must be refused before the store sees it."""
    alice = pg["server"].api.with_token(pg["tokens"]["alice"])
    for method, path in (
        ("GET", "/jobs/a%00b"),
        ("GET", "/jobs/%00/frames"),
        ("POST", "/jobs/%00/pause"),
        ("GET", "/hosts/%00"),
        ("GET", "/hosts/%00/gpus"),
        ("GET", "/jobs?name=%00"),
        ("GET", "/jobs?user=a%00"),
        ("GET", "/hosts?model=%00"),
    ):
        check_problem(alice.request(method, API + path), 400, detail="control character")
    assert "Traceback" not in pg["server"].output()
