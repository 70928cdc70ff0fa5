"""AMD device health from amdgpu's sysfs (issue 39 §3, docs/gpu-health.md): the real sysfs
capture (tests/fixtures/gpu/amd/sysfs) has no ``ras`` directory (a Vega 10 consumer card
without RAS), so it reads healthy; RAS error counts are added in the kernel's documented
format (``device/ras/<block>_err_count`` holding ``ue: N`` and ``ce: N`` lines), and a card
found through sysfs whose directory goes away reads lost."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpu_support import Out, StubTools, materialise_sysfs
from test_gpu_amd import SYSFS

from cuectl.gpu.amd import AmdBackend, ras_problems


def backend(tools: StubTools, root: Path) -> tuple[AmdBackend, str]:
    tools.add("amd-smi", Out(exit=1, stderr="ERROR: amdgpu driver not initialized"))
    tools.add("rocm-smi", Out(exit=2, text="ERROR:root:Driver not initialized (amdgpu not found in modules)\n"))
    amd = AmdBackend(sysfs_root=materialise_sysfs(SYSFS, root))
    (d,) = amd.discover()
    return amd, d.uuid


def test_the_captured_card_reads_healthy(tools: StubTools, tmp_path: Path) -> None:
    amd, uuid = backend(tools, tmp_path / "drm")
    (h,) = amd.health([uuid]).values()
    assert (h.known, h.lost, h.xids, h.problems) == (True, None, (), ())


def test_uncorrectable_ras_errors_are_a_problem_corrected_ones_are_not(tools: StubTools, tmp_path: Path) -> None:
    amd, uuid = backend(tools, tmp_path / "drm")
    ras = tmp_path / "drm" / "card0" / "device" / "ras"
    ras.mkdir()
    (ras / "umc_err_count").write_text("ue: 2\nce: 17\n")
    (ras / "gfx_err_count").write_text("ue: 0\nce: 3\n")
    (ras / "features").write_text("feature mask: 0x3fff\n")
    assert amd.health([uuid])[uuid].problems == ("uncorrectable RAS errors in umc: 2",)
    assert ras_problems(tmp_path / "nowhere") == ()


def test_a_card_gone_from_sysfs_is_lost_and_unknown_devices_are_left_out(tools: StubTools, tmp_path: Path) -> None:
    amd, uuid = backend(tools, tmp_path / "drm")
    shutil.rmtree(tmp_path / "drm" / "card0" / "device")
    h = amd.health([uuid, "GPU-not-here"])
    assert list(h) == [uuid] and h[uuid].lost is not None and "card0 is gone from" in h[uuid].lost
    # No sysfs at all (a container without /sys/class/drm): no signal, never "lost".
    shutil.rmtree(tmp_path / "drm")
    assert amd.health([uuid])[uuid].known is False
