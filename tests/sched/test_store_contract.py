"""The store contract: every backend must pass these — SQLite (real files in tmp dirs) and
PostgreSQL (a real server started by the suite, see conftest.py), through the ``store_url``
fixture. No mocks. Tests named test_sqlite_* are about SQLite alone."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from storedriver import pg_roles  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.errors import Conflict, InvalidInput, NotFound, SchemaTooNew, StoreError
from cuectl.sched import model as m
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, LiveUsage, open_store
from cuectl.sched.store.schema import SCHEMA_VERSION
from cuectl.sched.views import samples_json

NOW = 1_700_000_000.0
GPU = {
    "index": 0,
    "uuid": "GPU-a",
    "vendor": "NVIDIA",
    "model": "Tesla V100-SXM2-16GB",
    "backend": "fake",
    "memory_total_bytes": 16160 * 1024**2,
}


def job(name="j", layers=None, priority=0, paused=False):
    layers = layers or [{"name": "render", "command": ["true"], "range": "1-3"}]
    # Retries here run at once (the back-off has its own tests, test_scheduling_store.py).
    layers = [{"retry_delay": 0, **layer} for layer in layers]
    return spec_from_mapping({"name": name, "priority": priority, "paused": paused, "layers": layers}, user="alice")


def claim_next(store, host="h1", now=NOW, lease_s=60.0):
    for layer in store.runnable_layers():
        claimed = store.claim_frame(
            layer.layer_id, host=host, worker=f"{host}-w", gpu_uuids=[], now=now, lease_s=lease_s
        )
        if claimed:
            return claimed
    return None


def ok(code=0):
    return FrameResult(exit_code=code, started_at=NOW, ended_at=NOW + 1)


def test_submit_and_show_shapes(store):
    job_id = store.submit(
        job(
            layers=[
                {
                    "name": "render",
                    "command": "echo #IFRAME#",
                    "range": "1-10",
                    "chunk": 3,
                    "gpus": 1,
                    "gpu_vendor": "nvidia",
                    "gpu_models": ["V100"],
                    "gpu_memory_min": "16G",
                    "tags": ["gpu"],
                }
            ]
        ),
        now=NOW,
    )
    data = store.get_job(job_id)
    assert data["state"] == "PENDING" and data["user"] == "alice" and data["paused"] is False
    assert data["created_at"].endswith("Z")
    assert data["frame_counts"] == {"WAITING": 4}
    layer = data["layers"][0]
    assert (layer["name"], layer["range"], layer["chunk"], layer["gpus"], layer["gpu_vendor"]) == (
        "render",
        "1-10",
        3,
        1,
        "NVIDIA",
    )
    assert layer["gpu_memory_min_bytes"] == 16 * 1024**3 and layer["gpu_models"] == ["V100"]
    frames, total = store.list_frames(job=job_id)
    assert total == 4 and [f["number"] for f in frames] == [1, 4, 7, 10]
    assert frames[0]["name"] == "0001-render" and frames[0]["frames"] == "1-3"
    assert store.get_job("j")["id"] == job_id


def test_lookup_errors(store):
    with pytest.raises(NotFound):
        store.get_job("nope")
    store.submit(job("dup"), now=NOW)
    store.submit(job("dup"), now=NOW)
    with pytest.raises(Conflict):
        store.get_job("dup")
    with pytest.raises(NotFound):
        store.get_frame(999)
    with pytest.raises(NotFound):
        store.frame_action([999], "retry", now=NOW)


def test_list_frames_limit_and_filters(store):
    job_id = store.submit(
        job(
            layers=[
                {"name": "a", "command": ["true"], "range": "1-50"},
                {"name": "b", "command": ["true"], "range": "1-5"},
            ]
        ),
        now=NOW,
    )
    frames, total = store.list_frames(job=job_id, limit=10)
    assert len(frames) == 10 and total == 55
    frames, total = store.list_frames(job=job_id, layer="b")
    assert total == 5 and {f["layer"] for f in frames} == {"b"}
    frames, total = store.list_frames(state="RUNNING")
    assert total == 0


def test_claim_order_priority_then_submit_then_frame_order(store):
    low = store.submit(job("low", priority=1), now=NOW)
    high = store.submit(
        job("high", priority=10, layers=[{"name": "r", "command": ["true"], "range": "1-10:5"}]), now=NOW + 1
    )
    order = []
    while (c := claim_next(store)) is not None:
        order.append((c.job_id, c.number))
    assert order == [(high, n) for n in (1, 6, 3, 5, 7, 9, 2, 4, 8, 10)] + [(low, n) for n in (1, 2, 3)]


def test_paused_job_and_locked_host_are_not_claimed(store):
    job_id = store.submit(job(paused=True), now=NOW)
    assert claim_next(store) is None
    store.set_job_paused(job_id, False)
    store.register_host(HostInfo(name="h1", cores=4, memory_bytes=1 << 30, gpus=[GPU]), now=NOW)
    store.set_host_locked("h1", True)
    assert claim_next(store, host="h1") is None
    assert claim_next(store, host="h2") is not None


def test_claim_records_everything_and_completion_is_fenced(store):
    store.submit(
        job(layers=[{"name": "r", "command": ["run", "#IFRAME#"], "range": "1", "retries": 1, "env": {"A": "1"}}]),
        now=NOW,
    )
    layer = store.runnable_layers()[0]
    c = store.claim_frame(layer.layer_id, host="h1", worker="w1", gpu_uuids=["GPU-a"], now=NOW, lease_s=60)
    assert (c.attempt, c.number, c.frames, c.command, c.env, c.gpu_uuids) == (
        1,
        1,
        (1,),
        ("run", "#IFRAME#"),
        {"A": "1"},
        ("GPU-a",),
    )
    frame = store.get_frame(c.frame_id)
    assert frame["state"] == "RUNNING" and frame["host"] == "h1" and frame["gpu_uuids"] == ["GPU-a"]
    assert store.complete_frame(c.frame_id, c.attempt + 1, ok(), now=NOW) is None  # wrong attempt
    assert store.complete_frame(c.frame_id, c.attempt, ok(1), now=NOW) == "WAITING"  # retry 1 of 1
    assert store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW) is None  # stale report
    c2 = claim_next(store)
    assert c2.attempt == 2
    assert store.complete_frame(c2.frame_id, 2, ok(3), now=NOW) == "DEAD"
    assert store.get_job(c.job_id)["state"] == "FINISHED"
    history = store.get_frame(c.frame_id)["attempt_history"]
    assert [(a["attempt"], a["outcome"], a["exit_code"]) for a in history] == [(1, "failed", 1), (2, "failed", 3)]


def test_complete_and_claim_records_reports_then_claims(store):
    # A worker's slot: the frames that ended are recorded as complete_frame records them,
    # in order, and then the next frame is claimed; stale reports change nothing.
    job_id = store.submit(
        job(layers=[{"name": "r", "command": ["true"], "range": "1-4", "retries": 1, "max_running": 2}]), now=NOW
    )
    a, b = claim_next(store), claim_next(store)
    assert claim_next(store) is None  # the layer's max_running is reached
    layer_id = store.runnable_layers()[0].layer_id
    states, c = store.complete_and_claim(
        [(a.frame_id, a.attempt, ok()), (b.frame_id, b.attempt, ok(1)), (a.frame_id, a.attempt + 1, ok())],
        layer_id,
        reported_at=NOW + 2,
        host="h1",
        worker="h1-w",
        gpu_uuids=[],
        now=NOW + 2,
        lease_s=60,
    )
    assert states == ["SUCCEEDED", "WAITING", None]  # b has a retry left; the last report is stale
    # What the reports freed is what the claim sees: b's retry (frame order) runs next.
    assert c is not None and (c.frame_id, c.attempt) == (b.frame_id, 2)
    assert store.get_frame(a.frame_id)["state"] == "SUCCEEDED"
    assert [h["outcome"] for h in store.get_frame(b.frame_id)["attempt_history"]] == ["failed"]
    assert store.get_frame(c.frame_id)["state"] == "RUNNING"
    d = claim_next(store, now=NOW + 3)  # frame 3: the layer's two slots are taken again
    states, f = store.complete_and_claim(
        [(c.frame_id, c.attempt, ok()), (d.frame_id, d.attempt, ok())],
        layer_id,
        reported_at=NOW + 4,
        host="h1",
        worker="h1-w",
        gpu_uuids=[],
        now=NOW + 4,
        lease_s=60,
    )
    assert states == ["SUCCEEDED", "SUCCEEDED"] and f is not None and f.number == 4
    # Nothing left to claim: the report is recorded all the same, and finishes the job.
    states, none = store.complete_and_claim(
        [(f.frame_id, f.attempt, ok())],
        layer_id,
        reported_at=NOW + 5,
        host="h1",
        worker="h1-w",
        gpu_uuids=[],
        now=NOW + 5,
        lease_s=60,
    )
    assert states == ["SUCCEEDED"] and none is None
    assert store.get_job(job_id)["state"] == "FINISHED"


def test_complete_and_claim_without_reports_is_a_claim(store):
    store.submit(job(), now=NOW)
    layer_id = store.runnable_layers()[0].layer_id
    states, c = store.complete_and_claim(
        [], layer_id, reported_at=NOW, host="h1", worker="h1-w", gpu_uuids=["GPU-a"], now=NOW, lease_s=60
    )
    assert states == [] and c is not None and c.gpu_uuids == ("GPU-a",)
    assert store.get_frame(c.frame_id)["host"] == "h1"


def test_sqlite_complete_and_claim_is_one_transaction(tmp_path):
    # The point of it on SQLite: one commit for the reports and the claim. And all or
    # nothing: a claim that fails takes the reports back with it (they stay the worker's).
    store = open_store(str(tmp_path / "q.db"))
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-3"}]), now=NOW)
    a = claim_next(store)
    layer_id = store.runnable_layers()[0].layer_id
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    states, b = store.complete_and_claim(
        [(a.frame_id, a.attempt, ok())],
        layer_id,
        reported_at=NOW,
        host="h1",
        worker="h1-w",
        gpu_uuids=[],
        now=NOW,
        lease_s=60,
    )
    store.conn.set_trace_callback(None)
    assert states == ["SUCCEEDED"] and b is not None
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
    # A claim that fails inside the transaction: the report is rolled back too.
    store.conn.execute(
        "CREATE TRIGGER no_claims BEFORE UPDATE OF attempts ON frames BEGIN SELECT RAISE(ABORT, 'claims refused'); END"
    )
    with pytest.raises(StoreError, match="claims refused"):
        store.complete_and_claim(
            [(b.frame_id, b.attempt, ok())],
            layer_id,
            reported_at=NOW,
            host="h1",
            worker="h1-w",
            gpu_uuids=[],
            now=NOW,
            lease_s=60,
        )
    assert store.get_frame(b.frame_id)["state"] == "RUNNING"
    assert store.get_frame(b.frame_id)["attempt_history"] == []


def test_success_finishes_job(store):
    job_id = store.submit(job(), now=NOW)
    while (c := claim_next(store)) is not None:
        assert store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW) == "SUCCEEDED"
    data = store.get_job(job_id)
    assert data["state"] == "FINISHED" and data["frame_counts"] == {"SUCCEEDED": 3}
    assert not store.has_unfinished_work()


def test_layer_dependency_releases_in_same_transaction(store):
    job_id = store.submit(
        job(
            layers=[
                {"name": "render", "command": ["true"], "range": "1-2"},
                {"name": "comp", "command": ["true"], "range": "1-2", "depends": ["render"]},
            ]
        ),
        now=NOW,
    )
    assert store.list_frames(job=job_id, layer="comp")[0][0]["state"] == "DEPEND"
    first = claim_next(store)
    store.complete_frame(first.frame_id, 1, ok(), now=NOW)
    assert {f["state"] for f in store.list_frames(job=job_id, layer="comp")[0]} == {"DEPEND"}
    second = claim_next(store)
    assert second.layer == "render"
    store.complete_frame(second.frame_id, 1, ok(), now=NOW)
    assert {f["state"] for f in store.list_frames(job=job_id, layer="comp")[0]} == {"WAITING"}


def test_frame_by_frame_dependency_with_different_chunks(store):
    job_id = store.submit(
        job(
            layers=[
                {"name": "render", "command": ["true"], "range": "1-4"},
                {
                    "name": "comp",
                    "command": ["true"],
                    "range": "1-4",
                    "chunk": 2,
                    "depends": [{"layer": "render", "type": "frame"}],
                },
                {
                    "name": "extra",
                    "command": ["true"],
                    "range": "10-11",
                    "depends": [{"layer": "render", "type": "frame"}],
                },
            ]
        ),
        now=NOW,
    )
    comp = {f["number"]: f for f in store.list_frames(job=job_id, layer="comp")[0]}
    assert comp[1]["state"] == "DEPEND" and comp[3]["state"] == "DEPEND"
    # Frames without a counterpart upstream have no dependency at all.
    assert {f["state"] for f in store.list_frames(job=job_id, layer="extra")[0]} == {"WAITING"}
    render = {f["number"]: f["id"] for f in store.list_frames(job=job_id, layer="render")[0]}
    for number in (1, 2):
        c = claim_next(store)
        assert (c.layer, c.number) == ("render", number)
        store.complete_frame(c.frame_id, 1, ok(), now=NOW)
        assert store.get_frame(comp[1]["id"])["state"] == ("DEPEND" if number == 1 else "WAITING")
    assert store.get_frame(comp[3]["id"])["state"] == "DEPEND"
    assert render[1] != render[2]


def _eaten_upstream_job(store):
    """render 1-2, comp 1-2 frame by frame on render, final on comp (a layer dependency)."""
    job_id = store.submit(
        job(
            layers=[
                {"name": "render", "command": ["true"], "range": "1-2"},
                {
                    "name": "comp",
                    "command": ["true"],
                    "range": "1-2",
                    "depends": [{"layer": "render", "type": "frame"}],
                },
                {"name": "final", "command": ["true"], "range": "1", "depends": ["comp"]},
            ]
        ),
        now=NOW,
    )
    frames = {(f["layer"], f["number"]): f["id"] for f in store.list_frames(job=job_id)[0]}
    return job_id, frames


def test_eaten_frames_keep_dependents_waiting_by_default(store):
    # OpenCue's default: cuebot/src/main/resources/opencue.properties
    # depend.satisfy_only_on_frame_success=true (FrameCompleteHandler satisfies dependents
    # only on SUCCEEDED; JobManagerSupport.eatFrame satisfies nothing).
    job_id, frames = _eaten_upstream_job(store)
    assert {s["name"]: s["value"] for s in store.settings()} == {"depend.satisfy_on_eaten": False}
    store.frame_action([frames[("render", 1)]], "eat", now=NOW)
    assert store.get_frame(frames[("comp", 1)])["state"] == "DEPEND"
    c = claim_next(store)
    assert (c.layer, c.number) == ("render", 2)
    store.complete_frame(c.frame_id, 1, ok(), now=NOW)
    assert store.get_frame(frames[("comp", 2)])["state"] == "WAITING"
    shown = store.get_job(job_id)
    assert (shown["eaten_dependencies"], shown["dead_dependencies"]) == (1, 0)
    # comp 2 runs; comp 1 still waits, so final (on the whole layer) waits too.
    c = claim_next(store)
    store.complete_frame(c.frame_id, 1, ok(), now=NOW)
    assert store.get_frame(frames[("comp", 1)])["state"] == "DEPEND"
    assert claim_next(store) is None
    # Eating comp 1 finishes comp's frames, but a layer with an EATEN frame satisfies nothing.
    store.frame_action([frames[("comp", 1)]], "eat", now=NOW)
    assert store.get_frame(frames[("final", 1)])["state"] == "DEPEND"
    assert store.get_job(job_id)["state"] == "PENDING"
    # A retry of the eaten frames runs them; their success releases as usual.
    store.frame_action([frames[("render", 1)], frames[("comp", 1)]], "retry", now=NOW)
    c = claim_next(store)
    assert (c.layer, c.number) == ("render", 1)
    store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW)
    c = claim_next(store)
    assert (c.layer, c.number) == ("comp", 1)
    store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW)
    assert store.get_frame(frames[("final", 1)])["state"] == "WAITING"


def test_satisfy_on_eaten_setting_releases_like_success(store):
    # The other Cuebot behaviour (depend.satisfy_only_on_frame_success=false), as a setting.
    job_id, frames = _eaten_upstream_job(store)
    rows = store.set_setting("depend.satisfy_on_eaten", "true", now=NOW)
    assert {s["name"]: (s["value"], s["default"]) for s in rows} == {"depend.satisfy_on_eaten": (True, False)}
    store.frame_action([frames[("render", 1)]], "eat", now=NOW)
    assert store.get_frame(frames[("comp", 1)])["state"] == "WAITING"
    store.frame_action([frames[("render", 2)], frames[("comp", 1)]], "eat", now=NOW)
    c = claim_next(store)
    assert (c.layer, c.number) == ("comp", 2)
    store.complete_frame(c.frame_id, 1, ok(), now=NOW)
    assert store.get_frame(frames[("final", 1)])["state"] == "WAITING"  # a layer of SUCCEEDED + EATEN
    assert store.get_job(job_id)["eaten_dependencies"] == 0


def test_turning_satisfy_on_eaten_on_releases_what_already_waits(store):
    job_id, frames = _eaten_upstream_job(store)
    store.frame_action([frames[("render", 1)], frames[("render", 2)]], "eat", now=NOW)
    assert store.get_job(job_id)["eaten_dependencies"] == 2
    store.set_setting("depend.satisfy_on_eaten", "false", now=NOW)  # no change: nothing moves
    assert store.get_frame(frames[("comp", 1)])["state"] == "DEPEND"
    store.set_setting("depend.satisfy_on_eaten", True, now=NOW)
    assert {store.get_frame(frames[("comp", n)])["state"] for n in (1, 2)} == {"WAITING"}
    assert store.get_job(job_id)["eaten_dependencies"] == 0
    store.set_setting("depend.satisfy_on_eaten", "off", now=NOW)
    assert store.settings()[0]["value"] is False


def test_settings_refuse_unknown_names_and_values(store):
    with pytest.raises(InvalidInput, match="not a store setting"):
        store.set_setting("depend.nope", "true", now=NOW)
    with pytest.raises(InvalidInput, match="not true or false"):
        store.set_setting("depend.satisfy_on_eaten", "maybe", now=NOW)


def test_dead_upstream_blocks_and_retry_unblocks(store):
    job_id = store.submit(
        job(
            layers=[
                {"name": "a", "command": ["false"], "range": "1", "retries": 0},
                {"name": "b", "command": ["true"], "range": "1", "depends": [{"layer": "a", "type": "frame"}]},
            ]
        ),
        now=NOW,
    )
    c = claim_next(store)
    assert store.complete_frame(c.frame_id, 1, ok(1), now=NOW) == "DEAD"
    assert store.get_job(job_id)["dead_dependencies"] == 1
    assert store.get_job(job_id)["state"] == "PENDING"
    store.retry_job(job_id, now=NOW)
    c = claim_next(store)
    assert (c.layer, c.attempt) == ("a", 2)
    store.complete_frame(c.frame_id, 2, ok(), now=NOW)
    assert claim_next(store).layer == "b"


def test_actions_on_running_frames_reach_the_worker(store):
    store.submit(job(layers=[{"name": "r", "command": ["sleep", "9"], "range": "1-3"}]), now=NOW)
    store.register_host(HostInfo(name="h1", cores=4, memory_bytes=1 << 30, gpus=[]), now=NOW)
    a, b, c = (claim_next(store) for _ in range(3))
    store.frame_action([a.frame_id], "kill", now=NOW)
    store.frame_action([b.frame_id], "retry", now=NOW)
    store.frame_action([c.frame_id], "eat", now=NOW)
    actions = store.heartbeat("h1", [a.frame_id, b.frame_id, c.frame_id, 12345], now=NOW, lease_s=60)
    assert actions == {a.frame_id: "kill", b.frame_id: "retry", c.frame_id: "eat", 12345: "lost"}
    killed = FrameResult(exit_code=None, exit_signal=15, user_action="kill")
    assert store.complete_frame(a.frame_id, 1, killed, now=NOW) == "DEAD"
    assert store.complete_frame(b.frame_id, 1, killed, now=NOW) == "WAITING"
    assert store.complete_frame(c.frame_id, 1, killed, now=NOW) == "EATEN"


def test_kill_job_eats_waiting_and_flags_running(store):
    job_id = store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-3"}]), now=NOW)
    running = claim_next(store)
    data = store.kill_job(job_id, now=NOW)
    assert data["frame_counts"] == {"EATEN": 2, "RUNNING": 1} and data["state"] == "PENDING"
    assert store.get_frame(running.frame_id)["pending_action"] == "eat"
    store.complete_frame(running.frame_id, 1, FrameResult(exit_code=None, exit_signal=15), now=NOW)
    assert store.get_job(job_id)["state"] == "FINISHED"


def test_reap_requeues_expired_then_dead(store):
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1", "retries": 1}]), now=NOW)
    c = claim_next(store, lease_s=2)
    assert store.reap(now=NOW + 1) == []
    assert store.reap(now=NOW + 3) == [c.frame_id]
    frame = store.get_frame(c.frame_id)
    assert frame["state"] == "WAITING" and frame["attempts"] == 1
    c2 = claim_next(store, now=NOW + 4, lease_s=2)
    assert c2.attempt == 2
    # A heartbeat extends the lease; a late completion of attempt 1 is fenced off.
    store.register_host(HostInfo(name="h1", cores=1, memory_bytes=0, gpus=[]), now=NOW)
    store.heartbeat("h1", [c2.frame_id], now=NOW + 5, lease_s=2)
    assert store.reap(now=NOW + 6.5) == []
    assert store.complete_frame(c.frame_id, 1, ok(), now=NOW + 7) is None
    assert store.reap(now=NOW + 8) == [c2.frame_id]
    assert store.get_frame(c2.frame_id)["state"] == "DEAD"


def test_requeue_frame_is_fenced(store):
    store.submit(job(), now=NOW)
    c = claim_next(store)
    assert store.requeue_frame(c.frame_id, 2, now=NOW, reason="drain") is None
    assert store.requeue_frame(c.frame_id, 1, now=NOW, reason="drain") == "WAITING"
    assert store.get_frame(c.frame_id)["attempts"] == 1


def test_live_usage_of_running_frames_is_fenced_and_cleared_at_the_end(store):
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-3", "retries": 2}]), now=NOW)
    a, b = claim_next(store), claim_next(store)
    untouched = claim_next(store, host="h2")
    fresh = store.get_frame(a.frame_id)
    assert (fresh["gpu_util_pct"], fresh["gpu_memory_used_bytes"], fresh["gpu_sampled_at"]) == (None, None, None)
    series = {"GPU-a": [[NOW, 10.0, 100], [NOW + 10, 75.0, 2048]], "GPU-b": [[NOW, None, None]]}
    live = [
        LiveUsage(
            frame_id=a.frame_id, attempt=1, sampled_at=NOW + 10, util_pct=37.5, memory_used_bytes=2048, samples=series
        ),
        LiveUsage(
            frame_id=b.frame_id,
            attempt=2,
            sampled_at=NOW + 10,
            util_pct=1.0,
            memory_used_bytes=1,
            samples={"GPU-c": [[NOW, 1.0, 1]]},
        ),  # not b's attempt: fenced off
        LiveUsage(
            frame_id=untouched.frame_id,
            attempt=1,
            sampled_at=NOW + 10,
            util_pct=1.0,
            memory_used_bytes=1,
            samples={"GPU-d": [[NOW, 1.0, 1]]},
        ),
    ]  # another host's frame
    assert store.record_live_usage("h1", live, now=NOW + 10) == [a.frame_id]
    assert store.record_live_usage("h1", [], now=NOW + 10) == []
    shown = store.get_frame(a.frame_id)
    assert (shown["gpu_util_pct"], shown["gpu_memory_used_bytes"], shown["gpu_sampled_at"]) == (
        37.5,
        2048,
        "2023-11-14T22:13:30.000Z",
    )
    assert shown["samples"] == samples_json(series)  # times as ISO 8601 (DESIGN §9)
    listed = {f["id"]: f for f in store.list_frames()[0]}
    assert listed[a.frame_id]["gpu_util_pct"] == 37.5 and listed[a.frame_id]["gpu_sampled_at"].endswith("Z")
    for other in (b.frame_id, untouched.frame_id):
        assert listed[other]["gpu_util_pct"] is None and store.get_frame(other)["samples"] == {}
    # A later tick replaces the row (one per device, never a row per sample).
    longer = {"GPU-a": [*series["GPU-a"], [NOW + 20, 50.0, 4096]]}
    store.record_live_usage("h1", [LiveUsage(a.frame_id, 1, NOW + 20, 50.0, 4096, longer)], now=NOW + 20)
    shown = store.get_frame(a.frame_id)
    assert shown["gpu_util_pct"] == 50.0 and shown["samples"] == samples_json({**series, **longer})
    # The end of the attempt clears the live values; the completion's series replaces the live one.
    final = {"GPU-a": [[NOW, 10.0, 100], [NOW + 30, 0.0, 0]]}
    store.complete_frame(
        a.frame_id,
        1,
        FrameResult(exit_code=0, started_at=NOW, ended_at=NOW + 30, usage={"samples": final}),
        now=NOW + 30,
    )
    done = store.get_frame(a.frame_id)
    assert done["state"] == "SUCCEEDED" and done["gpu_util_pct"] is None and done["gpu_sampled_at"] is None
    assert done["samples"]["GPU-a"] == samples_json(final)["GPU-a"]
    assert store.record_live_usage("h1", [LiveUsage(a.frame_id, 1, NOW + 31, 9.0, 9)], now=NOW + 31) == []
    assert store.get_frame(a.frame_id)["gpu_util_pct"] is None
    # Requeued and reaped attempts are cleared too, and keep the series written so far.
    store.record_live_usage(
        "h1", [LiveUsage(b.frame_id, 1, NOW + 10, 5.0, 5, {"GPU-b": [[NOW, 5.0, 5]]})], now=NOW + 10
    )
    assert store.requeue_frame(b.frame_id, 1, now=NOW + 11, reason="drain") == "WAITING"
    requeued = store.get_frame(b.frame_id)
    assert requeued["gpu_util_pct"] is None and requeued["samples"] == samples_json({"GPU-b": [[NOW, 5.0, 5]]})
    store.record_live_usage("h2", [LiveUsage(untouched.frame_id, 1, NOW + 10, 7.0, 7)], now=NOW + 10)
    assert store.get_frame(untouched.frame_id)["gpu_util_pct"] == 7.0
    assert store.reap(now=NOW + 120) == [untouched.frame_id]
    assert store.get_frame(untouched.frame_id)["gpu_util_pct"] is None


def test_hosts_register_list_lock(store):
    store.register_host(HostInfo(name="h1", cores=8, memory_bytes=1 << 34, gpus=[GPU], tags=("gpu",)), now=NOW)
    hosts = store.list_hosts(now=NOW + 10, down_after=60)
    assert [(h["name"], h["state"], h["locked"], h["gpus"][0]["uuid"]) for h in hosts] == [("h1", "UP", False, "GPU-a")]
    assert store.list_hosts(now=NOW + 100, down_after=60)[0]["state"] == "DOWN"
    store.set_host_locked("h1", True)
    assert store.get_host("h1", now=NOW, down_after=60)["locked"] is True
    with pytest.raises(NotFound):
        store.set_host_locked("h9", True)
    # Re-registering refreshes the inventory.
    store.register_host(HostInfo(name="h1", cores=8, memory_bytes=1 << 34, gpus=[]), now=NOW + 200)
    assert store.get_host("h1", now=NOW + 200, down_after=60)["gpus"] == []


def test_a_signed_off_host_is_down_at_once_until_a_worker_registers_again(store):
    """A worker that stops cleanly signs off (issue 41): its host reads DOWN at once, not
    HOST_DOWN_AFTER_S later, `host forget` takes it without --force, and only the worker
    that registered the host may sign it off."""
    store.register_host(HostInfo(name="h1", cores=8, memory_bytes=1 << 34, gpus=[GPU], worker_pid=4242), now=NOW)
    store.register_host(HostInfo(name="h2", cores=8, memory_bytes=1 << 34, gpus=[], worker_pid=77), now=NOW)
    assert store.sign_off_host("h1", 4243, now=NOW + 1) is False  # another process's registration
    assert store.sign_off_host("h9", 4242, now=NOW + 1) is False  # no such host
    assert store.get_host("h1", now=NOW + 2, down_after=60)["state"] == "UP"
    assert store.sign_off_host("h1", 4242, now=NOW + 2) is True
    h1 = store.get_host("h1", now=NOW + 3, down_after=60)
    assert (h1["state"], h1["worker_pid"], h1["last_heartbeat"]) == ("DOWN", None, "2023-11-14T22:13:22.000Z")
    assert [(h["name"], h["state"]) for h in store.list_hosts(now=NOW + 3, down_after=60)] == [
        ("h1", "DOWN"),
        ("h2", "UP"),
    ]
    # A heartbeat (with or without a live document) or a registration brings it back UP.
    store.heartbeat("h1", [], now=NOW + 4, lease_s=60)
    assert store.get_host("h1", now=NOW + 5, down_after=60)["state"] == "UP"
    assert store.sign_off_host("h1", 4242, now=NOW + 6) is False  # signed off already: no pid
    store.register_host(HostInfo(name="h1", cores=8, memory_bytes=1 << 34, gpus=[GPU], worker_pid=5), now=NOW + 7)
    assert store.get_host("h1", now=NOW + 8, down_after=60)["state"] == "UP"
    assert store.sign_off_host("h1", 5, now=NOW + 9) is True
    assert store.forget_host("h1", now=NOW + 10, down_after=60)["state"] == "DOWN"


_CLAIMER = """
import json, sys
from cuectl.sched.store import open_store
s = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # start together: process start-up must not decide who claims
got = []
# Each claimer stops at 150, so the 400 frames need at least three of them whatever the
# scheduler does: one process given the whole CPU cannot drain the job alone.
while len(got) < 150:
    layers = s.runnable_layers()
    if not layers:
        break
    c = s.claim_frame(layers[0].layer_id, host=sys.argv[2], worker=sys.argv[2], gpu_uuids=[], now=0, lease_s=60)
    if c:
        got.append(c.frame_id)
