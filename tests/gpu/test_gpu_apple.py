"""Apple backend: system_profiler + sysctl discovery, ioreg sampling, odd outputs."""

from __future__ import annotations

import json

import pytest
from gpu_support import Out, StubTools, fixture_path

from cuectl.errors import BackendOutputError, BackendUnavailable
from cuectl.gpu.apple import AppleBackend, parse_ioreg, parse_system_profiler

M3 = fixture_path("macos/apple-m3-max_headless_macos-15.5_joulewise.json")
MEMSIZE = "137438953472\n"

# The shape of `ioreg -r -d 1 -w 0 -c IOAccelerator` on Apple Silicon, trimmed to the keys
# read; written for this test (no capture is among tests/fixtures/gpu).
IOREG = """\
+-o AGXAcceleratorG15X  <class AGXAcceleratorG15X, id 0x1000003f1, registered, matched, active, busy 0 (0 ms), retain 72>
    {
      "IOClass" = "AGXAcceleratorG15X"
      "PerformanceStatistics" = {"In use system memory (driver)"=0,"Alloc system memory"=4203085824,"Tiler Utilization %"=9,"Renderer Utilization %"=11,"Device Utilization %"=12,"In use system memory"=1390411776}
      "model" = "Apple M3 Max"
    }
"""


def install(tools: StubTools, ioreg: Out | None = Out(text=IOREG)) -> None:
    tools.add("system_profiler", [("SPDisplaysDataType -json", Out(file=M3))])
    tools.add("sysctl", [("-n hw.memsize", Out(text=MEMSIZE))])
    if ioreg is not None:
        tools.add("ioreg", [("-r -d 1 -w 0 -c IOAccelerator", ioreg)])


def test_discovery_and_sampling(tools: StubTools) -> None:
    install(tools)
    backend = AppleBackend(host="studio-3")
    (d,) = backend.discover()
    assert (d.memory_total_bytes, d.unified_memory, d.attributes["isolation"]) == (137438953472, True, "none")
    assert AppleBackend(host="studio-3").discover()[0].uuid == d.uuid  # stable on one host
    assert AppleBackend(host="studio-4").discover()[0].uuid != d.uuid
    s = backend.sample([d.uuid, "nope"], pids={1})
    assert list(s) == [d.uuid]
    assert (s[d.uuid].utilization_pct, s[d.uuid].memory_used_bytes, s[d.uuid].processes) == (12.0, 1390411776, ())
    assert len(tools.calls("ioreg")) == 1


def test_sampling_without_ioreg_gives_unknown_values(tools: StubTools) -> None:
    install(tools, ioreg=None)
    backend = AppleBackend(host="h")
    (d,) = backend.discover()
    s = backend.sample([d.uuid])[d.uuid]
    assert (s.utilization_pct, s.memory_used_bytes) == (None, None)


def test_missing_sysctl_leaves_memory_unknown(tools: StubTools) -> None:
    tools.add("system_profiler", Out(file=M3))
    (d,) = AppleBackend(host="h").discover()
    assert d.memory_total_bytes is None and d.model == "Apple M3 Max"


def test_not_on_macos(tools: StubTools) -> None:
    with pytest.raises(BackendUnavailable, match="system_profiler not found on PATH") as err:
        AppleBackend().discover()
    assert "macOS only" in (err.value.hint or "")


def test_bad_output(tools: StubTools) -> None:
    tools.add("system_profiler", Out(text="2026-01-01 12:00:00 system_profiler[1:2] crashed\n"))
    with pytest.raises(BackendOutputError, match="not JSON"):
        AppleBackend().discover()


def test_intel_mac_discrete_gpu_shape() -> None:
    """An Intel Mac's two entries (keys as system_profiler names them; values written for
    this test, since no genuine Intel-Mac capture exists): the Radeon has its own VRAM, the
    Intel iGPU shares host memory."""
    doc = {
        "SPDisplaysDataType": [
            {
                "_name": "AMD Radeon Pro 5500M",
                "sppci_model": "AMD Radeon Pro 5500M",
                "spdisplays_vram": "8 GB",
                "spdisplays_vendor": "sppci_vendor_amd",
                "sppci_device_type": "spdisplays_gpu",
                "spdisplays_mtlgpufamilysupport": "spdisplays_metal3",
            },
            {
                "_name": "Intel UHD Graphics 630",
                "sppci_model": "Intel UHD Graphics 630",
                "spdisplays_vram_shared": "1536 MB",
                "spdisplays_vendor": "Intel",
                "sppci_device_type": "spdisplays_gpu",
            },
            {"_name": "Display", "sppci_device_type": "spdisplays_display"},
        ]
    }
    amd, intel = parse_system_profiler(json.dumps(doc), 32 * 1024**3, host="h")
    assert (amd.vendor, amd.memory_total_bytes, amd.unified_memory, amd.api_version) == (
        "AMD",
        8 * 1024**3,
        False,
        "Metal 3",
    )
    assert (intel.vendor, intel.memory_total_bytes, intel.unified_memory) == ("Intel", 32 * 1024**3, True)
    assert (amd.index, intel.index) == (0, 1)


def test_parse_ioreg_ignores_accelerators_without_statistics() -> None:
    assert parse_ioreg("+-o IOAccelerator  <class X>\n    {\n    }\n" + IOREG) == [(12.0, 1390411776)]
