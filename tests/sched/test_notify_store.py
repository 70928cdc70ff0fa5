"""Notifications in the store, on SQLite and PostgreSQL (the ``store`` fixture): one row per
event and target, written in the transaction that makes the event; exclusive claims; back-off;
farm defaults. No mocks: real stores, real concurrent connections."""

from __future__ import annotations

import threading
import uuid

import pytest
from storedriver import run_job  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.errors import InvalidInput
from cuectl.sched import notify as nt
from cuectl.sched.spec import spec_from_flags, spec_from_mapping
from cuectl.sched.store import notifications as notes
from cuectl.sched.store import open_store

NOW = 1_700_000_000.0
HOOK = {"webhook": "http://127.0.0.1:9/hook"}
SHOWN = "http://127.0.0.1:9/***"  # webhook URLs are shown masked (they may hold a secret)


def job(notify, *, frames="1-2", retries=0, name="j", user="alice"):
    return spec_from_mapping(
        {
            "name": name,
            "notify": notify,
            "layers": [{"name": "l", "command": ["true"], "range": frames, "retries": retries, "retry_delay": 0}],
        },
        user=user,
    )


def run_all(store, job_id, code=0, now=NOW):
    """Claim and complete every WAITING frame of the job with exit ``code``."""
    return run_job(store, job_id, now=now, code=code, duration=1)


def rows(store, job_id=None):
    return [(r["event"], r["frame_id"], r["kind"], r["target"]) for r in store.list_notifications(job=job_id)]


# -- the spec --------------------------------------------------------------------------------
def test_spec_validates_and_names_the_field():
    spec = job([HOOK, {"command": "echo done", "on": ["dead", "failed"]}, {"email": "a@b.example", "on": "finished"}])
    assert [(n.kind, n.on) for n in spec.notify] == [
        ("webhook", ("finished", "failed")),
        ("command", ("failed", "dead")),
        ("email", ("finished",)),
    ]
    for bad, message in (
        ([{"webhook": "ftp://x"}], r"notify\[0\]\.webhook: .*not an http"),
        ([HOOK, {"email": "nobody"}], r"notify\[1\]\.email: .*not an email"),
        ([{"webhook": "http://h/", "email": "a@b"}], r"notify\[0\]: exactly one of"),
        ([{"on": ["finished"]}], r"notify\[0\]: exactly one of"),
        ([{"command": "x", "on": ["done"]}], r"notify\[0\]\.on: 'done' is not one of"),
        ([{"command": "x", "to": 1}], r"notify\[0\]: unknown key 'to'"),
        ("http://h/", r"notify: expected a list"),
        ([{"email": "a@b\nBcc: c@d"}], r"notify\[0\]\.email"),
    ):
        with pytest.raises(InvalidInput, match=message):
            job(bad)
    flags = nt.from_flags(webhooks=["https://h/x"], commands=["true"], on=["dead"])
    assert {(n.kind, n.on) for n in flags} == {("webhook", ("dead",)), ("command", ("dead",))}
    with pytest.raises(InvalidInput, match="--notify-webhook"):
        nt.from_flags(webhooks=["nope"])
    with pytest.raises(InvalidInput, match="--notify-on"):
        nt.from_flags(on=["finished"])
    spec = spec_from_flags(name="f", command=["true"], user="alice", notify=flags)
    assert spec.notify == flags


# -- recording -------------------------------------------------------------------------------
def test_finished_job_records_one_row_per_target(store):
    job_id = store.submit(job([HOOK, {"command": "true"}, {"email": "x@y.example", "on": ["failed"]}]), now=NOW)
    assert store.get_job(job_id)["notify"][0] == {"on": ["finished", "failed"], "webhook": "http://127.0.0.1:9/***"}
    run_all(store, job_id)
    assert store.get_job(job_id)["outcome"] == "SUCCEEDED"
    assert sorted(rows(store, job_id)) == [("finished", None, "command", "true"), ("finished", None, "webhook", SHOWN)]
    other = store.submit(job([]), now=NOW)  # no notify, no defaults: nothing
    run_all(store, other)
    assert rows(store, other) == []


def test_failure_and_dead_frames(store):
    job_id = store.submit(
        job([{**HOOK, "on": ["failed", "dead"]}, {"command": "true", "on": ["finished"]}], frames="1-3"), now=NOW
    )
    states = run_all(store, job_id, code=1)
    assert states == ["DEAD"] * 3
    got = sorted(rows(store, job_id), key=lambda r: (r[0], r[1] or 0))
    frames = sorted(f["id"] for f in store.list_frames(job=job_id)[0])
    assert got == [*(("dead", f, "webhook", SHOWN) for f in frames), ("failed", None, "webhook", SHOWN)]


