"""Every OpenCue dependency type, within a job and across jobs, on SQLite and PostgreSQL
(the ``store`` fixture): real stores, frames claimed and completed through the store API.

The vectors are ported from Cuebot's ``DependManagerTests``
(cuebot/src/test/java/com/imageworks/spcue/test/service/DependManagerTests.java) on its
``jobspec_depend_test.xml`` (jobs A and B, layers pass_1 and pass_2 of frames 1-10): where
Cuebot counts ``depend_count`` on every frame, cuectl keeps a whole layer's or job's wait on
the layer, so the observable the ports assert is the same one Cuebot's tests also check:
which frames are in DEPEND (``hasDependFrames``), and which are left once the target is done.
"""

from __future__ import annotations

import pytest
from storedriver import run_job  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.errors import InvalidInput, NotFound
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult

NOW = 1_700_000_000.0


def two_pass(name: str, retries: int = 3):
    """One job of Cuebot's jobspec_depend_test.xml: layers pass_1 and pass_2, frames 1-10."""
    return spec_from_mapping(
        {
            "name": name,
            "layers": [
                {"name": "pass_1", "command": ["true"], "range": "1-10", "retries": retries},
                {"name": "pass_2", "command": ["true"], "range": "1-10", "retries": retries},
            ],
        },
        user="alice",
    )


@pytest.fixture
def ab(store):
    """Jobs A and B of Cuebot's depend test."""
    return store.submit(two_pass("depend_test_a"), now=NOW), store.submit(two_pass("depend_test_b"), now=NOW)


def states(store, job_id, layer=None):
    frames, _ = store.list_frames(job=job_id, layer=layer)
    return {f["name"]: f["state"] for f in frames}


def depend_frames(store, job_id, layer=None):
    return sorted(n for n, s in states(store, job_id, layer).items() if s == "DEPEND")


def run(store, job_id, layer=None, code=0, now=NOW + 10):
    """Claim and complete every WAITING frame of a job (or of one layer) with exit ``code``."""
    run_job(store, job_id, now=now, layer=layer, code=code)


def finish_frames(store, job_id, layer, numbers, code=0):
    """Complete exactly these frames of a layer (claiming the layer until each has run)."""
    wanted = set(numbers)
    for lay in store.runnable_layers():
        if lay.job_id != job_id or lay.layer != layer:
            continue
        held = []
        while (
            wanted
            and (c := store.claim_frame(lay.layer_id, host="h", worker="h:1", gpu_uuids=[], now=NOW + 10, lease_s=60))
            is not None
        ):
            if c.number in wanted:
                store.complete_frame(
                    c.frame_id, c.attempt, FrameResult(exit_code=code, started_at=NOW, ended_at=NOW), now=NOW + 10
                )
                wanted.discard(c.number)
            else:
                held.append(c)
        for c in held:  # give back the others, as a worker that lost them would
            store.requeue_frame(c.frame_id, c.attempt, now=NOW + 10, reason="test")
    assert not wanted, f"frames {sorted(wanted)} of {layer} were not runnable"


ALL_A = [f"{n:04d}-{layer}" for layer in ("pass_1", "pass_2") for n in range(1, 11)]
PASS1 = [f"{n:04d}-pass_1" for n in range(1, 11)]


# -- Cuebot's DependManagerTests, one by one ----------------------------------------------------
def test_job_on_job(store, ab):
    """testCreateAndSatisfyJobOnJob: every frame of A waits until B is done."""
    a, b = ab
    d = store.add_depend(a, on_job=b, now=NOW)
    assert d["type"] == "job-on-job" and d["state"] == "waiting"
    assert depend_frames(store, a) == sorted(ALL_A) and depend_frames(store, b) == []
    run(store, b, layer="pass_1")
    assert depend_frames(store, a) == sorted(ALL_A)  # half of B is not B
    run(store, b)
    assert depend_frames(store, a) == [] and store.get_job(b)["state"] == "FINISHED"
    assert store.list_depends(a)["depends"][0]["state"] == "satisfied"


def test_job_on_layer(store, ab):
    """testCreateAndSatisfyJobOnLayer."""
    a, b = ab
    assert store.add_depend(a, on_job=b, on_layer="pass_1", now=NOW)["type"] == "job-on-layer"
    assert depend_frames(store, a) == sorted(ALL_A)
    run(store, b, layer="pass_2")
    assert depend_frames(store, a) == sorted(ALL_A)
    run(store, b, layer="pass_1")
    assert depend_frames(store, a) == []