print(json.dumps(got))
"""


def test_concurrent_claimers_never_share_a_frame(store_url: str):
    path = store_url
    s = open_store(path)
    s.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-400"}]), now=NOW)
    s.close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, path, f"h{i}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        for i in range(4)
    ]
    assert all(p.stdout.readline().strip() == "ready" for p in procs)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.close()
    results = [json.loads(p.stdout.read()) for p in procs]
    assert all(p.wait(120) == 0 for p in procs)
    claimed = [f for r in results for f in r]
    assert len(claimed) == 400 and len(set(claimed)) == 400
    assert all(len(r) <= 150 for r in results) and sum(1 for r in results if r) >= 3


# -- SQLite specifics: files, modes, versions, foreign files --------------------------------
def test_sqlite_file_modes_and_wal(tmp_path: Path):
    path = tmp_path / "new" / "dir" / "cuectl.db"
    s = open_store(str(path))
    s.submit(job(), now=NOW)
    assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, "store must not be world-accessible"
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o007 == 0
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


def test_sqlite_url_forms(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = open_store("sqlite:///rel.db")
    s.close()
    assert (tmp_path / "rel.db").exists()
    s = open_store(f"sqlite:///{tmp_path}/abs.db")
    s.close()
    assert (tmp_path / "abs.db").exists()
    with pytest.raises(InvalidInput):
        open_store("mysql://x")


def test_newer_schema_is_refused_untouched(tmp_path: Path):
    path = tmp_path / "v.db"
    open_store(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(SchemaTooNew, match="schema version 99"):
        open_store(str(path))
    assert path.read_bytes() == before


def test_foreign_and_corrupt_files_are_refused(tmp_path: Path):
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not a cuectl store"):
        open_store(str(foreign))
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(StoreError, match="not a usable cuectl store"):
        open_store(str(garbage))
    assert garbage.stat().st_size == 4096


def test_existing_store_reopens_with_data(store_url: str):
    path = store_url
    s = open_store(path)
    job_id = s.submit(job(), now=NOW)
    s.close()
    s = open_store(path)
    assert s.get_job(job_id)["name"] == "j" and s.schema_version() == SCHEMA_VERSION
    s.close()


def test_log_paths_are_named_after_the_frame_and_attempt(store, tmp_path: Path):
    """<log dir>/<job id>/<frame name>.<attempt>.log, frame names as OpenCue pads them:
    negative and wide numbers too; the store's own log dir when the worker names none."""
    job_id = store.submit(job(layers=[{"name": "ly", "command": ["true"], "range": "-5,3,12345,-1234"}]), now=NOW)
    layer = store.runnable_layers()[0].layer_id
    paths = [
        store.claim_frame(
            layer, host="h", worker="w", gpu_uuids=[], now=NOW, lease_s=60, log_dir=tmp_path / "logs"
        ).log_path
        for _ in range(3)
    ]
    assert paths == [f"{tmp_path}/logs/{job_id}/{name}-ly.1.log" for name in ("-005", "0003", "12345")]
    last = store.claim_frame(layer, host="h", worker="w", gpu_uuids=[], now=NOW, lease_s=60)
    assert last.log_path == f"{store.log_dir}/{job_id}/-1234-ly.1.log"
    assert store.get_frame(last.frame_id)["log_path"] == last.log_path
    store.frame_action([last.frame_id], "retry", now=NOW)
    store.complete_frame(last.frame_id, 1, ok(1), now=NOW + 1)
    again = store.claim_frame(layer, host="h", worker="w", gpu_uuids=[], now=NOW + 2, lease_s=60)
    assert again.log_path == f"{store.log_dir}/{job_id}/-1234-ly.2.log"