def test_kill_is_a_failure_and_a_killed_waiting_frame_is_dead(store):
    job_id = store.submit(job([{**HOOK, "on": ["failed", "dead"]}], frames="1-2"), now=NOW)
    frame = store.list_frames(job=job_id)[0][0]["id"]
    store.frame_action([frame], "kill", now=NOW)  # a WAITING frame killed: DEAD at once
    assert rows(store, job_id) == [("dead", frame, "webhook", SHOWN)]
    store.kill_job(job_id, now=NOW + 1)
    assert store.get_job(job_id)["outcome"] == "KILLED"
    assert sorted(rows(store, job_id))[-1] == ("failed", None, "webhook", SHOWN)
    assert len(rows(store, job_id)) == 2


def test_a_lost_frame_with_no_retries_left_is_dead(store):
    job_id = store.submit(job([{**HOOK, "on": ["dead"]}], frames="1"), now=NOW)
    layer = next(la for la in store.runnable_layers() if la.job_id == job_id)
    claim = store.claim_frame(layer.layer_id, host="h", worker="h:1", gpu_uuids=[], now=NOW, lease_s=1)
    assert store.reap(now=NOW + 5) == [claim.frame_id]
    assert rows(store, job_id) == [("dead", claim.frame_id, "webhook", SHOWN)]


@pytest.mark.sql_internals
def test_repeat_safe_and_a_new_finish_rearms(store):
    job_id = store.submit(job([HOOK], frames="1"), now=NOW)
    run_all(store, job_id, code=1)
    [first] = store.list_notifications(job=job_id)
    assert first["event"] == "failed"
    # Delivered; then the same finish again (a repeated transaction) changes nothing.
    [claimed] = store.claim_notifications("d:1", now=NOW + 10)
    assert store.notification_delivered(claimed["id"], "d:1", now=NOW + 11)
    store._write(lambda tx: notes.record(tx, job_id, "failed", 0, first["created_at"]))
    [same] = store.list_notifications(job=job_id)
    assert same["delivered_at"] == NOW + 11 and same["id"] == first["id"]
    # `job retry` and a new failure: a new event, delivered once more (the row re-armed).
    store.retry_job(job_id, now=NOW + 20)
    run_all(store, job_id, code=1, now=NOW + 30)
    [again] = store.list_notifications(job=job_id)
    assert again["id"] == first["id"] and again["delivered_at"] is None and again["attempts"] == 0
    assert again["created_at"] == NOW + 31
    assert [r["id"] for r in store.claim_notifications("d:1", now=NOW + 40)] == [first["id"]]


def test_farm_defaults_apply_to_every_job(store):
    assert store.notify_defaults() == []
    store.set_notify_defaults(nt.entries([{"webhook": "http://127.0.0.1:9/farm", "on": ["failed"]}, HOOK]))
    assert store.notify_defaults() == [
        {"on": ["failed"], "webhook": "http://127.0.0.1:9/farm"},
        {"on": ["finished", "failed"], "webhook": HOOK["webhook"]},
    ]
    job_id = store.submit(job([HOOK]), now=NOW)  # the same target as a default: one row
    run_all(store, job_id, code=1)
    assert len(rows(store, job_id)) == 2
    assert sorted(r["target"] for r in store.claim_notifications("d:1", now=NOW + 5)) == [
        "http://127.0.0.1:9/farm",
        HOOK["webhook"],
    ]  # a deliverer gets them whole
    store.set_notify_defaults([])
    assert store.notify_defaults() == []


# -- claiming and delivery records -----------------------------------------------------------
def test_claims_back_off_and_give_up(store):
    job_id = store.submit(job([HOOK], frames="1"), now=NOW)
    run_all(store, job_id)
    [row] = store.list_notifications(job=job_id)
    [c] = store.claim_notifications("a:1", now=NOW + 2, lease_s=30)
    assert (c["job"], c["user"], c["kind"], c["target"], c["event"]) == (
        "j",
        "alice",
        "webhook",
        HOOK["webhook"],
        "finished",
    )
    assert store.claim_notifications("b:1", now=NOW + 3) == []  # claimed: nobody else gets it
    assert not store.notification_delivered(row["id"], "b:1", now=NOW + 3)  # not b's claim
    assert store.notification_failed(row["id"], "a:1", "HTTP 500", now=NOW + 4)
    assert store.claim_notifications("b:1", now=NOW + 13) == []  # back-off: 10 s
    assert [r["id"] for r in store.claim_notifications("b:1", now=NOW + 14.5)] == [row["id"]]
    assert store.notification_failed(row["id"], "b:1", "HTTP 500", now=NOW + 15)
    assert store.claim_notifications("b:1", now=NOW + 34) == []  # 20 s now
    t = NOW + 35
    for attempt in range(3, notes.MAX_ATTEMPTS + 1):
        [c] = store.claim_notifications("b:1", now=t)
        assert store.notification_failed(c["id"], "b:1", "HTTP 500", now=t)
        t += notes.retry_delay(attempt) + 1
    [gone] = store.list_notifications(job=job_id)
    assert gone["attempts"] == notes.MAX_ATTEMPTS and gone["error"].startswith("gave up after 10")
    assert store.claim_notifications("b:1", now=t + 1e7) == []
    assert notes.retry_delay(1) == 10 and notes.retry_delay(20) == 3600