def test_job_on_frame(store, ab):
    """testCreateAndSatisfyJobOnFrame (frame 5 of B's pass_1)."""
    a, b = ab
    assert store.add_depend(a, on_job=b, on_layer="pass_1", on_frame=5, now=NOW)["type"] == "job-on-frame"
    assert depend_frames(store, a) == sorted(ALL_A)
    finish_frames(store, b, "pass_1", [4, 6])
    assert depend_frames(store, a) == sorted(ALL_A)
    finish_frames(store, b, "pass_1", [5])
    assert depend_frames(store, a) == []


def test_layer_on_job(store, ab):
    """testCreateAndSatisfyLayerOnJob: only the layer waits."""
    a, b = ab
    assert store.add_depend(a, layer="pass_1", on_job=b, now=NOW)["type"] == "layer-on-job"
    assert depend_frames(store, a) == PASS1
    run(store, b)
    assert depend_frames(store, a) == []


def test_layer_on_layer(store, ab):
    """testCreateAndSatisfyLayerOnLayer."""
    a, b = ab
    assert store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", now=NOW)["type"] == "layer-on-layer"
    assert depend_frames(store, a) == PASS1
    finish_frames(store, b, "pass_1", range(1, 10))
    assert depend_frames(store, a) == PASS1  # 9 of 10 is not the layer
    finish_frames(store, b, "pass_1", [10])
    assert depend_frames(store, a) == []


def test_layer_on_frame(store, ab):
    """testCreateAndSatisfyLayerOnFrame."""
    a, b = ab
    assert (
        store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", on_frame=5, now=NOW)["type"]
        == "layer-on-frame"
    )
    assert depend_frames(store, a) == PASS1
    finish_frames(store, b, "pass_1", [5])
    assert depend_frames(store, a) == []


def test_layer_on_sim_frame(store, ab):
    """testCreateAndSatisfyLayerOnSimFrame: every frame of the layer on one frame."""
    a, b = ab
    d = store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", on_frame=5, kind="layer-on-sim-frame", now=NOW)
    assert d["type"] == "layer-on-sim-frame" and depend_frames(store, a) == PASS1
    finish_frames(store, b, "pass_1", [5])
    assert depend_frames(store, a) == []


def test_frame_on_job(store, ab):
    """testCreateAndSatisfyFrameOnJob: one frame waits, its layer runs on."""
    a, b = ab
    assert store.add_depend(a, layer="pass_1", frame=5, on_job=b, now=NOW)["type"] == "frame-on-job"
    assert depend_frames(store, a) == ["0005-pass_1"]
    run(store, b)
    assert depend_frames(store, a) == []


def test_frame_on_layer(store, ab):
    """testCreateAndSatisfyFrameOnLayer."""
    a, b = ab
    assert (
        store.add_depend(a, layer="pass_1", frame=5, on_job=b, on_layer="pass_2", now=NOW)["type"] == "frame-on-layer"
    )
    assert depend_frames(store, a) == ["0005-pass_1"]
    run(store, b, layer="pass_1")
    assert depend_frames(store, a) == ["0005-pass_1"]
    run(store, b, layer="pass_2")
    assert depend_frames(store, a) == []


def test_frame_on_frame(store, ab):
    """testCreateAndSatisfyFrameOnFrame."""
    a, b = ab
    assert (
        store.add_depend(a, layer="pass_1", frame=5, on_job=b, on_layer="pass_1", on_frame=5, now=NOW)["type"]
        == "frame-on-frame"
    )
    assert depend_frames(store, a) == ["0005-pass_1"]
    finish_frames(store, b, "pass_1", [5])
    assert depend_frames(store, a) == []


def test_frame_by_frame(store, ab):
    """testCreateAndSatisfyFrameByFrame: frame N of A's pass_1 goes when frame N of B's does."""
    a, b = ab
    assert (
        store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", kind="frame-by-frame", now=NOW)["type"]
        == "frame-by-frame"
    )
    assert depend_frames(store, a) == PASS1
    finish_frames(store, b, "pass_1", [3, 7])
    assert depend_frames(store, a) == sorted(set(PASS1) - {"0003-pass_1", "0007-pass_1"})


