"""Every file of tests/fixtures/gpu, fed through the code that reads it, with what it must yield.

Tool outputs go through the real subprocess path wherever a backend would read them: a
stub executable on PATH prints the fixture bytes and exits with the code the fixture
README gives. Outputs of commands cuectl does not run itself (other query field lists,
``-q -x`` logs, ``-L``) go through their parser directly. ``test_every_fixture_is_listed``
fails when a fixture is added without an entry here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
from gpu_support import FIXTURES, Out, StubTools, fixture_path, materialise_sysfs

from cuectl.errors import BackendOutputError, BackendUnavailable
from cuectl.gpu.amd import AmdBackend
from cuectl.gpu.apple import AppleBackend
from cuectl.gpu.smi import SmiBackend, parse_list, parse_query_gpu, parse_xml, rows_to_devices
from cuectl.units import MIB

MASKED = "GPU-00000000-0000-0000-0000-000000000000"
TELEGRAF_2018_FIELDS = (
    "fan.speed",
    "memory.total",
    "memory.used",
    "memory.free",
    "pstate",
    "temperature.gpu",
    "name",
    "uuid",
    "compute_mode",
    "utilization.gpu",
    "utilization.memory",
    "index",
)
MEMSIZE = 68719476736  # what the sysctl stub prints: a 64 GiB Mac


def _smi_discover(
    tools: StubTools, query_fixture: str, list_fixture: str | None = None, xml_fixture: str | None = None
) -> list:
    rules = [("*--query-gpu=index*", Out(file=fixture_path(query_fixture)))]
    if list_fixture:
        rules.append(("-L", Out(file=fixture_path(list_fixture))))
    if xml_fixture:
        rules.append(("-q -x", Out(file=fixture_path(xml_fixture))))
    tools.add("nvidia-smi", rules)
    return SmiBackend().discover()


def _card(model, total_mib, free_mib, util, pci, cc, driver):
    return dict(
        model=model,
        memory_total_bytes=None if total_mib is None else total_mib * MIB,
        memory_free_bytes=None if free_mib is None else free_mib * MIB,
        utilization_pct=util,
        pci_bus_id=pci,
        compute_capability=cc,
        driver_version=driver,
    )


def _assert_devices(devices, expected: list[dict]) -> None:
    assert len(devices) == len(expected)
    for d, want in zip(devices, expected):
        got = {k: getattr(d, k) for k in want}
        if "attributes" in want:  # only the attributes named are checked
            got["attributes"] = {k: d.attributes.get(k) for k in want["attributes"]}
        assert got == want, d


# ---------------------------------------------------------------- query-gpu (nvidia-smi)


def query_gpu_case(rel: str, expected: dict) -> Callable[[StubTools, Path], None]:
    """A ``--query-gpu`` capture with a header: what SmiBackend.discover makes of it."""

    def check(tools: StubTools, tmp: Path) -> None:
        devices = _smi_discover(tools, rel)
        _assert_devices(devices, [expected])
        assert devices[0].vendor == "NVIDIA" and devices[0].backend == "smi"

    return check


def mig_query_case(rel: str, list_rel: str, profiles: list[str], card: str) -> Callable[[StubTools, Path], None]:
    """A MIG-enabled card: its instances (from ``-L``) are the devices, the card is not.

    No ``-q -x`` capture of these cards exists, so the stub answers with another card's
    log: instance memory must then stay unknown rather than be borrowed from that card.
    """

    def check(tools: StubTools, tmp: Path) -> None:
        devices = _smi_discover(tools, rel, list_rel, "nvidia-smi/xml/a100-sxm4-40gb-mig_510.47.03.xml")
        assert [d.mig_profile for d in devices] == profiles
        assert [d.model for d in devices] == [f"{card} MIG {p}" for p in profiles]
        assert all(d.mig_parent_uuid == MASKED and d.uuid.startswith("MIG-") for d in devices)
        assert [d.index for d in devices] == list(range(len(profiles)))
        assert all(d.memory_total_bytes is None and d.utilization_pct is None for d in devices)
        assert MASKED not in {d.uuid for d in devices}  # the MIG-enabled card itself is not leasable

    return check


def noheader_case(rel: str, fields: tuple[str, ...], check_rows: Callable[[list], None]):
    """A capture of another program's query (its field list from the fixture README)."""

    def check(tools: StubTools, tmp: Path) -> None:
        check_rows(parse_query_gpu(fixture_path(rel).read_text(), fields))

    return check