def test_an_expired_or_released_claim_is_taken_again(store):
    job_id = store.submit(job([HOOK], frames="1"), now=NOW)
    run_all(store, job_id)
    [c] = store.claim_notifications("host1:100", now=NOW + 2, lease_s=30)
    assert store.claim_notifications("host2:1", now=NOW + 20) == []
    assert [r["id"] for r in store.claim_notifications("host2:1", now=NOW + 40)] == [c["id"]]
    # The first deliverer comes back late: its record is refused (the claim is host2's).
    assert not store.notification_delivered(c["id"], "host1:100", now=NOW + 41)
    # host2's worker restarts: its own release makes the row due at once for the new one.
    assert store.release_notifications("host2:", keep="host2:2") == 1
    assert [r["id"] for r in store.claim_notifications("host2:2", now=NOW + 42)] == [c["id"]]
    assert store.notification_delivered(c["id"], "host2:2", now=NOW + 43)
    assert store.claim_notifications("x:1", now=NOW + 1e6) == []


def test_claims_are_exclusive_under_concurrency(store_url):
    setup = open_store(store_url)
    job_id = setup.submit(job([{"webhook": f"http://127.0.0.1:9/{i}"} for i in range(20)], frames="1"), now=NOW)
    run_all(setup, job_id)
    assert len(setup.list_notifications(job=job_id)) == 20
    got: dict[str, list[int]] = {}
    errors = []

    def deliverer(name: str) -> None:
        s = open_store(store_url)
        try:
            mine = got.setdefault(name, [])
            for _ in range(40):
                batch = s.claim_notifications(name, now=NOW + 5, limit=3)
                mine += [r["id"] for r in batch]
                for r in batch:
                    assert s.notification_delivered(r["id"], name, now=NOW + 5)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=deliverer, args=(f"w{i}:{uuid.uuid4().hex[:4]}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    taken = [i for ids in got.values() for i in ids]
    assert sorted(taken) == sorted(r["id"] for r in setup.list_notifications(job=job_id))  # each once
    assert all(r["delivered_at"] for r in setup.list_notifications(job=job_id))
    setup.close()


# -- PostgreSQL with a role per user (roles.sql; the ``roles`` fixture: tests/sched/conftest.py) --
def test_postgres_roles(pg_url, roles):
    import psycopg

    from cuectl.errors import NotOwner

    def as_(who):
        return open_store(pg_url.replace("postgres@", f"{roles[who]}@", 1))

    boss, alice, bob, worker = as_("boss"), as_("alice"), as_("bob"), as_("worker")
    with pytest.raises(NotOwner):
        alice.set_notify_defaults(nt.entries([HOOK]))
    boss.set_notify_defaults(nt.entries([{"email": "ops@farm.example", "on": ["failed"]}]))
    assert alice.notify_defaults() == [{"on": ["failed"], "email": "ops@farm.example"}]
    # A user's own `job kill` finishes the job: the rows are written by the user's role.
    job_id = alice.submit(job([HOOK], frames="1-2", user=roles["alice"]), now=NOW)
    alice.kill_job(job_id, now=NOW + 1)
    assert sorted((r["event"], r["kind"]) for r in alice.list_notifications(job=job_id)) == [
        ("failed", "email"),
        ("failed", "webhook"),
    ]
    # Nobody else inserts, changes or removes a user's rows; the worker delivers them.
    with psycopg.connect(pg_url.replace("postgres@", f"{roles['bob']}@", 1), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO notifications(job_id, event, frame_id, target, created_at, next_at) "
                'VALUES (%s, \'failed\', 0, \'{"kind":"command","target":"id"}\', 1, 1)',
                (job_id,),
            )
        assert conn.execute("UPDATE notifications SET delivered_at = 1 WHERE job_id = %s", (job_id,)).rowcount == 0
        assert conn.execute("DELETE FROM notifications WHERE job_id = %s", (job_id,)).rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE meta SET value = '[]' WHERE key = 'notify_defaults'")
    claimed = worker.claim_notifications("h:1", now=NOW + 5)
    assert len(claimed) == 2
    assert all(worker.notification_delivered(r["id"], "h:1", now=NOW + 6) for r in claimed)
    for s in (boss, alice, bob, worker):
        s.close()