def test_layer_json_round_trip_of_shell_and_argv_commands(store):
    job_id = store.submit(
        job(
            layers=[
                {"name": "a", "command": "echo 'x y' && true", "range": "1"},
                {"name": "b", "command": ["echo", "x y"], "range": "1"},
            ]
        ),
        now=NOW,
    )
    layers = store.get_job(job_id)["layers"]
    assert layers[0]["command"] == "echo 'x y' && true" and layers[1]["command"] == ["echo", "x y"]
    assert json.dumps(layers)  # JSON-serialisable


def test_usage_summary_and_prune(store):
    job_id = store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-2", "gpus": 1}]), now=NOW)
    c = claim_next(store)
    usage = {
        "gpu_util_mean_pct": 40.0,
        "gpu_util_max_pct": 90.0,
        "gpu_memory_peak_bytes": 123,
        "gpu_seconds": 10.0,
        "gpu_busy_seconds": 4.0,
        "gpu_models": ["V100"],
        "samples": {"GPU-a": [[NOW, 40.0, 123]]},
    }
    store.complete_frame(
        c.frame_id, 1, FrameResult(exit_code=0, started_at=NOW, ended_at=NOW + 10, usage=usage), now=NOW + 10
    )
    (group,), total = store.usage_summary(since=NOW, until=NOW + 11, by="gpu-model")
    assert (group.key, group.frames, group.succeeded, total.frames) == (("V100",), 1, 1, 1)
    assert (group.gpu_seconds_allocated, group.gpu_seconds_busy, group.gpu_memory_peak_bytes) == (10.0, 4.0, 123)
    assert (group.wall_seconds, group.util_weighted / group.util_weight) == (10.0, 40.0)
    assert store.usage_summary(since=NOW + 11, until=NOW + 20, by="user")[0] == []
    assert store.get_frame(c.frame_id)["samples"] == {"GPU-a": [["2023-11-14T22:13:20.000Z", 40.0, 123]]}
    assert store.prune(before=NOW + 100) == []  # not finished yet
    c2 = claim_next(store)
    store.complete_frame(c2.frame_id, 1, ok(), now=NOW + 20)
    assert store.prune(before=NOW + 15) == []  # finished at +20: too recent
    assert store.prune(before=NOW + 100) == [job_id]
    with pytest.raises(NotFound):
        store.get_job(job_id)
    assert store.usage_summary(since=0, until=NOW + 100, by="job")[0] == []


