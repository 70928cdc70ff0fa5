"""nvidia-smi backend behaviour beyond the fixture table: spawns, warnings, timeouts, MIG memory."""

from __future__ import annotations

import time

import pytest
from gpu_support import Out, StubTools, fixture_path

from cuectl.errors import BackendOutputError, BackendUnavailable
from cuectl.gpu.smi import QUERY_FIELDS, SmiBackend, parse_csv, parse_query_gpu
from cuectl.units import MIB

H100 = fixture_path("nvidia-smi/query-gpu/h100-80gb-hbm3_590.48.01_load.csv")
V100_TABLE = fixture_path("nvidia-smi/table/8x-tesla-v100-sxm2-32gb_460.32.03_inforom-corrupted-warning.txt")


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-444444444444"


def noheader_rows(n: int) -> str:
    """What the discovery query prints (noheader,nounits) on an n-GPU host, in QUERY_FIELDS order."""
    return "".join(
        f"{i}, {_uuid(i)}, Tesla V100-SXM2-32GB, 32510, {32510 - i}, {i}, {10 * i}, 00000000:{i + 1:02X}:00.0, "
        f"460.32.03, 7.0, [N/A]\n"
        for i in range(n)
    )


def sample_rows(n: int) -> str:
    """What the sampling query prints: uuid, utilization.gpu, memory.used, memory.free."""
    return "".join(f"{_uuid(i)}, {50 + i}, {1000 * i}, {32510 - 1000 * i}\n" for i in range(n))


def test_headerless_discovery_in_query_order(tools: StubTools) -> None:
    tools.add("nvidia-smi", [("*--query-gpu=index*", Out(text=noheader_rows(3)))])
    devices = SmiBackend().discover()
    assert [d.uuid for d in devices] == [_uuid(0), _uuid(1), _uuid(2)]
    assert [d.index for d in devices] == [0, 1, 2]
    d = devices[2]
    assert (d.memory_total_bytes, d.memory_free_bytes, d.utilization_pct) == (32510 * MIB, 32508 * MIB, 20.0)
    assert (d.pci_bus_id, d.compute_capability, d.driver_version) == ("0000:03:00.0", "7.0", "460.32.03")
    assert d.attributes["vendor_index"] == 2
    call = tools.calls("nvidia-smi")[0]
    assert call == f"--query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"


def test_warning_lines_around_the_csv_are_ignored(tools: StubTools) -> None:
    warning = V100_TABLE.read_text().splitlines()[-1]
    assert warning.startswith("WARNING: infoROM is corrupted")
    tools.add("nvidia-smi", Out(text=f"{warning}\n{noheader_rows(2)}{warning}\n"))
    assert len(SmiBackend().discover()) == 2


def test_row_with_wrong_column_count_is_a_clean_error() -> None:
    with pytest.raises(BackendOutputError, match="expected 11 comma-separated values, got 3"):
        parse_query_gpu("a, b, c\n")


def test_header_is_only_taken_when_it_names_asked_fields() -> None:
    # A data row of bare words must not be mistaken for a header.
    assert parse_csv("Enabled\n", ["mig.mode.current"]) == [{"mig.mode.current": "Enabled"}]
    assert parse_csv("mig.mode.current\nEnabled\n", ["mig.mode.current"]) == [{"mig.mode.current": "Enabled"}]


def test_placeholders_are_none() -> None:
    (row,) = parse_query_gpu(
        "0, GPU-1, Tesla P4, [Not Supported], [N/A], [N/A], [Unknown Error], , 1.0, [N/A], [N/A]\n"
    )
    assert (row.memory_total_bytes, row.memory_free_bytes, row.utilization_pct, row.pci_bus_id) == (None,) * 4
    assert row.compute_capability is None and row.driver_version == "1.0"