def test_frame_by_frame_partial(store, ab):
    """testCreateAndSatisfyFrameByFrameParital: frames 1-3 of B already SUCCEEDED leave 7
    frames waiting; dropping the dependency (satisfyDepend) releases them all."""
    a, b = ab
    finish_frames(store, b, "pass_1", [1, 2, 3])
    d = store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", kind="frame-by-frame", now=NOW)
    assert len(depend_frames(store, a)) == 7 and "0004-pass_1" in depend_frames(store, a)
    store.drop_depends(a, [d["id"]], now=NOW + 1)
    assert depend_frames(store, a) == []
    assert store.list_depends(a)["depends"][0]["state"] == "dropped"


def test_layer_on_layer_any_frame(store, ab):
    """testCreateAndSatisfyLayerOnLayerAnyFrame: frame 5 of B alone releases A's layer."""
    a, b = ab
    d = store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", how="any", now=NOW)
    assert d["type"] == "layer-on-layer" and d["any_frame"] and depend_frames(store, a) == PASS1
    finish_frames(store, b, "pass_1", [5])
    assert depend_frames(store, a) == []


def test_previous_frame(store, ab):
    """testCreateAndSatisfyPreviousFrame: 9 of 10 frames wait (the first has no previous);
    B's frame 9 done releases A's frame 10 only."""
    a, b = ab
    assert (
        store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", kind="previous-frame", now=NOW)["type"]
        == "previous-frame"
    )
    assert depend_frames(store, a) == PASS1[1:]
    finish_frames(store, b, "pass_1", [9])
    assert depend_frames(store, a) == PASS1[1:9]


# -- in a spec, at submit -----------------------------------------------------------------------
def test_spec_depends_on_other_jobs_and_a_previous_frame_chain(store):
    up = store.submit(two_pass("up"), now=NOW)
    down = store.submit(
        spec_from_mapping(
            {
                "name": "down",
                "depends": [{"job": "up", "layer": "pass_2"}],
                "layers": [
                    {
                        "name": "comp",
                        "command": ["true"],
                        "range": "1-3",
                        "depends": [{"job": str(up), "layer": "pass_1", "type": "frame"}],
                    },
                    {
                        "name": "sim",
                        "command": ["true"],
                        "range": "1-4",
                        "depends": [{"layer": "sim", "type": "previous"}],
                    },
                    {"name": "one", "command": ["true"], "depends": [{"layer": "sim", "frame": 2}]},
                ],
            },
            user="alice",
        ),
        now=NOW,
    )
    types = [(d["type"], d["layer"], d["on_layer"]) for d in store.list_depends(down)["depends"]]
    assert sorted(types) == sorted(
        [
            ("previous-frame", "sim", "sim"),
            ("layer-on-frame", "one", "sim"),
            ("job-on-layer", None, "pass_2"),
            ("frame-by-frame", "comp", "pass_1"),
        ]
    )
    assert [d["job"]["id"] for d in store.list_depends(up)["dependents"]] == [down, down]
    assert states(store, down) == dict.fromkeys(
        ["0001-comp", "0002-comp", "0003-comp", "0001-sim", "0002-sim", "0003-sim", "0004-sim", "0001-one"], "DEPEND"
    )
    run(store, up, layer="pass_2")
    assert depend_frames(store, down) == sorted(
        ["0001-comp", "0002-comp", "0003-comp", "0001-one", "0002-sim", "0003-sim", "0004-sim"]
    )
    finish_frames(store, up, "pass_1", [2])
    sim = next(lay.layer_id for lay in store.runnable_layers() if lay.job_id == down and lay.layer == "sim")
    for number in (1, 2, 3, 4):  # the chain runs in order: one frame claimable at a time
        c = store.claim_frame(sim, host="h", worker="h:1", gpu_uuids=[], now=NOW + 10, lease_s=60)
        assert c is not None and c.number == number
        assert store.claim_frame(sim, host="h", worker="h:1", gpu_uuids=[], now=NOW + 10, lease_s=60) is None
        store.complete_frame(
            c.frame_id, c.attempt, FrameResult(exit_code=0, started_at=NOW, ended_at=NOW), now=NOW + 10
        )
    assert states(store, down)["0002-comp"] == "WAITING" and states(store, down)["0001-one"] == "WAITING"
    assert depend_frames(store, down) == ["0001-comp", "0003-comp"]


