"""The uncontended lease fast path keeps every guarantee of the slow one.

Per-process caches (the inventory and what a request comes to on it, lock paths, the lock
directory check, a quiet wait-queue directory) must notice what changes: a rewritten fake
GPU file, a waiter's new ticket. The record is still written on every lease, and trimmed
when a stale longer one was left in the file. Behaviour only, never timing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import cuectl
from cuectl.config import lock_dir
from cuectl.errors import DevicesBusy, InvalidInput, LeaseError, NoMatchingDevice
from cuectl.run.lease import forget_discovery, list_leases, lock_path
from cuectl.run.lease.locks import QUEUE_DIRNAME
from cuectl.run.lease.queue import QUIET_NS, WaitQueue, _quiet, ticket_names

from .conftest import V100, FakeHost, make_fake_host


@pytest.fixture
def gpus1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    host = make_fake_host(tmp_path, [dict(V100)])
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(host.yaml_path))
    return host


def _record(uuid: str) -> dict[str, object]:
    return json.loads(lock_path(lock_dir(), uuid).read_bytes())


def test_inventory_cache_notices_a_rewritten_fake_gpu_file(tmp_path: Path, gpus1: FakeHost) -> None:
    with cuectl.lease(gpus=1):
        pass
    with pytest.raises(NoMatchingDevice):
        cuectl.lease(gpus=2)
    bigger = make_fake_host(tmp_path, [dict(V100), dict(V100)], name="two")
    os.replace(bigger.yaml_path, gpus1.yaml_path)
    later = time.time_ns() + 5_000_000_000  # a new mtime even on a coarse-clock filesystem
    os.utime(gpus1.yaml_path, ns=(later, later))
    with cuectl.lease(gpus=2) as both:
        assert len(both.devices) == 2


def test_a_refusal_is_not_cached(gpus4: FakeHost) -> None:
    for _ in range(2):
        with pytest.raises(NoMatchingDevice):
            cuectl.lease(gpus=5)
    with cuectl.lease(gpus=4) as all4:
        assert sorted(all4.uuids) == sorted(gpus4.uuids)


def test_record_is_written_on_the_fast_path_and_cleared_on_release(gpus4: FakeHost) -> None:
    for _ in range(3):  # the later leases take every cached path
        with cuectl.lease(gpus=1, label="fast-path") as held:
            (uuid,) = held.uuids
            record = _record(uuid)
            assert record["pid"] == os.getpid()
            assert record["label"] == "fast-path" and record["kind"] == "api" and record["uuid"] == uuid
            assert isinstance(record["since"], float)
            infos = list_leases(lock_dir())
            assert [(i.uuid, i.pid, i.label) for i in infos] == [(uuid, os.getpid(), "fast-path")]
        assert lock_path(lock_dir(), uuid).read_bytes() == b""


def test_a_longer_stale_record_is_trimmed(gpus1: FakeHost) -> None:
    with cuectl.lease(gpus=1):
        pass
    path = lock_path(lock_dir(), gpus1.uuids[0])
    # What a holder that shared its fd with a child leaves behind, padded to be longer
    # than any record this lease writes.
    path.write_text(json.dumps({"pid": 999999999, "holder": "x" * 2000}))
    with cuectl.lease(gpus=1, label="after-stale"):
        record = _record(gpus1.uuids[0])
        assert record["label"] == "after-stale" and record["pid"] == os.getpid()


def test_env_of_a_cached_grant_is_not_shared_between_leases(gpus4: FakeHost) -> None:
    with cuectl.lease(gpus=1) as first:
        first.env["CUE_GPUS"] = "tampered"
    with cuectl.lease(gpus=1) as second:
        assert second.env["CUE_GPUS"] == "1"


def _age_queue_dir() -> Path:
    queue_dir = lock_dir() / QUEUE_DIRNAME
    past = time.time_ns() - 10 * QUIET_NS
    os.utime(queue_dir, ns=(past, past))
    return queue_dir


def test_a_waiter_ticket_still_blocks_a_younger_no_wait_caller_after_a_quiet_listing(gpus1: FakeHost) -> None:
    with cuectl.lease(gpus=1):
        pass
    queue_dir = _age_queue_dir()
    with cuectl.lease(gpus=1):
        pass  # lists the (old, empty) queue dir and remembers it as quiet
    assert str(queue_dir) in _quiet
    waiter = WaitQueue(lock_dir())
    waiter.join(gpus1.uuids, 1, "older waiter")
    try:
        with pytest.raises(DevicesBusy):
            cuectl.lease(gpus=1)
    finally:
        waiter.leave()
    with cuectl.lease(gpus=1):
        pass


def test_quiet_listing_is_remembered_only_for_an_old_directory(tmp_path: Path) -> None:
    queue_dir = tmp_path / "queue"
    queue_dir.mkdir()
    assert ticket_names(queue_dir) == []
    assert str(queue_dir) not in _quiet  # modified just now: a ticket may land in the same tick
    past = time.time_ns() - 10 * QUIET_NS
    os.utime(queue_dir, ns=(past, past))
    assert ticket_names(queue_dir) == []
    assert str(queue_dir) in _quiet
    (queue_dir / "00000000000000000001-1-abcdef.ticket").write_text("{}")
    assert ticket_names(queue_dir) == ["00000000000000000001-1-abcdef.ticket"]
    assert str(queue_dir) not in _quiet


def test_forget_discovery_drops_the_plans(gpus4: FakeHost) -> None:
    import importlib

    acquire_mod = importlib.import_module("cuectl.run.lease.acquire")
    with cuectl.lease(gpus=1):
        pass
    assert acquire_mod._plans
    forget_discovery()
    assert not acquire_mod._plans
    with cuectl.lease(gpus=1):
        pass


# -- a call made before: ``lease()`` remembers what it made of its arguments ----------------------


def test_a_remembered_call_follows_the_lock_directory_the_environment_names(
    gpus4: FakeHost, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(2):
        with cuectl.lease(gpus=1) as held:
            assert held.lock_dir == lock_dir()
    other = tmp_path / "other-locks"
    monkeypatch.setenv("CUECTL_LOCK_DIR", str(other))
    for _ in range(2):
        with cuectl.lease(gpus=1) as held:
            assert held.lock_dir == other
            assert lock_path(other, held.uuids[0]).read_bytes()  # its record is there


@pytest.mark.parametrize(
    "valid, invalid",
    [
        (dict(gpus=1), dict(gpus=True)),
        (dict(gpus=1), dict(gpus=1.0)),
        (dict(devices=(1,)), dict(devices=(True,))),
        (dict(wait=True, timeout=1), dict(wait=True, timeout=True)),
    ],
)
def test_an_argument_equal_to_a_remembered_one_but_of_another_type_is_still_refused(
    gpus4: FakeHost, valid: dict[str, object], invalid: dict[str, object]
) -> None:
    # True == 1 == 1.0: a key of values alone would find the plan made for the valid call.
    for _ in range(2):
        with cuectl.lease(**valid):  # type: ignore[arg-type]
            pass
    with pytest.raises(InvalidInput):
        cuectl.lease(**invalid)  # type: ignore[arg-type]


def test_a_remembered_call_notices_a_rewritten_fake_gpu_file(tmp_path: Path, gpus1: FakeHost) -> None:
    for _ in range(2):
        with cuectl.lease(gpus=1) as held:
            assert held.uuids == (gpus1.uuids[0],)
    other = make_fake_host(tmp_path, [dict(V100, uuid="GPU-00000000-0000-0000-0000-0000000000aa")], name="other")
    os.replace(other.yaml_path, gpus1.yaml_path)
    later = time.time_ns() + 5_000_000_000  # a new mtime even on a coarse-clock filesystem
    os.utime(gpus1.yaml_path, ns=(later, later))
    with cuectl.lease(gpus=1) as held:
        assert held.uuids == ("GPU-00000000-0000-0000-0000-0000000000aa",)


def test_a_remembered_call_made_inside_a_frame_checks_the_frames_devices(
    gpus4: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(2):
        with cuectl.lease(gpus=1):
            pass
    # The environment of a frame that has ended: its device is leased by nobody.
    monkeypatch.setenv("CUE_FRAME_ID", "f-gone")
    monkeypatch.setenv("CUE_GPUS", "1")
    monkeypatch.setenv("CUE_GPU_UUIDS", gpus4.uuids[0])
    with pytest.raises(LeaseError, match="frame f-gone"):
        cuectl.lease(gpus=1)


def test_a_remembered_call_without_a_label_records_the_programs_name_now(
    gpus4: FakeHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.argv", ["/opt/tools/first-name"])
    for _ in range(2):
        with cuectl.lease(gpus=1) as held:
            assert _record(held.uuids[0])["label"] == "first-name"
    monkeypatch.setattr("sys.argv", ["/opt/tools/second-name"])
    with cuectl.lease(gpus=1) as held:
        assert _record(held.uuids[0])["label"] == "second-name"


def test_a_remembered_call_still_refuses_a_busy_device_naming_its_holder(gpus1: FakeHost) -> None:
    for _ in range(2):
        with cuectl.lease(gpus=1, label="mine"):
            pass
    with cuectl.lease(gpus=1, label="other holder"):
        # The same call again, while the device is held: the full path words the refusal.
        with pytest.raises(DevicesBusy, match="other holder") as refused:
            cuectl.lease(gpus=1, label="mine")
        assert refused.value.holders[0]["pid"] == os.getpid()


def test_arguments_that_cannot_be_remembered_take_the_full_path_every_time(gpus4: FakeHost) -> None:
    for _ in range(2):
        with cuectl.lease(gpus=1, gpu_models=["V100"]) as held:  # a list: no key
            assert len(held.uuids) == 1
        with cuectl.lease(devices=(d for d in [0])) as held:  # a generator: never the same
            assert held.devices[0].index == 0
