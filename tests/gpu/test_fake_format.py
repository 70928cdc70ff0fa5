"""The fake-GPU format's MIG instances, unified memory, unhealthy devices and ordering:
fake devices must look exactly as the real backends would give them (CI runs on them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cuectl.errors import InvalidInput
from cuectl.gpu import discover
from cuectl.gpu.fake import FakeBackend, default_fake_mig_uuid, default_fake_uuid, load_fake_config
from cuectl.units import GIB, MIB

# Values of the H100 MIG capture in tests/fixtures/gpu (nvidia-smi/table/h100-80gb-hbm3-mig_…).
H100 = "NVIDIA H100 80GB HBM3"
MIG_3G = "MIG-00000000-0000-0000-0000-000000000000"
MIG_1G = "MIG-00000002-0000-0000-0000-000000000002"


def write(tmp_path: Path, devices: list[dict], *, host: str = "box", state: bool = False) -> Path:
    doc: dict = {"host": host, "devices": devices}
    if state:
        doc["state_dir"] = "state"
        (tmp_path / "state").mkdir(exist_ok=True)
    path = tmp_path / "gpus.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def h100_mig(**extra) -> dict:
    return {
        "model": H100,
        "memory": "81559MiB",
        "uuid": "GPU-00000000-0000-0000-0000-0000000000aa",
        "pci_bus_id": "00000000:1B:00.0",
        "driver_version": "590.48.01",
        "compute_capability": "9.0",
        "mig": [
            {"profile": "3g.40gb", "memory": "40448MiB", "uuid": MIG_3G},
            {"profile": "1g.10gb", "memory": "9984MiB", "uuid": MIG_1G},
        ],
        **extra,
    }


# --------------------------------------------------------------------------- MIG


def test_mig_instances_are_devices_as_nvml_gives_them(tmp_path: Path) -> None:
    path = write(
        tmp_path, [{"model": "Tesla V100-SXM2-16GB", "memory": "16160MiB", "pci_bus_id": "0000:0a:00.0"}, h100_mig()]
    )
    devices = FakeBackend(path).discover()
    # The MIG card is not leasable as a whole: only its instances are listed.
    assert [(d.index, d.uuid) for d in devices] == [(0, default_fake_uuid("box", 0)), (1, MIG_3G), (2, MIG_1G)]
    big, small = devices[1:]
    assert (big.model, big.mig_profile, big.mig_parent_uuid) == (
        f"{H100} MIG 3g.40gb",
        "3g.40gb",
        "GPU-00000000-0000-0000-0000-0000000000aa",
    )
    assert (big.memory_total_bytes, big.memory_free_bytes, small.memory_total_bytes) == (
        40448 * MIB,
        40448 * MIB,
        9984 * MIB,
    )
    assert big.utilization_pct is None  # NVIDIA reports none for MIG instances
    assert (big.pci_bus_id, big.driver_version, big.compute_capability, big.vendor) == (
        "0000:1b:00.0",
        "590.48.01",
        "9.0",
        "NVIDIA",
    )
    # The attributes NVML gives: the card's index, the instance's slot.
    assert dict(big.attributes) == {"vendor_index": 1, "mig_device_index": 0, "gpu_instance_id": None}
    assert dict(small.attributes)["mig_device_index"] == 1


def test_mig_defaults_and_mig_on_without_instances(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"model": H100, "memory": "80GiB", "mig": [{"profile": "7g.80gb", "memory": "80GiB"}]},
            {"model": H100, "memory": "80GiB", "mig": []},
        ],
    )  # MIG on, no instances created
    (only,) = FakeBackend(path).discover()
    assert only.uuid == default_fake_mig_uuid("box", 0, 0) and only.uuid.startswith("MIG-")
    assert only.mig_parent_uuid == default_fake_uuid("box", 0)


def test_mig_instances_sample_their_own_state_file(tmp_path: Path) -> None:
    path = write(tmp_path, [h100_mig()], state=True)
    (tmp_path / "state" / "0.1.json").write_text(
        json.dumps(
            {"utilization_pct": 80, "memory_used_bytes": GIB, "processes": [{"pid": 7, "memory_used_bytes": GIB}]}
        )
    )
    backend = FakeBackend(path)
    backend.discover()
    samples = backend.sample([MIG_3G, MIG_1G], pids={7})
    assert (samples[MIG_1G].memory_used_bytes, samples[MIG_1G].memory_free_bytes) == (GIB, 9984 * MIB - GIB)
    assert samples[MIG_1G].utilization_pct is None
    assert [p.pid for p in samples[MIG_1G].processes] == [7]
    assert (samples[MIG_3G].memory_used_bytes, samples[MIG_3G].processes) == (0, ())


# --------------------------------------------------------------------------- unified memory


def test_unified_memory_is_the_hosts_and_its_free_share_unknown(tmp_path: Path) -> None:
    path = write(
        tmp_path, [{"model": "Apple M3 Max", "vendor": "Apple", "memory": "64GiB", "unified_memory": True}], state=True
    )
    (tmp_path / "state" / "0.json").write_text('{"utilization_pct": 30, "memory_used_bytes": 60000000000}')
    backend = FakeBackend(path)
    (d,) = backend.discover()
    assert (d.unified_memory, d.memory_total_bytes, d.memory_free_bytes, d.utilization_pct) == (
        True,
        64 * GIB,
        None,
        30.0,
    )
    assert d.to_json()["unified_memory"] is True
    s = backend.sample([d.uuid])[d.uuid]
    assert (s.memory_used_bytes, s.memory_free_bytes, s.utilization_pct) == (60000000000, None, 30.0)


# --------------------------------------------------------------------------- health


def test_unhealthy_devices_are_left_out_and_keep_their_number(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"model": "T4", "memory": "16G", "healthy": False, "error": "GPU has fallen off the bus"},
            {"model": "T4", "memory": "16G"},
            {"model": "T4", "memory": "16G", "error": "Xid 48: double-bit ECC error"},
        ],
    )
    cfg = load_fake_config(path)
    (d,) = cfg.devices
    assert (d.index, d.uuid, d.attributes["vendor_index"]) == (0, default_fake_uuid("box", 1), 1)
    assert cfg.skipped == (
        f"devices[0] ({default_fake_uuid('box', 0)}): GPU has fallen off the bus",
        f"devices[2] ({default_fake_uuid('box', 2)}): Xid 48: double-bit ECC error",
    )
    found = discover(fake_file=path)
    assert [x.uuid for x in found.devices] == [d.uuid]


def test_a_host_whose_every_gpu_is_unhealthy_reports_the_backend_failed(tmp_path: Path) -> None:
    path = write(tmp_path, [{"model": "T4", "memory": "16G", "healthy": False}])
    found = discover(fake_file=path)
    assert found.devices == []
    (status,) = found.backends
    assert (status.name, status.ok) == ("fake", False)
    assert (
        status.error == f"no GPU could be read: devices[0] ({default_fake_uuid('box', 0)}): "
        "marked unhealthy in the fake GPU file"
    )


# --------------------------------------------------------------------------- order and numbering


def test_vendor_indices_count_per_vendor(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"model": "AMD Instinct MI100", "vendor": "AMD", "memory": "32GiB"},
            {"model": "Apple M3 Max", "vendor": "Apple", "memory": "64GiB"},
            {"model": "Tesla V100-SXM2-16GB", "memory": "16160MiB"},
            {"model": "AMD Instinct MI100", "vendor": "AMD", "memory": "32GiB"},
            {"model": "NVIDIA A100-SXM4-80GB", "memory": "80GiB"},
        ],
    )
    devices = FakeBackend(path).discover()
    # As auto discovery lists them: NVIDIA (nvml), then AMD, then Apple; each numbered by its own tools.
    assert [(d.index, d.model, d.attributes["vendor_index"]) for d in devices] == [
        (0, "Tesla V100-SXM2-16GB", 0),
        (1, "NVIDIA A100-SXM4-80GB", 1),
        (2, "AMD Instinct MI100", 0),
        (3, "AMD Instinct MI100", 1),
        (4, "Apple M3 Max", 0),
    ]
    # UUIDs stay tied to the position in the file, whatever the order.
    assert devices[0].uuid == default_fake_uuid("box", 2) and devices[4].uuid == default_fake_uuid("box", 1)


def test_a_vendors_devices_are_ordered_by_pci_bus_id_then_listing(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [
            {"model": "no-bus-a", "memory": "16G"},
            {"model": "bus-c1", "memory": "16G", "pci_bus_id": "0000:C1:00.0"},
            {"model": "bus-1a", "memory": "16G", "pci_bus_id": "1a:00.0"},
            {"model": "no-bus-b", "memory": "16G"},
            {"model": "bus-3b", "memory": "16G", "pci_bus_id": "00000000:3B:00.0"},
        ],
        state=True,
    )
    (tmp_path / "state" / "2.json").write_text('{"utilization_pct": 42, "memory_used_bytes": 0}')
    backend = FakeBackend(path)
    devices = backend.discover()
    assert [(d.index, d.model, d.attributes["vendor_index"], d.pci_bus_id) for d in devices] == [
        (0, "bus-1a", 0, "0000:1a:00.0"),
        (1, "bus-3b", 1, "0000:3b:00.0"),
        (2, "bus-c1", 2, "0000:c1:00.0"),
        (3, "no-bus-a", 3, None),
        (4, "no-bus-b", 4, None),
    ]
    # State files stay named by the position in the file: "2.json" is bus-1a's.
    assert devices[0].utilization_pct == 42.0
    assert backend.sample([devices[0].uuid])[devices[0].uuid].utilization_pct == 42.0


# --------------------------------------------------------------------------- mistakes


@pytest.mark.parametrize(
    "device, message",
    [
        ({"model": "X", "memory": "16G", "vendor": "AMD", "mig": []}, "devices[0].mig: MIG is NVIDIA only"),
        ({"model": "X", "memory": "16G", "mig": {"profile": "1g.10gb"}}, "devices[0].mig: expected a list"),
        ({"model": "X", "memory": "16G", "mig": [{"memory": "8G"}]}, "devices[0].mig[0].profile: required"),
        ({"model": "X", "memory": "16G", "mig": [{"profile": "1g.10gb"}]}, "devices[0].mig[0].memory: required"),
        (
            {"model": "X", "memory": "16G", "mig": [{"profile": "1g.10gb", "memory": "x"}]},
            "devices[0].mig[0].memory: invalid size 'x'",
        ),
        (
            {"model": "X", "memory": "16G", "mig": [{"profile": "1g.10gb", "memory": "8G", "slot": 1}]},
            "devices[0].mig[0].slot: unknown key",
        ),
        (
            {"model": "X", "memory": "16G", "mig": [{"profile": "1g.10gb", "memory": "8G", "uuid": "MIG 1"}]},
            "devices[0].mig[0].uuid: expected a string without spaces",
        ),
        ({"model": "X", "memory": "16G", "unified_memory": "yes"}, "devices[0].unified_memory: expected true or false"),
        (
            {"model": "X", "memory": "16G", "unified_memory": True, "mig": []},
            "devices[0].unified_memory: a MIG card has memory of its own",
        ),
        ({"model": "X", "memory": "16G", "healthy": "no"}, "devices[0].healthy: expected true or false"),
        (
            {"model": "X", "memory": "16G", "healthy": True, "error": "Xid 79"},
            "devices[0].error: a healthy device has no error",
        ),
        ({"model": "X", "memory": "16G", "error": ""}, "devices[0].error: expected a message"),
        ({"model": "X", "memory": "16G", "pci_bus_id": "slot 3"}, "devices[0].pci_bus_id: expected a PCI bus id"),
    ],
)
def test_mistakes_in_the_new_keys_name_the_field(tmp_path: Path, device: dict, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_fake_config(write(tmp_path, [device]))
    assert message in err.value.message
    assert err.value.exit_code == 2


def test_uuids_and_bus_ids_are_unique_across_cards_and_instances(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"devices\[1\]\.mig\[0\]\.uuid: 'GPU-a' already used by devices\[0\]"):
        load_fake_config(
            write(
                tmp_path,
                [
                    {"model": "X", "memory": "16G", "uuid": "GPU-a"},
                    {"model": "Y", "memory": "16G", "mig": [{"profile": "1g.5gb", "memory": "5G", "uuid": "GPU-a"}]},
                ],
            )
        )
    with pytest.raises(InvalidInput, match=r"devices\[1\]\.pci_bus_id: '0000:1a:00\.0' already used by devices\[0\]"):
        load_fake_config(
            write(
                tmp_path,
                [
                    {"model": "X", "memory": "16G", "pci_bus_id": "1a:00.0"},
                    {"model": "Y", "memory": "16G", "pci_bus_id": "0000:1A:00.0"},
                ],
            )
        )


def test_an_unquoted_bus_id_that_yaml_reads_as_a_number_says_to_quote_it(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text("devices:\n  - {model: T4, memory: 16G, pci_bus_id: 0000:10:00.0}\n")  # YAML 1.1: base 60
    with pytest.raises(InvalidInput, match=r"devices\[0\]\.pci_bus_id: expected a PCI bus id") as err:
        load_fake_config(path)
    assert "quote it" in (err.value.hint or "")
