"""`cuectl host forget HOST` (issue 17): a dead host and its GPUs leave the store; an UP host
or one with RUNNING frames only with --force, which requeues those frames as lost."""

from __future__ import annotations

import time
from pathlib import Path

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import HostInfo, open_store

GPU = {
    "index": 0,
    "uuid": "GPU-a",
    "vendor": "NVIDIA",
    "model": "Tesla T4",
    "backend": "fake",
    "memory_total_bytes": 15360 * 1024**2,
}


def register(db: Path, name: str, *, ago: float, gpus=(GPU,)) -> None:
    store = open_store(str(db))
    try:
        store.register_host(HostInfo(name=name, cores=4, memory_bytes=1 << 33, gpus=list(gpus)), now=time.time() - ago)
    finally:
        store.close()


def run_on(db: Path, host: str) -> int:
    """Submit a one-frame job and claim it on ``host``: a RUNNING frame there."""
    store = open_store(str(db))
    try:
        store.submit(
            spec_from_mapping(
                {"name": "r", "layers": [{"name": "a", "command": ["true"], "retries": 2}]}, user="alice"
            ),
            now=time.time(),
        )
        layer = store.runnable_layers()[0]
        claimed = store.claim_frame(
            layer.layer_id, host=host, worker=f"{host}-w", gpu_uuids=["GPU-a"], now=time.time(), lease_s=600
        )
        assert claimed is not None
        return claimed.frame_id
    finally:
        store.close()


def hosts(cli) -> list[str]:
    return [h["name"] for h in cli("host", "list", "--json").json()["hosts"]]


def refused(res) -> None:
    assert res.exit_code == 1, res
    lines = res.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    assert "--force" in lines[1]


def test_a_down_idle_host_is_forgotten_with_its_gpus(cli, db_path: Path) -> None:
    register(db_path, "dead-01", ago=3600)
    register(db_path, "live-01", ago=0, gpus=())
    res = cli("host", "forget", "dead-01")
    assert res.exit_code == 0, res
    assert res.stdout == "forgot host dead-01 (DOWN, 1 GPU(s))\n"
    assert hosts(cli) == ["live-01"]
    assert "GPU-a" not in cli("host", "list", "--json").stdout  # its GPUs went with it
    res = cli("host", "show", "dead-01")
    assert res.exit_code == 1 and "no host 'dead-01'" in res.stderr


def test_json_shape(cli, db_path: Path) -> None:
    register(db_path, "dead-01", ago=3600)
    data = cli("host", "forget", "dead-01", "--json").json()
    assert set(data) == {"name", "state", "last_heartbeat", "gpus", "requeued"}
    assert (data["name"], data["state"], data["gpus"], data["requeued"]) == ("dead-01", "DOWN", ["GPU-a"], [])
    assert data["last_heartbeat"].endswith("Z")


def test_an_up_host_is_refused_without_force(cli, db_path: Path) -> None:
    register(db_path, "live-01", ago=0)
    res = cli("host", "forget", "live-01")
    refused(res)
    assert "is UP" in res.stderr
    assert hosts(cli) == ["live-01"]
    res = cli("host", "forget", "live-01", "--force")
    assert res.exit_code == 0, res
    assert hosts(cli) == []


def test_running_frames_refuse_and_force_requeues_them_as_lost(cli, db_path: Path) -> None:
    register(db_path, "dead-01", ago=3600)
    frame_id = run_on(db_path, "dead-01")
    res = cli("host", "forget", "dead-01")
    refused(res)
    assert "1 frame(s) are RUNNING" in res.stderr
    assert cli("frame", "show", str(frame_id), "--json").json()["state"] == "RUNNING"
    data = cli("host", "forget", "dead-01", "--force", "--json").json()
    assert data["requeued"] == [frame_id] and data["state"] == "DOWN"
    frame = cli("frame", "show", str(frame_id), "--json").json()
    assert frame["state"] == "WAITING"
    assert [a["outcome"] for a in frame["attempt_history"]] == ["lost"]
    assert hosts(cli) == []


def test_unknown_host_is_not_found(cli, db_path: Path) -> None:
    register(db_path, "other", ago=0)
    res = cli("host", "forget", "nope")
    assert res.exit_code == 1
    assert res.stderr.startswith("error: no host 'nope'")
