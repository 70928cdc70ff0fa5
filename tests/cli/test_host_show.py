"""`cuectl host show` of hosts registered by a real worker: a host without GPUs says so
instead of printing an empty device table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def register(db: Path, fake: Path) -> None:
    """Run a real worker once (`--until-idle` on an empty queue): it registers its host."""
    exe = Path(sys.executable).with_name("cuectl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]
    env = dict(os.environ, CUECTL_FAKE_GPUS=str(fake))
    res = subprocess.run(
        [*cmd, "--db", str(db), "worker", "--until-idle", "--poll", "0.05"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr


def test_host_without_gpus_says_no_gpus(cli, db_path: Path, fake_gpus) -> None:
    register(db_path, fake_gpus([], host="cpu-01"))
    res = cli("host", "show", "cpu-01")
    assert res.exit_code == 0, res
    lines = res.stdout.splitlines()
    assert "no GPUs" in lines
    assert not any(ln.startswith("IDX") for ln in lines), "no empty device table"
    assert cli("host", "show", "cpu-01", "--json").json()["gpus"] == []


def test_host_with_gpus_still_gets_its_table(cli, db_path: Path, fake_gpus) -> None:
    register(db_path, fake_gpus([{"model": "Tesla T4", "memory": "15360MiB"}], host="gpu-01"))
    lines = cli("host", "show", "gpu-01").stdout.splitlines()
    assert lines[lines.index("IDX\tUUID\tVENDOR\tMODEL\tMEMORY\tFREE\tUTIL\tSAMPLED") + 1].split("\t")[3] == "Tesla T4"
    assert "no GPUs" not in lines


def test_an_old_sample_is_not_shown_as_current(cli, db_path: Path) -> None:
    """Values older than two of the worker's sampling intervals show as unknown, with their
    age; a current one shows its values (issue 41 §2)."""
    from cuectl.sched.store import HostInfo, open_store

    gib = 1024**3
    store = open_store(str(db_path))
    try:
        now = store.clock()
        gpus = [
            {
                "index": i,
                "uuid": f"GPU-{i}",
                "vendor": "NVIDIA",
                "model": "Tesla T4",
                "backend": "fake",
                "memory_total_bytes": 16 * gib,
                "memory_free_bytes": 16 * gib,
            }
            for i in range(2)
        ]
        store.register_host(HostInfo(name="gpu-02", cores=8, memory_bytes=64 * gib, gpus=gpus), now=now)
        store.heartbeat(
            "gpu-02",
            [],
            now=now,
            lease_s=60.0,
            live={
                "at": now,
                "sample_interval_s": 10.0,
                "devices": [
                    {"uuid": "GPU-0", "utilization_pct": 55.0, "memory_free_bytes": 4 * gib, "sampled_at": now - 2},
                    {"uuid": "GPU-1", "utilization_pct": 66.0, "memory_free_bytes": 5 * gib, "sampled_at": now - 300},
                ],
            },
        )
    finally:
        store.close()
    lines = cli("host", "show", "gpu-02").stdout.splitlines()
    start = lines.index("IDX\tUUID\tVENDOR\tMODEL\tMEMORY\tFREE\tUTIL\tSAMPLED")
    fresh, stale = (line.split("\t") for line in lines[start + 1 : start + 3])
    assert fresh[5:7] == ["4.0 GiB", "55.0"] and fresh[7].endswith(" ago"), fresh
    assert stale[5:7] == ["-", "-"] and stale[7].startswith("5m") and stale[7].endswith(" ago (stale)"), stale
