"""``cuectl gpu list`` and the doctor lines, through typer's CliRunner on the sub-app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gpu_support import Out, StubTools, fixture_path
from typer.testing import CliRunner

from cuectl.cli.gpu_cmd import app, doctor_lines, short_uuid
from cuectl.errors import InvalidInput

runner = CliRunner()
FAKE = """\
host: render-01
state_dir: state
devices:
  - model: "Tesla V100-SXM2-16GB"
    vendor: NVIDIA
    memory: 16160MiB
    uuid: GPU-11111111-0000-0000-0000-000000000001
  - model: "NVIDIA A100-SXM4-80GB"
    memory: 80GiB
"""


@pytest.fixture
def fake_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "gpus.yaml"
    path.write_text(FAKE)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "1.json").write_text('{"utilization_pct": 73, "memory_used_bytes": 5368709120}')
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    return path


def test_list_json_shape(fake_env: Path) -> None:
    result = runner.invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    # host and states_unknown: each device's state comes from the store of this machine's
    # host (docs/gpu-health.md); run without one here, every device is ok and it says why.
    assert set(doc) == {"devices", "backends", "host", "states_unknown"}
    assert doc["states_unknown"] == "no store"
    assert [(d["state"], d["reason"]) for d in doc["devices"]] == [("ok", None), ("ok", None)]
    assert doc["backends"] == [{"name": "fake", "ok": True, "error": None, "hint": None}]
    first, second = doc["devices"]
    for key in (
        "index",
        "uuid",
        "vendor",
        "model",
        "memory_total_bytes",
        "memory_free_bytes",
        "utilization_pct",
        "pci_bus_id",
        "driver_version",
        "compute_capability",
        "backend",
    ):
        assert key in first
    assert (first["index"], first["uuid"], first["memory_total_bytes"]) == (
        0,
        "GPU-11111111-0000-0000-0000-000000000001",
        16160 * 1024**2,
    )
    assert (second["index"], second["utilization_pct"], second["memory_free_bytes"]) == (
        1,
        73.0,
        80 * 1024**3 - 5368709120,
    )


def test_list_table_when_piped(fake_env: Path) -> None:
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    header, row0, row1 = result.stdout.splitlines()
    assert header.split("\t") == ["index", "uuid", "vendor", "model", "memory", "free", "util", "driver", "state"]
    assert row0.split("\t") == [
        "0",
        "GPU-11111111…",
        "NVIDIA",
        "Tesla V100-SXM2-16GB",
        "15.8 GiB",
        "15.8 GiB",
        "0%",
        "-",
        "ok",
    ]
    assert row1.split("\t")[4:7] == ["80.0 GiB", "75.0 GiB", "73%"]


def test_no_gpu_is_not_an_error(tools: StubTools) -> None:
    result = runner.invoke(app, ["list", "--backend", "smi"])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "no GPUs found" in result.stderr
    assert "smi: nvidia-smi not found on PATH (hint: install the NVIDIA driver" in result.stderr
    as_json = runner.invoke(app, ["list", "--backend", "smi", "--json"])
    assert json.loads(as_json.stdout)["devices"] == []


def test_forced_smi_backend_with_a_stub(tools: StubTools) -> None:
    tools.add("nvidia-smi", Out(file=fixture_path("nvidia-smi/query-gpu/l40s_595.80_load.csv")))
    result = runner.invoke(app, ["list", "-b", "smi", "--json"])
    (device,) = json.loads(result.stdout)["devices"]
    assert (device["model"], device["backend"], device["pci_bus_id"]) == ("NVIDIA L40S", "smi", "0000:01:00.0")


def test_unknown_backend_raises_invalid_input() -> None:
    result = runner.invoke(app, ["list", "--backend", "cuda"])
    assert isinstance(result.exception, InvalidInput)
    assert result.exception.exit_code == 2


def test_short_uuid() -> None:
    assert short_uuid("GPU-1937b558-347d-0f30-105b-893b98985668") == "GPU-1937b558…"
    assert short_uuid("AMD-PCI-0000:07:00.0") == "AMD-PCI-0000:07:00.0"


def test_doctor_lines_explain_each_backend(tools: StubTools, fake_env: Path) -> None:
    lines = {name: (ok, text) for name, ok, text in doctor_lines()}
    assert list(lines) == [
        "gpu backend nvml",
        "gpu backend smi",
        "gpu backend amd",
        "gpu backend apple",
        "gpu backend fake",
    ]
    assert lines["gpu backend smi"] == (
        False,
        "nvidia-smi not found on PATH (hint: install the NVIDIA driver (it "
        "ships nvidia-smi); inside a container run it with the NVIDIA "
        "container runtime (--gpus all))",
    )
    ok, text = lines["gpu backend fake"]
    assert ok and text.startswith("2 device(s): NVIDIA A100-SXM4-80GB, Tesla V100-SXM2-16GB")
