"""Bulk job and frame actions (issue 17, item 8): kill_jobs, retry_jobs, set_jobs_paused,
set_jobs_priority, frames_action and select_frames — on SQLite and on a real PostgreSQL
(the ``store`` fixture), no mocks. One ownership check for all, all or nothing."""

from __future__ import annotations

import pytest
from storedriver import pg_roles  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.errors import Conflict, InvalidInput, NotFound, NotOwner
from cuectl.sched import model as m
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import Actor, FrameResult

NOW = 1_700_000_000.0


def spec(name: str, *, user: str = "alice", range_: str = "1-3", layers=None):
    layers = layers or [{"name": "render", "command": ["true"], "range": range_}]
    return spec_from_mapping({"name": name, "layers": [{"retry_delay": 0, **layer} for layer in layers]}, user=user)


def claim_one(store, now=NOW):
    for layer in store.runnable_layers():
        claimed = store.claim_frame(layer.layer_id, host="h1", worker="h1-w", gpu_uuids=[], now=now, lease_s=60.0)
        if claimed:
            return claimed
    return None


def test_kill_jobs_kills_many_in_order_given_and_by_name(store):
    ids = [store.submit(spec(f"shot-{i}"), now=NOW) for i in range(4)]
    running = claim_one(store)  # a frame of shot-0 runs: flagged for its worker, not eaten
    done = store.kill_jobs([ids[2], "shot-0", str(ids[1]), ids[2]], now=NOW + 1)
    assert [j["id"] for j in done] == [ids[2], ids[0], ids[1]]  # repeats dropped, order kept
    assert all("layers" not in j for j in done)  # job list's shape
    assert done[0]["state"] == "FINISHED" and done[0]["outcome"] == "KILLED"
    assert done[0]["frame_counts"] == {m.EATEN: 3}
    assert done[1]["state"] == "PENDING" and done[1]["frame_counts"] == {m.EATEN: 2, m.RUNNING: 1}
    assert store.get_frame(running.frame_id)["pending_action"] == "eat"
    assert store.get_job(ids[3])["frame_counts"] == {m.WAITING: 3}  # untouched
    # The worker reports the killed frame: the job finishes, killed.
    store.complete_frame(
        running.frame_id, running.attempt, FrameResult(exit_code=None, exit_signal=15, user_action="eat"), now=NOW + 2
    )
    assert store.get_job(ids[0])["outcome"] == "KILLED"


def test_bulk_job_actions_pause_resume_priority_retry(store):
    ids = [store.submit(spec(f"j{i}"), now=NOW) for i in range(3)]
    paused = store.set_jobs_paused(ids[:2], True)
    assert [j["paused"] for j in paused] == [True, True]
    assert store.get_job(ids[2])["paused"] is False
    assert [j["paused"] for j in store.set_jobs_paused(ids, False)] == [False] * 3
    assert [j["priority"] for j in store.set_jobs_priority(ids[1:], 50)] == [50, 50]
    assert store.get_job(ids[0])["priority"] == 0
    with pytest.raises(InvalidInput, match="priority"):
        store.set_jobs_priority(ids, 2**40)
    store.kill_jobs(ids, now=NOW)
    retried = store.retry_jobs(ids[:2], now=NOW + 1)
    assert [(j["state"], j["frame_counts"], j["outcome"]) for j in retried] == [("PENDING", {m.WAITING: 3}, None)] * 2
    assert store.get_job(ids[2])["outcome"] == "KILLED"
    assert store.retry_jobs([ids[0]], now=NOW + 2)[0]["frame_counts"] == {m.WAITING: 3}  # nothing to retry: as is


def test_bulk_refs_are_checked_before_anything_changes(store):
    a = store.submit(spec("a"), now=NOW)
    store.submit(spec("twin"), now=NOW)
    store.submit(spec("twin"), now=NOW)
    with pytest.raises(NotFound, match="nope"):
        store.kill_jobs([a, "nope"], now=NOW)
    with pytest.raises(Conflict, match="not unique"):
        store.set_jobs_paused([a, "twin"], True)
    with pytest.raises(NotFound):
        store.kill_jobs([a, 999_999], now=NOW)
    assert store.get_job(a)["frame_counts"] == {m.WAITING: 3} and store.get_job(a)["paused"] is False
    assert store.kill_jobs([], now=NOW) == [] and store.set_jobs_paused([], True) == []


