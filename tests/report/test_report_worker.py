"""End to end: a real `cuectl worker` runs GPU frames on fake devices that report 50 %
utilisation and 1 GiB in use; its samples go through the store into the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

GIB = 1024**3
V100 = {"model": "Tesla V100-SXM2-16GB", "vendor": "NVIDIA", "memory": "16160MiB"}
A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}


def test_worker_usage_reaches_the_report(cli, db_path: Path, tmp_path: Path):
    state = tmp_path / "gpu-state"
    state.mkdir()
    for index in (0, 1):
        (state / f"{index}.json").write_text(json.dumps({"utilization_pct": 50, "memory_used_bytes": GIB}))
    fake = tmp_path / "gpus.yaml"
    fake.write_text(yaml.safe_dump({"host": "render-01", "state_dir": str(state), "devices": [V100, A100]}))
    res = cli(
        "submit",
        "--name",
        "shot",
        "--range",
        "1-4",
        "--gpus",
        "1",
        "--cores",
        "1",
        "--",
        sys.executable,
        "-c",
        "import time; time.sleep(0.5)",
    )
    assert res.exit_code == 0, res
    worker = subprocess.run(
        [
            *_cuectl(),
            "--db",
            str(db_path),
            "worker",
            "--until-idle",
            "--poll",
            "0.05",
            "--lease-timeout",
            "5",
            "--sample-interval",
            "0.1",
            "--quiet",
        ],
        env={**_env(), "CUECTL_FAKE_GPUS": str(fake)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 0, worker.stderr

    res = cli("admin", "report", "--since", "1h", "--by", "job", "--json")
    assert res.exit_code == 0, res
    (row,) = res.json()["rows"]
    assert (row["group"], row["frames"], row["succeeded"], row["dead"], row["retries"]) == ("1 shot", 4, 4, 0, 0)
    assert 4 * 0.5 <= row["wall_seconds"] < 4 * 3.0
    assert abs(row["gpu_seconds_allocated"] - row["wall_seconds"]) < 0.05  # one device per frame
    assert 45 <= row["gpu_efficiency_pct"] <= 51, row  # the fake cards are busy 50 % of the time
    assert row["gpu_util_mean_pct"] == 50.0
    assert row["gpu_memory_peak_bytes"] == GIB
    assert row["wait_p50_s"] is not None and row["wait_p95_s"] >= row["wait_p50_s"]

    by_model = {
        r["group"]: r for r in cli("admin", "report", "--since", "1h", "--by", "gpu-model", "--json").json()["rows"]
    }
    assert set(by_model) <= {V100["model"], A100["model"]} and sum(r["frames"] for r in by_model.values()) == 4
    assert {r["gpu_memory_peak_bytes"] for r in by_model.values()} == {GIB}

    prom = cli("admin", "report", "--since", "1h", "--by", "host", "--format", "prometheus").stdout
    assert 'cuectl_report_gpu_memory_peak_bytes{by="host",group="render-01"} 1073741824\n' in prom
    assert 'cuectl_report_gpu_utilization_mean_ratio{by="host",group="render-01"} 0.5\n' in prom


def _cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("CUECTL_FAKE_GPUS", None)
    return env
