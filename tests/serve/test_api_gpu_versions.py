"""Compute capability, driver and CUDA minimums over HTTP (issue 39 §4): POST /api/v1/jobs
takes the spec keys and keeps them, malformed versions are 422 naming the key, and
GET /api/v1/hosts filters devices by them, numerically (8.9 < 8.10)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from apiclient import GIB, Server, check_problem, create_token, job_spec, layer_spec, new_store, register_host

from cuectl.gpu.device import Device

API = "/api/v1"


def _device(index: int, uuid: str, model: str, cc: str | None, driver: str | None, cuda: str | None) -> dict[str, Any]:
    base = Device(index=index, uuid=uuid, vendor="NVIDIA", model=model, backend="fake", memory_total_bytes=48 * GIB)
    return replace(base, compute_capability=cc, driver_version=driver, cuda_version=cuda).to_json()


@pytest.fixture(scope="module")
def api(serve_dir: Path, serve_env: dict[str, str]):
    db = new_store(serve_dir / "store" / "cuectl.db")
    register_host(db, "old", [_device(0, "GPU-old", "Tesla V100", "7.0", "535.104.05", "12.2")])
    register_host(db, "new", [_device(0, "GPU-new", "NVIDIA L40S", "8.9", "550.54.15", "12.4")])
    register_host(
        db,
        "amd",
        [replace(Device(0, "GPU-mi", "AMD", "AMD Instinct MI210", "fake"), compute_capability="gfx90a").to_json()],
    )
    token = create_token(db, "ops", "user", env=serve_env)
    server = Server(db, env=serve_env, log=serve_dir / "server.log", extra=("--cache", "0"))
    yield server.api.with_token(token)
    server.stop()


@pytest.mark.parametrize(
    "query, hosts",
    [
        ("?gpu_capability_min=8.0", {"new"}),
        ("?gpu_capability_min=8.10", set()),  # 8.9 < 8.10: numbers, not text
        ("?gpu_capability_min=7", {"old", "new"}),  # gfx90a is no CUDA capability
        ("?gpu_driver_min=535.104.05", {"old", "new"}),
        ("?gpu_driver_min=550", {"new"}),
        ("?gpu_cuda_min=12.3", {"new"}),
        ("?gpu_cuda_min=12.2&gpu_driver_min=536", {"new"}),
    ],
)
def test_hosts_filter_by_version_minimums(api, query: str, hosts: set[str]):
    res = api.get(f"{API}/hosts{query}")
    assert res.status == 200, res
    got = res.json()["hosts"]
    assert {h["name"] for h in got} == hosts
    for h in got:
        assert all(d["cuda_version"] for d in h["devices"]), h


def test_malformed_version_filter_is_422(api):
    check_problem(api.get(f"{API}/hosts?gpu_cuda_min=twelve"), 422, field="gpu_cuda_min", detail="invalid version")


def test_jobs_take_and_keep_version_minimums(api):
    layer = layer_spec("l", gpus=1, gpu_capability_min="8.10", gpu_driver_min="535.104.05", gpu_cuda_min=12.2)
    out = api.post(f"{API}/jobs", job_spec("versions", layer))
    assert out.status == 201, out
    shown = out.json()["layers"][0]
    assert (shown["gpu_capability_min"], shown["gpu_driver_min"], shown["gpu_cuda_min"]) == (
        "8.10",
        "535.104.05",
        "12.2",
    )
    bad = api.post(f"{API}/jobs", job_spec("bad", layer_spec("l", gpus=1, gpu_driver_min="5.x")))
    check_problem(bad, 422, detail="gpu_driver_min: invalid version '5.x'")
    cpu = api.post(f"{API}/jobs", job_spec("cpu", layer_spec("l", gpu_cuda_min="12")))
    check_problem(cpu, 422, detail="only applies to GPU requests")