@pytest.mark.acts_as_user
def test_bulk_action_over_someone_elses_job_changes_nothing(store):
    pg_roles(store, "bulk_ann", "bulk_bob")
    with store.acting_as(Actor("bulk_ann", False)):
        mine = [store.submit(spec(f"ann-{i}", user="bulk_ann"), now=NOW) for i in range(3)]
    with store.acting_as(Actor("bulk_bob", False)):
        bobs = [store.submit(spec(f"bob-{i}", user="bulk_bob"), now=NOW) for i in range(2)]
    every = mine + bobs
    frames = [f["id"] for f in store.list_frames(job=bobs[0])[0]] + [f["id"] for f in store.list_frames(job=mine[0])[0]]
    with store.acting_as(Actor("bulk_ann", False)):
        for change in (
            lambda: store.kill_jobs(every, now=NOW),
            lambda: store.set_jobs_paused(every, True),
            lambda: store.set_jobs_priority(every, 9),
            lambda: store.retry_jobs(every, now=NOW),
            lambda: store.frames_action(frames, "eat", now=NOW),
        ):
            with pytest.raises(NotOwner) as caught:
                change()
            assert "bulk_bob" in str(caught.value) and str(bobs[0]) in str(caught.value)
        assert [j["paused"] for j in store.set_jobs_paused(mine, True)] == [True] * 3  # their own: fine
    for job_id in bobs:
        data = store.get_job(job_id)
        assert (data["frame_counts"], data["paused"], data["priority"]) == ({m.WAITING: 3}, False, 0)
    assert store.get_job(mine[1])["frame_counts"] == {m.WAITING: 3}


def test_frames_action_and_select_frames(store):
    job_id = store.submit(
        spec(
            "shot",
            layers=[
                {"name": "sim", "command": ["true"], "range": "1-4"},
                {"name": "render", "command": ["true"], "range": "1-10"},
            ],
        ),
        now=NOW,
    )
    assert len(store.select_frames(job_id)) == 14
    sim, render = store.select_frames(job_id, layer="sim"), store.select_frames(job_id, layer="render")
    assert len(sim) == 4 and len(render) == 10
    numbers = {f["id"]: f["number"] for f in store.list_frames(job=job_id, limit=100)[0]}
    picked = store.select_frames("shot", layer="render", numbers=[2, 4, 6, 99])
    assert [numbers[i] for i in picked] == [2, 4, 6]
    assert store.select_frames(job_id, state=m.WAITING) == sim + render
    with pytest.raises(NotFound, match="no layer 'nope'"):
        store.select_frames(job_id, layer="nope")
    eaten = store.frames_action(sim, "eat", now=NOW)
    assert [f["state"] for f in eaten] == [m.EATEN] * 4 and "attempt_history" not in eaten[0]
    assert store.select_frames(job_id, state=m.EATEN) == sim
    killed = store.frames_action(picked, "kill", now=NOW)
    assert [f["state"] for f in killed] == [m.DEAD] * 3
    assert store.select_frames(job_id, state=m.DEAD, numbers=range(1, 5)) == picked[:2]
    assert [f["state"] for f in store.frames_action(picked, "retry", now=NOW)] == [m.WAITING] * 3
    with pytest.raises(NotFound):
        store.frames_action([picked[0], 999_999], "eat", now=NOW)
    assert store.get_frame(picked[0])["state"] == m.WAITING
    with pytest.raises(InvalidInput):
        store.frames_action(picked, "explode", now=NOW)
    # Every frame of the job at once: it finishes in the same transaction.
    store.frames_action(store.select_frames(job_id), "eat", now=NOW)
    assert store.get_job(job_id)["state"] == "FINISHED"


def test_bulk_kill_of_many_jobs_spans_id_batches(store):
    """More jobs than one IN (...) batch (500): every one killed, in one call."""
    ids = [store.submit(spec(f"many-{i}", range_="1"), now=NOW) for i in range(520)]
    done = store.kill_jobs(ids, now=NOW)
    assert len(done) == 520 and {j["outcome"] for j in done} == {"KILLED"}
    assert store.count_jobs(include_finished=False) == 0
    assert len(store.set_jobs_priority(ids, 3)) == 520


def test_bulk_kill_records_each_finished_jobs_notification_once(store):
    hook = {"webhook": "http://127.0.0.1:9/hook", "on": ["failed"]}
    told = [
        store.submit(
            spec_from_mapping(
                {"name": f"told-{i}", "notify": [hook], "layers": [{"name": "l", "command": ["true"], "range": "1-2"}]},
                user="alice",
            ),
            now=NOW,
        )
        for i in range(2)
    ]
    silent = store.submit(spec("silent"), now=NOW)
    running = claim_one(store)  # a frame of told-0 runs: that job finishes (and tells) when it ends
    store.kill_jobs([*told, silent], now=NOW + 1)
    assert [r["event"] for r in store.list_notifications(job=told[1])] == ["failed"]
    assert store.list_notifications(job=told[0]) == [] and store.list_notifications(job=silent) == []
    store.kill_jobs(told, now=NOW + 2)  # killing again finishes nothing new: nothing recorded twice
    assert len(store.list_notifications(job=told[1])) == 1
    store.complete_frame(
        running.frame_id, running.attempt, FrameResult(exit_code=None, exit_signal=15, user_action="eat"), now=NOW + 3
    )
    assert [r["event"] for r in store.list_notifications(job=told[0])] == ["failed"]
