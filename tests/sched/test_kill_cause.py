"""A user's kill of a frame says who, and a job that ends FAILED for it says why
(issue 41, section 4): "1 frame killed by alice", not a bare FAILED. And frames found by
name (``Store.frame_id``). On every store backend."""

from __future__ import annotations

import time

import pytest

from cuectl.errors import Conflict, NotFound
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult
from cuectl.sched.store.lifecycle import outcome_reason

NOW = time.time()


def submit(store, name: str = "sweep", range_: str = "1-3", retries: int = 0) -> int:
    return store.submit(
        spec_from_mapping(
            {"name": name, "layers": [{"name": "main", "command": ["true"], "range": range_, "retries": retries}]},
            user="alice",
        ),
        now=NOW,
    )


def frame_ids(store, job: int) -> list[int]:
    return [f["id"] for f in store.list_frames(job=job)[0]]


def eat_rest(store, ids: list[int]) -> None:
    store.frames_action(ids, "eat", now=NOW + 2)


def test_killing_a_waiting_frame_names_the_killer_on_the_frame_and_the_job(store):
    job = submit(store)
    first, *rest = frame_ids(store, job)
    store.frames_action([first], "kill", now=NOW + 1)
    me = store.actor().name
    assert store.get_frame(first)["failure"] == f"killed by {me} (frame kill)"
    eat_rest(store, rest)
    data = store.get_job(job)
    assert (data["outcome"], data["outcome_reason"]) == ("FAILED", f"1 frame killed by {me}")
    listed = [j for j in store.list_jobs() if j["id"] == job][0]
    assert listed["outcome_reason"] == f"1 frame killed by {me}"


def test_killing_a_running_frame_keeps_the_killer_through_the_workers_report(store):
    job = submit(store)
    layer = store.runnable_layers()[0]
    claimed = store.claim_frame(layer.layer_id, host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=600)
    store.frames_action([claimed.frame_id], "kill", now=NOW + 1)
    # The worker kills the group and reports how it ended, as it does for a user's kill.
    store.complete_frame(
        claimed.frame_id,
        claimed.attempt,
        FrameResult(
            exit_code=None,
            exit_signal=15,
            started_at=NOW,
            ended_at=NOW + 1,
            failure="killed by a user",
            failure_kind="killed",
        ),
        now=NOW + 1,
    )
    frame = store.get_frame(claimed.frame_id)
    me = store.actor().name
    assert (frame["state"], frame["failure"]) == ("DEAD", f"killed by {me} (frame kill)")
    eat_rest(store, [i for i in frame_ids(store, job) if i != claimed.frame_id])
    assert store.get_job(job)["outcome_reason"] == f"1 frame killed by {me}"


def test_a_frame_that_failed_is_counted_as_failed(store):
    job = submit(store, range_="1-2")
    layer = store.runnable_layers()[0]
    claimed = store.claim_frame(layer.layer_id, host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=600)
    store.complete_frame(
        claimed.frame_id, claimed.attempt, FrameResult(exit_code=3, started_at=NOW, ended_at=NOW + 1), now=NOW + 1
    )
    store.frames_action([i for i in frame_ids(store, job) if i != claimed.frame_id], "kill", now=NOW + 2)
    me = store.actor().name
    assert store.get_job(job)["outcome_reason"] == f"1 frame killed by {me}, 1 frame failed"


def test_a_succeeded_or_unfinished_job_has_no_reason(store):
    job = submit(store, range_="1")
    assert store.get_job(job)["outcome_reason"] is None
    eat_rest(store, frame_ids(store, job))
    assert (store.get_job(job)["outcome"], store.get_job(job)["outcome_reason"]) == ("SUCCEEDED", None)


def test_outcome_reason_words() -> None:
    assert outcome_reason({}) is None
    assert (
        outcome_reason(
            {
                "killed by bob (frame kill)": 2,
                "killed by alice (frame kill)": 1,
                "exit 1": 3,
                None: 1,
                "killed by signal 9 (SIGKILL)": 1,
            }
        )
        == "2 frames killed by bob, 1 frame killed by alice, 5 frames failed"
    )


def test_frame_id_by_name(store):
    job = submit(store, name="shots/sq010", range_="1-2")
    ids = frame_ids(store, job)
    assert store.frame_id("shots/sq010/0002-main") == ids[1]
    assert store.frame_id(f"{job}/1") == ids[0]
    assert store.frame_id(str(ids[0])) == ids[0]
    with pytest.raises(NotFound):
        store.frame_id("shots/sq010/0003-main")
    other = store.submit(
        spec_from_mapping(
            {
                "name": "two",
                "layers": [
                    {"name": "a", "command": ["true"], "range": "1"},
                    {"name": "b", "command": ["true"], "range": "1"},
                ],
            },
            user="alice",
        ),
        now=NOW,
    )
    with pytest.raises(Conflict):
        store.frame_id(f"{other}/1")
    assert store.frame_id(f"{other}/0001-b") == frame_ids(store, other)[1]
