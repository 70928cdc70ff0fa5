"""PostgreSQL with a role per user: notification rows are written by workers and admins
only; a user's own `job kill` or `frame kill` records its event through the SECURITY
DEFINER cuectl_record_notification (roles.sql), which writes only the row that event's
transaction would write. Real login roles on the suite's real server (issue 35, item 8)."""

from __future__ import annotations

import json

import pytest

psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")

from pgroles import as_role, login_roles, sql  # noqa: E402  (tests/ is on sys.path)

from cuectl.sched import notify as nt  # noqa: E402
from cuectl.sched.model import Notify  # noqa: E402
from cuectl.sched.spec import spec_from_mapping  # noqa: E402
from cuectl.sched.store import FrameResult, open_store  # noqa: E402

NOW = 1_700_000_000.0
HOOK = "http://127.0.0.1:9/hook"
RECORD = "SELECT cuectl_record_notification(%s, %s, %s, %s, %s)"
Refused = psycopg.errors.InsufficientPrivilege


@pytest.fixture
def roles(pg_url):
    with login_roles(pg_url, ("alice", "bob", "worker")) as names:
        yield names


def target(kind: str, value: str) -> str:
    return nt.target_json(Notify(kind=kind, target=value))


def submit(pg_url: str, role: str, notify: list, frames: str = "1-2") -> int:
    s = open_store(as_role(pg_url, role))
    try:
        return s.submit(
            spec_from_mapping(
                {
                    "name": "n",
                    "notify": notify,
                    "layers": [{"name": "l", "command": ["true"], "range": frames, "retries": 0}],
                },
                user=role,
            ),
            now=NOW,
        )
    finally:
        s.close()


def kill(pg_url: str, role: str, job: int, now: float) -> None:
    s = open_store(as_role(pg_url, role))
    try:
        s.kill_job(job, now=now)
    finally:
        s.close()


def rows(pg_url: str, job: int) -> list[tuple]:
    return sql(
        pg_url,
        "SELECT event, frame_id, target, created_at, delivered_at FROM notifications WHERE job_id = %s ORDER BY id",
        (job,),
    )


def test_an_owner_cannot_write_her_notification_rows_herself(pg_url, roles):
    """Before: alice's role inserted a row naming any command (run by a root deliverer as
    her, or any mail address) and marked her rows delivered or claimed."""
    alice = roles["alice"]
    mine = submit(pg_url, alice, [{"webhook": HOOK}])
    kill(pg_url, alice, mine, NOW + 1)
    [(event, _, text, _, _)] = rows(pg_url, mine)
    assert (event, text) == ("failed", target("webhook", HOOK))  # her kill recorded it, through the guard
    url = as_role(pg_url, alice)
    with pytest.raises(Refused, match="row-level security"):
        sql(
            url,
            "INSERT INTO notifications(job_id, event, frame_id, target, created_at, next_at) "
            "VALUES (%s, 'failed', 0, %s, 5, 5)",
            (mine, target("command", "id")),
        )
    for change in (
        "delivered_at = 1",
        "claimed_by = 'me', claimed_until = 1e18",
        "attempts = 99",
        "created_at = 0, next_at = 0",
    ):
        assert sql(url, f"UPDATE notifications SET {change} WHERE job_id = %s", (mine,)) == 0, change
    assert sql(url, "DELETE FROM notifications WHERE job_id = %s", (mine,)) == 0
    assert sql(pg_url, "SELECT attempts, claimed_by, delivered_at FROM notifications WHERE job_id = %s", (mine,)) == [
        (0, None, None)
    ]


