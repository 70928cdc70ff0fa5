"""Devices out of service for leases (run/lease/outofservice.py, docs/gpu-health.md): what a
worker publishes beside the locks, read back by leases; links and other entries ignored;
a lease through the Python API leaves a drained device out. Real files, real locks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from cuectl.errors import LeaseError
from cuectl.run.lease import lease, outofservice


def test_publish_and_read_back(tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir()
    assert outofservice.read(locks) == {} and not outofservice.any_present(locks)
    assert outofservice.publish(locks, {"GPU-a", "GPU-b"}, {"GPU-a": "Xid 79: GPU has\x1b[2J fallen off the bus"})
    assert outofservice.read(locks) == {"GPU-a": "Xid 79: GPU has [2J fallen off the bus"}
    assert outofservice.any_present(locks)
    # A link, a dot file and a directory are never read as a device.
    where = locks / outofservice.DIRNAME
    (where / "GPU-link").symlink_to(where / "GPU-a")
    (where / ".GPU-x.tmp").write_text("half")
    (where / "GPU-dir").mkdir()
    assert outofservice.read(locks) == {"GPU-a": "Xid 79: GPU has [2J fallen off the bus"}
    # Back in service: removed; devices not this worker's are left alone.
    (where / "GPU-other").write_text("another worker's")
    assert outofservice.publish(locks, {"GPU-a", "GPU-b"}, {})
    assert set(outofservice.read(locks)) == {"GPU-other"}


def test_a_drained_device_is_not_leased(tmp_path, monkeypatch):
    fake = tmp_path / "gpus.yaml"
    fake.write_text(yaml.safe_dump({"host": "h", "devices": [{"model": "T4", "memory": "15360MiB"}] * 2}))
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o1777)
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(fake))
    with lease(gpus=1, backend="fake", lock_dir=locks) as first:
        (drained,) = first.uuids
    outofservice.publish(locks, {drained}, {drained: "fan noise"})
    for _ in range(2):  # (the second call may take the quick path)
        with lease(gpus=1, backend="fake", lock_dir=locks) as again:
            assert again.uuids != first.uuids
    with pytest.raises(LeaseError):
        lease(gpus=2, backend="fake", lock_dir=locks, wait=False)
    assert os.path.isdir(Path(locks) / outofservice.DIRNAME)