def test_sqlite_migrates_a_v1_store_forward(tmp_path: Path):
    from cuectl.sched.dialect import SQLITE
    from cuectl.sched.store.schema import SCHEMA_VERSION, statements

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for statement in statements(0, SQLITE):
        conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    conn.execute("INSERT INTO jobs(name, user, created_at) VALUES ('old', 'bob', 1.0)")
    conn.close()
    s = open_store(str(path))
    assert s.schema_version() == SCHEMA_VERSION == 12
    assert s.get_job("old")["user"] == "bob"
    assert s.usage_summary(since=0, until=2e9, by="job", with_total=False) == ([], None)
    s.close()


def test_sqlite_online_backup_is_a_consistent_store(tmp_path: Path):
    s = open_store(str(tmp_path / "live.db"))
    job_id = s.submit(job(), now=NOW)
    dest = tmp_path / "backups" / "copy.db"
    dest.parent.mkdir()
    s.backup(dest)
    copy = open_store(str(dest))
    assert copy.get_job(job_id)["frame_counts"] == {"WAITING": 3}
    assert copy.integrity_problems() == []
    assert not list(dest.parent.glob("*.partial"))
    copy.close()
    with pytest.raises(StoreError, match="cannot write backup"):
        s.backup(tmp_path / "missing-dir" / "x.db")
    s.close()