def _eight_v100s(rows) -> None:
    assert len(rows) == 8
    assert {r.memory_total_bytes for r in rows} == {16130 * MIB}
    assert [r.memory_free_bytes // MIB for r in rows] == [16103, 16119, 16119, 16119, 4200, 16119, 16119, 16119]
    assert rows_to_devices(rows) == []  # no uuid, no name: nothing leasable can be built from it


def _gtx_1070_ti(rows) -> None:
    (r,) = rows
    assert (r.index, r.name, r.uuid) == (1, "GeForce GTX 1070 Ti", "GPU-d1911b8a-f5c8-5e66-057c-486561269de8")
    assert (r.memory_total_bytes, r.memory_used_bytes, r.memory_free_bytes) == (8114 * MIB, 553 * MIB, 7561 * MIB)
    assert r.utilization_pct == 100.0
    (d,) = rows_to_devices(rows)
    assert d.index == 1 and d.model == "GeForce GTX 1070 Ti"


def _tesla_p4(rows) -> None:
    (r,) = rows
    assert (r.name, r.uuid, r.memory_total_bytes, r.utilization_pct) == ("Tesla P4", "GPU-xxx", 7606 * MIB, 0.0)


# ---------------------------------------------------------------- compute apps


def compute_apps_case(query_rel: str, apps_rel: str, pids: set[int], expected: dict[int, int | None]):
    """Per-process memory through SmiBackend.sample: one --query-gpu and one compute-apps spawn."""

    def check(tools: StubTools, tmp: Path) -> None:
        tools.add(
            "nvidia-smi",
            [
                ("*--query-compute-apps*", Out(file=fixture_path(apps_rel))),
                ("*--query-gpu=*", Out(file=fixture_path(query_rel))),
            ],
        )
        backend = SmiBackend()
        (device,) = backend.discover()
        before = len(tools.calls("nvidia-smi"))
        sample = backend.sample([device.uuid], pids=pids)[device.uuid]
        assert {p.pid: p.memory_used_bytes for p in sample.processes} == expected
        assert len(tools.calls("nvidia-smi")) - before == 2

    return check


def mig_compute_apps(tools: StubTools, tmp: Path) -> None:
    """Rows name the parent card: credited to the one wanted MIG instance of that card."""
    tools.add(
        "nvidia-smi",
        [
            (
                "*--query-compute-apps*",
                Out(file=fixture_path("nvidia-smi/query-compute-apps/h100-80gb-hbm3-mig_590.48.01_load.csv")),
            ),
            ("*--query-gpu=*", Out(file=fixture_path("nvidia-smi/query-gpu/h100-80gb-hbm3-mig_590.48.01_load.csv"))),
            ("-L", Out(file=fixture_path("nvidia-smi/list/h100-80gb-hbm3-mig_590.48.01_L.txt"))),
            ("-q -x", Out(file=fixture_path("nvidia-smi/xml/a100-sxm4-40gb-mig_510.47.03.xml"))),
        ],
    )
    backend = SmiBackend()
    migs = backend.discover()
    one = backend.sample([migs[0].uuid], pids={21180, 21198})[migs[0].uuid]
    assert {p.pid: p.memory_used_bytes for p in one.processes} == {21180: 2296 * MIB, 21198: 7484 * MIB}
    assert one.utilization_pct is None and one.memory_used_bytes is None
    two = backend.sample([migs[0].uuid, migs[1].uuid], pids={21180})
    assert all(s.processes == () for s in two.values())  # ambiguous: which instance? none credited
    # --query-gpu reports nothing about instances, so sampling only instances skips it.
    assert [c.split("=")[0] for c in tools.calls("nvidia-smi")[3:]] == ["--query-compute-apps"] * 2


# ---------------------------------------------------------------- -L, table, xml, errors


def list_case(rel: str, card: str, profiles: list[str]):
    def check(tools: StubTools, tmp: Path) -> None:
        (gpu,) = parse_list(fixture_path(rel).read_text())
        assert (gpu.index, gpu.name, gpu.uuid) == (0, card, MASKED)
        assert [m.profile for m in gpu.migs] == profiles
        assert [m.device_index for m in gpu.migs] == list(range(len(profiles)))
        assert len({m.uuid for m in gpu.migs}) == len(profiles)

    return check


def table_case(rel: str):
    """Plain ``nvidia-smi`` tables are not a query answer: a clean BackendOutputError."""

    def check(tools: StubTools, tmp: Path) -> None:
        tools.add("nvidia-smi", Out(file=fixture_path(rel)))
        with pytest.raises(BackendOutputError, match="unexpected output line 1"):
            SmiBackend().discover()

    return check


def xml_case(rel: str, cards: list[dict], migs: list[int], processes: list[int]):
    def check(tools: StubTools, tmp: Path) -> None:
        gpus = parse_xml(fixture_path(rel).read_text())
        _assert_devices([g.device for g in gpus], cards)
        assert [len(g.migs) for g in gpus] == migs
        assert [len(g.processes) for g in gpus] == processes

    return check


def error_case(rel: str, exit_code: int, hint_word: str):
    def check(tools: StubTools, tmp: Path) -> None:
        tools.add("nvidia-smi", Out(file=fixture_path(rel), exit=exit_code))
        with pytest.raises(BackendUnavailable) as err:
            SmiBackend().discover()
        message = " ".join(fixture_path(rel).read_text().split())
        assert err.value.message == f"nvidia-smi failed (exit {exit_code}): {message}"
        assert hint_word in (err.value.hint or "")

    return check


def invalid_field_retry(tools: StubTools, tmp: Path) -> None:
    """Driver 465 rejects compute_cap (exit 2): asked again without it, once, then remembered."""
    tools.add(
        "nvidia-smi",
        [
            ("*compute_cap*", Out(file=fixture_path("nvidia-smi/errors/invalid-query-field_compute_cap.txt"), exit=2)),
            ("*--query-gpu=*", Out(file=fixture_path("nvidia-smi/query-gpu/rtx-2080-super_linux_465.27_2021.csv"))),
        ],
    )
    backend = SmiBackend()
    (d,) = backend.discover()
    assert (d.model, d.compute_capability, d.memory_total_bytes) == ("NVIDIA GeForce RTX 2080 SUPER", None, 7979 * MIB)
    backend.discover()
    calls = tools.calls("nvidia-smi")
    assert len(calls) == 3 and "compute_cap" in calls[0] and "compute_cap" not in calls[1] + calls[2]


# ---------------------------------------------------------------- macOS, AMD


def apple_case(rel: str, model: str, cores: int, api: str):
    def check(tools: StubTools, tmp: Path) -> None:
        tools.add("system_profiler", [("SPDisplaysDataType -json", Out(file=fixture_path(rel)))])
        tools.add("sysctl", [("-n hw.memsize", Out(text=f"{MEMSIZE}\n"))])
        (d,) = AppleBackend(host="mac-01").discover()
        assert (d.vendor, d.model, d.gpu_cores, d.api_version) == ("Apple", model, cores, api)
        assert d.unified_memory and d.memory_total_bytes == MEMSIZE and d.backend == "apple"
        assert d.uuid.startswith("APPLE-")

    return check


def rocm_case(rel: str, expected: list[dict]):
    def check(tools: StubTools, tmp: Path) -> None:
        tools.add("rocm-smi", Out(file=fixture_path(rel)))
        backend = AmdBackend(sysfs_root=tmp / "no-sysfs")
        devices = backend.discover()
        assert backend.source == "rocm-smi"
        _assert_devices(devices, expected)
        assert all(d.vendor == "AMD" and d.backend == "amd" for d in devices)

    return check


def _amd(uuid, model, total, free, util, pci):
    return dict(
        uuid=uuid, model=model, memory_total_bytes=total, memory_free_bytes=free, utilization_pct=util, pci_bus_id=pci
    )


def sysfs_case(tools: StubTools, tmp: Path) -> None:
    root = materialise_sysfs(fixture_path(SYSFS), tmp / "drm")
    backend = AmdBackend(sysfs_root=root, proc_root=tmp / "proc")
    devices = backend.discover()
    assert backend.source == "sysfs"
    # card1 is the Intel iGPU (i915): not listed.
    _assert_devices(
        devices,
        [_amd("GPU-0123456789abcdef", "AMD GPU 0x687f", 8573157376, 8573157376 - 1490378752, 4.0, "0000:09:00.0")],
    )


SYSFS = "amd/sysfs/procfs-fixture_class-drm_card0-amdgpu-vega10_card1-i915.json"
MI100 = "AMD Instinct MI100"
MI250 = "AMD INSTINCT MI250 (MCM) OAM AC MBA"
QG = "nvidia-smi/query-gpu/"
QA = "nvidia-smi/query-compute-apps/"
XML = "nvidia-smi/xml/"
ERR = "nvidia-smi/errors/"

CASES: dict[str, Callable[[StubTools, Path], None]] = {
    # query-gpu
    QG + "h100-80gb-hbm3_590.48.01_load.csv": query_gpu_case(
        QG + "h100-80gb-hbm3_590.48.01_load.csv",
        _card("NVIDIA H100 80GB HBM3", 81559, 61263, 100.0, "0000:00:09.0", "9.0", "590.48.01"),
    ),
    QG + "h100-80gb-hbm3-mig_590.48.01_load.csv": mig_query_case(
        QG + "h100-80gb-hbm3-mig_590.48.01_load.csv",
        "nvidia-smi/list/h100-80gb-hbm3-mig_590.48.01_L.txt",
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        "NVIDIA H100 80GB HBM3",
    ),
    QG + "h200_590.48.01_idle.csv": query_gpu_case(
        QG + "h200_590.48.01_idle.csv", _card("NVIDIA H200", 143771, 143158, 0.0, "0000:83:00.0", "9.0", "590.48.01")
    ),
    QG + "h200-mig_590.48.01_load.csv": mig_query_case(
        QG + "h200-mig_590.48.01_load.csv",
        "nvidia-smi/list/h200-mig_590.48.01_L.txt",
        ["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"],
        "NVIDIA H200",
    ),
    QG + "l40s_595.80_load.csv": query_gpu_case(
        QG + "l40s_595.80_load.csv", _card("NVIDIA L40S", 46068, 44225, 9.0, "0000:01:00.0", "8.9", "595.80")
    ),
    QG + "rtx-4080-super_595.71.05_load.csv": query_gpu_case(
        QG + "rtx-4080-super_595.71.05_load.csv",
        _card("NVIDIA GeForce RTX 4080 SUPER", 16376, 14470, 7.0, "0000:01:00.0", "8.9", "595.71.05"),
    ),
    QG + "rtx-2080-super_linux_610.57.04_idle.csv": query_gpu_case(
        QG + "rtx-2080-super_linux_610.57.04_idle.csv",
        _card("NVIDIA GeForce RTX 2080 SUPER", 8192, 7582, 0.0, "0000:0c:00.0", "7.5", "610.57.04"),
    ),
    QG + "rtx-2080-super_windows-wddm_610.62_load.csv": query_gpu_case(
        QG + "rtx-2080-super_windows-wddm_610.62_load.csv",
        _card("NVIDIA GeForce RTX 2080 SUPER", 8192, 6622, 7.0, "0000:0c:00.0", "7.5", "610.62"),
    ),
    QG + "rtx-2080-super_linux_465.27_2021.csv": query_gpu_case(
        QG + "rtx-2080-super_linux_465.27_2021.csv",
        dict(
            _card("NVIDIA GeForce RTX 2080 SUPER", 7979, 7635, 0.0, "0000:0c:00.0", None, "465.27"),
            uuid="GPU-1937b558-347d-0f30-105b-893b98985668",
        ),
    ),
    QG + "tesla-p100-pcie-16gb_510.47.03_csv-nounits.csv": query_gpu_case(
        QG + "tesla-p100-pcie-16gb_510.47.03_csv-nounits.csv",
        # netdata's field list has no memory.total, pci.bus_id or driver_version: unknown, not guessed
        dict(_card("Tesla P100-PCIE-16GB", None, 16280, 0.0, None, None, None), index=0),
    ),
    QG + "gtx-1070-ti_noheader-nounits.csv": noheader_case(
        QG + "gtx-1070-ti_noheader-nounits.csv", TELEGRAF_2018_FIELDS, _gtx_1070_ti
    ),
    QG + "tesla-p4_not-supported_noheader-nounits.csv": noheader_case(
        QG + "tesla-p4_not-supported_noheader-nounits.csv", TELEGRAF_2018_FIELDS, _tesla_p4
    ),
    QG + "8x-16130MiB_memory-total-free-count_noheader.csv": noheader_case(
        QG + "8x-16130MiB_memory-total-free-count_noheader.csv", ("memory.total", "memory.free", "count"), _eight_v100s
    ),
    # compute apps
    QA + "h100-80gb-hbm3_590.48.01_load.csv": compute_apps_case(
        QG + "h100-80gb-hbm3_590.48.01_load.csv",
        QA + "h100-80gb-hbm3_590.48.01_load.csv",
        {11327, 11345, 4},
        {11327: 2566 * MIB, 11345: 15690 * MIB},
    ),
    QA + "h100-80gb-hbm3-mig_590.48.01_load.csv": mig_compute_apps,
    QA + "rtx-2080-super_windows-wddm_610.62_load.csv": compute_apps_case(
        QG + "rtx-2080-super_windows-wddm_610.62_load.csv",
        QA + "rtx-2080-super_windows-wddm_610.62_load.csv",
        {2140, 12940},
        {2140: None, 12940: None},
    ),  # WDDM: nvidia-smi cannot tell per-process memory
    QA + "l40s_595.80_idle_no-processes.csv": compute_apps_case(
        QG + "l40s_595.80_load.csv", QA + "l40s_595.80_idle_no-processes.csv", {1, 2}, {}
    ),
    # -L
    "nvidia-smi/list/h100-80gb-hbm3-mig_590.48.01_L.txt": list_case(
        "nvidia-smi/list/h100-80gb-hbm3-mig_590.48.01_L.txt",
        "NVIDIA H100 80GB HBM3",
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
    ),
    "nvidia-smi/list/h200-mig_590.48.01_L.txt": list_case(
        "nvidia-smi/list/h200-mig_590.48.01_L.txt",
        "NVIDIA H200",
        ["1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"],
    ),
    # default tables
    "nvidia-smi/table/h100-80gb-hbm3-mig_590.48.01_load.txt": table_case(
        "nvidia-smi/table/h100-80gb-hbm3-mig_590.48.01_load.txt"
    ),
    "nvidia-smi/table/rtx-2080-super_windows-wddm_610.62_load.txt": table_case(
        "nvidia-smi/table/rtx-2080-super_windows-wddm_610.62_load.txt"
    ),
    "nvidia-smi/table/8x-tesla-v100-sxm2-32gb_460.32.03_inforom-corrupted-warning.txt": table_case(
        "nvidia-smi/table/8x-tesla-v100-sxm2-32gb_460.32.03_inforom-corrupted-warning.txt"
    ),
    # -q -x
    XML + "2x-rtx-a5000_dual-gpu.xml": xml_case(
        XML + "2x-rtx-a5000_dual-gpu.xml",
        [
            _card("NVIDIA RTX A5000", 24564, 1678, 0.0, "0000:81:00.0", None, "590.44.01"),
            _card("NVIDIA RTX A5000", 24564, 6862, 0.0, "0000:c1:00.0", None, "590.44.01"),
        ],
        [0, 0],
        [1, 1],
    ),
    XML + "a100-sxm4-40gb-mig_510.47.03.xml": xml_case(
        XML + "a100-sxm4-40gb-mig_510.47.03.xml",
        [_card("NVIDIA A100-SXM4-40GB", 40960, 40315, None, "0000:00:04.0", None, "510.47.03")],
        [2],
        [0],
    ),
    XML + "a100-sxm4-80gb_535.54.03.xml": xml_case(
        XML + "a100-sxm4-80gb_535.54.03.xml",
        [_card("NVIDIA A100-SXM4-80GB", 81920, 80999, None, "0000:01:00.0", None, "535.54.03")],
        [4],
        [0],
    ),
    XML + "rtx-3090_525.147.05.xml": xml_case(
        XML + "rtx-3090_525.147.05.xml",
        [_card("NVIDIA GeForce RTX 3090", 24576, 24258, 0.0, "0000:00:10.0", None, "525.147.05")],
        [0],
        [0],
    ),
    XML + "rtx-4090_535.86.05.xml": xml_case(
        XML + "rtx-4090_535.86.05.xml",
        [_card("NVIDIA GeForce RTX 4090", 24564, 24214, 0.0, "0000:84:00.0", None, "535.86.05")],
        [0],
        [0],
    ),
    XML + "tesla-p100-pcie-16gb_510.47.03.xml": xml_case(
        XML + "tesla-p100-pcie-16gb_510.47.03.xml",
        [_card("Tesla P100-PCIE-16GB", 16384, 16280, 0.0, "0000:00:04.0", None, "510.47.03")],
        [0],
        [0],
    ),
    XML + "tesla-t4_515.105.01.xml": xml_case(
        XML + "tesla-t4_515.105.01.xml",
        [_card("Tesla T4", 15360, 13939, 0.0, "0000:00:1e.0", None, "515.105.01")],
        [0],
        [2],
    ),
    XML + "rtx-2080_windows_516.59_with-processes.xml": xml_case(
        XML + "rtx-2080_windows_516.59_with-processes.xml",
        [_card("NVIDIA GeForce RTX 2080", 8192, 7147, 2.0, "0000:0a:00.0", None, "516.59")],
        [0],
        [26],
    ),
    # errors: exit codes from the nvidia-smi man page as listed in the fixture README
    ERR + "driver-not-loaded_couldnt-communicate.txt": error_case(
        ERR + "driver-not-loaded_couldnt-communicate.txt", 9, "modprobe nvidia"
    ),
    ERR + "no-devices-were-found.txt": error_case(ERR + "no-devices-were-found.txt", 6, "RmInitAdapter"),
    ERR + "driver-library-version-mismatch.txt": error_case(ERR + "driver-library-version-mismatch.txt", 18, "reboot"),
    ERR + "driver-library-version-mismatch_with-nvml-library-version.txt": error_case(
        ERR + "driver-library-version-mismatch_with-nvml-library-version.txt", 18, "reboot"
    ),
    ERR + "nvml-unknown-error_container.txt": error_case(
        ERR + "nvml-unknown-error_container.txt", 255, "restart the container"
    ),
    ERR + "no-supported-gpus.txt": error_case(ERR + "no-supported-gpus.txt", 255, "lspci -k"),
    ERR + "invalid-query-field_compute_cap.txt": invalid_field_retry,
    # macOS
    "macos/apple-m1_laptop_torchserve.json": apple_case(
        "macos/apple-m1_laptop_torchserve.json", "Apple M1", 7, "Metal (GPU family Apple7)"
    ),
    "macos/apple-m2-max_macos-15_sensoryplex_display-entry-trimmed.json": apple_case(
        "macos/apple-m2-max_macos-15_sensoryplex_display-entry-trimmed.json", "Apple M2 Max", 30, "Metal 4"
    ),
    "macos/apple-m3-max_headless_macos-15.5_joulewise.json": apple_case(
        "macos/apple-m3-max_headless_macos-15.5_joulewise.json", "Apple M3 Max", 40, "Metal"
    ),
    # AMD rocm-smi
    "amd/rocm-smi/4x-mi100_rocm-6.0.2_telegraf-query.json": rocm_case(
        "amd/rocm-smi/4x-mi100_rocm-6.0.2_telegraf-query.json",
        [
            _amd("GPU-79ccd55167a2124a", MI100, 34342961152, 34342961152 - 6750208, 0.0, "0000:83:00.0"),
            _amd("GPU-04edfb117a17a07d", MI100, 34342961152, 34342961152 - 6750208, 0.0, "0000:a3:00.0"),
            _amd("GPU-d4a9ec48d03d261d", MI100, 34342961152, 34342961152 - 6750208, 0.0, "0000:c3:00.0"),
            _amd("GPU-1b9dd972253c3736", MI100, 34342961152, 34342961152 - 6750208, 0.0, "0000:e3:00.0"),
        ],
    ),
    "amd/rocm-smi/rx6700xt_rocm-6.1.2_telegraf-query.json": rocm_case(
        "amd/rocm-smi/rx6700xt_rocm-6.1.2_telegraf-query.json",
        [
            dict(
                _amd(
                    "AMD-PCI-0000:07:00.0",
                    "AMD Radeon RX 6700/6700 XT / 6800M",
                    12868124672,
                    12868124672 - 1572745216,
                    0.0,
                    "0000:07:00.0",
                ),
                compute_capability="gfx1031",
                driver_version="6.3.6",
            )
        ],
    ),
    "amd/rocm-smi/rx6700xt_rocm-4.3.0_telegraf-query.json": rocm_case(
        "amd/rocm-smi/rx6700xt_rocm-4.3.0_telegraf-query.json",
        [
            # "Card series": "0x1002" is the vendor id, not a name: only the device id is left
            _amd("AMD-PCI-0000:07:00.0", "AMD GPU 0x73df", 12868124672, 12868124672 - 1622728704, 0.0, "0000:07:00.0")
        ],
    ),
    "amd/rocm-smi/mi50-vega20_telegraf-query.json": rocm_case(
        "amd/rocm-smi/mi50-vega20_telegraf-query.json",
        [
            dict(
                _amd(
                    "GPU-02f048617326b1ea",
                    "AMD Radeon Instinct MI50 32GB",
                    34342961152,
                    34342961152 - 10850304,
                    0.0,
                    "0000:63:00.0",
                ),
                driver_version="5.9.17",
            )
        ],
    ),
    "amd/rocm-smi/2x-mi250-gcd_showproductname-P_torchserve.json": rocm_case(
        "amd/rocm-smi/2x-mi250-gcd_showproductname-P_torchserve.json",
        [_amd("AMD-card0", MI250, None, None, None, None), _amd("AMD-card1", MI250, None, None, None, None)],
    ),
    "amd/rocm-smi/2x-mi250-gcd_showid-showproductname-showuse-showmemuse-showmeminfo-vram-P_torchserve.json": rocm_case(
        "amd/rocm-smi/2x-mi250-gcd_showid-showproductname-showuse-showmemuse-showmeminfo-vram-P_torchserve.json",
        [
            dict(
                _amd("AMD-card0", MI250, 68702699520, 68702699520 - 51527024640, 50.0, None),
                attributes={"secondary_die": False},
            ),
            dict(
                _amd("AMD-card1", MI250, 68702699520, 68702699520 - 51527024640, 50.0, None),
                attributes={"secondary_die": True},
            ),
        ],
    ),
    "amd/rocm-smi/mi250-gcd_a-json_wandb.json": rocm_case(
        "amd/rocm-smi/mi250-gcd_a-json_wandb.json",
        [dict(_amd("GPU-719d230578348e8c", MI250, None, None, 0.0, "0000:2f:00.0"), driver_version="6.2.4")],
    ),
    SYSFS: sysfs_case,
}


def test_every_fixture_is_listed() -> None:
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*") if p.is_file() and p.name != "README.md"}
    assert on_disk == set(CASES)


@pytest.mark.parametrize("rel", sorted(CASES))
def test_fixture(rel: str, tools: StubTools, tmp_path: Path) -> None:
    CASES[rel](tools, tmp_path)
