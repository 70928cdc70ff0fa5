"""Fake GPUs (DESIGN §7): the YAML file, its validation, and sampling from state files."""

from __future__ import annotations

import json
import re
import uuid as uuidlib
from pathlib import Path

import pytest

from cuectl.errors import InvalidInput
from cuectl.gpu import discover, fake_host_name, get_backend
from cuectl.gpu.fake import FakeBackend, default_fake_uuid, load_fake_config
from cuectl.units import GIB, MIB

DESIGN_EXAMPLE = """\
host: render-01            # optional: host name to register as
state_dir: state           # optional: per-device live values
devices:
  - model: "Tesla V100-SXM2-16GB"
    vendor: NVIDIA
    memory: 16160MiB
    uuid: GPU-11111111-0000-0000-0000-000000000001
  - model: "NVIDIA A100-SXM4-80GB"
    vendor: nvidia
    memory: 80GiB
  - model: Apple M3 Max
    vendor: Apple
    memory: 68719476736
"""


def write(tmp_path: Path, text: str, name: str = "gpus.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_design_example(tmp_path: Path) -> None:
    devices = FakeBackend(write(tmp_path, DESIGN_EXAMPLE)).discover()
    assert [(d.index, d.vendor, d.model, d.memory_total_bytes) for d in devices] == [
        (0, "NVIDIA", "Tesla V100-SXM2-16GB", 16160 * MIB),
        (1, "NVIDIA", "NVIDIA A100-SXM4-80GB", 80 * GIB),
        (2, "Apple", "Apple M3 Max", 68719476736),
    ]
    assert devices[0].uuid == "GPU-11111111-0000-0000-0000-000000000001"
    assert all(d.backend == "fake" and d.utilization_pct == 0.0 for d in devices)
    assert devices[1].memory_free_bytes == 80 * GIB  # no state file: idle


def test_default_uuid_is_stable_per_host_and_index(tmp_path: Path) -> None:
    a = FakeBackend(write(tmp_path, DESIGN_EXAMPLE)).discover()
    b = FakeBackend(write(tmp_path, DESIGN_EXAMPLE, "copy.yaml")).discover()
    assert a[1].uuid == b[1].uuid == default_fake_uuid("render-01", 1)
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", a[1].uuid) and uuidlib.UUID(a[1].uuid[4:]).version == 5
    other = FakeBackend(write(tmp_path, DESIGN_EXAMPLE.replace("render-01", "render-02"), "o.yaml")).discover()
    assert other[1].uuid != a[1].uuid and a[1].uuid != a[2].uuid


def test_without_host_key_the_machine_name_seeds_the_uuids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_HOSTNAME", "box-7")
    path = write(tmp_path, "devices:\n  - {model: T4, memory: '15360'}\n")
    (d,) = FakeBackend(path).discover()
    assert d.uuid == default_fake_uuid("box-7", 0)
    assert d.memory_total_bytes == 15360 * MIB  # a bare number string is MiB, as everywhere in cuectl
    assert fake_host_name(path) is None


def test_fake_host_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, DESIGN_EXAMPLE)
    assert fake_host_name(path) == "render-01"
    assert fake_host_name() is None  # CUECTL_FAKE_GPUS unset
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    assert fake_host_name() == "render-01"