def test_sqlite_store_deleted_or_replaced_in_use_is_an_error(tmp_path: Path):
    from cuectl.errors import StoreGone

    path = tmp_path / "s.db"
    s = open_store(str(path))
    job_id = s.submit(job(), now=NOW)
    path.unlink()
    with pytest.raises(StoreGone, match="was deleted while in use"):
        s.runnable_layers()
    with pytest.raises(StoreGone):
        s.kill_job(job_id, now=NOW)
    s.close()
    other = open_store(str(path))  # a new store now lives at the path
    s2 = open_store(str(tmp_path / "t.db"))
    os.replace(tmp_path / "t.db", path)
    with pytest.raises(StoreGone, match="replaced by another file"):
        other.list_jobs()
    other.close()
    s2.close()


def test_sqlite_empty_file_is_not_reinitialised(tmp_path: Path):
    path = tmp_path / "truncated.db"
    path.write_bytes(b"")
    os.utime(path, (NOW, NOW))  # truncated a while ago, not a store being created
    with pytest.raises(StoreError, match="is empty"):
        open_store(str(path))
    assert path.stat().st_size == 0


def test_sqlite_store_being_created_by_another_process_is_waited_for(tmp_path: Path):
    """A worker and a submit started together on a new path: one creates the file, the
    other finds it empty for a moment; it waits for it instead of calling it truncated."""
    import threading

    made = tmp_path / "made.db"
    open_store(str(made)).close()
    path = tmp_path / "new.db"
    path.write_bytes(b"")  # the creator has made the file, not yet the database

    def finish() -> None:
        time.sleep(0.4)
        with open(path, "r+b") as fh:
            fh.write(made.read_bytes())

    creator = threading.Thread(target=finish)
    creator.start()
    s = open_store(str(path))
    creator.join()
    assert s.list_jobs() == []
    s.close()


def test_api_tokens_are_stored_hashed_revocable_and_listed(store):
    token, secret = store.create_token("alice", role="user", label="laptop", now=NOW)
    assert secret.startswith("cuectl_") and len(secret) > 40
    assert (token.user, token.role, token.label, token.revoked_at) == ("alice", "user", "laptop", None)
    assert store.authenticate(secret, now=NOW + 1).user == "alice"
    assert store.authenticate(secret + "x", now=NOW + 1) is None
    listed = store.list_tokens()
    assert [t.id for t in listed] == [token.id] and listed[0].last_used_at == NOW + 1
    assert secret not in json.dumps([t.to_json() for t in listed])
    other, _ = store.create_token("bob", role="viewer", label=None, now=NOW)
    assert store.revoke_token(token.id, now=NOW + 2).revoked_at == NOW + 2
    assert store.authenticate(secret, now=NOW + 3) is None
    assert store.revoke_token(token.id, now=NOW + 9).revoked_at == NOW + 2  # revoking again changes nothing
    with pytest.raises(NotFound):
        store.revoke_token(other.id + 100, now=NOW)
    with pytest.raises(InvalidInput, match="--role"):
        store.create_token("carol", role="root", label=None, now=NOW)
    assert [t.user for t in store.list_tokens()] == ["alice", "bob"]


def test_priority_has_one_range_for_every_caller(store):
    job_id = store.submit(job(), now=NOW)
    with pytest.raises(InvalidInput, match="priority"):
        store.set_job_priority(job_id, 99_999_999_999)
    assert store.set_job_priority(job_id, 2**31 - 1)["priority"] == 2**31 - 1


def test_authenticate_records_use_at_most_once_a_minute(store):
    token, secret = store.create_token("alice", role="user", label=None, now=NOW)
    assert store.authenticate(secret, now=NOW + 1).last_used_at == NOW + 1
    assert store.authenticate(secret, now=NOW + 30).last_used_at == NOW + 1  # a read, no write
    assert store.authenticate(secret, now=NOW + 61).last_used_at == NOW + 61
    store.revoke_token(token.id, now=NOW + 62)
    assert store.authenticate(secret, now=NOW + 200) is None


def test_list_jobs_filters_pages_and_counts(store):
    ids = [store.submit(job(f"shot-{i}"), now=NOW) for i in range(5)]
    bob = store.submit(
        spec_from_mapping({"name": "shot-b", "layers": [{"name": "a", "command": ["true"]}]}, user="bob"), now=NOW
    )
    store.kill_job(ids[0], now=NOW, force=True)
    store.frame_action([f["id"] for f in store.list_frames(job=ids[0])[0]], "eat", now=NOW, force=True)
    assert [j["id"] for j in store.list_jobs(user="bob")] == [bob]
    assert store.count_jobs(user="alice") == 5 and store.count_jobs() == 6
    assert [j["id"] for j in store.list_jobs(state="FINISHED")] == [ids[0]]
    assert store.count_jobs(include_finished=False) == 5
    assert [j["name"] for j in store.list_jobs(name="shot-3")] == ["shot-3"]
    page = store.list_jobs(limit=2, offset=2)
    assert [j["id"] for j in page] == ids[2:4] and page[0]["frame_counts"] == {"WAITING": 3}
    assert store.list_jobs(limit=5, offset=100) == []


def test_list_frames_pages_after_an_id(store):
    job_id = store.submit(job(layers=[{"name": "a", "command": ["true"], "range": "1-7"}]), now=NOW)
    first, total = store.list_frames(job=job_id, limit=3)
    second, total2 = store.list_frames(job=job_id, limit=3, after=first[-1]["id"])
    rest, _ = store.list_frames(job=job_id, limit=3, after=second[-1]["id"])
    assert total == total2 == 7
    assert [f["number"] for f in first + second + rest] == [1, 2, 3, 4, 5, 6, 7]


def test_frame_attempts_list_each_attempt_with_its_outcome(store):
    job_id = store.submit(job(layers=[{"name": "a", "command": ["true"], "range": "1", "retries": 1}]), now=NOW)
    claimed = claim_next(store)
    assert store.complete_frame(claimed.frame_id, claimed.attempt, ok(3), now=NOW + 1) == m.WAITING
    claimed = claim_next(store)
    store.complete_frame(claimed.frame_id, claimed.attempt, ok(0), now=NOW + 2)
    history = store.frame_attempts([claimed.frame_id, 12345])
    assert list(history) == [claimed.frame_id]
    assert [(a["attempt"], a["outcome"], a["exit_code"]) for a in history[claimed.frame_id]] == [
        (1, "failed", 3),
        (2, "succeeded", 0),
    ]
    assert store.list_frames(job=job_id)[0][0]["attempts"] == 2