def test_sample_is_one_spawn_without_pids_and_two_with(tools: StubTools) -> None:
    tools.add(
        "nvidia-smi",
        [
            ("*--query-gpu=index*", Out(text=noheader_rows(8))),
            ("*--query-gpu=uuid*", Out(text=sample_rows(8))),
            ("*--query-compute-apps*", Out(text=f"4242, {_uuid(3)}, 700\n77, {_uuid(3)}, 5\n")),
        ],
    )
    backend = SmiBackend()
    uuids = [d.uuid for d in backend.discover()]
    n0 = len(tools.calls("nvidia-smi"))
    samples = backend.sample(uuids)
    assert len(tools.calls("nvidia-smi")) - n0 == 1
    assert set(samples) == set(uuids)
    s3 = samples[_uuid(3)]
    assert (s3.utilization_pct, s3.memory_used_bytes, s3.memory_free_bytes) == (53.0, 3000 * MIB, 29510 * MIB)
    assert s3.processes == ()
    with_pids = backend.sample([_uuid(3), "GPU-unknown"], pids={4242})
    assert len(tools.calls("nvidia-smi")) - n0 == 3
    assert list(with_pids) == [_uuid(3)]
    assert [(p.pid, p.memory_used_bytes, p.utilization_pct) for p in with_pids[_uuid(3)].processes] == [
        (4242, 700 * MIB, None)
    ]


def test_sample_before_discover_discovers_first(tools: StubTools) -> None:
    tools.add(
        "nvidia-smi",
        [("*--query-gpu=index*", Out(text=noheader_rows(1))), ("*--query-gpu=uuid*", Out(text=sample_rows(1)))],
    )
    assert list(SmiBackend().sample([_uuid(0)])) == [_uuid(0)]


def test_missing_tool_is_unavailable_with_install_hint(tools: StubTools) -> None:
    with pytest.raises(BackendUnavailable, match="nvidia-smi not found on PATH") as err:
        SmiBackend().discover()
    assert "NVIDIA driver" in (err.value.hint or "")


def test_hanging_tool_times_out(tools: StubTools) -> None:
    tools.add("nvidia-smi", Out(hang=True))
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="did not answer within 0.3 s"):
        SmiBackend(timeout=0.3).discover()
    assert time.monotonic() - start < 5


def test_unknown_failure_keeps_stderr(tools: StubTools) -> None:
    tools.add("nvidia-smi", Out(exit=3, stderr="something odd"))
    with pytest.raises(BackendUnavailable, match=r"nvidia-smi failed \(exit 3\): something odd"):
        SmiBackend().discover()


A100_XML = fixture_path("nvidia-smi/xml/a100-sxm4-40gb-mig_510.47.03.xml")
A100_UUID = "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"


def test_mig_instances_take_their_memory_from_the_xml_log(tools: StubTools) -> None:
    """The A100 of the MIG XML fixture, with -L and query lines written in nvidia-smi's format
    for that card (no capture of those two commands exists for it)."""
    listing = (
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {A100_UUID})\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-aaaaaaaa-0000-0000-0000-000000000000)\n"
        "  MIG 3g.20gb     Device  1: (UUID: MIG-bbbbbbbb-0000-0000-0000-000000000000)\n"
    )
    query = (
        f"0, {A100_UUID}, NVIDIA A100-SXM4-40GB, 40960, 40315, 38, [N/A], 00000000:00:04.0, 510.47.03, 8.0, Enabled\n"
    )
    tools.add(
        "nvidia-smi",
        [("*--query-gpu=index*", Out(text=query)), ("-L", Out(text=listing)), ("-q -x", Out(file=A100_XML))],
    )
    devices = SmiBackend().discover()
    assert [(d.uuid, d.mig_profile, d.memory_total_bytes, d.memory_free_bytes) for d in devices] == [
        ("MIG-aaaaaaaa-0000-0000-0000-000000000000", "3g.20gb", 19968 * MIB, 19948 * MIB),
        ("MIG-bbbbbbbb-0000-0000-0000-000000000000", "3g.20gb", 19968 * MIB, 19948 * MIB),
    ]
    assert [d.attributes["gpu_instance_id"] for d in devices] == [1, 2]
    assert all(d.model == "NVIDIA A100-SXM4-40GB MIG 3g.20gb" and d.mig_parent_uuid == A100_UUID for d in devices)
    assert all(d.compute_capability == "8.0" and d.pci_bus_id == "0000:00:04.0" for d in devices)


def test_no_mig_means_no_extra_spawns(tools: StubTools) -> None:
    tools.add("nvidia-smi", [("*--query-gpu=index*", Out(file=H100))])
    SmiBackend().discover()
    assert len(tools.calls("nvidia-smi")) == 1
