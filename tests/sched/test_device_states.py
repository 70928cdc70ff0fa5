"""Device states and sick-device attempts (docs/gpu-health.md, issue 39 §3) on every backend
(the ``store`` fixture: SQLite, PostgreSQL, the socket ...): an attempt whose device failed
does not spend the frame's retries; devices drained by the worker and by hand, shown with
their host; the suspect rule's evidence. Real stores, no mocks."""

from __future__ import annotations

import json

import pytest

from cuectl.errors import InvalidInput, NotFound, NotOwner
from cuectl.sched import model as m
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo
from cuectl.sched.store.base import Actor

NOW = 1_700_000_000.0
GPUS = [
    {
        "index": i,
        "uuid": f"GPU-{c}",
        "vendor": "NVIDIA",
        "model": "T4",
        "backend": "fake",
        "memory_total_bytes": 1 << 34,
    }
    for i, c in enumerate("ab")
]
XID = "device failed: Xid 79: GPU has fallen off the bus on GPU 0 (GPU-a)"


def job(store, name="j", retries=1, retry_delay=0, frames="1"):
    spec = spec_from_mapping(
        {
            "name": name,
            "layers": [
                {"name": "r", "command": ["true"], "range": frames, "retries": retries, "retry_delay": retry_delay}
            ],
        },
        user="alice",
    )
    return store.submit(spec, now=NOW)


def claim(store, job_id, host="h1", uuids=("GPU-a",), now=NOW):
    for layer in store.runnable_layers():
        if layer.job_id == job_id:
            got = store.claim_frame(
                layer.layer_id, host=host, worker=f"{host}-w", gpu_uuids=list(uuids), now=now, lease_s=60
            )
            if got:
                return got
    return None


def device_failed():
    return FrameResult(
        exit_code=None, exit_signal=15, started_at=NOW, ended_at=NOW + 1, failure_kind="device-failed", failure=XID
    )


def failed(ended=NOW + 1):
    return FrameResult(exit_code=1, started_at=NOW, ended_at=ended, failure_kind="exit", failure="exit 1")


def test_a_device_failure_does_not_spend_the_frames_retries(store):
    job_id = job(store, retries=1, retry_delay=600)
    a = claim(store, job_id)
    assert store.complete_frame(a.frame_id, 1, device_failed(), now=NOW + 1) == m.WAITING
    frame = store.get_frame(a.frame_id)
    # Waits again at once (no retry back-off) and is not marked failed.
    assert frame["state"] == "WAITING" and frame["retry_at"] is None and frame["failure"] is None
    history = store.frame_attempts([a.frame_id])[a.frame_id]
    assert [(h["outcome"], h["failure_kind"], h["failure"]) for h in history] == [
        ("device-failed", "device-failed", XID)
    ]
    # Retries 1: one real failure is still retried (two would have been DEAD had the
    # device's attempt counted), the second is the last.
    b = claim(store, job_id, uuids=("GPU-b",), now=NOW + 2)
    assert b.attempt == 2
    assert store.complete_frame(b.frame_id, 2, failed(), now=NOW + 3) == m.WAITING
    c = claim(store, job_id, uuids=("GPU-b",), now=NOW + 700)
    assert store.complete_frame(c.frame_id, 3, failed(), now=NOW + 701) == m.DEAD


def test_retries_zero_survive_any_number_of_device_failures(store):
    job_id = job(store, retries=0)
    for attempt in (1, 2, 3):
        a = claim(store, job_id, now=NOW + attempt)
        assert a.attempt == attempt
        assert store.complete_frame(a.frame_id, attempt, device_failed(), now=NOW + attempt) == m.WAITING
    a = claim(store, job_id, uuids=("GPU-b",), now=NOW + 10)
    assert store.complete_frame(a.frame_id, 4, FrameResult(exit_code=0), now=NOW + 11) == m.SUCCEEDED
    outcomes = [h["outcome"] for h in store.frame_attempts([a.frame_id])[a.frame_id]]
    assert outcomes == ["device-failed"] * 3 + ["succeeded"]


def test_a_reaped_attempt_after_device_failures_still_has_its_retries(store):
    job_id = job(store, retries=0)
    a = claim(store, job_id)
    store.complete_frame(a.frame_id, 1, device_failed(), now=NOW + 1)
    b = claim(store, job_id, now=NOW + 2)
    # Its worker goes silent: the lost attempt counts (the first one), the device's did not.
    assert store.reap(now=NOW + 1000) == [b.frame_id]
    assert store.get_frame(b.frame_id)["state"] == "DEAD"  # retries 0: one counted attempt ends it
    job_id = job(store, name="k", retries=1)
    a = claim(store, job_id)
    store.complete_frame(a.frame_id, 1, device_failed(), now=NOW + 1)
    b = claim(store, job_id, now=NOW + 2)
    assert store.reap(now=NOW + 1000) == [b.frame_id]
    assert store.get_frame(b.frame_id)["state"] == "WAITING"


def register(store, name="h1", live=None):
    store.register_host(HostInfo(name=name, cores=4, memory_bytes=1 << 33, gpus=GPUS), now=NOW)
    if live is not None:
        store.heartbeat(name, [], now=NOW, lease_s=60, live=live)