@pytest.mark.acts_as_user
def test_acting_as_a_user_is_who_the_store_checks_and_records(store):
    from cuectl.errors import NotOwner
    from cuectl.sched.store import Actor

    if store.local_path is None:
        pg_roles(store, "api_alice", "api_bob")
    own = store.actor()
    with store.acting_as(Actor("api_alice", False)):
        assert store.actor().name == "api_alice"
        job_id = store.submit(
            spec_from_mapping({"name": "mine", "layers": [{"name": "a", "command": ["true"]}]}, user="api_alice"),
            now=NOW,
        )
    data = store.get_job(job_id)
    if store.local_path is None:  # the server recorded the role the API acted as
        assert data["submitted_by"] == "api_alice"
    else:
        assert data["submitted_by"] is None and data["receipt"]
    with store.acting_as(Actor("api_bob", False)):
        with pytest.raises(NotOwner, match="api_alice"):
            store.set_job_paused(job_id, True)
    assert store.get_job(job_id)["paused"] is False
    with store.acting_as(Actor("api_alice", False)):
        assert store.set_job_paused(job_id, True)["paused"] is True
    assert store.actor() == own  # back to the connection's own user


def test_a_finished_job_says_how_it_ended(store):
    """FINISHED alone said the same of a killed job as of a successful one (issue 20)."""
    ok_id = store.submit(job("fine", layers=[{"name": "a", "command": ["true"], "range": "1"}]), now=NOW)
    claimed = claim_next(store)
    store.complete_frame(claimed.frame_id, claimed.attempt, ok(0), now=NOW + 1)
    assert (store.get_job(ok_id)["state"], store.get_job(ok_id)["outcome"]) == ("FINISHED", "SUCCEEDED")

    dead_id = store.submit(
        job("broken", layers=[{"name": "a", "command": ["true"], "range": "1", "retries": 0}]), now=NOW
    )
    claimed = claim_next(store)
    store.complete_frame(claimed.frame_id, claimed.attempt, ok(1), now=NOW + 1)
    assert store.get_job(dead_id)["outcome"] == "FAILED"

    killed_id = store.submit(job("stopped", layers=[{"name": "a", "command": ["true"], "range": "1-2"}]), now=NOW)
    assert store.get_job(killed_id)["outcome"] is None  # not finished yet
    store.kill_job(killed_id, now=NOW + 2, force=True)
    listed = {j["id"]: j for j in store.list_jobs()}
    assert (listed[killed_id]["state"], listed[killed_id]["outcome"]) == ("FINISHED", "KILLED")
    assert listed[killed_id]["frame_counts"] == {"EATEN": 2}
    store.retry_job(killed_id, now=NOW + 3, force=True)  # a retry takes the kill back
    assert (store.get_job(killed_id)["state"], store.get_job(killed_id)["outcome"]) == ("PENDING", None)
    for _ in range(2):
        claimed = claim_next(store)
        store.complete_frame(claimed.frame_id, claimed.attempt, ok(0), now=NOW + 4)
    assert store.get_job(killed_id)["outcome"] == "SUCCEEDED"


@pytest.mark.acts_as_user
def test_forget_host_removes_a_dead_host_and_only_an_admin_may(store):
    """`cuectl host forget` (issue 17): a DOWN, idle host goes (its GPUs with it); an UP one
    or one with RUNNING frames only with force, and those frames are lost as `reap` loses them."""
    from cuectl.errors import NotOwner
    from cuectl.sched.store import Actor

    store.register_host(HostInfo(name="h1", cores=8, memory_bytes=1 << 34, gpus=[GPU]), now=NOW)
    store.register_host(HostInfo(name="h2", cores=8, memory_bytes=1 << 34, gpus=[]), now=NOW)
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-2", "retries": 1}]), now=NOW)
    c = claim_next(store, host="h1")
    with pytest.raises(NotFound, match="h9"):
        store.forget_host("h9", now=NOW, down_after=60)
    with pytest.raises(Conflict, match="UP"):
        store.forget_host("h1", now=NOW + 10, down_after=60)
    with pytest.raises(Conflict, match="RUNNING"):
        store.forget_host("h1", now=NOW + 100, down_after=60)
    if store.local_path is None:
        pg_roles(store, "api_bob")
    with store.acting_as(Actor("api_bob", False)):
        with pytest.raises(NotOwner, match="admin"):
            store.forget_host("h2", now=NOW + 100, down_after=60, force=True)
    assert [h["name"] for h in store.list_hosts(now=NOW + 100, down_after=60)] == ["h1", "h2"]

    assert store.forget_host("h2", now=NOW + 100, down_after=60) == {
        "name": "h2",
        "state": "DOWN",
        "last_heartbeat": "2023-11-14T22:13:20.000Z",
        "gpus": [],
        "requeued": [],
    }
    out = store.forget_host("h1", now=NOW + 10, down_after=60, force=True)
    assert (out["state"], out["gpus"], out["requeued"]) == ("UP", ["GPU-a"], [c.frame_id])
    assert store.list_hosts(now=NOW + 10, down_after=60) == [] and store.host_inventories() == {}
    with pytest.raises(NotFound):
        store.get_host("h1", now=NOW + 10, down_after=60)
    frame = store.get_frame(c.frame_id)
    assert frame["state"] == "WAITING"
    assert [a["outcome"] for a in store.frame_attempts([c.frame_id])[c.frame_id]] == ["lost"]
    assert store.running_count() == 0 and store.integrity_problems() in (None, [])
    # The lost frame runs again elsewhere; a late report from the forgotten host is fenced off.
    again = claim_next(store, host="h3", now=NOW + 20)
    assert again is not None and {again.frame_id} <= {c.frame_id, c.frame_id + 1}
    assert store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW + 21) is None
    # Its worker, started again, registers it anew.
    store.register_host(HostInfo(name="h1", cores=8, memory_bytes=1 << 34, gpus=[GPU]), now=NOW + 30)
    assert store.get_host("h1", now=NOW + 30, down_after=60)["state"] == "UP"


def test_the_dispatch_read_follows_every_change_between_reads(store_url):
    """A worker reads the runnable layers every pass (SQLite keeps the answer while nothing
    that changes it happened: runnable_layers). Whatever changes it — another connection's
    submit, pause, priority; this connection's own claims exhausting a layer, a completion
    that releases a dependent or queues a retry — shows in the next read."""
    worker, other = open_store(store_url), open_store(store_url)
    try:

        def names():
            return [(layer.job, layer.layer) for layer in worker.runnable_layers()]

        def claim(layer_name, now=NOW):
            layer = next(x for x in worker.runnable_layers() if x.layer == layer_name)
            return worker.claim_frame(layer.layer_id, host="h1", worker="h1-w", gpu_uuids=[], now=now, lease_s=60)

        assert names() == [] and names() == []
        other.submit(
            job(
                "a",
                layers=[
                    {"name": "render", "command": ["true"], "range": "1-2", "retries": 1},
                    {"name": "comp", "command": ["true"], "range": "1", "depends": ["render"]},
                ],
            ),
            now=NOW,
        )
        assert names() == [("a", "render")]
        r1, r2 = claim("render"), claim("render")
        assert r1 is not None and r2 is not None
        # Its own claims took the layer's last frames: a claim from it finds nothing, and the
        # next read knows (SQLite's kept answer named it until then).
        layer_id = r1.layer_id
        assert worker.claim_frame(layer_id, host="h1", worker="h1-w", gpu_uuids=[], now=NOW, lease_s=60) is None
        assert names() == []
        # Its own completion fails r1, whose retry the same transaction claims again.
        states, again = worker.complete_and_claim(
            [(r1.frame_id, r1.attempt, ok(1))],
            layer_id,
            reported_at=NOW + 1,
            host="h1",
            worker="h1-w",
            gpu_uuids=[],
            now=NOW + 1,
            lease_s=60,
        )
        assert states == ["WAITING"] and again is not None and again.frame_id == r1.frame_id
        assert names() == []
        # Another connection submits; this one's completions (with a claim from the new job)
        # finish the layer, which releases its dependent: both are read.
        other.submit(job("b"), now=NOW + 2)
        assert names() == [("b", "render")]
        b_layer = worker.runnable_layers()[0].layer_id
        states, b1 = worker.complete_and_claim(
            [(again.frame_id, again.attempt, ok()), (r2.frame_id, r2.attempt, ok())],
            b_layer,
            reported_at=NOW + 2,
            host="h1",
            worker="h1-w",
            gpu_uuids=[],
            now=NOW + 2,
            lease_s=60,
        )
        assert states == ["SUCCEEDED", "SUCCEEDED"] and b1 is not None
        assert names() == [("a", "comp"), ("b", "render")]
        # Another connection's pause and priority.
        other.set_job_paused("b", True)
        assert names() == [("a", "comp")]
        other.set_job_paused("b", False)
        other.set_job_priority("b", 10)
        assert names() == [("b", "render"), ("a", "comp")]
    finally:
        worker.close()
        other.close()


