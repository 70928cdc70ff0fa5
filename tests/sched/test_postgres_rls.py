"""PostgreSQL roles and row-level security (`cuectl admin pg-roles`, roles.sql) attacked
directly with SQL, as a hostile user's own connection would, on the suite's real server with
real database roles (issue 35: items 3, 6 and 13)."""

from __future__ import annotations

import uuid

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

from pgroles import as_role, login_roles, sql  # noqa: E402  (tests/ is on sys.path)

from cuectl.sched.spec import spec_from_mapping  # noqa: E402
from cuectl.sched.store import FrameResult, open_store, roles_sql  # noqa: E402

NOW = 1_700_000_000.0
Refused = psycopg.errors.InsufficientPrivilege


# What versions before issue 35 installed: ownership checks on the caller's search_path
# (pg_temp first) and attempts an owner could delete. Re-running pg-roles must replace them.
LEGACY = """
CREATE OR REPLACE FUNCTION cuectl_owns(job bigint, who name) RETURNS boolean LANGUAGE sql STABLE
    SECURITY DEFINER SET search_path FROM CURRENT AS $f$
    SELECT EXISTS (SELECT 1 FROM jobs WHERE id = job AND submitted_by = who) $f$;
DROP POLICY IF EXISTS cuectl_write ON attempts;
CREATE POLICY cuectl_write ON attempts FOR ALL USING (cuectl_privileged() OR cuectl_owns(job_id, current_user))
    WITH CHECK (cuectl_privileged());
"""


@pytest.fixture
def roles(pg_url):
    """alice and bob (cuectl_user), a worker and an admin, on a database set up by an older
    `cuectl admin pg-roles` and then this version's, as an upgrade does."""
    with login_roles(pg_url, ("alice", "bob", "worker", "boss"), scripts=(LEGACY, roles_sql())) as names:
        yield names


def submit(pg_url: str, role: str, name: str, command=("true",), frames="1-2") -> int:
    s = open_store(as_role(pg_url, role))
    try:
        return s.submit(
            spec_from_mapping(
                {"name": name, "layers": [{"name": "l", "command": list(command), "range": frames}]}, user=role
            ),
            now=NOW,
        )
    finally:
        s.close()


def first(pg_url: str, statement: str, params=()):
    return sql(pg_url, statement, params)[0][0]


# -- item 3: the ownership checks read our tables, never a caller's ------------------------------
def test_every_security_definer_function_has_a_fixed_search_path(pg_url, roles):
    rows = sql(
        pg_url,
        "SELECT proname, prosecdef, proconfig FROM pg_proc WHERE proname LIKE 'cuectl%%' "
        "AND pronamespace = 'public'::regnamespace AND proname <> 'cuectl_submitter'",
    )
    assert {r[0] for r in rows if r[1]} >= {
        "cuectl_owns",
        "cuectl_owns_frame",
        "cuectl_owns_layer",
        "cuectl_owns_depend",
        "cuectl_layer_job",
        "cuectl_frame_job",
        "cuectl_depend_job",
        "cuectl_record_notification",
    }
    for name, _, config in rows:
        assert config == ["search_path=pg_catalog, public, pg_temp"], name