def test_a_killed_job_releases_its_dependents_and_one_with_dead_frames_does_not(store):
    """Cuebot's shutdownJob satisfies what depends on a job, a kill included; a job that
    ended with DEAD frames (OpenCue keeps it in the cue) holds them until it is done."""
    a, b = store.submit(two_pass("a"), now=NOW), store.submit(two_pass("b", retries=0), now=NOW)
    store.add_depend(a, on_job=b, now=NOW)
    run(store, b, code=1)
    assert store.get_job(b)["state"] == "FINISHED" and depend_frames(store, a) == sorted(ALL_A)
    store.kill_job(b, now=NOW + 20_000)
    assert depend_frames(store, a) == []


def test_eating_the_last_dead_frame_releases_a_job_dependency(store):
    up = store.submit(
        spec_from_mapping(
            {"name": "up", "layers": [{"name": "l", "command": ["false"], "range": "1-2", "retries": 0}]}, user="alice"
        ),
        now=NOW,
    )
    down = store.submit(
        spec_from_mapping(
            {"name": "down", "depends": ["up"], "layers": [{"name": "l", "command": ["true"]}]}, user="alice"
        ),
        now=NOW,
    )
    run(store, up, code=1)
    frames, _ = store.list_frames(job=up)
    assert {f["state"] for f in frames} == {"DEAD"} and depend_frames(store, down) == ["0001-l"]
    store.frame_action([frames[0]["id"]], "eat", now=NOW + 20)
    assert depend_frames(store, down) == ["0001-l"]
    store.frame_action([frames[1]["id"]], "eat", now=NOW + 21)
    assert depend_frames(store, down) == []


def test_a_dependency_on_what_is_done_is_recorded_satisfied(store, ab):
    a, b = ab
    run(store, b)
    d = store.add_depend(a, on_job=b, on_layer="pass_1", now=NOW)
    assert d["state"] == "satisfied" and depend_frames(store, a) == []
    assert store.add_depend(a, on_job=b, now=NOW)["state"] == "satisfied"


def test_undepend_all_releases_spec_dependencies_too(store):
    job = store.submit(
        spec_from_mapping(
            {
                "name": "j",
                "layers": [
                    {"name": "a", "command": ["true"], "range": "1-3"},
                    {"name": "b", "command": ["true"], "range": "1-3", "depends": ["a"]},
                    {"name": "c", "command": ["true"], "range": "1-3", "depends": [{"layer": "a", "type": "frame"}]},
                ],
            },
            user="alice",
        ),
        now=NOW,
    )
    assert len(depend_frames(store, job)) == 6
    dropped = store.drop_depends(job, None, now=NOW + 1)
    assert {d["state"] for d in dropped} == {"dropped"} and depend_frames(store, job) == []


# -- refused, changing nothing ------------------------------------------------------------------
def test_refusals_change_nothing(store, ab):
    a, b = ab
    before = states(store, a)
    for kwargs, error, text in (
        ({"on_job": a}, InvalidInput, "on itself"),
        ({"layer": "pass_1", "on_layer": "pass_1"}, InvalidInput, "on itself"),
        ({"frame": 3}, InvalidInput, "needs its --layer"),
        ({"on_job": b, "on_frame": 3}, InvalidInput, "needs its --on-layer"),
        ({"on_job": b, "how": "any"}, InvalidInput, "--any-frame"),
        ({"on_job": b, "kind": "frame-by-frame"}, InvalidInput, "only a layer waits on a layer"),
        ({"on_job": b, "kind": "layer-on-layer"}, InvalidInput, "make a job-on-job"),
        ({"on_job": b, "kind": "bogus"}, InvalidInput, "not a dependency type"),
        ({"on_job": b, "on_layer": "nope"}, NotFound, "no layer 'nope'"),
        ({"on_job": b, "on_layer": "pass_1", "on_frame": 99}, NotFound, "no frame 99"),
        ({"on_job": "no-such-job"}, NotFound, "no job"),
    ):
        with pytest.raises(error, match=text):
            store.add_depend(a, now=NOW, **kwargs)
    assert states(store, a) == before and store.list_depends(a)["depends"] == []
    with pytest.raises(NotFound, match="no dependency 7"):
        store.drop_depends(a, [7], now=NOW)


