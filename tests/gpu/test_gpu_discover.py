"""discover(): which backends run, combined indices, routing of samples to backends."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_support import Out, StubTools, fixture_path, materialise_sysfs
from nvml_double import FakeNvml, h100_box

from cuectl.errors import InvalidInput
from cuectl.gpu import BACKEND_NAMES, Discovery, discover, get_backend
from cuectl.gpu.amd import AmdBackend
from cuectl.gpu.apple import AppleBackend
from cuectl.gpu.base import Backend
from cuectl.gpu.nvml import NvmlBackend
from cuectl.gpu.smi import SmiBackend

H100_CSV = fixture_path("nvidia-smi/query-gpu/h100-80gb-hbm3_590.48.01_load.csv")
SYSFS = fixture_path("amd/sysfs/procfs-fixture_class-drm_card0-amdgpu-vega10_card1-i915.json")
FAKE = """\
host: ci-01
devices:
  - {model: Tesla T4, memory: 15360MiB}
"""


def factory(nvml: FakeNvml, sysfs_root: Path):
    def make(name: str) -> Backend:
        return {
            "nvml": lambda: NvmlBackend(nvml=nvml),
            "smi": SmiBackend,
            "amd": lambda: AmdBackend(sysfs_root=sysfs_root),
            "apple": AppleBackend,
        }[name]()

    return make


def test_backend_names_and_unknown_name() -> None:
    assert BACKEND_NAMES == ("nvml", "smi", "apple", "amd", "fake")
    for bad in ("cuda", ""):
        with pytest.raises(InvalidInput, match="unknown GPU backend") as err:
            discover(bad)
        assert err.value.exit_code == 2
        with pytest.raises(InvalidInput):
            get_backend(bad)
    assert isinstance(get_backend("SMI"), SmiBackend)


def test_fake_file_replaces_every_real_backend(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", Out(file=H100_CSV))
    path = tmp_path / "gpus.yaml"
    path.write_text(FAKE)
    found = discover(fake_file=path)
    assert [b.name for b in found.backends] == ["fake"]
    assert [d.model for d in found.devices] == ["Tesla T4"]
    assert tools.calls("nvidia-smi") == []


def test_fake_file_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(FAKE)
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    assert [d.model for d in discover().devices] == ["Tesla T4"]
    assert [d.model for d in discover("fake").devices] == ["Tesla T4"]


def test_invalid_fake_file_is_raised_not_reported(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("devices:\n  - {model: T4, memory: lots}\n")
    with pytest.raises(InvalidInput, match=r"devices\[0\]\.memory: invalid size 'lots'"):
        discover(fake_file=path)


def test_auto_skips_smi_when_nvml_found_gpus_and_combines_vendors(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", Out(file=H100_CSV))
    found = discover(fake_file="", make_backend=factory(h100_box(2), materialise_sysfs(SYSFS, tmp_path / "drm")))
    assert [(b.name, b.ok) for b in found.backends] == [("nvml", True), ("amd", True), ("apple", False)]
    assert tools.calls("nvidia-smi") == []
    assert [(d.index, d.backend, d.vendor) for d in found.devices] == [
        (0, "nvml", "NVIDIA"),
        (1, "nvml", "NVIDIA"),
        (2, "amd", "AMD"),
    ]
    assert found.devices[2].attributes["vendor_index"] == 0  # its index within the AMD tools
    apple = found.to_json()["backends"][2]
    assert apple == {
        "name": "apple",
        "ok": False,
        "error": "system_profiler not found on PATH",
        "hint": "Apple GPUs are detected on macOS only (system_profiler is part of macOS)",
    }


def test_auto_falls_back_to_smi_when_nvml_fails(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", Out(file=H100_CSV))
    found = discover(fake_file="", make_backend=factory(FakeNvml([], init_error=18), tmp_path / "none"))
    assert [(b.name, b.ok) for b in found.backends] == [
        ("nvml", False),
        ("smi", True),
        ("amd", False),
        ("apple", False),
    ]
    assert [d.backend for d in found.devices] == ["smi"]
    assert "reboot" in found.backends[0].hint


def test_forced_backend_runs_alone_and_failure_is_reported(tools: StubTools) -> None:
    found = discover("smi", fake_file="")
    assert found.devices == []
    assert [b.to_json()["error"] for b in found.backends] == ["nvidia-smi not found on PATH"]


def test_sample_routes_one_batch_per_backend(tools: StubTools, tmp_path: Path) -> None:
    nvml = h100_box(3)
    root = materialise_sysfs(SYSFS, tmp_path / "drm")
    found = discover(fake_file="", make_backend=factory(nvml, root))
    nvml.calls.clear()
    everything = found.sample()
    assert list(everything) == [d.uuid for d in found.devices]
    assert nvml.calls["nvmlDeviceGetMemoryInfo"] == 3  # the three NVIDIA devices, once each
    picked = found.sample([found.devices[2].uuid, found.devices[3].uuid, "GPU-not-here"], pids={1002})
    assert list(picked) == [found.devices[2].uuid, found.devices[3].uuid]
    assert [p.pid for p in picked[found.devices[2].uuid].processes] == [1002]


def test_a_failing_backend_does_not_hide_the_others(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", [("*--query-gpu=index*", Out(file=H100_CSV)), ("*", Out(exit=15, text="GPU is lost\n"))])
    found = discover(
        fake_file="", make_backend=factory(FakeNvml([], init_error=12), materialise_sysfs(SYSFS, tmp_path / "drm"))
    )
    smi_uuid, amd_uuid = (d.uuid for d in found.devices)
    samples = found.sample()
    assert list(samples) == [amd_uuid]
    assert found.sample_errors == {"smi": "nvidia-smi failed (exit 15): GPU is lost"}
    assert found.backend_of(smi_uuid).name == "smi"


def test_same_uuid_from_two_backends_is_listed_once() -> None:
    class Stub(Backend):
        name = "stub"

        def __init__(self, devices):
            super().__init__()
            self._devices = devices

        def _discover(self):
            return self._devices

        def sample(self, uuids, pids=()):
            return {}

    nv = NvmlBackend(nvml=h100_box(1))
    first = nv.discover()
    found = Discovery([(nv, first), (Stub(first), first)], [])
    assert [d.uuid for d in found.devices] == [first[0].uuid]