@pytest.mark.parametrize("shadow", ["jobs", "layers", "frames"])
def test_a_temporary_table_cannot_stand_in_for_the_jobs_an_ownership_check_reads(pg_url, roles, shadow):
    """Alice's temporary tables say she owns bob's job; she then changes his layer's command
    and his frames, and records dependencies for them: nothing changes, nothing is added."""
    alice, bob = roles["alice"], roles["bob"]
    bobs = submit(pg_url, bob, "b")
    layer = first(pg_url, "SELECT id FROM layers WHERE job_id = %s", (bobs,))
    frame = first(pg_url, "SELECT id FROM frames WHERE job_id = %s ORDER BY id", (bobs,))
    with psycopg.connect(as_role(pg_url, alice), autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE jobs (id bigint, submitted_by name)")
        conn.execute("INSERT INTO pg_temp.jobs VALUES (%s, %s)", (bobs, alice))
        if shadow != "jobs":  # and the tables the other checks join
            conn.execute(f"CREATE TEMP TABLE {shadow} (id bigint, job_id bigint)")
            conn.execute(
                f"INSERT INTO pg_temp.{shadow} VALUES (%s, %s)", (layer if shadow == "layers" else frame, bobs)
            )
        # (her statements name the real tables; the checks they call read only ours)
        changed = conn.execute(
            'UPDATE public.layers SET command = \'["sh", "-c", "id"]\' WHERE job_id = %s', (bobs,)
        ).rowcount
        changed += conn.execute("UPDATE public.frames SET state = 'EATEN' WHERE job_id = %s", (bobs,)).rowcount
        assert changed == 0
        for statement, params in (
            ("INSERT INTO public.layer_deps(layer_id, on_layer_id) VALUES (%s, %s)", (layer, layer)),
            ("INSERT INTO public.frame_deps(frame_id, on_frame_id) VALUES (%s, %s)", (frame, frame)),
            ("INSERT INTO public.layer_limits(name, layer_id) VALUES ('lic', %s)", (layer,)),
        ):
            with pytest.raises(Refused, match="row-level security"):
                conn.execute(statement, params)
    assert first(pg_url, "SELECT command FROM layers WHERE id = %s", (layer,)) == '["true"]'
    assert sql(pg_url, "SELECT DISTINCT state FROM frames WHERE job_id = %s", (bobs,)) == [("WAITING",)]


# -- item 6: a row of one job never points into another's -----------------------------------------
def test_a_frame_of_her_job_cannot_point_at_another_users_layer(pg_url, roles):
    alice, bob = roles["alice"], roles["bob"]
    mine, bobs = submit(pg_url, alice, "a"), submit(pg_url, bob, "b", command=("render", "#FRAME#"))
    bobs_layer = first(pg_url, "SELECT id FROM layers WHERE job_id = %s", (bobs,))
    my_frame = first(pg_url, "SELECT id FROM frames WHERE job_id = %s ORDER BY id", (mine,))
    url = as_role(pg_url, alice)
    with pytest.raises(Refused, match="row-level security"):
        sql(
            url,
            "INSERT INTO frames(job_id, layer_id, number, frames, state) VALUES (%s, %s, 7, '7', 'WAITING')",
            (mine, bobs_layer),
        )
    with pytest.raises(Refused, match="row-level security"):
        sql(url, "UPDATE frames SET layer_id = %s WHERE id = %s", (bobs_layer, my_frame))
    assert first(pg_url, "SELECT COUNT(*) FROM frames WHERE layer_id = %s", (bobs_layer,)) == 2
    # A frame of her own layer, in her own job, she may add.
    my_layer = first(pg_url, "SELECT id FROM layers WHERE job_id = %s", (mine,))
    sql(
        url,
        "INSERT INTO frames(job_id, layer_id, number, frames, state) VALUES (%s, %s, 7, '7', 'WAITING')",
        (mine, my_layer),
    )


def test_her_dependencies_and_notifications_cannot_name_another_users_layer_or_frame(pg_url, roles):
    """Every foreign key a policy relies on is checked: a dependency of her job whose waiting
    layer or frame (or edge) is bob's would let a release change his rows."""
    alice, bob = roles["alice"], roles["bob"]
    mine, bobs = submit(pg_url, alice, "a"), submit(pg_url, bob, "b")
    bobs_layer = first(pg_url, "SELECT id FROM layers WHERE job_id = %s", (bobs,))
    bobs_frame = first(pg_url, "SELECT id FROM frames WHERE job_id = %s ORDER BY id", (bobs,))
    my_layer = first(pg_url, "SELECT id FROM layers WHERE job_id = %s", (mine,))
    my_frame = first(pg_url, "SELECT id FROM frames WHERE job_id = %s ORDER BY id", (mine,))
    url = as_role(pg_url, alice)
    dep = "INSERT INTO depends(type, job_id, layer_id, frame_id, on_job_id, created_at) VALUES (%s, %s, %s, %s, %s, 1)"
    for params in (("LAYER_ON_JOB", mine, bobs_layer, None, mine), ("FRAME_ON_JOB", mine, None, bobs_frame, mine)):
        with pytest.raises(Refused, match="row-level security"):
            sql(url, dep, params)
    with psycopg.connect(url, autocommit=True) as conn:
        mine_dep = conn.execute(dep + " RETURNING id", ("LAYER_ON_JOB", mine, my_layer, None, bobs)).fetchone()[0]
    edge = "INSERT INTO depend_edges(depend_id, layer_id, frame_id, on_kind, on_id) VALUES (%s, %s, %s, 'job', %s)"
    for params in ((mine_dep, bobs_layer, None, mine), (mine_dep, None, bobs_frame, mine)):
        with pytest.raises(Refused, match="row-level security"):
            sql(url, edge, params)
    sql(url, edge, (mine_dep, my_layer, None, bobs))  # her own layer waits on bob's job: allowed
    bobs_dep = first(
        pg_url,
        "INSERT INTO depends(type, job_id, on_job_id, created_at) VALUES ('JOB_ON_JOB', %s, %s, 1) RETURNING id",
        (bobs, mine),
    )
    for statement, params in (
        (
            "INSERT INTO frame_deps(frame_id, on_frame_id, depend_id) VALUES (%s, %s, %s)",
            (my_frame, my_frame, bobs_dep),
        ),
        (
            "INSERT INTO layer_deps(layer_id, on_layer_id, depend_id) VALUES (%s, %s, %s)",
            (my_layer, my_layer, bobs_dep),
        ),
        (
            "INSERT INTO notifications(job_id, event, frame_id, target, created_at, next_at) "
            "VALUES (%s, 'frame_dead', %s, 'mailto:a@example.com', 1, 1)",
            (mine, bobs_frame),
        ),
    ):
        with pytest.raises(Refused, match="row-level security"):
            sql(url, statement, params)


# -- item 13: accounting is written by workers and admins only ------------------------------------
def test_an_owner_cannot_delete_or_change_the_attempts_and_samples_of_her_job(pg_url, roles):
    alice = roles["alice"]
    mine = submit(pg_url, alice, "a", frames="1")
    w = open_store(as_role(pg_url, roles["worker"]))
    try:
        (layer,) = w.runnable_layers()
        c = w.claim_frame(layer.layer_id, host="h", worker="h-w", gpu_uuids=[], now=NOW, lease_s=60)
        assert (
            w.complete_frame(
                c.frame_id, c.attempt, FrameResult(exit_code=3, started_at=NOW, ended_at=NOW + 9), now=NOW + 9
            )
            is not None
        )
    finally:
        w.close()
    sql(pg_url, "INSERT INTO samples(frame_id, attempt, uuid, points) VALUES (%s, 1, 'GPU-0', '[]')", (c.frame_id,))
    url = as_role(pg_url, alice)
    assert sql(url, "DELETE FROM attempts WHERE job_id = %s", (mine,)) == 0
    assert sql(url, "UPDATE attempts SET exit_code = 0, ended_at = started_at WHERE job_id = %s", (mine,)) == 0
    assert sql(url, "DELETE FROM samples WHERE frame_id = %s", (c.frame_id,)) == 0
    assert sql(url, "UPDATE samples SET points = '[1]' WHERE frame_id = %s", (c.frame_id,)) == 0
    with pytest.raises(Refused, match="row-level security"):
        sql(
            url,
            "INSERT INTO attempts(frame_id, attempt, job_id, outcome) VALUES (%s, 9, %s, 'SUCCEEDED')",
            (c.frame_id, mine),
        )
    with pytest.raises(Refused, match="row-level security"):
        sql(url, "INSERT INTO samples(frame_id, attempt, uuid, points) VALUES (%s, 9, 'GPU-1', '[]')", (c.frame_id,))
    assert sql(pg_url, "SELECT exit_code, ended_at - started_at FROM attempts WHERE job_id = %s", (mine,)) == [(3, 9.0)]
    assert first(pg_url, "SELECT points FROM samples WHERE frame_id = %s", (c.frame_id,)) == "[]"
    # An admin may; and pruning her own finished job still removes them (with its frames).
    assert sql(as_role(pg_url, roles["boss"]), "UPDATE attempts SET host = 'h2' WHERE job_id = %s", (mine,)) == 1
    a = open_store(url)
    try:
        a.kill_job(mine, now=NOW + 10)
        assert a.prune(before=NOW + 1e9) == [mine]
    finally:
        a.close()
    assert first(pg_url, "SELECT COUNT(*) FROM attempts") == 0 and first(pg_url, "SELECT COUNT(*) FROM samples") == 0


# -- the matrix: each role x each table x each statement, against the policies ---------------------
# Rows of alice's job (and farm rows: a host, a token, a limit...); each case runs in a
# transaction rolled back after it, so every case sees the same rows. "other" is bob, a user
# who owns none of them. (A viewer is an API token's role, not a database role: docs/api.md.)
MATRIX_ROLES = ("owner", "other", "worker", "admin")
OPS = ("select", "insert", "update", "delete", "truncate")
_P, _OP, _A = ("worker", "admin"), ("owner", "worker", "admin"), ("admin",)
_ALL = MATRIX_ROLES
# table: (where its rows are, an insert of a row of alice's job, a no-op SET, who may
#         select, insert, update, delete)
TABLES = {
    "jobs": (
        "id = {A}",
        "INSERT INTO jobs(name, \"user\", created_at) VALUES ('n', 'u', 1)",
        "priority = priority",
        _ALL,
        _ALL,
        _OP,
        _OP,
    ),
    # Layers and frames are submitted by the job's owner alone (a worker or admin submits its own jobs).
    "layers": (
        "job_id = {A}",
        "INSERT INTO layers(job_id, idx, name, command, range, chunk, gpus, gpu_models, "
        "gpu_memory_min_bytes, cores, memory_bytes, retries, env, tags, depends) VALUES ({A}, 9, 'new', "
        "'[\"true\"]', '1', 1, 0, '[]', 0, 1, 0, 0, '{{}}', '[]', '[]')",
        "idx = idx",
        _ALL,
        ("owner",),
        _OP,
        _OP,
    ),
    "frames": (
        "job_id = {A}",
        "INSERT INTO frames(job_id, layer_id, number, frames, state) VALUES ({A}, {L1}, 99, '99', 'WAITING')",
        "number = number",
        _ALL,
        ("owner",),
        _OP,
        _OP,
    ),
    "layer_deps": (
        "layer_id = {L2}",
        "INSERT INTO layer_deps(layer_id, on_layer_id) VALUES ({L1}, {L2})",
        "any_frame = any_frame",
        _ALL,
        _OP,
        _OP,
        _OP,
    ),
    "frame_deps": (
        "frame_id = {F3}",
        "INSERT INTO frame_deps(frame_id, on_frame_id) VALUES ({F1}, {F2})",
        "depend_id = depend_id",
        _ALL,
        _OP,
        _OP,
        _OP,
    ),
    "layer_limits": (
        "layer_id = {L1}",
        "INSERT INTO layer_limits(name, layer_id) VALUES ('other', {L1})",
        "name = name",
        _ALL,
        _OP,
        _P,
        _P,
    ),
    "notifications": (
        "job_id = {A}",
        "INSERT INTO notifications(job_id, event, frame_id, target, created_at, "
        "next_at) VALUES ({A}, 'job_done', 0, 'mailto:new@example.com', 1, 1)",
        "error = error",
        _ALL,
        _P,
        _P,
        _P,
    ),  # an owner's events go through cuectl_record_notification
    "depends": (
        "job_id = {A}",
        "INSERT INTO depends(type, job_id, layer_id, on_job_id, created_at) VALUES ('LAYER_ON_JOB', {A}, {L1}, {A}, 1)",
        "satisfied_at = satisfied_at",
        _ALL,
        _OP,
        _OP,
        _OP,
    ),
    "depend_edges": (
        "depend_id = {D}",
        "INSERT INTO depend_edges(depend_id, layer_id, on_kind, on_id) VALUES ({D}, {L1}, 'job', {A})",
        "on_id = on_id",
        _ALL,
        _OP,
        _OP,
        _OP,
    ),
    "attempts": (
        "job_id = {A}",
        "INSERT INTO attempts(frame_id, attempt, job_id, outcome) VALUES ({F1}, 7, {A}, 'SUCCEEDED')",
        "host = host",
        _ALL,
        _P,
        _P,
        _P,
    ),
    "samples": (
        "frame_id = {F1}",
        "INSERT INTO samples(frame_id, attempt, uuid, points) VALUES ({F1}, 7, 'GPU-new', '[]')",
        "points = points",
        _ALL,
        _P,
        _P,
        _P,
    ),
    "hosts": (
        "name = 'h1'",
        "INSERT INTO hosts(name, cores, memory_bytes, gpus, registered_at, last_heartbeat) "
        "VALUES ('h2', 1, 1, '[]', 1, 1)",
        "locked = locked",
        _ALL,
        _P,
        _P,
        _P,
    ),
    # Tokens are read and written by admins only, and revoked, never deleted.
    "tokens": (
        "hash = 'h'",
        "INSERT INTO tokens(\"user\", role, hash, created_at, created_by) VALUES ('u', 'admin', 'h2', 1, 'x')",
        "label = label",
        _A,
        _A,
        _A,
        (),
    ),
    "limits": (
        "name = 'lic'",
        "INSERT INTO limits(name, max_running) VALUES ('new', 1)",
        "max_running = max_running",
        _ALL,
        _A,
        _A,
        _A,
    ),
    "quotas": (
        "name = 'alice'",
        "INSERT INTO quotas(kind, name, max_gpus) VALUES ('user', 'new', 1)",
        "max_gpus = max_gpus",
        _ALL,
        _A,
        _A,
        _A,
    ),
    "services": ("name = 'svc'", "INSERT INTO services(name) VALUES ('new')", "cores = cores", _ALL, _A, _A, _A),
    # What workers see on their devices, and devices out of service: everyone reads them,
    # workers and admins write them (docs/gpu-health.md).
    "gpu_events": (
        "frame_id = {F1}",
        "INSERT INTO gpu_events(host, kind, at, job_id, frame_id, attempt) VALUES ('h1', 'idle', 2, {A}, {F1}, 1)",
        "detail = detail",
        _ALL,
        _P,
        _P,
        _P,
    ),
    "device_states": (
        "host = 'h1'",
        "INSERT INTO device_states(host, uuid, state, since) VALUES ('h1', 'GPU-new', 'drained', 1)",
        "reason = reason",
        _ALL,
        _P,
        _P,
        _P,
    ),
    "meta": (
        "key = 'notify_defaults'",
        "INSERT INTO meta(key, value) VALUES ('depend.satisfy_on_eaten', '1')",
        "value = value",
        _ALL,
        _A,
        _A,
        _A,
    ),
}


def test_the_matrix_covers_every_table_of_the_store():
    from cuectl.sched.store.schema import TABLES as STORE_TABLES

    assert set(TABLES) == set(STORE_TABLES)


@pytest.fixture(scope="module")
def matrix(pg_server):
    """One database for every case: {role: an open connection, "ids": the rows' ids}."""
    name = pg_server.create_database()
    url = pg_server.url(name)
    open_store(url).close()
    suffix = uuid.uuid4().hex[:6]
    names = {who: f"m{who}_{suffix}" for who in MATRIX_ROLES}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(roles_sql())
        for who, role in names.items():
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(
                f"GRANT { ({'worker': 'cuectl_worker', 'admin': 'cuectl_admin'}.get(who, 'cuectl_user')) } TO {role}"
            )
    s = open_store(as_role(url, names["owner"]))
    a = s.submit(
        spec_from_mapping(
            {
                "name": "a",
                "layers": [
                    {"name": "l1", "command": ["true"], "range": "1-2"},
                    {"name": "l2", "command": ["true"], "range": "1", "depends": ["l1"]},
                ],
            },
            user=names["owner"],
        ),
        now=NOW,
    )
    s.close()
    ids = {"A": a}
    with psycopg.connect(url, autocommit=True) as conn:

        def one(q, p=()):
            return conn.execute(q, p).fetchone()[0]

        ids["L1"] = one("SELECT id FROM layers WHERE job_id = %s AND name = 'l1'", (a,))
        ids["L2"] = one("SELECT id FROM layers WHERE job_id = %s AND name = 'l2'", (a,))
        ids["F1"], ids["F2"] = [
            r[0] for r in conn.execute("SELECT id FROM frames WHERE layer_id = %s ORDER BY id", (ids["L1"],))
        ]
        ids["F3"] = one("SELECT id FROM frames WHERE layer_id = %s", (ids["L2"],))
        ids["D"] = one(
            "INSERT INTO depends(type, job_id, layer_id, on_job_id, created_at) "
            "VALUES ('LAYER_ON_JOB', %s, %s, %s, 1) RETURNING id",
            (a, ids["L2"], a),
        )
        for q in (
            "INSERT INTO layer_deps(layer_id, on_layer_id) VALUES ({L2}, {L1}) ON CONFLICT DO NOTHING",
            "INSERT INTO frame_deps(frame_id, on_frame_id) VALUES ({F3}, {F1})",
            "INSERT INTO depend_edges(depend_id, layer_id, on_kind, on_id) VALUES ({D}, {L2}, 'job', {A})",
            "INSERT INTO attempts(frame_id, attempt, job_id, outcome) VALUES ({F1}, 1, {A}, 'FAILED')",
            "INSERT INTO samples(frame_id, attempt, uuid, points) VALUES ({F1}, 1, 'GPU-0', '[]')",
            "INSERT INTO layer_limits(name, layer_id) VALUES ('lic', {L1})",
            "INSERT INTO notifications(job_id, event, frame_id, target, created_at, next_at) "
            "VALUES ({A}, 'job_done', 0, 'mailto:a@example.com', 1, 1)",
            "INSERT INTO hosts(name, cores, memory_bytes, gpus, registered_at, last_heartbeat) "
            "VALUES ('h1', 1, 1, '[]', 1, 1)",
            "INSERT INTO tokens(\"user\", role, hash, created_at, created_by) VALUES ('u', 'user', 'h', 1, 'x')",
            "INSERT INTO limits(name, max_running) VALUES ('lic', 1)",
            "INSERT INTO quotas(kind, name, max_gpus) VALUES ('user', 'alice', 1)",
            "INSERT INTO services(name) VALUES ('svc')",
            "INSERT INTO gpu_events(host, kind, at, job_id, frame_id, attempt, detail) "
            "VALUES ('h1', 'escape', 1, {A}, {F1}, 1, 'x')",
            "INSERT INTO device_states(host, uuid, state, reason, since) VALUES ('h1', 'GPU-0', 'drained', 'x', 1)",
            "INSERT INTO meta(key, value) VALUES ('notify_defaults', '[]')",
        ):
            conn.execute(q.format(**ids))
    conns = {who: psycopg.connect(as_role(url, role)) for who, role in names.items()}
    yield {"conns": conns, "ids": ids}
    for c in conns.values():
        c.close()
    with psycopg.connect(url, autocommit=True) as conn:
        for role in names.values():
            conn.execute(f"REASSIGN OWNED BY {role} TO postgres; DROP OWNED BY {role}")
    pg_server.drop_database(name)
    for role in names.values():
        pg_server._admin(f"DROP ROLE {role}")


@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("who", MATRIX_ROLES)
def test_who_may_do_what_to_each_table(matrix, who, op, table):
    where, insert, noop, *allowed_by = TABLES[table]
    allowed = who in (allowed_by[OPS.index(op)] if op != "truncate" else ())
    ids = matrix["ids"]
    statement = {
        "select": f"SELECT COUNT(*) FROM {table} WHERE {where}",
        "insert": insert,
        "update": f"UPDATE {table} SET {noop} WHERE {where}",
        "delete": f"DELETE FROM {table} WHERE {where}",
        "truncate": f"TRUNCATE {table} CASCADE",
    }[op].format(**ids)
    conn = matrix["conns"][who]
    try:
        try:
            cur = conn.execute(statement)
        except Refused:
            done = False
        else:
            done = (cur.fetchone()[0] if op == "select" else cur.rowcount) > 0 or op == "truncate"
    finally:
        conn.rollback()
    assert done == allowed, f"{who} {op} {table}: {'done' if done else 'refused'}"