def test_a_cycle_between_jobs_is_refused(store, ab):
    a, b = ab
    c = store.submit(two_pass("c"), now=NOW)
    store.add_depend(a, on_job=b, now=NOW)
    store.add_depend(b, layer="pass_2", on_job=c, on_layer="pass_1", now=NOW)
    with pytest.raises(InvalidInput, match="wait on each other forever"):
        store.add_depend(c, layer="pass_1", frame=2, on_job=a, now=NOW)
    assert depend_frames(store, c) == []


def test_prune_releases_what_waits_on_a_pruned_job(store):
    a, b = store.submit(two_pass("a"), now=NOW), store.submit(two_pass("b", retries=0), now=NOW)
    store.add_depend(a, on_job=b, now=NOW)
    run(store, b, code=1)
    assert store.get_job(b)["state"] == "FINISHED" and len(depend_frames(store, a)) == 20
    assert store.prune(before=NOW + 10**9) == [b]
    assert depend_frames(store, a) == [] and store.list_depends(a)["depends"][0]["on_job"]["name"] is None


@pytest.mark.sql_internals
def test_the_sweep_releases_edges_whose_target_is_done(store, ab):
    """What a transaction could not release (another user's rows on PostgreSQL with roles)
    is released by the workers' sweep; simulated by putting an edge back by hand."""
    a, b = ab
    run(store, b)
    d = store.add_depend(a, layer="pass_1", on_job=b, on_layer="pass_1", on_frame=1, now=NOW)
    assert d["state"] == "satisfied"
    frame_id = store.list_frames(job=b, layer="pass_1")[0][0]["id"]
    layer_id = store.get_job(a)["layers"][0]["id"]

    def restore(tx):
        tx.run(
            "INSERT INTO depend_edges(depend_id, layer_id, frame_id, on_kind, on_id) VALUES (?, ?, NULL, 'frame', ?)",
            (d["id"], layer_id, frame_id),
        )
        tx.run("UPDATE layers SET depend_count = depend_count + 1 WHERE id = ?", (layer_id,))
        tx.run("UPDATE frames SET state = 'DEPEND' WHERE layer_id = ? AND state = 'WAITING'", (layer_id,))

    store._write(restore)
    assert depend_frames(store, a) == PASS1
    assert store.sweep_depends(now=NOW + 5) == 10
    assert depend_frames(store, a) == [] and store.sweep_depends(now=NOW + 6) == 0


# -- PostgreSQL with a role per user (roles.sql) ---------------------------------------------
def test_postgres_roles_between_users(pg_url, roles):
    """Alice's job may wait on Bob's; Bob cannot make Alice's job wait or drop its waits, and
    nobody writes dependency rows of another user's job. Bob's kill cannot change Alice's
    frames (row-level security): the workers' sweep releases them."""
    import psycopg

    from cuectl.errors import NotOwner
    from cuectl.sched.store import open_store

    def as_(who):
        return open_store(pg_url.replace("postgres@", f"{roles[who]}@", 1))

    alice, bob, worker = as_("alice"), as_("bob"), as_("worker")
    a = alice.submit(
        spec_from_mapping({"name": "a", "layers": [{"name": "l", "command": ["true"]}]}, user=roles["alice"]), now=NOW
    )
    b = bob.submit(
        spec_from_mapping(
            {"name": "b", "layers": [{"name": "l", "command": ["true"], "range": "1-2"}]}, user=roles["bob"]
        ),
        now=NOW,
    )
    d = alice.add_depend(a, on_job=b, now=NOW)
    with pytest.raises(NotOwner):
        bob.add_depend(a, on_job=b, on_layer="l", now=NOW)
    with pytest.raises(NotOwner):
        bob.drop_depends(a, [d["id"]], now=NOW)
    with psycopg.connect(pg_url.replace("postgres@", f"{roles['bob']}@", 1), autocommit=True) as conn:
        assert conn.execute("DELETE FROM depend_edges").rowcount == 0
        assert conn.execute("UPDATE depends SET satisfied_at = 1").rowcount == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO depends(type, job_id, on_job_id, created_at) VALUES ('job-on-job', %s, %s, 1)", (a, b)
            )
    assert depend_frames(alice, a) == ["0001-l"]
    bob.kill_job(b, now=NOW + 1)
    assert depend_frames(alice, a) == ["0001-l"]  # Bob's transaction could not release Alice's frame
    assert worker.sweep_depends(now=NOW + 2) == 1
    assert depend_frames(alice, a) == []
    for s in (alice, bob, worker):
        s.close()
