"""``Store.usage_summary``: the accounting sums the report is made of, computed in SQL by
each backend (``cuectl.sched.usage_sql``). Attempts are written straight into the
``attempts`` table of a real store so each rule can be set up exactly; a plain Python
oracle, written from docs/accounting.md, checks random farms against both backends."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuectl.report import build_rows, percentile, report_row
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store
from cuectl.sched.store.sqlite import SQLiteStore
from cuectl.sched.usage_sql import FAILED_OUTCOMES, GROUPINGS

NOW = 1_700_000_000.0
WINDOW = {"since": NOW - 3600, "until": NOW + 3600}
OUTCOMES = ("succeeded", "failed", "timeout", "killed", "lost", "worker stopped", "eaten", "retried")


def add_frames(
    store,
    count: int = 1,
    *,
    job: str = "j",
    user: str = "u",
    layer: str = "l",
    project: str | None = None,
    show: str | None = None,
) -> list[int]:
    """A job of ``count`` frames, through the real submit path; its frame ids."""
    job_id = store.submit(
        spec_from_mapping(
            {
                "name": job,
                "project": project,
                "show": show,
                "layers": [{"name": layer, "command": ["true"], "range": f"1-{count}", "retry_delay": 0}],
            },
            user=user,
        ),
        now=NOW,
    )
    frames, _ = store.list_frames(job=job_id)
    return [f["id"] for f in frames]


def add_attempt(
    store,
    frame_id: int,
    attempt: int = 1,
    *,
    outcome: str = "succeeded",
    start: float | None = NOW,
    end: float = NOW + 10,
    host: str | None = "h",
    uuids: tuple[str, ...] = (),
    models: tuple[str, ...] = (),
    alloc: float | None = None,
    busy: float | None = None,
    util: float | None = None,
    mem: int | None = None,
    waiting: float | None = None,
    cores: float | None = 1.0,
) -> None:
    """One row of ``attempts``, as ``complete_frame``/``reap`` write it."""
    job_id = store.get_frame(frame_id)["job_id"]
    sql = (
        "INSERT INTO attempts(frame_id, attempt, job_id, host, gpu_uuids, outcome, waiting_since, started_at, "
        "ended_at, cores, gpu_util_mean_pct, gpu_seconds, gpu_busy_seconds, gpu_memory_peak_bytes, gpu_models) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    params = (
        frame_id,
        attempt,
        job_id,
        host,
        json.dumps(list(uuids)),
        outcome,
        waiting,
        start,
        end,
        cores,
        util,
        alloc,
        busy,
        mem,
        json.dumps(list(models)) if models else None,
    )
    if isinstance(store, SQLiteStore):
        store.conn.execute(sql, params)
    else:
        store._call(lambda conn: conn.execute(sql.replace("?", "%s"), params))


def report(store, by: str):
    groups, total = store.usage_summary(**WINDOW, by=by)
    return {r.group: r for r in build_rows(groups, by=by)}, report_row(total, "total")


# -- the rules, one at a time ---------------------------------------------------------------
@pytest.mark.parametrize(
    "outcomes, dead",
    [
        (["failed"], 1),  # failed, nothing after it in the window
        (["failed", "succeeded"], 0),  # retried and then succeeded
        (["succeeded", "failed"], 1),  # re-run by a user, then failed for good
        (["timeout"], 1),
        (["killed"], 1),
        (["lost"], 1),
        (["failed", "worker stopped"], 0),  # requeued by a stopping worker: back in the queue, not dead
        (["eaten"], 0),
        (["retried"], 0),
        (["drain"], 0),
    ],
)
def test_dead_is_decided_by_the_last_attempt_in_the_window(store, outcomes, dead):
    (frame,) = add_frames(store)
    for i, outcome in enumerate(outcomes):
        add_attempt(store, frame, i + 1, outcome=outcome, end=NOW + 10 * (i + 1))
    rows, total = report(store, "user")
    assert (rows["u"].frames, rows["u"].dead, rows["u"].retries, rows["u"].attempts) == (
        1,
        dead,
        len(outcomes) - 1,
        len(outcomes),
    )
    assert rows["u"].succeeded == outcomes.count("succeeded") and total.dead == dead


def test_a_later_success_outside_the_window_does_not_undo_dead(store):
    (frame,) = add_frames(store)
    add_attempt(store, frame, 1, outcome="failed", end=NOW)
    add_attempt(store, frame, 2, outcome="succeeded", end=WINDOW["until"] + 5)  # after the window
    rows, _ = report(store, "user")
    assert (rows["u"].frames, rows["u"].dead, rows["u"].attempts) == (1, 1, 1)


def test_window_is_half_open(store):
    frames = add_frames(store, 3)
    add_attempt(store, frames[0], start=WINDOW["since"] - 20, end=WINDOW["since"])  # on the start: in
    add_attempt(store, frames[1], start=WINDOW["until"] - 20, end=WINDOW["until"])  # on the end: out
    add_attempt(store, frames[2], start=WINDOW["since"] - 50, end=WINDOW["since"] - 1)  # before: out
    rows, total = report(store, "user")
    assert (rows["u"].attempts, rows["u"].wall_seconds, total.frames) == (1, 20.0, 1)


def test_empty_window(store):
    add_frames(store)
    groups, total = store.usage_summary(**WINDOW, by="job")
    assert groups == [] and total is not None and (total.frames, total.attempts, total.waits) == (0, 0, [])
    assert store.usage_summary(**WINDOW, by="job", with_total=False) == ([], None)


def test_gpu_model_shares_are_per_device(store):
    frames = add_frames(store, 3)
    add_attempt(
        store,
        frames[0],
        uuids=("a", "b", "c"),
        models=("A100", "A100", "V100"),
        alloc=30.0,
        busy=15.0,
        util=50.0,
        start=NOW,
        end=NOW + 10,
    )
    add_attempt(store, frames[1], uuids=("d",), start=NOW, end=NOW + 7)  # never reported: 7 s x 1 device
    add_attempt(store, frames[2])  # CPU only
    rows, total = report(store, "gpu-model")
    assert rows["A100"].gpu_seconds_allocated == pytest.approx(20.0)
    assert rows["A100"].gpu_seconds_busy == pytest.approx(10.0)
    assert rows["V100"].gpu_seconds_allocated == pytest.approx(10.0)
    assert rows["unknown"].gpu_seconds_allocated == 7.0 and rows["unknown"].gpu_seconds_busy == 0.0
    assert rows["cpu"].gpu_seconds_allocated == 0.0 and rows["cpu"].gpu_efficiency_pct is None
    # Counts and wall are attempt facts: the three-device attempt is a whole frame in each model.
    assert (rows["A100"].frames, rows["V100"].frames, rows["A100"].wall_seconds) == (1, 1, 10.0)
    assert (total.frames, total.attempts, total.gpu_seconds_allocated, total.wall_seconds) == (3, 3, 37.0, 27.0)


def test_utilisation_is_weighted_by_allocation_and_waits_clamped(store):
    frames = add_frames(store, 2)
    add_attempt(
        store,
        frames[0],
        uuids=("a",),
        alloc=300.0,
        busy=30.0,
        util=10.0,
        start=NOW + 100,
        waiting=NOW + 40,
        end=NOW + 400,
    )
    add_attempt(
        store,
        frames[1],
        uuids=("a",),
        alloc=100.0,
        busy=90.0,
        util=90.0,
        start=NOW + 100,
        waiting=NOW + 130,
        end=NOW + 200,
    )  # a clock-skewed negative wait counts as 0
    rows, _ = report(store, "user")
    row = rows["u"]
    assert row.gpu_util_mean_pct == pytest.approx((10 * 300 + 90 * 100) / 400)  # 30, not the plain mean 50
    assert row.gpu_efficiency_pct == pytest.approx(120 / 400 * 100)
    assert row.gpu_seconds_wasted == pytest.approx(280.0)
    assert (row.wait_p50_s, row.wait_p95_s) == (0.0, 60.0)


def test_wasted_never_negative_and_missing_times_are_zero_wall(store):
    frames = add_frames(store, 3)
    add_attempt(store, frames[0], uuids=("a",), alloc=10.0, busy=10.0004, util=100.0)
    add_attempt(store, frames[1], start=None, end=NOW + 5)
    add_attempt(store, frames[2], start=NOW + 9, end=NOW + 5, cores=None)  # clock went backwards
    rows, _ = report(store, "user")
    assert rows["u"].gpu_seconds_wasted == 0.0 and rows["u"].wall_seconds == 10.0
    assert rows["u"].core_seconds == 10.0


def test_rows_sorted_by_allocated_then_group_and_job_ids_numerically(store):
    ids = {}
    for name in ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"):
        ids[name] = add_frames(store, job=name)[0]  # job ids 1..11: "10" sorts before "2" as text
    add_attempt(store, ids["j"], uuids=("a",), alloc=5.0)
    add_attempt(store, ids["b"])
    add_attempt(store, ids["k"])
    add_attempt(store, ids["c"], uuids=("a",), alloc=50.0)
    groups, _ = store.usage_summary(**WINDOW, by="job")
    assert [r.group for r in build_rows(groups, by="job")] == ["3 c", "10 j", "2 b", "11 k"]


def test_layer_and_user_groups_span_jobs_of_the_same_name(store):
    first = add_frames(store, job="shot", user="ann", layer="fx")[0]
    second = add_frames(store, job="shot", user="ann", layer="fx")[0]
    other = add_frames(store, job="shot", user="ann", layer="comp")[0]
    for frame in (first, second, other):
        add_attempt(store, frame)
    layers, _ = report(store, "layer")
    assert {g: r.frames for g, r in layers.items()} == {"shot/fx": 2, "shot/comp": 1}
    assert layers["shot/fx"].labels == {"job_name": "shot", "layer": "fx"}
    users, total = report(store, "user")
    assert users["ann"].frames == 3 == total.frames


def test_day_groups_use_utc(store):
    day = 86400.0
    frames = add_frames(store, 3)
    for frame, end in zip(frames, (19723 * day + 1, 19724 * day - 1, 19724 * day)):
        add_attempt(store, frame, start=end - 1, end=end)
    groups, _ = store.usage_summary(since=19723 * day, until=19725 * day, by="day")
    assert sorted((r.group, r.frames) for r in build_rows(groups, by="day")) == [("2024-01-01", 2), ("2024-01-02", 1)]


def test_total_counts_distinct_frames_across_groups(store):
    (frame,) = add_frames(store)
    add_attempt(store, frame, 1, outcome="failed", host="h1", waiting=NOW - 5, end=NOW + 10)
    add_attempt(store, frame, 2, host="h2", waiting=NOW + 10, start=NOW + 30, end=NOW + 40)
    add_attempt(store, add_frames(store, job="k")[0], host=None)
    rows, total = report(store, "host")
    assert sum(r.frames for r in rows.values()) == 3 and (total.frames, total.dead, total.attempts) == (2, 0, 3)
    assert set(rows) == {"h1", "h2", "-"}
    assert (total.wait_p50_s, total.wait_p95_s) == (5.0, 20.0)


def test_peak_memory_is_the_largest_of_the_group(store):
    frames = add_frames(store, 3)
    for frame, mem in zip(frames, (3 << 30, None, 5 << 30)):
        add_attempt(store, frame, uuids=("a",), alloc=1.0, mem=mem)
    rows, total = report(store, "user")
    assert rows["u"].gpu_memory_peak_bytes == 5 << 30 == total.gpu_memory_peak_bytes


def test_unknown_grouping_is_refused(store):
    with pytest.raises(ValueError):
        store.usage_summary(**WINDOW, by="nope")


# -- the oracle -----------------------------------------------------------------------------
def oracle(attempts: list[dict[str, Any]], by: str | None) -> dict[Any, dict[str, Any]]:
    """The figures of docs/accounting.md, the slow obvious way, one attempt at a time."""
    window = [a for a in attempts if WINDOW["since"] <= a["end"] < WINDOW["until"]]
    last: dict[int, dict[str, Any]] = {}
    for a in window:
        if a["frame"] not in last or a["attempt"] > last[a["frame"]]["attempt"]:
            last[a["frame"]] = a
    out: dict[Any, dict[str, Any]] = {}
    for a in window:
        if by == "gpu-model":
            models = a["models"] or (("unknown",) if a["uuids"] else ("cpu",))
            shares = [(m, models.count(m) / len(models)) for m in dict.fromkeys(models)]
        else:
            shares = [
                (
                    {
                        "user": a["user"],
                        "project": a["project"],
                        "show": a["show"],
                        "host": a["host"] or "-",
                        "job": a["job"],
                        None: "total",
                        "day": int(a["end"] // 86400),
                        "layer": (a["job"], a["layer"]),
                    }[by],
                    1.0,
                )
            ]
        wall = a["end"] - a["start"] if a["start"] is not None and a["end"] > a["start"] else 0.0
        alloc = a["alloc"] if a["alloc"] is not None else wall * len(a["uuids"])
        for key, share in shares:
            g = out.setdefault(
                key,
                {
                    "frames": set(),
                    "attempts": 0,
                    "succeeded": 0,
                    "retries": 0,
                    "dead": 0,
                    "wall": 0.0,
                    "cores": 0.0,
                    "alloc": 0.0,
                    "busy": 0.0,
                    "uw": 0.0,
                    "un": 0.0,
                    "mem": None,
                    "waits": [],
                },
            )
            g["frames"].add(a["frame"])
            g["attempts"] += 1
            g["succeeded"] += a["outcome"] == "succeeded"
            g["retries"] += a["attempt"] > 1
            g["dead"] += last[a["frame"]] is a and a["outcome"] in FAILED_OUTCOMES
            g["wall"] += wall
            g["cores"] += (a["cores"] or 0) * wall
            g["alloc"] += alloc * share
            g["busy"] += (a["busy"] or 0) * share
            if a["util"] is not None and alloc > 0:
                g["uw"] += a["util"] * alloc * share
                g["un"] += alloc * share
            if a["mem"] is not None:
                g["mem"] = max(g["mem"] or 0, a["mem"])
            if a["waiting"] is not None and a["start"] is not None:
                g["waits"].append(max(0.0, a["start"] - a["waiting"]))
    return out


def random_farm(rng: random.Random, n: int) -> list[dict[str, Any]]:
    jobs = [(f"job{j}", rng.choice(["ann", "bo", "cy"]), rng.choice(["fx", "lit"])) for j in range(4)]
    projects = ["show1", None, "show2", "show1"]  # by job; no rng draw, so the farms stay as they were
    shows = ["fx", "fx", None, "anim"]  # likewise
    attempts = []
    for frame in range(1, n + 1):
        job, user, layer = jobs[frame % len(jobs)]
        project, show = projects[frame % len(jobs)], shows[frame % len(jobs)]
        t = NOW + rng.uniform(-4000, 3000)
        for attempt in range(1, rng.choice([1, 1, 1, 2, 3]) + 1):
            gpus = rng.choice([0, 1, 2, 3])
            start = None if rng.random() < 0.05 else t + rng.uniform(-10, 60)
            end = t + rng.uniform(0, 900)
            reported = gpus and rng.random() < 0.8
            attempts.append(
                {
                    "frame": frame,
                    "attempt": attempt,
                    "job": job,
                    "user": user,
                    "layer": layer,
                    "project": project,
                    "show": show,
                    "host": rng.choice(["h1", "h2", None]),
                    "outcome": rng.choice(OUTCOMES),
                    "uuids": tuple(f"GPU-{i}" for i in range(gpus)),
                    "models": tuple(rng.choice(["A100", "V100"]) for _ in range(gpus)) if reported else (),
                    "start": start,
                    "end": end,
                    "waiting": None if rng.random() < 0.1 else t - rng.uniform(-5, 300),
                    "alloc": max(0.0, end - (start or end)) * gpus if reported else None,
                    "busy": rng.uniform(0, 100) if reported else None,
                    "util": rng.uniform(0, 100) if reported else None,
                    "mem": rng.randrange(1 << 34) if reported else None,
                    "cores": rng.choice([None, 1.0, 4.0]),
                }
            )
            t = end
    return attempts


def load(store, attempts: list[dict[str, Any]]) -> None:
    """One job per job name (so ``--by job`` can be checked by name), its frames in order."""
    frames_of: dict[tuple, list[int]] = {}
    for a in attempts:
        frames = frames_of.setdefault((a["job"], a["user"], a["layer"], a["project"], a["show"]), [])
        if a["frame"] not in frames:
            frames.append(a["frame"])
    frame_ids: dict[int, int] = {}
    for (job, user, layer, project, show), frames in frames_of.items():
        frame_ids.update(
            zip(frames, add_frames(store, len(frames), job=job, user=user, layer=layer, project=project, show=show))
        )
    for a in attempts:
        add_attempt(
            store,
            frame_ids[a["frame"]],
            a["attempt"],
            outcome=a["outcome"],
            start=a["start"],
            end=a["end"],
            host=a["host"],
            uuids=a["uuids"],
            models=a["models"],
            alloc=a["alloc"],
            busy=a["busy"],
            util=a["util"],
            mem=a["mem"],
            waiting=a["waiting"],
            cores=a["cores"],
        )


def assert_matches_oracle(store, attempts: list[dict[str, Any]], by: str) -> None:
    groups, total = store.usage_summary(**WINDOW, by=by)
    expected = oracle(attempts, by)
    # The oracle keys a job by its name (unique in these farms), a layer by (job, layer).
    got: dict[Any, Any] = {(g.key[1] if by == "job" else g.key if by == "layer" else g.key[0]): g for g in groups}
    got["total"] = total
    expected["total"] = oracle(attempts, None).get("total") or {
        "frames": set(),
        "attempts": 0,
        "succeeded": 0,
        "retries": 0,
        "dead": 0,
        "wall": 0.0,
        "cores": 0.0,
        "alloc": 0.0,
        "busy": 0.0,
        "uw": 0.0,
        "un": 0.0,
        "mem": None,
        "waits": [],
    }
    assert set(got) == set(expected)
    for key, e in expected.items():
        g = got[key]
        assert (g.frames, g.attempts, g.succeeded, g.retries, g.dead, g.gpu_memory_peak_bytes) == (
            len(e["frames"]),
            e["attempts"],
            e["succeeded"],
            e["retries"],
            e["dead"],
            e["mem"],
        ), key
        for name, value in (
            ("wall_seconds", e["wall"]),
            ("core_seconds", e["cores"]),
            ("gpu_seconds_allocated", e["alloc"]),
            ("gpu_seconds_busy", e["busy"]),
            ("util_weighted", e["uw"]),
            ("util_weight", e["un"]),
        ):
            assert math.isclose(getattr(g, name), value, rel_tol=1e-9, abs_tol=1e-6), (key, name)
        waits = sorted(e["waits"])
        assert [percentile(g.waits, p) for p in (50, 95)] == pytest.approx([percentile(waits, p) for p in (50, 95)])


@pytest.mark.parametrize("by", GROUPINGS)
def test_random_farm_matches_the_oracle(store, by):
    attempts = random_farm(random.Random(7), 60)
    load(store, attempts)
    assert_matches_oracle(store, attempts, by)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 12), by=st.sampled_from(GROUPINGS))
def test_sqlite_matches_the_oracle_on_any_farm(tmp_path: Path, seed: int, n: int, by: str):
    path = tmp_path / f"{seed}-{n}-{by}.db"
    path.unlink(missing_ok=True)
    s = open_store(str(path))
    try:
        attempts = random_farm(random.Random(seed), n)
        load(s, attempts)
        assert_matches_oracle(s, attempts, by)
    finally:
        s.close()
