"""Sick GPUs out of service (issue 39 §3, docs/gpu-health.md), through real workers on fake
GPUs (DESIGN §7: the device's state file carries ``xid`` and ``lost``): an Xid 79 on a
running frame's device drains that device, the frame is stopped and runs again on the
other device without its failure counting; a lost device; drains by hand; the suspect rule
drains one device of a host and leaves its others working."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from farmlib import RTX4090
from test_scheduling import devices_of, stop  # tests/worker's helpers (on sys.path)

from cuectl.sched.store import open_store

# The frame: appends its devices to argv[1]; the first attempt (no argv[2] yet) then waits
# to be stopped, a later one succeeds.
ONCE = (
    "import os, sys, time; open(sys.argv[1], 'a').write(os.environ['CUE_GPU_UUIDS'] + '\\n')\n"
    "if os.path.exists(sys.argv[2]): sys.exit(0)\n"
    "open(sys.argv[2], 'w').close()\n"
    "while True: time.sleep(0.05)"
)
# Fails on the device named in argv[1], succeeds on any other; takes a moment, so that both
# devices are busy at once (each job then has frames on both).
PICKY = "import os, sys, time; time.sleep(0.3); sys.exit(1 if os.environ['CUE_GPU_UUIDS'] == sys.argv[1] else 0)"
GATE = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"


def host_gpus(farm, name: str) -> dict[str, dict]:
    res = farm.cuectl("host", "show", name, "--json", check=False)
    return {g["uuid"]: g for g in json.loads(res.stdout)["gpus"]} if res.returncode == 0 else {}  # not registered yet


def state(farm, name: str, uuid: str) -> str | None:
    return host_gpus(farm, name).get(uuid, {}).get("state")


def attempts(farm, frame_id: int) -> list[dict]:
    return json.loads(farm.cuectl("frame", "show", str(frame_id), "--json").stdout)["attempt_history"]


def write_state(fake: Path, index: int, doc: dict) -> None:
    state = fake.with_name(f"{fake.stem}-state")
    tmp = state / f".{index}.tmp"
    tmp.write_text(json.dumps(doc))
    tmp.replace(state / f"{index}.json")  # whole, as a sampler must see it


def test_xid_79_drains_the_device_and_the_frame_reruns_elsewhere_uncounted(farm):
    fake = farm.host("xid-host", [RTX4090, RTX4090], state=True)
    uuids = devices_of(farm, fake)
    runs, marker = farm.tmp / "runs.txt", farm.tmp / "started"
    job = farm.submit(
        {
            "name": "render",
            "layers": [
                {
                    "name": "r",
                    "command": [sys.executable, "-c", ONCE, str(runs), str(marker)],
                    "gpus": 1,
                    "retries": 0,  # a counted failure would make it DEAD
                    "retry_delay": 600,  # and a failure's back-off would hold it for 10 minutes
                }
            ],
        }
    )
    proc = farm.start_worker(fake)
    try:
        running = farm.wait_for(
            lambda: (f := farm.frames(job)[0])["state"] == "RUNNING" and marker.exists() and f, what="the frame running"
        )
        (first,) = running["gpu_uuids"]
        index = next(i for i, u in uuids.items() if u == first)
        write_state(fake, index, {"xid": [79]})
        farm.wait_for(lambda: farm.frames(job)[0]["state"] == "SUCCEEDED", what="the frame rerun elsewhere")
        gpus = host_gpus(farm, "xid-host")
        other = next(u for u in uuids.values() if u != first)
        assert (gpus[first]["state"], gpus[first]["reason"]) == ("drained", "Xid 79: GPU has fallen off the bus")
        assert gpus[first]["state_automatic"] is True
        assert (gpus[other]["state"], gpus[other]["reason"]) == ("ok", None)
        # The worker keeps its drain (the Xid is read once): a new frame goes to the other device.
        again = farm.submit(
            {"name": "next", "layers": [{"name": "n", "command": [sys.executable, "-c", "pass"], "gpus": 1}]}
        )
        farm.wait_for(lambda: farm.frames(again)[0]["state"] == "SUCCEEDED", what="the next frame")
        assert farm.frames(again)[0]["gpu_uuids"] == [other]
        # Leases leave it out too (`cuectl run`, twice: the second may take the quick path).
        show = [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"]
        for _ in range(2):
            res = farm.cuectl("run", "--gpus", "1", "--", *show, fake=fake)
            assert res.stdout.strip() == str(1 - index) and other in res.stderr, (res.stdout, res.stderr)
    finally:
        stop(proc)
    (frame,) = farm.frames(job)
    assert (frame["attempts"], frame["failure"]) == (2, None)
    history = attempts(farm, frame["id"])
    assert [(a["outcome"], a["failure_kind"], a["gpu_uuids"]) for a in history] == [
        ("device-failed", "device-failed", [first]),
        ("succeeded", None, [other]),
    ]
    assert history[0]["failure"] == f"device failed: Xid 79: GPU has fallen off the bus on GPU {index} ({first})"
    assert runs.read_text().split() == [first, other]
    listed = {d["uuid"]: d for d in json.loads(farm.cuectl("gpu", "list", "--json", fake=fake).stdout)["devices"]}
    assert (listed[first]["state"], listed[first]["reason"]) == ("drained", "Xid 79: GPU has fallen off the bus")
    assert listed[other]["state"] == "ok"
    store = open_store(str(farm.db))
    try:
        seen = [(e.kind, e.device_uuid, e.detail) for e in store.gpu_events(host="xid-host")]
        assert ("xid", first, "Xid 79: GPU has fallen off the bus") in seen
        assert ("drained", first, "drained: Xid 79: GPU has fallen off the bus") in seen
        assert [k for k, _, _ in seen].count("xid") == 1  # one event, however many readings
    finally:
        store.close()


def test_a_lost_device_and_drains_by_hand(farm):
    fake = farm.host("lost-host", [RTX4090, RTX4090], state=True)
    uuids = devices_of(farm, fake)
    write_state(fake, 0, {"lost": True})
    gate = farm.tmp / "gate"
    job = farm.submit(
        {
            "name": "hold",
            "layers": [{"name": "h", "command": [sys.executable, "-c", GATE, str(gate)], "gpus": 1, "range": "1-2"}],
        }
    )
    proc = farm.start_worker(fake)
    try:
        farm.wait_for(lambda: state(farm, "lost-host", uuids[0]) == "lost", what="device 0 marked lost")
        farm.wait_for(lambda: [f["state"] for f in farm.frames(job)].count("RUNNING") == 1, what="one frame")
        frames = farm.frames(job)
        assert [f["gpu_uuids"] for f in frames if f["state"] == "RUNNING"] == [[uuids[1]]]
        assert host_gpus(farm, "lost-host")[uuids[0]]["reason"] == "GPU is lost (fallen off the bus)"
        # By hand: drain device 1 (its frame finishes, as Slurm's drain), undrain device 0.
        out = farm.cuectl("gpu", "drain", "1", "--host", "lost-host", "--reason", "fan noise; RMA").stdout
        assert out.strip() == f"drained {uuids[1]} on host lost-host: fan noise; RMA"
        write_state(fake, 0, {})
        assert farm.cuectl("gpu", "undrain", uuids[0][:14], "--host", "lost-host").returncode == 0
        gate.write_text("")
        farm.wait_for(lambda: all(f["state"] == "SUCCEEDED" for f in farm.frames(job)), what="both frames")
        frames = farm.frames(job)
        assert sorted(f["gpu_uuids"][0] for f in frames) == sorted(uuids.values())  # the second ran on device 0
        gpus = host_gpus(farm, "lost-host")
        assert (gpus[uuids[1]]["state"], gpus[uuids[1]]["reason"], gpus[uuids[1]]["state_automatic"]) == (
            "drained",
            "fan noise; RMA",
            False,
        )
        assert gpus[uuids[0]]["state"] == "ok"
    finally:
        gate.write_text("")
        stop(proc)
    # A bad drain: one error line, exit 2, nothing changed.
    res = farm.cuectl("gpu", "drain", "0", "--host", "lost-host", "--reason", "a\x1b[2Jb", check=False)
    assert res.returncode == 2 and res.stderr.startswith("error: --reason: one line of printable text"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = farm.cuectl("gpu", "drain", "9", "--host", "lost-host", "--reason", "x", check=False)
    assert res.returncode == 1 and "no device '9' on host lost-host" in res.stderr
    assert host_gpus(farm, "lost-host")[uuids[0]]["state"] == "ok"


def test_the_suspect_rule_drains_one_device_and_the_host_keeps_working(farm):
    fake = farm.host("suspect-host", [RTX4090, RTX4090])
    uuids = devices_of(farm, fake)
    bad = uuids[0]
    jobs = [
        farm.submit(
            {
                "name": f"j{i}",
                "layers": [
                    {
                        "name": "r",
                        "command": [sys.executable, "-c", PICKY, bad],
                        "gpus": 1,
                        "range": "1-2",
                        "retries": 20,  # enough to outlast the failures before the drain
                        "retry_delay": 0,
                    }
                ],
            }
        )
        for i in range(3)
    ]
    proc = farm.start_worker(fake)
    try:
        farm.wait_for(lambda: state(farm, "suspect-host", bad) == "drained", timeout=120, what="the suspect drained")
        farm.wait_for(
            lambda: all(f["state"] == "SUCCEEDED" for j in jobs for f in farm.frames(j)), timeout=120, what="all done"
        )
    finally:
        stop(proc)
    gpus = host_gpus(farm, "suspect-host")
    assert gpus[bad]["reason"] == "suspect: 3 jobs failed here and succeeded elsewhere"
    assert gpus[uuids[1]]["state"] == "ok"


def test_a_user_who_is_neither_admin_nor_the_hosts_owner_cannot_drain(shared_farm, os_users):
    """On a shared machine (the root-owned store behind `cuectl serve --socket`) a user's
    `gpu drain` reaches the store as that user, who is neither an admin nor the host's owner
    (its worker runs as root): one error line, the permission exit code, nothing changed.
    Root (an admin) drains and undrains."""
    from farmlib import cuectl_cmd

    from cuectl.errors import NotOwner
    from cuectl.sched.store import HostInfo

    (alice,) = os_users("alice")
    gpus = [{"index": 0, "uuid": "GPU-a", "vendor": "NVIDIA", "model": "T4", "backend": "fake"}]
    store = open_store(str(shared_farm.db))
    try:
        store.register_host(HostInfo(name="shared-host", cores=4, memory_bytes=1 << 33, gpus=gpus), now=0)
        store.heartbeat("shared-host", [], now=0, lease_s=60, live={"at": 0, "worker_user": "root"})
    finally:
        store.close()
    for args in (["drain", "0", "--reason", "mine now"], ["undrain", "0"]):
        res = alice.run(
            [*cuectl_cmd(), "--db", str(shared_farm.db), "gpu", *args, "--host", "shared-host"],
            env=shared_farm.env(),
            cwd=shared_farm.tmp,
        )
        assert res.returncode == NotOwner.exit_code, res.stderr
        assert res.stderr.startswith("error: gpu ") and "only an admin or the host’s owner" in res.stderr
        assert f"not {alice.name}" in res.stderr and len(res.stderr.strip().splitlines()) <= 2  # (and a hint)
    assert host_gpus(shared_farm, "shared-host")["GPU-a"]["state"] == "ok"
    shared_farm.cuectl("gpu", "drain", "GPU-a", "--host", "shared-host", "--reason", "RMA")
    assert host_gpus(shared_farm, "shared-host")["GPU-a"]["reason"] == "RMA"
