"""A store with known accounting figures, built through the real store API (submit, claim,
complete, reap), so the numbers in the tests can be worked out by hand.

Window used by most tests: [T0, T0 + 1 h) with T0 = 2024-03-01T00:00:00Z.

job 1 "train"  alice  layer fit     gpus 1, cores 2, retries 1   (submitted T0)
  frame 1 attempt 1  h1 GPU-a A100  T0+10..T0+110  ok      alloc 100 busy 50 util 55 peak 4 GiB
  frame 2 attempt 1  h1 GPU-b A100  T0+20..T0+70   exit 1  alloc 50  busy 10 util 20 peak 2 GiB  -> WAITING
  frame 2 attempt 2  h2 GPU-c V100  T0+100..T0+130 exit 1  alloc 30  busy 0  util 0  peak 1 GiB  -> DEAD
job 2 "mixed"  alice  layer sim     gpus 2, cores 1              (submitted T0+5)
  frame 1 attempt 1  h2 GPU-c+GPU-d A100+V100  T0+45..T0+65 ok  alloc 40 busy 30 util 75 peak 8 GiB
job 3 "comp"   bob    layer beauty  CPU, cores 4                 (submitted T0)
  frame 1 attempt 1  h3  T0+60..T0+120 ok;  frame 2 attempt 1  h3  T0+90..T0+150 ok
job 4 "flaky"  bob    layer gpu     gpus 1, cores 1, retries 0   (submitted T0+100)
  frame 1 attempt 1  h1 GPU-e  claimed T0+200, never reported, reaped T0+300 -> lost, DEAD
job 5 "old"    carol  CPU: ended T0-3000 (2024-02-29, before the window)
job 6 "late"   carol  CPU: ended T0+3600 (the window's exclusive end)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, open_store

sys.path.insert(0, str(Path(__file__).parent))  # promtext.py, as tests/worker does for farmlib

T0 = 1709251200.0  # 2024-03-01T00:00:00Z
GIB = 1024**3
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"


def _spec(name: str, user: str, layer: dict[str, Any]):
    return spec_from_mapping({"name": name, "layers": [{"command": ["true"], **layer}]}, user=user)


def _usage(util: float, alloc: float, busy: float, peak: int, models: list[str]) -> dict[str, Any]:
    return {
        "gpu_util_mean_pct": util,
        "gpu_util_max_pct": util,
        "gpu_seconds": alloc,
        "gpu_busy_seconds": busy,
        "gpu_memory_peak_bytes": peak,
        "gpu_models": models,
    }


@dataclass
class Farm:
    store: Any

    def claim(self, job_id: int, *, host: str, uuids: list[str], at: float, lease_s: float = 3600.0):
        layer = next(layer for layer in self.store.runnable_layers() if layer.job_id == job_id)
        claimed = self.store.claim_frame(
            layer.layer_id, host=host, worker=f"{host}-w", gpu_uuids=uuids, now=at, lease_s=lease_s
        )
        assert claimed is not None
        return claimed

    def complete(
        self, claimed, *, start: float, end: float, code: int = 0, usage: dict[str, Any] | None = None
    ) -> str | None:
        return self.store.complete_frame(
            claimed.frame_id,
            claimed.attempt,
            FrameResult(exit_code=code, started_at=start, ended_at=end, usage=usage or {}),
            now=end,
        )


def build_known_store(path: Path) -> None:
    store = open_store(str(path))
    farm = Farm(store)
    try:
        train = store.submit(
            _spec("train", "alice", {"name": "fit", "range": "1-2", "gpus": 1, "cores": 2, "retries": 1}), now=T0
        )
        mixed = store.submit(_spec("mixed", "alice", {"name": "sim", "range": "1", "gpus": 2, "cores": 1}), now=T0 + 5)
        comp = store.submit(_spec("comp", "bob", {"name": "beauty", "range": "1-2", "cores": 4}), now=T0)
        flaky = store.submit(
            _spec("flaky", "bob", {"name": "gpu", "range": "1", "gpus": 1, "cores": 1, "retries": 0}), now=T0 + 100
        )
        old = store.submit(_spec("old", "carol", {"name": "x", "range": "1"}), now=T0 - 7200)
        late = store.submit(_spec("late", "carol", {"name": "x", "range": "1"}), now=T0)
        assert (train, mixed, comp, flaky, old, late) == (1, 2, 3, 4, 5, 6)

        f1 = farm.claim(train, host="h1", uuids=["GPU-a"], at=T0 + 10)
        f2 = farm.claim(train, host="h1", uuids=["GPU-b"], at=T0 + 20)
        assert (
            farm.complete(f2, start=T0 + 20, end=T0 + 70, code=1, usage=_usage(20, 50, 10, 2 * GIB, [A100]))
            == "WAITING"
        )
        f2b = farm.claim(train, host="h2", uuids=["GPU-c"], at=T0 + 100)
        assert f2b.attempt == 2
        assert farm.complete(f1, start=T0 + 10, end=T0 + 110, usage=_usage(55, 100, 50, 4 * GIB, [A100])) == "SUCCEEDED"
        assert (
            farm.complete(f2b, start=T0 + 100, end=T0 + 130, code=1, usage=_usage(0, 30, 0, 1 * GIB, [V100])) == "DEAD"
        )

        m1 = farm.claim(mixed, host="h2", uuids=["GPU-c", "GPU-d"], at=T0 + 45)
        farm.complete(m1, start=T0 + 45, end=T0 + 65, usage=_usage(75, 40, 30, 8 * GIB, [A100, V100]))

        c1 = farm.claim(comp, host="h3", uuids=[], at=T0 + 60)
        c2 = farm.claim(comp, host="h3", uuids=[], at=T0 + 90)
        farm.complete(c1, start=T0 + 60, end=T0 + 120)
        farm.complete(c2, start=T0 + 90, end=T0 + 150)

        farm.claim(flaky, host="h1", uuids=["GPU-e"], at=T0 + 200, lease_s=50)
        assert len(store.reap(now=T0 + 300)) == 1  # lease expired at T0+250: lost, no retries left -> DEAD

        o1 = farm.claim(old, host="h3", uuids=[], at=T0 - 3600)
        farm.complete(o1, start=T0 - 3600, end=T0 - 3000)
        l1 = farm.claim(late, host="h3", uuids=[], at=T0 + 3000)
        farm.complete(l1, start=T0 + 3000, end=T0 + 3600)
    finally:
        store.close()


@pytest.fixture
def known_store(db_path: Path) -> Path:
    """The store above at the ``cli`` fixture's path."""
    build_known_store(db_path)
    return db_path