def test_complete_and_claim_many_claims_up_to_count_within_the_caps(store):
    """A worker whose slots all freed: the reports, then up to ``count`` frames of the layer,
    as many as it has and its caps allow (each claim counts for the next)."""
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-5", "max_running": 3}]), now=NOW)
    layer_id = store.runnable_layers()[0].layer_id
    states, claims = store.complete_and_claim_many(
        [], layer_id, 2, reported_at=NOW, host="h1", worker="h1-w", now=NOW, lease_s=60
    )
    assert states == [] and [c.number for c in claims] == [1, 2]
    # The layer's max_running (3) leaves room for one more, whatever count asks.
    states, more = store.complete_and_claim_many(
        [], layer_id, 4, reported_at=NOW, host="h1", worker="h1-w", now=NOW, lease_s=60
    )
    assert [c.number for c in more] == [3]
    a, b = claims
    states, next_ones = store.complete_and_claim_many(
        [(a.frame_id, a.attempt, ok()), (b.frame_id, b.attempt, ok()), (a.frame_id, a.attempt, ok())],
        layer_id,
        3,
        reported_at=NOW + 1,
        host="h1",
        worker="h1-w",
        now=NOW + 1,
        lease_s=60,
    )
    assert states == ["SUCCEEDED", "SUCCEEDED", None] and [c.number for c in next_ones] == [4, 5]
    assert all(
        store.get_frame(c.frame_id)["state"] == "RUNNING" and store.get_frame(c.frame_id)["host"] == "h1"
        for c in next_ones
    )
    c, d, e = more[0], *next_ones
    states, none = store.complete_and_claim_many(
        [(x.frame_id, x.attempt, ok()) for x in (c, d, e)],
        layer_id,
        2,
        reported_at=NOW + 2,
        host="h1",
        worker="h1-w",
        now=NOW + 2,
        lease_s=60,
    )
    assert states == ["SUCCEEDED"] * 3 and none == []
    assert store.get_job(claims[0].job_id)["state"] == "FINISHED"


def test_complete_and_claim_finishes_the_reported_jobs_whatever_is_claimed(store):
    """Each reported job is finished when its last frame is in: a job of the claimed layer
    whether or not a frame of it is claimed, and any other job as well."""
    first = store.submit(
        job(name="a", layers=[{"name": "r", "command": ["true"], "range": "1-2", "max_running": 1, "retries": 0}]),
        now=NOW,
    )
    second = store.submit(job(name="b", layers=[{"name": "r", "command": ["true"], "range": "1"}]), now=NOW)
    layers = {layer.job_id: layer.layer_id for layer in store.runnable_layers()}
    _, (a1,) = store.complete_and_claim_many(
        [], layers[first], 1, reported_at=NOW, host="h1", worker="h1-w", now=NOW, lease_s=60
    )
    # a1 ends, a2 is claimed: job a has work left.
    states, (a2,) = store.complete_and_claim_many(
        [(a1.frame_id, a1.attempt, ok())],
        layers[first],
        1,
        reported_at=NOW + 1,
        host="h1",
        worker="h1-w",
        now=NOW + 1,
        lease_s=60,
    )
    assert states == ["SUCCEEDED"] and store.get_job(first)["state"] == "PENDING"
    # a2 (a's last frame) ends while a frame of job b is claimed: a is finished all the same.
    states, (b1,) = store.complete_and_claim_many(
        [(a2.frame_id, a2.attempt, ok(1))],
        layers[second],
        1,
        reported_at=NOW + 2,
        host="h1",
        worker="h1-w",
        now=NOW + 2,
        lease_s=60,
    )
    assert states == ["DEAD"] and store.get_job(first)["state"] == "FINISHED"
    assert store.get_job(second)["state"] == "PENDING"
    # b's last frame ends and its layer has nothing left to claim: b is finished.
    states, none = store.complete_and_claim_many(
        [(b1.frame_id, b1.attempt, ok())],
        layers[second],
        1,
        reported_at=NOW + 3,
        host="h1",
        worker="h1-w",
        now=NOW + 3,
        lease_s=60,
    )
    assert states == ["SUCCEEDED"] and none == [] and store.get_job(second)["state"] == "FINISHED"


def test_complete_and_claim_that_claims_nothing_keeps_an_unfinished_job_pending(store):
    # The claimed layer's caps refuse the claim (max_running), yet frames are left: the job
    # of the report stays PENDING, and a user's retry of its DEAD frame later runs.
    job_id = store.submit(
        job(layers=[{"name": "r", "command": ["true"], "range": "1-3", "max_running": 1, "retries": 0}]), now=NOW
    )
    layer_id = store.runnable_layers()[0].layer_id
    _, (a,) = store.complete_and_claim_many(
        [], layer_id, 1, reported_at=NOW, host="h1", worker="h1-w", now=NOW, lease_s=60
    )
    b = store.claim_frame(layer_id, host="h2", worker="h2-w", gpu_uuids=[], now=NOW, lease_s=60)
    assert b is None  # max_running 1
    states, claims = store.complete_and_claim_many(
        [(a.frame_id, a.attempt, ok(1))],
        layer_id,
        1,
        reported_at=NOW + 1,
        host="h1",
        worker="h1-w",
        now=NOW + 1,
        lease_s=60,
    )
    # The report freed the layer's only running slot, so the claim in the same transaction
    # takes frame 2; the job is unfinished either way.
    assert states == ["DEAD"] and [c.number for c in claims] == [2]
    assert store.get_job(job_id)["state"] == "PENDING"


def test_sqlite_complete_and_claim_asks_no_job_question_when_it_claims_a_frame_of_that_job(tmp_path):
    # The job of a report is finished only if done; a frame of that same job claimed in the
    # same transaction proves it is not, so the question is not asked (a statement a frame).
    store = open_store(str(tmp_path / "q.db"))
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-3"}]), now=NOW)
    layer_id = store.runnable_layers()[0].layer_id
    a = claim_next(store)
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    states, (b,) = store.complete_and_claim_many(
        [(a.frame_id, a.attempt, ok())], layer_id, 1, reported_at=NOW, host="h1", worker="h1-w", now=NOW, lease_s=60
    )
    assert states == ["SUCCEEDED"]
    assert not [s for s in statements if s.startswith("SELECT state, EXISTS")]
    # With nothing left to claim the question is asked, and finishes the job.
    c = claim_next(store)
    statements.clear()
    states, none = store.complete_and_claim_many(
        [(b.frame_id, b.attempt, ok()), (c.frame_id, c.attempt, ok())],
        layer_id,
        1,
        reported_at=NOW,
        host="h1",
        worker="h1-w",
        now=NOW,
        lease_s=60,
    )
    store.conn.set_trace_callback(None)
    assert states == ["SUCCEEDED", "SUCCEEDED"] and none == []
    assert len([s for s in statements if s.startswith("SELECT state, EXISTS")]) == 1
    assert store.get_job(a.job_id)["state"] == "FINISHED"


def test_sqlite_complete_and_claim_many_is_one_transaction(tmp_path):
    store = open_store(str(tmp_path / "q.db"))
    store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-4"}]), now=NOW)
    layer_id = store.runnable_layers()[0].layer_id
    _, (a, b) = store.complete_and_claim_many(
        [], layer_id, 2, reported_at=NOW, host="h1", worker="h1-w", now=NOW, lease_s=60
    )
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    states, claims = store.complete_and_claim_many(
        [(a.frame_id, a.attempt, ok()), (b.frame_id, b.attempt, ok())],
        layer_id,
        2,
        reported_at=NOW,
        host="h1",
        worker="h1-w",
        now=NOW,
        lease_s=60,
    )
    store.conn.set_trace_callback(None)
    assert states == ["SUCCEEDED", "SUCCEEDED"] and len(claims) == 2
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == ["BEGIN IMMEDIATE", "COMMIT"]
    assert statements[-1] == "COMMIT"  # both claims inside it


# -- what OpenCue's clients read (cuectl serve --opencue, src/cuectl/cuebot) ----------------------
def test_list_jobs_by_ids_and_in_the_cue_with_failed_ones(store):
    ok_id = store.submit(job("ok", layers=[{"name": "l", "command": ["true"], "range": "1"}]), now=NOW)
    bad_id = store.submit(job("bad", layers=[{"name": "l", "command": ["false"], "range": "1", "retries": 0}]), now=NOW)
    killed_id = store.submit(
        job("killed", layers=[{"name": "l", "command": ["false"], "range": "1-2", "retries": 0}]), now=NOW
    )
    open_id = store.submit(job("open"), now=NOW)
    for expected in (ok_id, bad_id, killed_id):
        c = claim_next(store)
        assert c.job_id == expected
        store.complete_frame(c.frame_id, c.attempt, ok(0 if expected == ok_id else 1), now=NOW)
    store.kill_job(killed_id, now=NOW, force=True)
    assert {j["id"]: j["state"] for j in store.list_jobs()}[bad_id] == "FINISHED"
    assert [j["id"] for j in store.list_jobs(ids=[open_id, ok_id, 999])] == [ok_id, open_id]
    assert store.list_jobs(ids=[]) == []
    # OpenCue keeps a job with DEAD frames in the cue; one killed, or that succeeded, leaves it.
    assert [j["id"] for j in store.list_jobs(include_finished=False)] == [open_id]
    assert [j["id"] for j in store.list_jobs(include_finished=False, keep_failed=True)] == [bad_id, open_id]
    assert [j["id"] for j in store.list_jobs(include_finished=False, keep_failed=True, name="bad")] == [bad_id]
    with pytest.raises(InvalidInput):
        store.list_jobs(ids=range(5000))


