"""Caps on what runs at once (layer and job max_running, job max_gpus/max_cores, named
limits, user and project quotas) and the retry back-off, on both backends through the
``store`` fixture (a real SQLite file, a real PostgreSQL database). See
docs/scheduling.md and store/caps.py."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from storedriver import pg_roles  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.errors import Conflict, InvalidInput, NotFound, NotOwner
from cuectl.sched import model as m
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import Actor, FrameResult, open_store

NOW = 1_700_000_000.0


def submit(
    store, name: str = "j", *, user: str = "alice", layers: list[dict[str, Any]] | None = None, **job: Any
) -> int:
    layers = layers or [{"name": "a", "command": ["true"], "range": "1-10"}]
    spec = spec_from_mapping({"name": name, **job, "layers": layers}, user=user)
    return store.submit(spec, now=NOW)


def layer_ids(store, job_id: int) -> list[int]:
    return [layer["id"] for layer in store.get_job(job_id)["layers"]]


def claim(store, layer_id: int, *, now: float = NOW, host: str = "h1", lease_s: float = 60.0):
    return store.claim_frame(layer_id, host=host, worker=f"{host}:1", gpu_uuids=[], now=now, lease_s=lease_s)


def claim_all(store, layer_id: int, *, now: float = NOW) -> list[Any]:
    got = []
    while (c := claim(store, layer_id, now=now)) is not None:
        got.append(c)
        assert len(got) < 100
    return got


def running(store, job_id: int | None = None) -> int:
    frames, _ = (
        store.list_frames(job=job_id, state=m.RUNNING) if job_id is not None else store.list_frames(state=m.RUNNING)
    )
    return len(frames)


def fail(code: int = 1, **kw: Any) -> FrameResult:
    return FrameResult(exit_code=code, started_at=NOW, ended_at=NOW + 1, **kw)


def ok() -> FrameResult:
    return FrameResult(exit_code=0, started_at=NOW, ended_at=NOW + 1)


# -- per layer and per job ---------------------------------------------------------------------
def test_layer_max_running(store):
    job_id = submit(
        store,
        layers=[
            {"name": "a", "command": ["true"], "range": "1-10", "max_running": 2},
            {"name": "b", "command": ["true"], "range": "1-3"},
        ],
    )
    a, b = layer_ids(store, job_id)
    first = claim_all(store, a)
    assert len(first) == 2
    assert "the layer's max_running reached: 2 of 2 running" == store.cap_reached(a)
    assert len(claim_all(store, b)) == 3  # the other layer is not held back
    assert store.cap_reached(b) is None
    store.complete_frame(first[0].frame_id, first[0].attempt, ok(), now=NOW + 1)
    assert store.cap_reached(a) is None
    assert len(claim_all(store, a)) == 1


def test_job_max_running_spans_its_layers(store):
    job_id = submit(
        store,
        max_running=3,
        layers=[{"name": "a", "command": ["true"], "range": "1-2"}, {"name": "b", "command": ["true"], "range": "1-5"}],
    )
    a, b = layer_ids(store, job_id)
    assert len(claim_all(store, a)) == 2
    assert len(claim_all(store, b)) == 1
    assert running(store, job_id) == 3
    assert store.cap_reached(b) == "the job's max_running reached: 3 of 3 running"
    other = submit(store, "other")
    assert len(claim_all(store, layer_ids(store, other)[0])) == 10  # another job is not capped


def test_job_max_gpus_and_max_cores(store):
    gpu_job = submit(
        store,
        "g",
        max_gpus=4,
        layers=[
            {"name": "a", "command": ["true"], "range": "1-5", "gpus": 2},
            {"name": "cpu", "command": ["true"], "range": "1-3"},
        ],
    )
    a, cpu = layer_ids(store, gpu_job)
    assert len(claim_all(store, a)) == 2
    assert store.cap_reached(a) == "the job's max_gpus reached: 4 of 4 GPUs in use (a frame needs 2)"
    assert len(claim_all(store, cpu)) == 3  # max_gpus does not hold CPU frames back

    core_job = submit(store, "c", max_cores=5, layers=[{"name": "a", "command": ["true"], "range": "1-5", "cores": 2}])
    (c,) = layer_ids(store, core_job)
    assert len(claim_all(store, c)) == 2
    assert store.cap_reached(c) == "the job's max_cores reached: 4 of 5 cores in use (a frame needs 2)"


# -- named limits ------------------------------------------------------------------------------
def test_named_limit_across_two_jobs(store):
    store.set_limit("nuke", 3)
    one = submit(store, "one", layers=[{"name": "a", "command": ["true"], "range": "1-5", "limits": ["nuke"]}])
    two = submit(
        store,
        "two",
        layers=[
            {"name": "a", "command": ["true"], "range": "1-5", "limits": "nuke"},
            {"name": "free", "command": ["true"], "range": "1-2"},
        ],
    )
    (a1,) = layer_ids(store, one)
    a2, free = layer_ids(store, two)
    # The layer's limits are rows of layer_limits (what the cap's SQL reads), not only JSON.
    rows = store._read("SELECT layer_id, name FROM layer_limits ORDER BY layer_id", ())
    assert [(r["layer_id"], r["name"]) for r in rows] == [(a1, "nuke"), (a2, "nuke")]
    assert store.get_job(two)["layers"][0]["limits"] == ["nuke"]
    assert claim(store, a1) and claim(store, a1)
    assert len(claim_all(store, a2)) == 1  # the pool holds 3 frames of both jobs together
    assert claim(store, a1) is None
    assert running(store) == 3
    assert store.cap_reached(a2) == "limit 'nuke' reached: 3 of 3 running"
    assert len(claim_all(store, free)) == 2
    limits = store.list_limits()
    assert limits == [{"name": "nuke", "max_running": 3, "running": 3, "waiting": 7}]


def test_raising_a_limit_lets_claims_through(store):
    store.set_limit("lic", 1)
    job_id = submit(store, layers=[{"name": "a", "command": ["true"], "range": "1-5", "limits": ["lic"]}])
    (a,) = layer_ids(store, job_id)
    assert len(claim_all(store, a)) == 1
    store.set_limit("lic", 3)
    assert store.cap_reached(a) is None
    assert len(claim_all(store, a)) == 2
    assert running(store) == 3
    store.set_limit("lic", 0)  # lowering never stops running frames; it only holds new ones
    assert running(store) == 3 and claim(store, a) is None
    assert store.cap_reached(a) == "limit 'lic' reached: 3 of 0 running"


def test_submit_with_an_unknown_limit_is_refused(store):
    with pytest.raises(InvalidInput, match="no limit named 'nope'"):
        submit(store, layers=[{"name": "a", "command": ["true"], "limits": ["nope"]}])
    assert store.list_frames()[1] == 0  # nothing stored


def test_limit_delete_and_errors(store):
    store.set_limit("pool", 2)
    job_id = submit(store, layers=[{"name": "a", "command": ["true"], "range": "1", "limits": ["pool"]}])
    with pytest.raises(Conflict, match="held by unfinished frames"):
        store.set_limit("pool", None)
    (a,) = layer_ids(store, job_id)
    c = claim(store, a)
    store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW + 1)
    assert store.set_limit("pool", None) is None
    assert store.list_limits() == []
    with pytest.raises(NotFound):
        store.set_limit("pool", None)
    with pytest.raises(InvalidInput):
        store.set_limit("bad name", 2)
    with pytest.raises(InvalidInput):
        store.set_limit("x", -1)
    assert store.list_limits() == []


# -- quotas ------------------------------------------------------------------------------------
def test_user_gpu_quota_spans_jobs_and_leaves_cpu_layers_alone(store):
    store.set_quota("user", "alice", max_gpus=3, max_cores=None)
    one = submit(store, "one", layers=[{"name": "g", "command": ["true"], "range": "1-5", "gpus": 1}])
    two = submit(
        store,
        "two",
        layers=[
            {"name": "g", "command": ["true"], "range": "1-5", "gpus": 2},
            {"name": "cpu", "command": ["true"], "range": "1-4"},
        ],
    )
    bob = submit(store, "bobs", user="bob", layers=[{"name": "g", "command": ["true"], "range": "1-2", "gpus": 1}])
    (g1,) = layer_ids(store, one)
    g2, cpu = layer_ids(store, two)
    assert len(claim_all(store, g2)) == 1
    assert store.cap_reached(g2) == "user alice's GPU quota reached: 2 of 3 GPUs in use (a frame needs 2)"
    assert len(claim_all(store, g1)) == 1
    assert store.cap_reached(g1) == "user alice's GPU quota reached: 3 of 3 GPUs in use (a frame needs 1)"
    assert len(claim_all(store, cpu)) == 4  # a CPU layer is not blocked by a GPU quota
    assert len(claim_all(store, layer_ids(store, bob)[0])) == 2  # nor is another user
    (quota,) = store.list_quotas()
    assert quota == {
        "kind": "user",
        "name": "alice",
        "max_gpus": 3,
        "max_cores": None,
        "gpus_in_use": 3,
        "cores_in_use": 6.0,
    }


def test_project_quotas_on_gpus_and_cores(store):
    store.set_quota("project", "show1", max_gpus=2, max_cores=3)
    a = submit(
        store,
        "a",
        project="show1",
        layers=[{"name": "g", "command": ["true"], "range": "1-5", "gpus": 1, "cores": 0.5}],
    )
    b = submit(
        store, "b", user="bob", project="show1", layers=[{"name": "c", "command": ["true"], "range": "1-9", "cores": 1}]
    )
    free = submit(store, "free", layers=[{"name": "g", "command": ["true"], "range": "1-3", "gpus": 1}])
    assert store.get_job(a)["project"] == "show1"
    assert len(claim_all(store, layer_ids(store, a)[0])) == 2
    assert store.cap_reached(layer_ids(store, a)[0]).startswith("project show1's GPU quota reached: 2 of 2")
    assert len(claim_all(store, layer_ids(store, b)[0])) == 2  # 1 core of the two GPU frames, plus 2
    assert (
        store.cap_reached(layer_ids(store, b)[0])
        == "project show1's core quota reached: 3 of 3 cores in use (a frame needs 1)"
    )
    assert len(claim_all(store, layer_ids(store, free)[0])) == 3  # no project: no project quota
    store.set_quota("project", "show1", max_gpus=None, max_cores=None, delete=True)
    assert store.list_quotas() == []
    assert len(claim_all(store, layer_ids(store, b)[0])) == 7


def test_quota_input_errors(store):
    with pytest.raises(InvalidInput):
        store.set_quota("group", "x", max_gpus=1, max_cores=None)
    with pytest.raises(InvalidInput):
        store.set_quota("user", "ann", max_gpus=None, max_cores=None)
    with pytest.raises(InvalidInput):
        store.set_quota("user", "ann", max_gpus=-1, max_cores=None)
    with pytest.raises(InvalidInput):
        store.set_quota("project", "bad name", max_gpus=1, max_cores=None)
    with pytest.raises(NotFound):
        store.set_quota("user", "ann", max_gpus=None, max_cores=None, delete=True)
    assert store.list_quotas() == []


@pytest.mark.acts_as_user
def test_limits_and_quotas_are_admin_only(store):
    pg_roles(store, "cap_bob")
    store.set_limit("kept", 2)
    with store.acting_as(Actor("cap_bob", False)):
        with pytest.raises(NotOwner, match="only an admin"):
            store.set_limit("mine", 5)
        with pytest.raises(NotOwner):
            store.set_limit("kept", 50)
        with pytest.raises(NotOwner):
            store.set_limit("kept", None)
        with pytest.raises(NotOwner):
            store.set_quota("user", "cap_bob", max_gpus=100, max_cores=None)
        assert [r["name"] for r in store.list_limits()] == ["kept"]  # reading is for everyone
    assert store.list_limits()[0]["max_running"] == 2
    assert store.list_quotas() == []


# -- retry back-off ----------------------------------------------------------------------------
def test_a_failed_frame_waits_for_its_back_off_doubling_per_failure(store):
    job_id = submit(store, layers=[{"name": "a", "command": ["false"], "range": "1", "retries": 5, "retry_delay": 10}])
    (a,) = layer_ids(store, job_id)
    t = NOW
    for failures, delay in ((1, 10), (2, 20), (3, 40)):
        c = claim(store, a, now=t)
        assert c is not None and c.attempt == failures
        assert store.complete_frame(c.frame_id, c.attempt, fail(), now=t) == m.WAITING
        assert claim(store, a, now=t + delay - 0.5) is None, (failures, delay)
        t += delay
    assert claim(store, a, now=t) is not None


def test_default_back_off_and_retry_delay_zero(store):
    assert m.retry_delay(None, 1) == m.DEFAULT_RETRY_DELAY_S and m.retry_delay(None, 2) == 2 * m.DEFAULT_RETRY_DELAY_S
    assert m.retry_delay(300, 5) == m.MAX_RETRY_DELAY_S and m.retry_delay(0, 3) == 0
    dflt = submit(store, "dflt", layers=[{"name": "a", "command": ["false"], "range": "1"}])
    (a,) = layer_ids(store, dflt)
    c = claim(store, a)
    store.complete_frame(c.frame_id, c.attempt, fail(), now=NOW)
    assert claim(store, a, now=NOW + 1) is None
    assert claim(store, a, now=NOW + m.DEFAULT_RETRY_DELAY_S) is not None

    now = submit(store, "now", layers=[{"name": "a", "command": ["false"], "range": "1", "retry_delay": 0}])
    (b,) = layer_ids(store, now)
    c = claim(store, b)
    store.complete_frame(c.frame_id, c.attempt, fail(), now=NOW)
    assert claim(store, b, now=NOW) is not None  # retry_delay 0: at once


def test_a_users_retry_clears_the_back_off(store):
    job_id = submit(store, layers=[{"name": "a", "command": ["false"], "range": "1", "retry_delay": 600}])
    (a,) = layer_ids(store, job_id)
    c = claim(store, a)
    store.complete_frame(c.frame_id, c.attempt, fail(), now=NOW)
    assert claim(store, a, now=NOW + 1) is None
    (frame,) = store.frame_action([c.frame_id], "retry", now=NOW + 1)
    assert frame["state"] == m.WAITING
    again = claim(store, a, now=NOW + 1)
    assert again is not None and again.attempt == 2


def test_a_user_retry_of_a_running_frame_does_not_back_off(store):
    job_id = submit(store, layers=[{"name": "a", "command": ["sleep", "9"], "range": "1", "retry_delay": 600}])
    (a,) = layer_ids(store, job_id)
    c = claim(store, a)
    store.frame_action([c.frame_id], "retry", now=NOW)
    assert (
        store.complete_frame(
            c.frame_id, c.attempt, FrameResult(exit_code=None, exit_signal=15, user_action="retry"), now=NOW + 1
        )
        == m.WAITING
    )
    assert claim(store, a, now=NOW + 1) is not None


def test_a_permanent_failure_goes_dead_at_once(store):
    job_id = submit(store, layers=[{"name": "a", "command": ["nosuchcmd"], "range": "1", "retries": 3}])
    (a,) = layer_ids(store, job_id)
    c = claim(store, a)
    result = fail(127, permanent=True, failure_kind="not-found", failure="command not found (exit 127)")
    assert store.complete_frame(c.frame_id, c.attempt, result, now=NOW + 1) == m.DEAD
    (attempt,) = store.frame_attempts([c.frame_id])[c.frame_id]
    assert (attempt["outcome"], attempt["failure_kind"], attempt["failure"]) == (
        "failed",
        "not-found",
        "command not found (exit 127)",
    )


def test_attempts_carry_failure_kind_and_text(store):
    job_id = submit(store, layers=[{"name": "a", "command": ["false"], "range": "1", "retries": 5, "retry_delay": 0}])
    (a,) = layer_ids(store, job_id)
    c = claim(store, a)
    store.complete_frame(c.frame_id, c.attempt, fail(3), now=NOW + 1)
    c = claim(store, a, now=NOW + 2)
    store.complete_frame(
        c.frame_id,
        c.attempt,
        FrameResult(exit_code=None, exit_signal=9, timed_out=True, started_at=NOW + 2, ended_at=NOW + 3),
        now=NOW + 3,
    )
    c = claim(store, a, now=NOW + 4, lease_s=10)
    assert store.reap(now=NOW + 100) == [c.frame_id]
    c = claim(store, a, now=NOW + 101)
    store.complete_frame(
        c.frame_id, c.attempt, fail(1, failure_kind="gpu-oom", failure="CUDA out of memory"), now=NOW + 102
    )
    c = claim(store, a, now=NOW + 103)
    store.complete_frame(c.frame_id, c.attempt, ok(), now=NOW + 104)
    history = store.frame_attempts([c.frame_id])[c.frame_id]
    assert [(h["outcome"], h["failure_kind"], h["failure"]) for h in history] == [
        ("failed", "exit", "exit 3"),
        ("timeout", "timeout", "timed out"),
        ("lost", "lost", "worker lost (no heartbeat)"),
        ("failed", "gpu-oom", "CUDA out of memory"),
        ("succeeded", None, None),
    ]


# -- concurrency -------------------------------------------------------------------------------
def _claimer(url: str, layer_id: int, host: str, start: Any, out: Any) -> None:
    store = open_store(url)
    try:
        start.wait(60)
        got = 0
        for _ in range(20):  # keep trying: a claim that found the cap full must stay refused
            if (
                store.claim_frame(layer_id, host=host, worker=f"{host}:1", gpu_uuids=[], now=NOW, lease_s=600)
                is not None
            ):
                got += 1
        out.put((host, got))
    finally:
        store.close()


@pytest.mark.parametrize("cap", ["max_running", "limit"])
def test_concurrent_claimers_never_exceed_a_cap(store_url, cap):
    store = open_store(store_url)
    try:
        if cap == "limit":
            store.set_limit("pool3", 3)
            layer = {"name": "a", "command": ["true"], "range": "1-50", "limits": ["pool3"]}
        else:
            layer = {"name": "a", "command": ["true"], "range": "1-50", "max_running": 3}
        job_id = submit(store, layers=[layer])
        (a,) = layer_ids(store, job_id)
    finally:
        store.close()
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(store_url, a, f"h{i}", start, out)) for i in range(8)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sum(got for _, got in results) == 3, results
    store = open_store(store_url)
    try:
        assert running(store) == 3
    finally:
        store.close()


def test_runnable_layers_leave_out_what_a_host_could_never_run_by_size(store):
    """``host=`` filters in SQL by size alone, never a layer the host could run: a 24G
    request stays for a "24 GB" card that reports 24564 MiB (match.py's rounding)."""
    from cuectl.sched.store import HostShape

    submit(
        store,
        "shapes",
        layers=[
            {"name": "two", "command": ["true"], "gpus": 2},
            {"name": "big", "command": ["true"], "gpus": 1, "gpu_memory_min": "80G"},
            {"name": "fits", "command": ["true"], "gpus": 1, "gpu_memory_min": "24G"},
            {"name": "wide", "command": ["true"], "cores": 8},
            {"name": "cpu", "command": ["true"], "cores": 2},
        ],
    )
    card = HostShape(gpus=1, gpu_memory_max_bytes=24564 << 20, cores=4, memory_bytes=1 << 36)
    assert [layer.layer for layer in store.runnable_layers(host=card)] == ["fits", "cpu"]
    gpu_only = HostShape(gpus=1, gpu_memory_max_bytes=24564 << 20, cores=4, memory_bytes=1 << 36, gpu_only=True)
    assert [layer.layer for layer in store.runnable_layers(host=gpu_only)] == ["fits"]
    assert len(store.runnable_layers()) == 5  # without a host: everything
