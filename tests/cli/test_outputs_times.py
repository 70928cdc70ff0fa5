"""`--json` times are ISO 8601 UTC everywhere (DESIGN §9) — attempts, GPU samples, a host's
live sample too — and `frame show` prints the attempt's stored, time-weighted mean
utilisation, not a plain average of its samples.

The store is a real SQLite file written through the store API (register, submit, claim,
live usage, complete, reap), so every number below is known exactly."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, LiveUsage, open_store

T0 = 1709251200.0  # 2024-03-01T00:00:00Z
GIB = 1024**3
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
V100 = {
    "index": 0,
    "uuid": "GPU-a",
    "vendor": "NVIDIA",
    "model": "Tesla V100-SXM2-16GB",
    "backend": "fake",
    "memory_total_bytes": 16 * GIB,
}
# The samples of one attempt: 60 % for 5 s, 20 % for 5 s, 60 % for 5 s, then the final
# sample at the end (0 %, the process is gone). A plain average of the points is 35 %;
# what the worker stores as the attempt's mean is its time-weighted figure, here 40 %.
SERIES = [[T0 + 10, 60.0, 2 * GIB], [T0 + 15, 20.0, 2 * GIB], [T0 + 20, 60.0, 3 * GIB], [T0 + 25, 0.0, 0]]
USAGE = {
    "gpu_util_mean_pct": 40.0,
    "gpu_util_max_pct": 60.0,
    "gpu_memory_peak_bytes": 3 * GIB,
    "gpu_seconds": 15.0,
    "gpu_busy_seconds": 6.0,
    "gpu_models": [V100["model"]],
}


def _farm(db: Path) -> dict[str, int]:
    """One GPU host with a live sample; frame ``done``: a failed attempt (lost: its worker
    vanished) then one that succeeded with SERIES; frame ``running``: sampled so far."""
    store = open_store(str(db))
    try:
        store.register_host(HostInfo(name="h1", cores=8, memory_bytes=64 * GIB, gpus=[V100]), now=T0)
        job_id = store.submit(
            spec_from_mapping(
                {
                    "name": "shot",
                    "layers": [{"name": "render", "command": ["true"], "range": "1-2", "gpus": 1, "retries": 2}],
                },
                user="alice",
            ),
            now=T0,
        )
        layer = store.runnable_layers()[0].layer_id
        lost = store.claim_frame(layer, host="h1", worker="w", gpu_uuids=["GPU-a"], now=T0, lease_s=5)
        assert lost is not None and store.reap(now=T0 + 6) == [lost.frame_id]
        done = store.claim_frame(layer, host="h1", worker="w", gpu_uuids=["GPU-a"], now=T0 + 10, lease_s=600)
        assert done is not None and done.frame_id == lost.frame_id and done.attempt == 2
        store.complete_frame(
            done.frame_id,
            2,
            FrameResult(
                exit_code=0, started_at=T0 + 10, ended_at=T0 + 25, usage={**USAGE, "samples": {"GPU-a": SERIES}}
            ),
            now=T0 + 25,
        )
        running = store.claim_frame(layer, host="h1", worker="w", gpu_uuids=["GPU-a"], now=T0 + 30, lease_s=600)
        assert running is not None
        store.record_live_usage(
            "h1",
            [
                LiveUsage(
                    running.frame_id, 1, T0 + 40, 50.0, GIB, {"GPU-a": [[T0 + 30, 40.0, GIB], [T0 + 40, 50.0, GIB]]}
                )
            ],
            now=T0 + 40,
        )
        store.heartbeat(
            "h1",
            [running.frame_id],
            now=T0 + 40,
            lease_s=600,
            live={
                "at": T0 + 40,
                "devices": [
                    {"uuid": "GPU-a", "utilization_pct": 50.0, "memory_used_bytes": GIB, "memory_free_bytes": 15 * GIB}
                ],
            },
        )
        return {"job": job_id, "done": done.frame_id, "running": running.frame_id}
    finally:
        store.close()


TIME_KEYS = ("_at", "since", "until", "last_heartbeat")


def _times(doc: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every value under a key that names a time (``*_at``, ``at``, ``since``, …)."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            here = f"{path}.{key}"
            if key == "at" or key.endswith(TIME_KEYS):
                yield here, value
            yield from _times(value, here)
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from _times(value, f"{path}[{i}]")


def assert_iso_times(doc: Any) -> int:
    times = list(_times(doc))
    bad = [
        (path, value)
        for path, value in times
        if value is not None and not (isinstance(value, str) and ISO.match(value))
    ]
    assert not bad, bad
    return len(times)


def test_frame_show_json_attempts_and_samples_are_iso(cli, db_path):
    ids = _farm(db_path)
    res = cli("frame", "show", ids["done"], "--json")
    assert res.exit_code == 0, res
    data = res.json()
    history = data["attempt_history"]
    assert [(a["attempt"], a["outcome"], a["started_at"], a["ended_at"]) for a in history] == [
        (1, "lost", "2024-03-01T00:00:00.000Z", "2024-03-01T00:00:06.000Z"),
        (2, "succeeded", "2024-03-01T00:00:10.000Z", "2024-03-01T00:00:25.000Z"),
    ]
    assert history[1]["gpu_util_mean_pct"] == 40.0 and history[1]["timed_out"] is False
    # Samples stay [t, util_pct, memory_used_bytes] triples; t is an ISO 8601 UTC string.
    assert data["samples"] == {
        "GPU-a": [
            ["2024-03-01T00:00:10.000Z", 60.0, 2 * GIB],
            ["2024-03-01T00:00:15.000Z", 20.0, 2 * GIB],
            ["2024-03-01T00:00:20.000Z", 60.0, 3 * GIB],
            ["2024-03-01T00:00:25.000Z", 0.0, 0],
        ]
    }
    assert data["samples_attempt"] == 2
    assert assert_iso_times(data) >= 6

    running = cli("frame", "show", ids["running"], "--json").json()
    assert running["samples"] == {
        "GPU-a": [["2024-03-01T00:00:30.000Z", 40.0, GIB], ["2024-03-01T00:00:40.000Z", 50.0, GIB]]
    }
    assert running["attempt_history"] == [] and running["gpu_sampled_at"] == "2024-03-01T00:00:40.000Z"
    assert_iso_times(running)


def test_other_json_outputs_have_no_epoch_times(cli, db_path):
    ids = _farm(db_path)
    host = cli("host", "show", "h1", "--json").json()
    assert host["live"]["at"] == "2024-03-01T00:00:40.000Z"  # the worker's last device sample
    assert host["last_heartbeat"] == "2024-03-01T00:00:40.000Z"
    assert_iso_times(host)
    hosts = cli("host", "list", "--json").json()
    assert hosts["hosts"][0]["live"]["at"] == "2024-03-01T00:00:40.000Z"
    assert cli("admin", "token", "create", "alice", "--json").exit_code == 0
    for args in (("job", "show", ids["job"]), ("job", "list"), ("frame", "list"), ("admin", "token", "list")):
        res = cli(*args, "--json")
        assert res.exit_code == 0, (args, res)
        assert_iso_times(res.json())


def test_frame_show_text_prints_the_stored_time_weighted_mean(cli, db_path):
    ids = _farm(db_path)
    res = cli("frame", "show", ids["done"])
    assert res.exit_code == 0, res
    out = res.stdout
    # The one mean: the attempt's stored gpu_util_mean_pct (40), never an average of the
    # points (35) that counts the final 0 % sample as much as a whole interval.
    assert re.search(r"gpu_util_mean_pct\s+40\.0", out), out
    assert re.search(r"GPU-a\s+\S+\s+mean 40% max 60%, peak 3\.0 GiB", out), out
    assert "35%" not in out, out
    # The attempt table has each attempt's times, ISO like everything else (the lost
    # attempt's end appears nowhere else).
    assert "2024-03-01T00:00:06.000Z" in out, out

    # A running attempt has no mean yet: the sparkline line shows what it has so far.
    running = cli("frame", "show", ids["running"]).stdout
    assert "so far" in running and "max 50%, peak 1.0 GiB" in running and "mean" not in running.split("GPU samples")[1]


def test_frame_show_text_with_several_devices_prints_the_attempt_mean_once(cli, db_path):
    store = open_store(str(db_path))
    try:
        store.submit(
            spec_from_mapping(
                {"name": "pair", "layers": [{"name": "r", "command": ["true"], "gpus": 2}]}, user="alice"
            ),
            now=T0,
        )
        c = store.claim_frame(
            store.runnable_layers()[0].layer_id,
            host="h1",
            worker="w",
            gpu_uuids=["GPU-a", "GPU-b"],
            now=T0,
            lease_s=600,
        )
        assert c is not None
        samples = {"GPU-a": SERIES, "GPU-b": [[T0 + 10, 10.0, GIB], [T0 + 25, 0.0, 0]]}
        store.complete_frame(
            c.frame_id,
            1,
            FrameResult(
                exit_code=0,
                started_at=T0 + 10,
                ended_at=T0 + 25,
                usage={**USAGE, "gpu_util_mean_pct": 27.5, "samples": samples},
            ),
            now=T0 + 25,
        )
    finally:
        store.close()
    out = cli("frame", "show", c.frame_id).stdout
    assert re.search(r"GPU-a\s+\S+\s+max 60%, peak 3\.0 GiB", out), out
    assert re.search(r"GPU-b\s+\S+\s+max 10%, peak 1\.0 GiB", out), out
    assert "mean 28% over its 2 devices (time-weighted)" in out, out