def test_layer_frame_counts_and_running_bookings(store):
    job_id = store.submit(
        job(
            "j",
            layers=[
                {
                    "name": "render",
                    "command": ["true"],
                    "range": "1-3",
                    "gpus": 1,
                    "cores": 2,
                    "memory": "1G",
                    "gpu_memory_min": "8G",
                },
                {"name": "comp", "command": ["true"], "range": "1-2"},
            ],
        ),
        now=NOW,
    )
    layers = {layer["name"]: layer["id"] for layer in store.get_job(job_id)["layers"]}
    layer = next(lay for lay in store.runnable_layers() if lay.layer_id == layers["render"])
    c = store.claim_frame(layer.layer_id, host="h1", worker="h1-w", gpu_uuids=["GPU-a"], now=NOW, lease_s=60)
    assert store.layer_frame_counts(job_id) == {
        layers["render"]: {"RUNNING": 1, "WAITING": 2},
        layers["comp"]: {"WAITING": 2},
    }
    [booked] = store.running_bookings()
    assert (
        booked["id"],
        booked["job_id"],
        booked["job_name"],
        booked["job_user"],
        booked["layer_name"],
        booked["number"],
        booked["host"],
        booked["gpu_uuids"],
    ) == (c.frame_id, job_id, "j", "alice", "render", 1, "h1", ["GPU-a"])
    assert (booked["cores"], booked["memory_bytes"], booked["gpus"], booked["gpu_memory_min_bytes"]) == (
        2.0,
        1024**3,
        1,
        8 * 1024**3,
    )
    assert booked["started_at"] == NOW and booked["lease_expires"] == NOW + 60
    assert store.running_bookings("h1") == [booked] and store.running_bookings("h2") == []
    store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW)
    assert store.running_bookings() == []


def test_list_frames_changed_since(store):
    """What changed since a moment: started, ended, made WAITING again (a retry), and every
    RUNNING frame (OpenCue's GetUpdatedFrames)."""
    job_id = store.submit(job("j", layers=[{"name": "l", "command": ["true"], "range": "1-4", "retries": 0}]), now=NOW)
    first = claim_next(store, now=NOW + 10)
    store.complete_frame(
        first.frame_id, first.attempt, FrameResult(exit_code=1, started_at=NOW + 10, ended_at=NOW + 20), now=NOW + 20
    )  # DEAD at +20
    running = claim_next(store, now=NOW + 30)  # RUNNING since +30

    def changed(since):
        return sorted(f["number"] for f in store.list_frames(job=job_id, changed_since=since)[0])

    assert changed(NOW) == [1, 2, 3, 4]  # submitted: all WAITING since NOW
    assert changed(NOW + 1) == [1, 2]
    assert changed(NOW + 25) == [2]  # the running one, always
    assert changed(NOW + 100) == [2]
    store.frame_action([first.frame_id], "retry", now=NOW + 200, force=True)
    assert changed(NOW + 150) == [1, 2]  # retried: WAITING again at +200
    store.complete_frame(
        running.frame_id,
        running.attempt,
        FrameResult(exit_code=0, started_at=NOW + 30, ended_at=NOW + 300),
        now=NOW + 300,
    )
    assert changed(NOW + 250) == [2]  # ended at +300
    assert changed(NOW + 400) == []


def test_get_jobs_and_caps_reached_answer_a_list_in_one_call(store):
    """What `job list` reads for its pending reasons, in one call each (one trip behind a
    socket): the same as get_job and cap_reached one by one, in order."""
    ids = [
        store.submit(job(name=f"j{i}", layers=[{"name": "a", "command": ["true"], "max_running": 1}]), now=NOW)
        for i in range(3)
    ]
    layer = next(la for la in store.runnable_layers() if la.job_id == ids[1])
    store.claim_frame(layer.layer_id, host="h", worker="h:1", gpu_uuids=[], now=NOW, lease_s=60)
    assert store.get_jobs([ids[2], ids[0]]) == [store.get_job(ids[2]), store.get_job(ids[0])]
    layers = [layer["id"] for full in store.get_jobs(ids) for layer in full["layers"]]
    assert store.caps_reached(layers) == {i: store.cap_reached(i) for i in layers}
    assert [bool(c) for c in store.caps_reached(layers).values()] == [False, True, False]  # its one may run
    assert store.get_jobs([]) == [] and store.caps_reached([]) == {}
    with pytest.raises(NotFound):
        store.get_jobs([ids[0], 987654])


def test_gpu_events_are_kept_per_attempt_counted_and_go_with_their_job(store):
    from cuectl.sched.store import GpuEvent

    job_id = store.submit(job(layers=[{"name": "r", "command": ["true"], "range": "1-2"}]), now=NOW)
    a = claim_next(store)
    escape = GpuEvent(
        kind="escape",
        at=NOW + 5,
        device_uuid="GPU-b",
        device_index=1,
        pid=4242,
        memory_bytes=512 * 1024**2,
        detail="pid 4242 on GPU 1, not given to the frame",
        frame_id=a.frame_id,
        attempt=1,
    )
    xid = GpuEvent(
        kind="xid", at=NOW + 6, device_uuid="GPU-a", device_index=0, detail="Xid 79: GPU has fallen off the bus"
    )
    gone = GpuEvent(kind="idle", at=NOW + 7, frame_id=999_999, attempt=1)  # no such frame: dropped
    assert store.record_gpu_events("h1", [escape, xid, gone]) == 2
    assert store.record_gpu_events("h1", []) == 0
    kept = store.gpu_events(frame_id=a.frame_id)
    assert kept == [escape.__class__(**{**escape.__dict__, "host": "h1"})]
    assert kept[0].to_json() == {
        "kind": "escape",
        "device": "GPU-b",
        "pid": 4242,
        "at": "2023-11-14T22:13:25.000Z",
        "detail": "pid 4242 on GPU 1, not given to the frame",
        "device_index": 1,
        "memory_bytes": 512 * 1024**2,
        "host": "h1",
        "frame_id": a.frame_id,
        "attempt": 1,
    }
    assert [e.kind for e in store.gpu_events(job_id=job_id)] == ["escape"]
    assert [e.kind for e in store.gpu_events(host="h1")] == ["escape", "xid"]
    assert [e.kind for e in store.gpu_events(kinds=["xid"])] == ["xid"]
    assert [e.kind for e in store.gpu_events(limit=1)] == ["xid"]  # the newest
    assert store.gpu_event_counts() == {"escape": 1, "xid:79": 1}
    with pytest.raises(InvalidInput, match="unknown GPU event kind"):
        store.record_gpu_events("h1", [GpuEvent(kind="bogus", at=NOW)])
    # Pruning the finished job removes its events (the device's own stay).
    b = claim_next(store)
    store.complete_frame(a.frame_id, 1, ok(), now=NOW + 10)
    store.complete_frame(b.frame_id, 1, ok(), now=NOW + 10)
    assert store.prune(before=NOW + 1000) == [job_id]
    assert [e.kind for e in store.gpu_events()] == ["xid"]


def test_a_frame_stopped_for_a_gpu_escape_is_not_retried_on_that_host_while_another_is_up(store):
    from cuectl.sched.store import HostInfo

    def escaped():
        return FrameResult(
            exit_code=None,
            exit_signal=15,
            started_at=NOW,
            ended_at=NOW + 1,
            failure_kind="gpu-escape",
            failure="GPU escape: pid 4242 on GPU 1",
        )

    # Alone on the farm: retried where it is (else it could never run again).
    store.register_host(HostInfo(name="h1", cores=4, memory_bytes=1 << 30, gpus=[]), now=NOW)
    store.submit(job(layers=[{"name": "r", "command": ["true"], "retries": 3}]), now=NOW)
    a = claim_next(store, host="h1")
    assert store.complete_frame(a.frame_id, 1, escaped(), now=NOW + 1) == "WAITING"
    assert claim_next(store, host="h1", now=NOW + 2) is not None
    # With h2 up: the next attempt is for any host but h1.
    store.register_host(HostInfo(name="h2", cores=4, memory_bytes=1 << 30, gpus=[]), now=NOW + 2)
    assert store.complete_frame(a.frame_id, 2, escaped(), now=NOW + 3) == "WAITING"
    assert claim_next(store, host="h1", now=NOW + 4) is None
    again = claim_next(store, host="h2", now=NOW + 4)
    assert again is not None and again.frame_id == a.frame_id and again.attempt == 3
    # Claimed: the bar is gone (an ordinary failure there is retried anywhere).
    assert (
        store.complete_frame(a.frame_id, 3, FrameResult(exit_code=1, started_at=NOW, ended_at=NOW + 5), now=NOW + 5)
        == "WAITING"
    )
    assert claim_next(store, host="h2", now=NOW + 6) is not None