def test_device_states_by_the_worker_and_by_hand_show_with_the_host(store):
    register(store)
    assert store.device_states() == []
    assert all(g["state"] == "ok" and g["reason"] is None for g in store.get_host("h1", now=NOW, down_after=60)["gpus"])
    # The worker drains a sick device: the reason is cleaned (an escape sequence, a newline).
    assert store.set_device_state("h1", "GPU-a", "drained", "Xid 79: GPU has\x1b[31m fallen\noff the bus", now=NOW)
    assert not store.set_device_state("h1", "GPU-a", "drained", "Xid 79: GPU has\x1b[31m fallen\noff the bus", now=NOW)
    [state] = store.device_states("h1")
    assert (state.uuid, state.state, state.automatic) == ("GPU-a", "drained", True)
    assert state.reason == "Xid 79: GPU has [31m fallen off the bus"
    assert store.set_device_state("h1", "GPU-a", "drained", "x" * 500, now=NOW)
    assert len(store.device_states("h1")[0].reason) == 200
    host = store.get_host("h1", now=NOW, down_after=60)
    by_uuid = {g["uuid"]: g for g in host["gpus"]}
    assert by_uuid["GPU-a"]["state"] == "drained" and by_uuid["GPU-a"]["state_automatic"] is True
    assert by_uuid["GPU-b"]["state"] == "ok"
    listed = {g["uuid"]: g["state"] for h in store.list_hosts(now=NOW, down_after=60) for g in h["gpus"]}
    assert listed == {"GPU-a": "drained", "GPU-b": "ok"}
    # By hand: by index or uuid; undrain brings a worker's drain back too.
    drained = store.drain_device("h1", "1", reason="fan noise, RMA pending", now=NOW + 5)
    assert (drained.uuid, drained.state, drained.reason, drained.automatic) == (
        "GPU-b",
        "drained",
        "fan noise, RMA pending",
        False,
    )
    back = store.undrain_device("h1", "GPU-a", now=NOW + 6)
    assert (back.state, back.reason, back.automatic) == ("ok", None, False)
    assert {s.uuid: s.state for s in store.device_states()} == {"GPU-a": "ok", "GPU-b": "drained"}
    assert store.get_host("h1", now=NOW, down_after=60)["gpus"][0]["reason"] is None
    assert back.to_json()["state"] == "ok" and back.to_json()["since"].startswith("2023-11-14T22:13:26")


@pytest.mark.parametrize(
    ("device", "reason", "error", "match"),
    [
        ("0", "", InvalidInput, "--reason: required"),
        ("0", "two\nlines", InvalidInput, "one line"),
        ("0", "y" * 201, InvalidInput, "at most 200"),
        ("7", "why", NotFound, "no device '7' on host h1"),
        ("GPU-", "why", NotFound, "several"),
    ],
)
def test_a_bad_drain_is_refused_and_changes_nothing(store, device, reason, error, match):
    register(store)
    with pytest.raises(error, match=match):
        store.drain_device("h1", device, reason=reason, now=NOW)
    with pytest.raises(NotFound, match="no host"):
        store.drain_device("nohost", "0", reason="why", now=NOW)
    assert store.device_states() == []


def test_the_suspect_rules_evidence(store):
    jobs = [job(store, name=f"j{i}", retries=0, frames="1-2") for i in range(3)]
    for i, job_id in enumerate(jobs):
        a = claim(store, job_id, uuids=("GPU-a",), now=NOW + i)
        store.complete_frame(a.frame_id, 1, failed(NOW + 10 + i), now=NOW + 10 + i)
        if i < 2:  # two of the three succeed elsewhere: on the other device, on another host
            b = claim(store, job_id, host="h1" if i == 0 else "h2", uuids=("GPU-b",) if i == 0 else ("GPU-a",))
            store.complete_frame(b.frame_id, 1, FrameResult(exit_code=0), now=NOW + 20 + i)
    evidence = store.failed_attempts("h1", NOW)
    assert [(j, uuids) for j, uuids, _ in evidence] == [(j, ("GPU-a",)) for j in jobs]
    assert store.failed_attempts("h1", NOW + 11) == [(jobs[2], ("GPU-a",), NOW + 12)]
    assert store.failed_attempts("h2", NOW) == []
    assert store.jobs_succeeded_elsewhere(jobs, "h1", "GPU-a") == {jobs[0], jobs[1]}
    assert store.jobs_succeeded_elsewhere(jobs, "h2", "GPU-a") == {jobs[0]}  # (job 1's success was there)
    assert store.jobs_succeeded_elsewhere([], "h1", "GPU-a") == set()


def test_sqlite_a_device_is_drained_by_hand_by_an_admin_or_the_hosts_owner(tmp_path):
    from cuectl.sched.store import open_store

    store = open_store(str(tmp_path / "s.db"))
    register(store, live={"at": NOW, "worker_user": "bob"})
    with store.acting_as(Actor("eve", admin=False)):
        with pytest.raises(NotOwner, match="only an admin or the host’s owner .* not eve"):
            store.drain_device("h1", "0", reason="mine now", now=NOW)
        with pytest.raises(NotOwner):
            store.undrain_device("h1", "0", now=NOW)
    assert store.device_states() == []
    with store.acting_as(Actor("bob", admin=False)):
        assert store.drain_device("h1", "0", reason="testing a driver", now=NOW).by_user == "bob"
    assert json.loads(json.dumps(store.device_states()[0].to_json()))["by"] == "bob"
    store.close()
