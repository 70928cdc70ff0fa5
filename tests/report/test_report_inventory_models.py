"""`admin report --by gpu-model` for attempts that never reported their devices' models
(lost: the worker died, the lease expired, the frame was reaped): the model comes from the
host inventory the worker registered (hosts.gpus, by device UUID), and only a device the
inventory does not know is `unknown`. On SQLite and on a real PostgreSQL (the SQL differs)."""

from __future__ import annotations

from typing import Any

import pytest

from cuectl.report import build_rows
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, open_store

T0 = 1709251200.0  # 2024-03-01T00:00:00Z
GIB = 1024**3
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"
WINDOW = {"since": T0, "until": T0 + 3600}


def _gpu(index: int, uuid: str, model: str) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid,
        "vendor": "NVIDIA",
        "model": model,
        "backend": "fake",
        "memory_total_bytes": 16 * GIB,
    }


def lose(store: Any, job: str, *, host: str, uuids: list[str], claimed: float, reaped: float) -> int:
    """Submit a one-frame GPU job, claim it on ``host`` and reap it after its lease ran
    out, as happens when the worker dies: one ``lost`` attempt, no usage, no models."""
    job_id = store.submit(
        spec_from_mapping(
            {
                "name": job,
                "layers": [{"name": "r", "command": ["true"], "range": "1", "gpus": len(uuids), "retries": 0}],
            },
            user="ann",
        ),
        now=claimed,
    )
    layer = next(layer for layer in store.runnable_layers() if layer.job_id == job_id)
    c = store.claim_frame(layer.layer_id, host=host, worker=f"{host}:1", gpu_uuids=uuids, now=claimed, lease_s=10)
    assert c is not None
    assert store.reap(now=reaped) == [c.frame_id]
    assert store.get_frame(c.frame_id)["attempt_history"][0]["outcome"] == "lost"
    return c.frame_id


def build(store: Any) -> None:
    store.register_host(
        HostInfo(
            name="h1",
            cores=8,
            memory_bytes=64 * GIB,
            gpus=[_gpu(0, "GPU-a", V100), _gpu(1, "GPU-b", A100), _gpu(2, "GPU-c", V100)],
        ),
        now=T0,
    )
    # Lost on two devices of two models: wall 100 s x 2 devices, half to each model.
    lose(store, "mixed", host="h1", uuids=["GPU-a", "GPU-b"], claimed=T0 + 100, reaped=T0 + 200)
    # Lost on two V100s: wall 50 s x 2 devices, all V100, counted once.
    lose(store, "pair", host="h1", uuids=["GPU-a", "GPU-c"], claimed=T0 + 300, reaped=T0 + 350)
    # A device the host's inventory does not list, and a host that never registered.
    lose(store, "gone", host="h1", uuids=["GPU-z"], claimed=T0 + 400, reaped=T0 + 420)
    lose(store, "nohost", host="h9", uuids=["GPU-a"], claimed=T0 + 500, reaped=T0 + 520)
    # A reported attempt keeps the models its worker recorded.
    job_id = store.submit(
        spec_from_mapping(
            {"name": "ok", "layers": [{"name": "r", "command": ["true"], "range": "1", "gpus": 1}]}, user="ann"
        ),
        now=T0,
    )
    layer = next(layer for layer in store.runnable_layers() if layer.job_id == job_id)
    c = store.claim_frame(layer.layer_id, host="h1", worker="h1:1", gpu_uuids=["GPU-b"], now=T0 + 600, lease_s=600)
    assert c is not None
    store.complete_frame(
        c.frame_id,
        1,
        FrameResult(
            exit_code=0,
            started_at=T0 + 600,
            ended_at=T0 + 640,
            usage={"gpu_util_mean_pct": 50.0, "gpu_seconds": 40.0, "gpu_busy_seconds": 20.0, "gpu_models": [A100]},
        ),
        now=T0 + 640,
    )


def test_lost_attempts_take_their_models_from_the_host_inventory(store_url):
    store = open_store(store_url)
    try:
        build(store)
        groups, total = store.usage_summary(**WINDOW, by="gpu-model")
        rows = {r.group: r for r in build_rows(groups, by="gpu-model")}
    finally:
        store.close()
    assert set(rows) == {V100, A100, "unknown"}
    # V100: half of "mixed" (100) + all of "pair" (100); A100: half of "mixed" + "ok" (40).
    assert rows[V100].gpu_seconds_allocated == pytest.approx(200.0)
    assert rows[A100].gpu_seconds_allocated == pytest.approx(140.0)
    assert (rows[V100].frames, rows[V100].attempts, rows[V100].dead) == (2, 2, 2)
    assert (rows[A100].frames, rows[A100].attempts, rows[A100].dead, rows[A100].succeeded) == (2, 2, 1, 1)
    assert rows[A100].gpu_seconds_busy == pytest.approx(20.0) and rows[V100].gpu_seconds_busy == 0.0
    # Only devices no inventory knows stay unknown: GPU-z (20 s) and h9's device (20 s).
    assert (rows["unknown"].gpu_seconds_allocated, rows["unknown"].frames) == (pytest.approx(40.0), 2)
    # Nothing counted twice or lost in the split.
    assert sum(r.gpu_seconds_allocated for r in rows.values()) == pytest.approx(total.gpu_seconds_allocated)
    assert total.gpu_seconds_allocated == pytest.approx(380.0) and total.frames == 5


def test_report_cli_names_the_model_of_a_lost_attempt(cli, db_path):
    store = open_store(str(db_path))
    try:
        store.register_host(HostInfo(name="h1", cores=8, memory_bytes=64 * GIB, gpus=[_gpu(0, "GPU-a", V100)]), now=T0)
        lose(store, "lost", host="h1", uuids=["GPU-a"], claimed=T0 + 100, reaped=T0 + 200)
    finally:
        store.close()
    res = cli(
        "admin",
        "report",
        "--by",
        "gpu-model",
        "--since",
        "2024-03-01T00:00:00Z",
        "--until",
        "2024-03-01T01:00:00Z",
        "--format",
        "json",
    )
    assert res.exit_code == 0, res
    rows = res.json()["rows"]
    assert [(r["group"], r["gpu_seconds_allocated"], r["dead"]) for r in rows] == [(V100, 100.0, 1)]


def test_the_library_takes_gpu_model_spelt_as_the_json_keys_are(store_url):
    """`run_report(by="gpu_model")` groups as `by="gpu-model"` (report.check_by's canonical
    spelling reaches the store, not the caller's)."""
    from cuectl.report import run_report

    store = open_store(store_url)
    try:
        build(store)
        rows, _total = run_report(store, by="gpu_model", **WINDOW)
        dashed, _ = run_report(store, by="gpu-model", **WINDOW)
    finally:
        store.close()
    assert [r.group for r in rows] == [r.group for r in dashed] and {V100, A100} <= {r.group for r in rows}
