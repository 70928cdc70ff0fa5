"""scripts/gpu-e2e.sh and scripts/gpu_e2e.py (docs/gpu-setup.md, "Checking a real GPU
machine"): the real-GPU end-to-end checks, run here in their ``--fake`` mode against fake
GPUs and a fake ``nvidia-smi`` built from the real nvidia-smi fixtures. The shell entry
point runs once, offline (pip with --no-index), with this venv's interpreter; the other
tests call the Python script or its check functions directly."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_e2e.py"
SHELL = REPO / "scripts" / "gpu-e2e.sh"
ALL_CHECKS = ["inventory", "isolation", "overlap", "usage", "run-lease", "share", "escape", "idle", "mig"]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_e2e", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_e2e"] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


e2e = _load()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUECTL_")}
    env["PIP_NO_INDEX"] = "1"  # never the network, whatever the script does
    return env


def _rows(path: Path) -> dict[str, dict[str, str]]:
    data = json.loads(path.read_text())
    return {r["name"]: r for r in data["results"]}


def test_shell_entry_point_fake_mode_passes(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {**_env(), "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    res = subprocess.run(
        ["bash", str(SHELL), "--fake", "--json", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = _rows(out)
    assert list(rows) == ALL_CHECKS
    for name in ALL_CHECKS[:-1]:
        assert rows[name]["status"] == "PASS", rows[name]
    assert rows["mig"]["status"] == "SKIP"
    assert "MIG not enabled" in rows["mig"]["detail"]
    # the printed table: one row per check, and the summary line
    for name in ALL_CHECKS:
        assert any(
            line.startswith(name + " ") and ("PASS" in line or "SKIP" in line) for line in res.stdout.splitlines()
        ), res.stdout
    assert "gpu-e2e: OK: 8 passed, 0 failed, 1 skipped" in res.stdout
    # the shell installed cuectl offline into a temporary place it removed afterwards
    assert "installing cuectl from" in res.stderr
    assert not list(tmp_path.glob("cuectl-gpu-e2e-*"))
    # the usage check saw the busy frame through the worker's sampling
    assert "peak 4.00 GiB vs allocated 4.00 GiB" in rows["usage"]["detail"]


def test_fake_mig_instances_are_listed_and_leasable(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "--fake-mig", "--only", "inventory,isolation,mig", "--json", str(out)],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    rows = _rows(out)
    assert {n: r["status"] for n, r in rows.items()} == {"inventory": "PASS", "isolation": "PASS", "mig": "PASS"}
    assert "4 MIG instance(s)" in rows["mig"]["detail"]
    assert "CUDA_VISIBLE_DEVICES=MIG-" in rows["mig"]["detail"]


def test_a_cuda_numbering_that_is_not_cuectls_fails_isolation(tmp_path: Path) -> None:
    """The simulated CUDA numbers devices in reverse PCI order: index 0 is then the other
    card, so the frame's device is not its lease, and the check must say so."""
    out = tmp_path / "results.json"
    res = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--fake",
            "--only",
            "isolation",
            "--fake-cuda-order",
            "reversed",
            "--json",
            str(out),
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    row = _rows(out)["isolation"]
    assert row["status"] == "FAIL"
    assert "CUDA device 0 is GPU-" in row["detail"] and "the lease is GPU-" in row["detail"]
    assert "gpu-e2e: FAILED: 0 passed, 1 failed, 0 skipped" in res.stdout


def _fake_ctx(tmp_path: Path) -> object:
    args = argparse.Namespace(
        fake=True,
        fake_mig=False,
        fake_cuda_order="pci",
        fixtures=None,
        alloc_gib=1.0,
        cuda_lib="auto",
        busy_seconds=1.0,
    )
    return e2e.make_ctx(args, tmp_path / "ctx")


def test_inventory_disagreement_fails(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    ctx = _fake_ctx(tmp_path)
    assert e2e.check_inventory(ctx).status == "PASS"
    query = tmp_path / "ctx" / "fake-smi-query.txt"
    query.write_text(query.read_text().replace("143771", "143000"))
    r = e2e.check_inventory(ctx)
    assert r.status == "FAIL"
    assert "memory cuectl=143771 MiB nvidia-smi=143000 MiB" in r.detail


def test_judges_catch_a_leaky_view() -> None:
    leased = ["GPU-00000000-0000-0000-0000-000000000001"]
    good = {
        "env": {"NVIDIA_VISIBLE_DEVICES": leased[0]},
        "cuda_count": 1,
        "cuda_uuid": "00000000-0000-0000-0000-000000000001",
        "errors": [],
    }
    assert e2e.judge_gpu_view(good, leased) == []
    two = {**good, "cuda_count": 2}
    assert "CUDA sees 2 devices, expected 1" in e2e.judge_gpu_view(two, leased)
    cpu_leak = {"env": {"NVIDIA_VISIBLE_DEVICES": "all"}, "cuda_count": 1, "errors": []}
    problems = e2e.judge_cpu_view(cpu_leak)
    assert any("sees 1 CUDA devices" in p for p in problems)
    assert any("NVIDIA_VISIBLE_DEVICES=all" in p for p in problems)


@pytest.mark.parametrize(
    "raw",
    [
        bytes.fromhex("abcdef0123456789abcdef0123456789"),  # cuDeviceGetUuid's 16 bytes
        "GPU-ABCDEF01-2345-6789-abcd-ef0123456789",  # NVML / nvidia-smi
        "MIG-abcdef01-2345-6789-abcd-ef0123456789",
        "abcdef01-2345-6789-abcd-ef0123456789",  # torch's uuid
    ],
)
def test_uuid_normalisation(raw: object) -> None:
    assert e2e._uuid_text(raw) == "abcdef01-2345-6789-abcd-ef0123456789"


def test_nvidia_smi_bus_ids_normalise_to_nvmls() -> None:
    assert e2e._norm_bus("00000000:83:00.0") == "0000:83:00.0"
    assert e2e._norm_bus("0000:1A:00.0") == "0000:1a:00.0"
