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
    res = subprocess.run([*cmd, "--db", str(db), "worker", "--until-idle", "--poll", "0.05"], capture_output=True,
                         text=True, env=env, timeout=120)
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
    assert lines[lines.index("IDX\tUUID\tVENDOR\tMODEL\tMEMORY\tFREE\tUTIL") + 1].split("\t")[3] == "Tesla T4"
    assert "no GPUs" not in lines
