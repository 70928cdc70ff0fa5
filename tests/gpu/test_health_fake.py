"""The fake backend's health (DESIGN §7, docs/gpu-health.md): ``xid``, ``lost`` and the
conditions that last until a reset, read from each device's state file; an ``xid`` list is
reported once per change of the file."""

from __future__ import annotations

import json
import os

import yaml

from cuectl.gpu.fake import FakeBackend


def backend(tmp_path):
    (tmp_path / "state").mkdir()
    path = tmp_path / "gpus.yaml"
    path.write_text(
        yaml.safe_dump({"host": "h", "state_dir": "state", "devices": [{"model": "T4", "memory": "15GiB"}] * 2})
    )
    b = FakeBackend(path)
    return b, [d.uuid for d in b.discover()], tmp_path / "state"


def test_xid_is_reported_once_per_change_and_lost_and_problems_each_time(tmp_path):
    b, (u0, u1), state = backend(tmp_path)
    assert {u: (h.known, h.xids, h.lost, h.problems) for u, h in b.health([u0, u1]).items()} == {
        u0: (True, (), None, ()),
        u1: (True, (), None, ()),
    }
    (state / "0.json").write_text(json.dumps({"xid": [79, "x", True, 13], "utilization_pct": 50}))
    assert b.health([u0])[u0].xids == (79, 13)
    assert b.health([u0])[u0].xids == ()  # read already
    assert FakeBackend(tmp_path / "gpus.yaml").health([u0])[u0].xids == ()  # a re-discovery too
    (state / "0.json").write_text(json.dumps({"xid": [79], "lost": True}))
    os.utime(state / "0.json", ns=(1, 1))
    h = b.health([u0])[u0]
    assert (h.xids, h.lost) == ((79,), "GPU is lost (fallen off the bus)")
    (state / "1.json").write_text(
        json.dumps({"ecc_uncorrectable": 3, "retirement_pending": True, "remap_pending": True})
    )
    assert b.health([u1])[u1].problems == (
        "uncorrectable ECC errors: 3 since the last reset",
        "page retirement pending (needs a reset)",
        "row remapping pending (needs a reset)",
    )
    assert b.health([u1])[u1].problems == b.health([u1])[u1].problems  # they last
    (state / "1.json").write_text("{half")
    assert not b.health([u1])[u1].known  # a file half-written: no signal
    assert b.health(["GPU-nope"]) == {}
