"""Compute capability, driver and CUDA minimums on ad-hoc leases (issue 39 §4): `cuectl run`
(both the console script's fast path and typer's) and `cuectl.lease()` take the devices
that meet them, compared numerically, refuse a minimum no device here meets, and refuse
malformed versions as input errors (exit 2) naming the flag or keyword."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cuectl
from cuectl.errors import InvalidInput, NoMatchingDevice

from .conftest import make_fake_host

OLD = {
    "model": "Tesla V100-SXM2-16GB",
    "memory": "16160MiB",
    "compute_capability": "7.0",
    "driver_version": "535.104.05",
    "cuda_version": "12.2",
}
NEW = {
    "model": "NVIDIA L40S",
    "memory": "46068MiB",
    "compute_capability": "8.9",
    "driver_version": "550.54.15",
    "cuda_version": "12.4",
}
SHOW = "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])"


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    fake = make_fake_host(tmp_path, [OLD, NEW])
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(fake.yaml_path))
    return fake


def _cuectl(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("cuectl")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("debug", [(), ("--debug",)], ids=["fast-path", "typer"])
def test_run_takes_the_device_that_meets_the_minimum(host, debug):
    out = _cuectl(*debug, "run", "--gpu-capability-min", "8.9", "--no-wait", "--", sys.executable, "-c", SHOW)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == host.uuids[1]
    out = _cuectl(*debug, "run", "--gpu-driver-min", "535.104.5", "--gpus", "2", "--", sys.executable, "-c", SHOW)
    assert out.returncode == 0, out.stderr  # 535.104.05 == 535.104.5: numbers
    out = _cuectl(*debug, "run", "--gpu-cuda-min", "12.10", "--no-wait", "--", "true")
    assert out.returncode != 0 and "CUDA >= 12.10" in out.stderr, out.stderr
    out = _cuectl(*debug, "run", "--gpu-cuda-min", "12.x", "--", "true")
    assert out.returncode == 2 and "--gpu-cuda-min: invalid version '12.x'" in out.stderr, out.stderr


def test_lease_keywords(host):
    with cuectl.lease(gpu_cuda_min="12.3", gpu_driver_min=550) as lease:
        assert [d.uuid for d in lease.devices] == [host.uuids[1]]
    with cuectl.lease(gpu_capability_min=7.0) as lease:  # the smallest that meets it
        assert [d.uuid for d in lease.devices] == [host.uuids[0]]
    with pytest.raises(NoMatchingDevice, match=r"compute capability >= 9\.0"):
        cuectl.lease(gpu_capability_min="9.0")
    with pytest.raises(InvalidInput, match=r"^gpu_driver_min: invalid version '550\.x'"):
        cuectl.lease(gpu_driver_min="550.x")
    with pytest.raises(InvalidInput, match=r"^gpu_cuda_min: only applies to GPU requests"):
        cuectl.lease(0, gpu_cuda_min="12")
