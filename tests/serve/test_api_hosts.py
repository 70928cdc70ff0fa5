"""The farm's GPUs over HTTP: GET /api/v1/hosts and its filters, /hosts/{name}/gpus,
/leases, /readyz's GPU figures and /metrics, on a store whose hosts are known exactly
(registered as workers register them: UP, DOWN, locked, with and without GPUs)."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apiclient import (
    GIB,
    MIB,
    Api,
    Server,
    check_problem,
    claim,
    create_token,
    device,
    job_spec,
    layer_spec,
    new_store,
    register_host,
)

API = "/api/v1"
A100 = "NVIDIA A100-SXM4-80GB"
RTX = "NVIDIA GeForce RTX 4090"
MI = "AMD Instinct MI210"
V100 = "Tesla V100-SXM2-16GB"


@dataclass
class Farm:
    db: Path
    server: Server
    api: Api
    job_id: int
    frame_id: int
    rtx_frame_id: int


@pytest.fixture(scope="module")
def farm(serve_dir: Path, serve_env: dict[str, str]):
    db = new_store(serve_dir / "store" / "cuectl.db")
    register_host(db, "gpu-a100", [device(0, "GPU-a100-0", A100, 80 * GIB), device(1, "GPU-a100-1", A100, 80 * GIB)])
    register_host(db, "gpu-4090", [device(0, "GPU-4090-0", RTX, 24564 * MIB)])  # a "24 GB" card
    register_host(db, "gpu-mi", [device(0, "GPU-mi-0", MI, 64 * GIB, vendor="AMD")], locked=True)
    register_host(db, "old-v100", [device(0, "GPU-v100-0", V100, 16160 * MIB)], age_s=3600)  # DOWN
    register_host(db, "cpu-only", [])
    token = create_token(db, "ops", "user", env=serve_env)
    server = Server(db, env=serve_env, log=serve_dir / "server.log", extra=("--cache", "0"))
    api = server.api.with_token(token)
    out = api.post(f"{API}/jobs", job_spec("farm", layer_spec("l", range="1-5", gpus=1, gpu_models=["A100"])))
    assert out.status == 201, out
    claimed = claim(db, out.json()["layers"][0]["id"], host="gpu-a100", gpu_uuids=("GPU-a100-1",))
    # A second RUNNING frame on another host: every holder counts, not only the first.
    rtx = api.post(f"{API}/jobs", job_spec("rtx", layer_spec("l", range="1", gpus=1, gpu_models=["RTX 4090"])))
    assert rtx.status == 201, rtx
    second = claim(db, rtx.json()["layers"][0]["id"], host="gpu-4090", gpu_uuids=("GPU-4090-0",))
    yield Farm(db, server, api, out.json()["id"], claimed.frame_id, second.frame_id)
    server.stop()


def hosts(farm: Farm, query: str = "") -> dict[str, list[str]]:
    """host name -> the uuids of its devices that passed the filter."""
    data = farm.api.ok("GET", f"{API}/hosts{query}")
    return {h["name"]: [d["uuid"] for d in h["devices"]] for h in data["hosts"]}


def test_hosts_with_their_devices_state_and_holders(farm):
    data = farm.api.ok("GET", f"{API}/hosts")
    assert data["at"].endswith("Z")
    by_name = {h["name"]: h for h in data["hosts"]}
    assert sorted(by_name) == ["cpu-only", "gpu-4090", "gpu-a100", "gpu-mi", "old-v100"]
    assert {n: (h["state"], h["locked"]) for n, h in by_name.items()} == {
        "cpu-only": ("UP", False),
        "gpu-4090": ("UP", False),
        "gpu-a100": ("UP", False),
        "gpu-mi": ("UP", True),
        "old-v100": ("DOWN", False),
    }
    a100 = by_name["gpu-a100"]
    assert a100["running"] == 1
    assert [(d["index"], d["uuid"], d["vendor"], d["model"], d["memory_total_bytes"]) for d in a100["devices"]] == [
        (0, "GPU-a100-0", "NVIDIA", A100, 80 * GIB),
        (1, "GPU-a100-1", "NVIDIA", A100, 80 * GIB),
    ]
    assert a100["devices"][0]["holder"] is None
    assert a100["devices"][1]["holder"]["kind"] == "frame" and a100["devices"][1]["holder"]["frame_id"] == farm.frame_id
    assert by_name["cpu-only"]["devices"] == []


@pytest.mark.parametrize(
    "query, expected",
    [
        ("?vendor=AMD", {"gpu-mi": ["GPU-mi-0"]}),
        (
            "?vendor=nvidia",
            {"gpu-a100": ["GPU-a100-0", "GPU-a100-1"], "gpu-4090": ["GPU-4090-0"], "old-v100": ["GPU-v100-0"]},
        ),
        ("?vendor=Intel", {}),
        ("?model=A100", {"gpu-a100": ["GPU-a100-0", "GPU-a100-1"]}),
        ("?model=a100", {"gpu-a100": ["GPU-a100-0", "GPU-a100-1"]}),
        ("?model=A10", {}),  # the scheduler's word rule: A10 is not an A100
        ("?model=rtx%204090", {"gpu-4090": ["GPU-4090-0"]}),
        ("?model=*4090*", {"gpu-4090": ["GPU-4090-0"]}),
        ("?model=Tesla*", {"old-v100": ["GPU-v100-0"]}),
        (
            "?gpu_memory_min=24G",
            {"gpu-a100": ["GPU-a100-0", "GPU-a100-1"], "gpu-4090": ["GPU-4090-0"], "gpu-mi": ["GPU-mi-0"]},
        ),  # 24564 MiB rounds to 24 GiB, as for the scheduler
        ("?gpu_memory_min=40000", {"gpu-a100": ["GPU-a100-0", "GPU-a100-1"], "gpu-mi": ["GPU-mi-0"]}),  # MiB
        ("?gpu_memory_min=100GiB", {}),
        ("?state=DOWN", {"old-v100": ["GPU-v100-0"]}),
        (
            "?state=up",
            {
                "cpu-only": [],
                "gpu-4090": ["GPU-4090-0"],
                "gpu-a100": ["GPU-a100-0", "GPU-a100-1"],
                "gpu-mi": ["GPU-mi-0"],
            },
        ),
        (
            "?vendor=NVIDIA&gpu_memory_min=20G&state=UP",
            {"gpu-a100": ["GPU-a100-0", "GPU-a100-1"], "gpu-4090": ["GPU-4090-0"]},
        ),
    ],
)
def test_host_filters(farm, query, expected):
    assert hosts(farm, query) == expected


def test_one_hosts_gpus(farm):
    data = farm.api.ok("GET", f"{API}/hosts/gpu-a100/gpus")
    assert (data["host"], data["state"], data["locked"]) == ("gpu-a100", "UP", False)
    assert [(g["uuid"], g["model"], (g["holder"] or {}).get("frame_id")) for g in data["gpus"]] == [
        ("GPU-a100-0", A100, None),
        ("GPU-a100-1", A100, farm.frame_id),
    ]
    assert farm.api.ok("GET", f"{API}/hosts/gpu-mi/gpus")["locked"] is True
    assert farm.api.ok("GET", f"{API}/hosts/cpu-only/gpus")["gpus"] == []
    check_problem(farm.api.get(f"{API}/hosts/gpu-a1000/gpus"), 404, detail="gpu-a1000")


def test_leases_are_the_devices_held_now(farm):
    data = farm.api.ok("GET", f"{API}/leases")
    assert data["leases"] == [
        {
            "host": "gpu-4090",
            "uuid": "GPU-4090-0",
            "index": 0,
            "model": RTX,
            "kind": "frame",
            "frame_id": farm.rtx_frame_id,
            "label": "rtx/0001-l",
            "pid": None,
            "user": None,
        },
        {
            "host": "gpu-a100",
            "uuid": "GPU-a100-1",
            "index": 1,
            "model": A100,
            "kind": "frame",
            "frame_id": farm.frame_id,
            "label": "farm/0001-l",
            "pid": None,
            "user": None,
        },
    ]


def test_readyz_counts_gpus(farm):
    data = farm.server.api.ok("GET", "/readyz")  # a health check: no token needed
    # 5 devices, each counted once; an A100 and the 4090 are held by RUNNING frames; free:
    # the other A100 (the MI210's host is locked, the V100's is DOWN).
    assert data == {
        "status": "ready",
        "gpus": {"total": 5, "leased": 2, "foreign_busy": 0, "available": 1, "unavailable": 2, "active_jobs": 2},
        "active_jobs": 2,
    }


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics(farm):
    check_problem(farm.server.api.get("/metrics"), 401)
    resp = farm.api.get("/metrics")
    assert resp.status == 200 and resp.content_type == "text/plain", resp
    samples = _samples(resp.text)
    conn = sqlite3.connect(farm.db)
    counts = dict(conn.execute("SELECT state, COUNT(*) FROM frames GROUP BY state").fetchall())
    conn.close()
    assert counts == {"WAITING": 4, "RUNNING": 2}
    for state in ("WAITING", "RUNNING", "DEPEND", "SUCCEEDED", "DEAD", "EATEN"):
        assert samples[("cuectl_frames", (("state", state),))] == counts.get(state, 0), state
    assert samples[("cuectl_jobs_active", ())] == 2
    assert samples[("cuectl_queue_depth", (("job_id", str(farm.job_id)), ("job_name", "farm"), ("layer", "l")))] == 4
    assert samples[("cuectl_host_up", (("host", "gpu-a100"),))] == 1
    assert samples[("cuectl_host_up", (("host", "old-v100"),))] == 0
    a100 = (("host", "gpu-a100"), ("index", "1"), ("model", A100), ("uuid", "GPU-a100-1"))
    assert samples[("cuectl_gpu_memory_total_bytes", a100)] == 80 * GIB
    assert samples[("cuectl_gpu_held", tuple(sorted((*a100, ("kind", "frame")))))] == 1
    assert samples[("cuectl_leases_held", (("kind", "frame"),))] == 2


def test_hosts_seen_from_a_heartbeat_are_live(farm):
    """A worker's heartbeat carries live values: the host list shows them per device."""
    from cuectl.sched.store import open_store

    store = open_store(str(farm.db))
    try:
        live: dict[str, Any] = {
            "at": time.time(),
            "devices": [{"uuid": "GPU-4090-0", "utilization_pct": 4.0, "memory_used_bytes": 200 * MIB}],
        }
        store.heartbeat("gpu-4090", [farm.rtx_frame_id], now=time.time(), lease_s=600, live=live)
    finally:
        store.close()
    (dev,) = farm.api.ok("GET", f"{API}/hosts/gpu-4090/gpus")["gpus"]
    assert (dev["utilization_pct"], dev["memory_used_bytes"]) == (4.0, 200 * MIB)
    assert (dev["holder"]["kind"], dev["holder"]["frame_id"]) == ("frame", farm.rtx_frame_id)