def test_the_guard_writes_only_what_this_transactions_event_asks_for(pg_url, roles):
    alice, bob = roles["alice"], roles["bob"]
    hook = target("webhook", HOOK)
    mine = submit(pg_url, alice, [{"webhook": HOOK}])
    kill(pg_url, alice, mine, NOW + 1)
    sql(pg_url, "UPDATE notifications SET delivered_at = %s WHERE job_id = %s", (NOW + 2, mine))
    before = rows(pg_url, mine)
    # The event happened in an earlier transaction: neither she nor bob re-arms the row
    # (delivered again) or records another event of the job.
    for role in (alice, bob):
        for event, frame in (("failed", 0), ("finished", 0)):
            assert sql(as_role(pg_url, role), RECORD, (mine, event, frame, hook, NOW + 50)) == [(False,)]
    assert rows(pg_url, mine) == before
    # In a transaction that changed her job's row (she may: it is hers), only the job's own
    # targets for its real event are written: not a command of her choosing, not the other
    # event, not a target text other than the canonical one, not a frame of another job.
    bobs = submit(pg_url, bob, [{"webhook": HOOK, "on": ["dead"]}])
    bobs_frame = sql(pg_url, "SELECT id FROM frames WHERE job_id = %s ORDER BY id LIMIT 1", (bobs,))[0][0]
    with psycopg.connect(as_role(pg_url, alice)) as conn:
        assert conn.execute("UPDATE jobs SET priority = priority WHERE id = %s", (mine,)).rowcount == 1
        for args in (
            (mine, "failed", 0, target("command", "id"), NOW + 60),
            (mine, "failed", 0, target("email", "me@example.com"), NOW + 60),
            (mine, "finished", 0, hook, NOW + 60),
            (mine, "failed", 0, json.dumps({"kind": "webhook", "target": HOOK}), NOW + 60),
            (mine, "dead", bobs_frame, hook, NOW + 60),
            (bobs, "dead", bobs_frame, hook, NOW + 60),
            (mine, "failed", 0, "not json", NOW + 60),
        ):
            assert conn.execute(RECORD, args).fetchone() == (False,), args
        conn.commit()
    assert rows(pg_url, mine) == before and rows(pg_url, bobs) == []


def test_kills_and_a_workers_dead_frame_record_through_the_guard(pg_url, roles):
    """Every way an event is recorded on such a store: her `frame kill` (a waiting frame
    goes DEAD), her `job kill`, a worker's report of a DEAD frame; a retried job's new
    failure re-arms its row — whose text is the one Python writes, non-ASCII and all."""
    alice, worker = roles["alice"], roles["worker"]
    command = 'echo "done: é \\" \U0001f600\t$CUE_EVENT"'
    mine = submit(pg_url, alice, [{"command": command, "on": ["failed", "dead"]}], frames="1-3")
    frames = [r[0] for r in sql(pg_url, "SELECT id FROM frames WHERE job_id = %s ORDER BY id", (mine,))]
    s = open_store(as_role(pg_url, alice))
    w = open_store(as_role(pg_url, worker))
    try:
        s.frame_action([frames[0]], "kill", now=NOW + 1)
        (layer,) = w.runnable_layers()
        c = w.claim_frame(layer.layer_id, host="h", worker="h:1", gpu_uuids=[], now=NOW + 2, lease_s=60)
        assert (
            w.complete_frame(
                c.frame_id, c.attempt, FrameResult(exit_code=3, started_at=NOW + 2, ended_at=NOW + 3), now=NOW + 3
            )
            == "DEAD"
        )
        s.kill_job(mine, now=NOW + 4)
        text = target("command", command)
        got = rows(pg_url, mine)
        # (a job kill eats its waiting frames: no more dead events)
        assert [(e, f, t) for e, f, t, _, _ in got] == [
            ("dead", frames[0], text),
            ("dead", c.frame_id, text),
            ("failed", 0, text),
        ]
        sql(pg_url, "UPDATE notifications SET delivered_at = 1 WHERE job_id = %s", (mine,))
        s.retry_job(mine, now=NOW + 10)
        s.kill_job(mine, now=NOW + 11)
        again = {(e, f): (created, delivered) for e, f, _, created, delivered in rows(pg_url, mine)}
        assert len(again) == len(got) and again[("failed", 0)] == (NOW + 11, None)
    finally:
        s.close()
        w.close()


def test_the_guards_target_text_is_pythons(pg_url, roles):
    """The row's unique key is its target's text: written by Python (SQLite, PostgreSQL
    without pg-roles) or by the guard, one target must give one text, or a re-armed event
    would be recorded twice after pg-roles is installed."""
    for value in ('a"b\\c', "x\n\r\t\b\f\x01\x1f\x7f", "é € \u2028 \u202e", "\U0001f600 \U0010ffff", "", " ~"):
        for kind in ("command", "webhook", "email"):
            assert sql(pg_url, "SELECT cuectl_notify_target(%s, %s)", (kind, value)) == [(target(kind, value),)]
