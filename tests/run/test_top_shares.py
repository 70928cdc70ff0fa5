"""`cuectl top` (and the API's hosts, the web pages, /metrics, all from top.snapshot) names
who holds a device shared by memory budget (issue 39 §5): its ledger's shares, not "free"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

import cuectl
from cuectl import top
from cuectl.gpu import discover
from cuectl.run import lease as leases
from cuectl.sched.store import HostInfo, open_store


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        yaml.safe_dump({"host": "top-share", "devices": [{"model": "NVIDIA A100 32GB", "memory": "32GiB"}]})
    )
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    leases.forget_discovery()
    return path


def test_a_shared_device_is_held_by_its_shares(fake, tmp_path):
    (device,) = discover().devices
    store = open_store(str(tmp_path / "s.db"))
    store.register_host(
        HostInfo(name="top-share", cores=4, memory_bytes=1 << 34, gpus=[device.to_json()]), now=time.time()
    )
    lock_dir = Path(__import__("os").environ["CUECTL_LOCK_DIR"])
    try:
        (d,) = top.snapshot(store, lock_dir=lock_dir)["hosts"][0]["devices"]
        assert d["holder"] is None
        with cuectl.lease(gpu_share="4G", label="eval-a"), cuectl.lease(gpu_share="4G", label="eval-b"):
            (d,) = top.snapshot(store, lock_dir=lock_dir)["hosts"][0]["devices"]
            assert d["holder"]["label"] in ("eval-a and 1 more share", "eval-b and 1 more share"), d["holder"]
        with cuectl.lease(gpu_share="4G", label="eval-c"):
            (d,) = top.snapshot(store, lock_dir=lock_dir)["hosts"][0]["devices"]
            assert d["holder"]["label"] == "eval-c (a share)", d["holder"]
    finally:
        store.close()