def test_sampling_reads_state_files(tmp_path: Path) -> None:
    backend = FakeBackend(write(tmp_path, DESIGN_EXAMPLE))
    devices = backend.discover()
    state = tmp_path / "state"  # relative state_dir: beside the YAML file
    state.mkdir()
    (state / "1.json").write_text(
        json.dumps(
            {
                "utilization_pct": 73,
                "memory_used_bytes": 5 * GIB,
                "processes": [
                    {"pid": 4242, "memory_used_bytes": GIB, "utilization_pct": 40},
                    {"pid": 17, "memory_used_bytes": 2 * GIB},
                ],
            }
        )
    )
    (state / "2.json").write_text('{"utilization_pct": 12, "memory_')  # half-written by a test frame
    samples = backend.sample([d.uuid for d in devices] + ["GPU-unknown"], pids={4242})
    assert set(samples) == {d.uuid for d in devices}
    idle, busy, torn = (samples[d.uuid] for d in devices)
    assert (idle.utilization_pct, idle.memory_used_bytes, idle.memory_free_bytes) == (0.0, 0, 16160 * MIB)
    assert (busy.utilization_pct, busy.memory_used_bytes, busy.memory_free_bytes) == (73.0, 5 * GIB, 75 * GIB)
    assert [(p.pid, p.memory_used_bytes, p.utilization_pct) for p in busy.processes] == [(4242, GIB, 40.0)]
    assert (torn.utilization_pct, torn.memory_used_bytes, torn.memory_free_bytes) == (None, None, None)
    # Values change between samples: the file is read every time.
    (state / "1.json").write_text('{"utilization_pct": 5, "memory_used_bytes": 0}')
    assert backend.sample([devices[1].uuid])[devices[1].uuid].utilization_pct == 5.0
    # Discovery reports the live values too.
    assert FakeBackend(tmp_path / "gpus.yaml").discover()[1].memory_free_bytes == 80 * GIB


def test_absolute_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "elsewhere"
    state.mkdir()
    (state / "0.json").write_text('{"utilization_pct": 99, "memory_used_bytes": 1048576}')
    (tmp_path / "sub").mkdir()
    path = write(tmp_path / "sub", f"state_dir: {state}\ndevices:\n  - {{model: T4, memory: 16G}}\n")
    backend = FakeBackend(path)
    (d,) = backend.discover()
    assert backend.sample([d.uuid])[d.uuid].utilization_pct == 99.0


@pytest.mark.parametrize(
    "text, message",
    [
        ("devices: [\n", "malformed YAML"),
        ("- a\n- b\n", "expected a mapping with a 'devices' list"),
        ("gpus: []\n", "gpus: unknown key in fake GPU file"),
        ("devices: {model: x}\n", "devices: expected a list of devices"),
        ("devices:\n  - {model: T4, memory: 16G}\n  - {model: T4, memory: x}\n", "devices[1].memory: invalid size 'x'"),
        ("devices:\n  - {model: T4, memory: 1.5}\n", "devices[0].memory: invalid size 1.5"),
        ("devices:\n  - {model: T4, memory: 0}\n", "devices[0].memory: must be more than 0"),
        ("devices:\n  - {model: T4, memory: 16160}\n", "devices[0].memory: 16160 bytes is less than 1 MiB"),
        ("devices:\n  - {model: T4}\n", "devices[0].memory: required"),
        ("devices:\n  - {memory: 16G}\n", "devices[0].model: required"),
        ("devices:\n  - {model: T4, memory: 16G, colour: red}\n", "devices[0].colour: unknown key"),
        ("devices:\n  - {model: T4, memory: 16G, vendor: Matrox}\n", "devices[0].vendor: unknown vendor 'Matrox'"),
        (
            "devices:\n  - {model: T4, memory: 16G, uuid: GPU-1}\n  - {model: T4, memory: 16G, uuid: GPU-1}\n",
            "devices[1].uuid: 'GPU-1' already used by devices[0]",
        ),
        (
            "devices:\n  - {model: T4, memory: 16G, uuid: 'GPU 1'}\n",
            "devices[0].uuid: expected a string without spaces",
        ),
        ("host: 12\ndevices: []\n", "host: expected a non-empty string"),
    ],
)
def test_invalid_files_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        load_fake_config(write(tmp_path, text))
    assert message in err.value.message
    assert err.value.exit_code == 2


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="No such file"):
        FakeBackend(tmp_path / "nope.yaml").discover()


def test_empty_file_is_a_host_without_gpus(tmp_path: Path) -> None:
    found = discover("auto", fake_file=write(tmp_path, ""))
    assert found.devices == [] and [b.to_json() for b in found.backends] == [
        {"name": "fake", "ok": True, "error": None, "hint": None}
    ]


def test_fake_backend_needs_a_file() -> None:
    with pytest.raises(InvalidInput, match="needs a device file") as err:
        get_backend("fake")
    assert "CUECTL_FAKE_GPUS" in (err.value.hint or "")
