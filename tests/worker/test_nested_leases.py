"""Leases inside a frame (issue 13, item 5): `cuectl.lease()` and `cuectl run` in a frame
run by a real worker draw only from the frame's own devices, without waiting for the
frame's own locks, and never point the isolation variables outside the allocation."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from farmlib import V100, cuectl_cmd

from cuectl.run.lease import list_leases

API_FRAME = textwrap.dedent("""
    import json, os, sys
    import cuectl
    from cuectl.errors import LeaseError

    def err(call):
        try:
            call().release()
        except LeaseError as exc:
            return [type(exc).__name__, exc.message]
        return None

    out = {"frame": os.environ["CUE_GPU_UUIDS"].split(","), "cvd": os.environ["CUDA_VISIBLE_DEVICES"]}
    with cuectl.lease(gpus=1, label="a") as a, cuectl.lease(gpus=1, label="b") as b:
        out["a"], out["b"] = a.env, b.env
        out["third"] = err(lambda: cuectl.lease(gpus=1))  # both of the frame's devices are taken
    with cuectl.lease(gpus=2) as both:
        out["both"] = both.env
    out["too_many"] = err(lambda: cuectl.lease(gpus=3))
    out["outside"] = err(lambda: cuectl.lease(devices=[os.environ["OTHER"]]))
    with open(os.path.join(os.environ["OUT"], os.environ["CUE_FRAME_ID"] + ".json"), "w") as fh:
        json.dump(out, fh)
""")


def _devices(fake):
    from cuectl.gpu import discover

    return discover("fake", fake_file=str(fake)).devices


@pytest.fixture
def lock_dir_env() -> Path:
    return Path(os.environ["CUECTL_LOCK_DIR"])


def test_python_api_inside_a_frame_uses_only_the_frames_devices(farm, lock_dir_env):
    fake = farm.host("nest", [V100, V100, V100, V100])
    devices = _devices(fake)
    script = farm.tmp / "api_frame.py"
    script.write_text(API_FRAME)
    out = farm.tmp / "out"
    out.mkdir()
    job = farm.submit(
        {
            "name": "nested-api",
            "layers": [
                {
                    "name": "n",
                    "command": [sys.executable, str(script)],
                    "range": "1-2",
                    "gpus": 2,
                    "timeout": "60",
                    # A device of the host that the frame may or may not have: refused unless it is the frame's.
                    "env": {"OUT": str(out), "OTHER": devices[3].uuid},
                }
            ],
        }
    )
    res = farm.run_worker(fake, timeout=120)
    assert res.returncode == 0, res.stderr
    frames = farm.frames(job)
    assert {f["state"] for f in frames} == {"SUCCEEDED"}, [
        farm.cuectl("frame", "log", str(f["id"])).stdout for f in frames
    ]
    index = {d.uuid: str(d.index) for d in devices}
    for f in frames:
        got = json.loads((out / f"{f['id']}.json").read_text())
        mine = set(got["frame"])
        assert len(mine) == 2
        a, b = got["a"]["CUE_GPU_UUIDS"], got["b"]["CUE_GPU_UUIDS"]
        assert {a, b} == mine, "two sub-leases get the frame's two devices, one each"
        for env in (got["a"], got["b"]):
            assert env["CUDA_VISIBLE_DEVICES"] == index[env["CUE_GPU_UUIDS"]]
            assert env["CUE_LEASE_LEVEL"] == "1"
        assert set(got["both"]["CUE_GPU_UUIDS"].split(",")) == mine
        assert set(got["both"]["CUDA_VISIBLE_DEVICES"].split(",")) == {index[u] for u in mine}
        assert got["third"][0] == "DevicesBusy"
        assert got["too_many"][0] == "NoMatchingDevice"
        assert "asks for 3 devices but the frame has 2 devices" in got["too_many"][1]
        if devices[3].uuid in mine:
            assert got["outside"] is None
        else:
            assert got["outside"][0] == "InvalidDevice" and "not one of the frame's devices" in got["outside"][1]
    assert list_leases(lock_dir_env) == []


def test_cuectl_run_inside_a_frame_uses_only_the_frames_device(farm, lock_dir_env):
    fake = farm.host("nest2", [V100, V100, V100])
    cuectl = " ".join(cuectl_cmd())
    out = farm.tmp / "out"
    out.mkdir()
    script = textwrap.dedent(f"""
        set -u
        echo "frame $CUE_GPU_UUIDS $CUDA_VISIBLE_DEVICES" > "$OUT/$CUE_FRAME_ID"
        {cuectl} run --gpus 1 --no-wait -- sh -c 'echo "run $CUE_GPU_UUIDS $CUDA_VISIBLE_DEVICES"' >> "$OUT/$CUE_FRAME_ID"
        {cuectl} run --gpus 1 --no-wait -- {cuectl} run --gpus 1 --no-wait -- \\
            sh -c 'echo "nested $CUE_GPU_UUIDS $CUDA_VISIBLE_DEVICES"' >> "$OUT/$CUE_FRAME_ID"
        {cuectl} run --gpus 2 --no-wait -- true 2> "$OUT/$CUE_FRAME_ID.err"
        echo "two $?" >> "$OUT/$CUE_FRAME_ID"
    """)
    job = farm.submit(
        {
            "name": "nested-run",
            "layers": [
                {"name": "r", "command": script, "range": "1-3", "gpus": 1, "timeout": "60", "env": {"OUT": str(out)}}
            ],
        }
    )
    res = farm.run_worker(fake, timeout=120)
    assert res.returncode == 0, res.stderr
    frames = farm.frames(job)
    assert {f["state"] for f in frames} == {"SUCCEEDED"}
    for f in frames:
        lines = [line.split() for line in (out / str(f["id"])).read_text().splitlines()]
        assert [line[0] for line in lines] == ["frame", "run", "nested", "two"], lines
        frame_dev = lines[0][1:]
        assert lines[1][1:] == frame_dev and lines[2][1:] == frame_dev  # same uuid, same CUDA index
        assert lines[3] == ["two", "1"]
        err = (out / f"{f['id']}.err").read_text()
        assert "error: inside frame" in err and "asks for 2 devices but the frame has 1 device" in err, err
    assert list_leases(lock_dir_env) == []


def test_a_stale_frame_environment_is_refused(farm, monkeypatch):
    """A copied frame environment whose devices nobody leases is not a frame."""
    import cuectl
    from cuectl.errors import LeaseError

    fake = farm.host("stale", [V100])
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(fake))
    monkeypatch.setenv("CUE_FRAME_ID", "77")
    monkeypatch.setenv("CUE_GPUS", "1")
    monkeypatch.setenv("CUE_GPU_UUIDS", _devices(fake)[0].uuid)
    with pytest.raises(LeaseError, match="inside frame 77, but its device .* is not leased"):
        cuectl.lease(gpus=1)
