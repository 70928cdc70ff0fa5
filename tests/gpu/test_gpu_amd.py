"""AMD backend: amd-smi, rocm-smi and sysfs sources, sampling, per-process VRAM from fdinfo."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gpu_support import Out, StubTools, fixture_path, materialise_sysfs

from cuectl.errors import BackendUnavailable
from cuectl.gpu.amd import AmdBackend, amd_model, amd_uuid, parse_fdinfo, process_vram
from cuectl.units import MIB

RX6700 = fixture_path("amd/rocm-smi/rx6700xt_rocm-6.1.2_telegraf-query.json")
MI100 = fixture_path("amd/rocm-smi/4x-mi100_rocm-6.0.2_telegraf-query.json")
SYSFS = fixture_path("amd/sysfs/procfs-fixture_class-drm_card0-amdgpu-vega10_card1-i915.json")

# No genuine amd-smi capture exists (see the fixture README's Gaps). These inputs follow the
# documented shapes of `amd-smi static --json` and `amd-smi metric --json` (amd-smi < 7: a
# list; >= 7: {"gpu_data": [...]}, values as {"value", "unit"} with MB meaning MiB). They
# are test inputs written for this file, not captured output.
AMD_SMI_STATIC = [
    {
        "gpu": 0,
        "asic": {
            "market_name": "AMD Instinct MI210",
            "vendor_id": "0x1002",
            "device_id": "0x740f",
            "asic_serial": "0x3B8AF2E1C4D50917",
            "target_graphics_version": "gfx90a",
        },
        "bus": {"bdf": "0000:C1:00.0"},
        "vram": {"type": "HBM", "size": {"value": 65520, "unit": "MB"}},
        "driver": {"name": "amdgpu", "version": "6.7.0"},
    },
    {
        "gpu": 1,
        "asic": {
            "market_name": "AMD Instinct MI210",
            "vendor_id": "0x1002",
            "device_id": "0x740f",
            "asic_serial": "N/A",
        },
        "bus": {"bdf": "0000:c2:00.0"},
        "vram": {"size": "65520 MB"},
        "driver": {"VERSION": "6.7.0"},
    },
]
AMD_SMI_METRIC = [
    {
        "gpu": 0,
        "usage": {"gfx_activity": {"value": 87, "unit": "%"}},
        "mem_usage": {
            "total_vram": {"value": 65520, "unit": "MB"},
            "used_vram": {"value": 20480, "unit": "MB"},
            "free_vram": {"value": 45040, "unit": "MB"},
        },
    },
    {
        "gpu": 1,
        "usage": {"gfx_activity": "N/A"},
        "mem_usage": {"total_vram": {"value": 65520, "unit": "MB"}, "used_vram": {"value": 10, "unit": "MB"}},
    },
]


def test_uuid_and_model_rules() -> None:
    assert amd_uuid("0x4edfb117a17a07d", None, "card1") == "GPU-04edfb117a17a07d"  # padded as rocminfo prints it
    assert amd_uuid("N/A", "0000:07:00.0", "card0") == "AMD-PCI-0000:07:00.0"
    assert amd_uuid("0x0", None, "card0") == "AMD-card0"
    assert amd_model("Arcturus GL-XL [Instinct MI100]") == "AMD Instinct MI100"
    assert amd_model("0x1002", None, device_id="0x73DF") == "AMD GPU 0x73df"
    assert amd_model("", device_id=None) == "AMD GPU"


@pytest.mark.parametrize("wrap", [False, True], ids=["list", "gpu_data"])
def test_amd_smi_discovery_and_sampling(tools: StubTools, tmp_path: Path, wrap: bool) -> None:
    def doc(value):
        return json.dumps({"gpu_data": value} if wrap else value)

    tools.add(
        "amd-smi",
        [
            ("static --json", Out(text=doc(AMD_SMI_STATIC))),
            ("metric --usage --mem-usage --json", Out(text=doc(AMD_SMI_METRIC))),
        ],
    )
    tools.add("rocm-smi", Out(file=RX6700))  # present, but amd-smi comes first
    backend = AmdBackend(sysfs_root=tmp_path / "none")
    devices = backend.discover()
    assert backend.source == "amd-smi" and tools.calls("rocm-smi") == []
    assert [(d.uuid, d.model, d.memory_total_bytes, d.pci_bus_id, d.driver_version) for d in devices] == [
        ("GPU-3b8af2e1c4d50917", "AMD Instinct MI210", 65520 * MIB, "0000:c1:00.0", "6.7.0"),
        ("AMD-PCI-0000:c2:00.0", "AMD Instinct MI210", 65520 * MIB, "0000:c2:00.0", "6.7.0"),
    ]
    assert devices[0].compute_capability == "gfx90a"
    samples = backend.sample([d.uuid for d in devices])
    assert len(tools.calls("amd-smi")) == 2  # one discovery, one sample for both GPUs
    s0, s1 = (samples[d.uuid] for d in devices)
    assert (s0.utilization_pct, s0.memory_used_bytes, s0.memory_free_bytes) == (87.0, 20480 * MIB, 45040 * MIB)
    assert (s1.utilization_pct, s1.memory_used_bytes, s1.memory_free_bytes) == (None, 10 * MIB, 65510 * MIB)


def test_rocm_smi_sampling_is_one_spawn(tools: StubTools, tmp_path: Path) -> None:
    tools.add(
        "rocm-smi", [("--showproductname*", Out(file=MI100)), ("--showuse --showmeminfo vram --json", Out(file=MI100))]
    )
    backend = AmdBackend(sysfs_root=tmp_path / "none")
    devices = backend.discover()
    samples = backend.sample([d.uuid for d in devices])
    assert len(tools.calls("rocm-smi")) == 2
    assert {s.memory_used_bytes for s in samples.values()} == {6750208}
    assert {s.memory_free_bytes for s in samples.values()} == {34342961152 - 6750208}


def test_rocm_smi_warning_before_json(tools: StubTools, tmp_path: Path) -> None:
    tools.add(
        "rocm-smi",
        Out(
            text="WARNING: AMD GPU device(s) is/are in a low-power state. Check power "
            "control/runtime_status [see docs]\n\n" + RX6700.read_text()
        ),
    )
    (d,) = AmdBackend(sysfs_root=tmp_path / "none").discover()
    assert d.model == "AMD Radeon RX 6700/6700 XT / 6800M"


def test_truncated_json_is_an_output_error(tools: StubTools, tmp_path: Path) -> None:
    tools.add("rocm-smi", Out(text=RX6700.read_text()[:200]))
    with pytest.raises(BackendUnavailable, match="rocm-smi: malformed JSON"):
        AmdBackend(sysfs_root=tmp_path / "none").discover()


def test_failing_tools_fall_back_to_sysfs(tools: StubTools, tmp_path: Path) -> None:
    tools.add("amd-smi", Out(exit=1, stderr="ERROR: amdgpu driver not initialized"))
    tools.add("rocm-smi", Out(exit=2, text="ERROR:root:Driver not initialized (amdgpu not found in modules)\n"))
    root = materialise_sysfs(SYSFS, tmp_path / "drm")
    backend = AmdBackend(sysfs_root=root)
    (d,) = backend.discover()
    assert backend.source == "sysfs" and d.uuid == "GPU-0123456789abcdef"
    # sysfs sampling reads files, spawns nothing, and sees changes.
    (root / "card0" / "device" / "gpu_busy_percent").write_text("61\n")
    (root / "card0" / "device" / "mem_info_vram_used").write_text(f"{2 * 1024**3}\n")
    s = backend.sample([d.uuid])[d.uuid]
    assert (s.utilization_pct, s.memory_used_bytes, s.memory_free_bytes) == (
        61.0,
        2 * 1024**3,
        8573157376 - 2 * 1024**3,
    )
    assert len(tools.calls("amd-smi")) == 1 and len(tools.calls("rocm-smi")) == 1


def test_nothing_found_explains_the_failures(tools: StubTools, tmp_path: Path) -> None:
    tools.add("rocm-smi", Out(exit=2, text="ERROR:root:Driver not initialized (amdgpu not found in modules)\n"))
    with pytest.raises(
        BackendUnavailable, match=r"rocm-smi failed \(exit 2\): ERROR:root:Driver not initialized"
    ) as err:
        AmdBackend(sysfs_root=tmp_path / "none").discover()
    assert "modprobe amdgpu" in (err.value.hint or "")


def test_no_tools_and_no_cards(tools: StubTools, tmp_path: Path) -> None:
    only_intel = materialise_sysfs(SYSFS, tmp_path / "drm")
    shutil.rmtree(only_intel / "card0")
    with pytest.raises(BackendUnavailable, match="no AMD GPU found") as err:
        AmdBackend(sysfs_root=only_intel).discover()
    assert "ROCm" in (err.value.hint or "")


# DRM fdinfo files as the kernel documents them (Documentation/gpu/drm-usage-stats.rst);
# written for these tests.
FDINFO_NEW = (
    "pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t0000:09:00.0\ndrm-client-id:\t42\n"
    "drm-memory-vram:\t1048576 KiB\ndrm-memory-gtt:\t2048 KiB\n"
)
FDINFO_OLD = "pos:\t0\nflags:\t02100002\npdev:\t0000:09:00.0\npasid:\t32770\nvram mem:\t524288 kB\n"


def make_proc(root: Path, pid: int, fds: dict[str, tuple[str, str]]) -> None:
    """``fds``: fd number -> (link target, fdinfo text)."""
    (root / str(pid) / "fd").mkdir(parents=True)
    (root / str(pid) / "fdinfo").mkdir()
    for fd, (target, info) in fds.items():
        (root / str(pid) / "fd" / fd).symlink_to(target)
        (root / str(pid) / "fdinfo" / fd).write_text(info)


def test_parse_fdinfo_both_formats() -> None:
    new = parse_fdinfo(FDINFO_NEW)
    assert (new.pdev, new.client_id, new.vram_bytes) == ("0000:09:00.0", "42", 1024**3)
    old = parse_fdinfo(FDINFO_OLD)
    assert (old.pdev, old.client_id, old.vram_bytes) == ("0000:09:00.0", None, 512 * MIB)
    assert parse_fdinfo("pos:\t0\nflags:\t0100000\n") is None


def test_process_vram_counts_each_client_once(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    make_proc(
        proc,
        100,
        {
            "3": ("/dev/dri/renderD128", FDINFO_NEW),
            "4": ("/dev/dri/card0", FDINFO_NEW),
            "5": ("/tmp/log.txt", FDINFO_NEW),
        },
    )
    make_proc(proc, 200, {"7": ("/dev/dri/renderD128", FDINFO_OLD)})
    make_proc(proc, 300, {"7": ("/dev/dri/renderD128", FDINFO_NEW)})
    assert process_vram({100, 200, 999}, proc) == {"0000:09:00.0": {100: 1024**3, 200: 512 * MIB}}


def test_sample_attaches_process_vram_by_pci_bus(tools: StubTools, tmp_path: Path) -> None:
    root = materialise_sysfs(SYSFS, tmp_path / "drm")
    proc = tmp_path / "proc"
    make_proc(proc, 100, {"3": ("/dev/dri/renderD128", FDINFO_NEW)})
    backend = AmdBackend(sysfs_root=root, proc_root=proc)
    (d,) = backend.discover()
    s = backend.sample([d.uuid], pids={100})[d.uuid]
    assert [(p.pid, p.memory_used_bytes, p.utilization_pct) for p in s.processes] == [(100, 1024**3, None)]
    assert backend.sample([d.uuid])[d.uuid].processes == ()
