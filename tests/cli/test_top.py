"""`cuectl top`: the snapshot on a real SQLite store, `--once`/`--json` through the real
executable, and the live view on a real pseudo-terminal (`q` quits, terminal restored)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import termios
import time
from pathlib import Path

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import HostInfo, LiveUsage, open_store
from cuectl.top import snapshot

GIB = 1024**3


def _gpu(index: int, uuid: str) -> dict:
    return {
        "index": index,
        "uuid": uuid,
        "vendor": "NVIDIA",
        "model": "Tesla V100-SXM2-16GB",
        "backend": "fake",
        "memory_total_bytes": 16 * GIB,
    }


def cuectl_exe() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def make_farm(db: Path | str) -> int:
    """A host with three GPUs: one running a frame (live 42%, 3 GiB), one busy with a
    process cuectl does not know (5 GiB used), one free; plus a job still waiting.
    Returns the running frame's id."""
    now = time.time()
    store = open_store(str(db))
    try:
        store.register_host(
            HostInfo(
                name="node-7",
                cores=8,
                memory_bytes=64 * GIB,
                gpus=[_gpu(0, "GPU-aaa"), _gpu(1, "GPU-bbb"), _gpu(2, "GPU-ccc")],
            ),
            now=now,
        )
        store.submit(
            spec_from_mapping(
                {"name": "shot010", "layers": [{"name": "render", "command": ["true"], "range": "1-3"}]}, user="alice"
            ),
            now=now,
        )
        layer = store.runnable_layers()[0]
        claimed = store.claim_frame(
            layer.layer_id, host="node-7", worker="node-7:1", gpu_uuids=["GPU-aaa"], now=now, lease_s=600.0
        )
        assert claimed is not None
        store.record_live_usage("node-7", [LiveUsage(claimed.frame_id, claimed.attempt, now, 42.0, 3 * GIB)], now=now)
        live = {
            "at": now,
            "devices": [
                {
                    "uuid": "GPU-aaa",
                    "utilization_pct": 42.0,
                    "memory_used_bytes": 3 * GIB,
                    "memory_free_bytes": 13 * GIB,
                },
                {
                    "uuid": "GPU-bbb",
                    "utilization_pct": 0.0,
                    "memory_used_bytes": 5 * GIB,
                    "memory_free_bytes": 11 * GIB,
                },
                {"uuid": "GPU-ccc", "utilization_pct": 0.0, "memory_used_bytes": 0, "memory_free_bytes": 16 * GIB},
            ],
        }
        store.heartbeat(
            "node-7",
            [claimed.frame_id],
            now=now,
            lease_s=600.0,
            live=live,
            attempts={claimed.frame_id: claimed.attempt},
        )
        return claimed.frame_id
    finally:
        store.close()


def test_snapshot_on_a_real_store(tmp_path):
    db = tmp_path / "store.db"
    frame_id = make_farm(db)
    store = open_store(str(db), create=False)
    try:
        snap = snapshot(store, lock_dir=tmp_path / "no-locks")
    finally:
        store.close()
    assert set(snap) == {"at", "hosts", "frames", "waiting", "totals"}
    [host] = snap["hosts"]
    assert (host["name"], host["state"], host["running"]) == ("node-7", "UP", 1)
    held, foreign, free = host["devices"]
    assert (held["index"], held["utilization_pct"], held["memory_used_bytes"], held["memory_total_bytes"]) == (
        0,
        42.0,
        3 * GIB,
        16 * GIB,
    )
    assert held["holder"]["kind"] == "frame" and held["holder"]["frame_id"] == frame_id
    assert held["holder"]["label"] == "shot010/0001-render"
    assert foreign["holder"]["kind"] == "foreign" and foreign["memory_used_bytes"] == 5 * GIB
    assert free["holder"] is None
    [frame] = snap["frames"]
    assert (frame["id"], frame["host"], frame["gpu_util_pct"], frame["gpu_memory_used_bytes"]) == (
        frame_id,
        "node-7",
        42.0,
        3 * GIB,
    )
    assert frame["gpu_sampled_at"].endswith("Z") and frame["elapsed_s"] is not None
    [job] = snap["waiting"]
    assert (job["name"], job["user"], job["waiting"]) == ("shot010", "alice", 2)
    assert job["pending_reason"]  # why the other two frames wait, in words
    assert snap["totals"] == {
        "hosts": 1,
        "hosts_up": 1,
        "gpus": 3,
        "gpus_held": 2,
        "running": 1,
        "waiting_jobs": 1,
        "waiting_frames": 2,
    }
    json.dumps(snap)  # JSON-ready as is


def test_snapshot_names_a_local_lease(tmp_path):
    """A device locked in the local lock directory by `cuectl run` shows its label."""
    from cuectl.gpu.device import Device
    from cuectl.run.lease import try_lock

    db = tmp_path / "store.db"
    make_farm(db)
    locks = tmp_path / "locks"
    locks.mkdir(exist_ok=True)
    device = Device(
        index=2,
        uuid="GPU-ccc",
        vendor="NVIDIA",
        model="Tesla V100-SXM2-16GB",
        backend="fake",
        memory_total_bytes=16 * GIB,
    )
    lock = try_lock(locks, device, holder="cuectl run", kind="run", label="train-a")
    assert lock is not None
    store = open_store(str(db), create=False)
    try:
        devices = snapshot(store, lock_dir=locks)["hosts"][0]["devices"]
    finally:
        store.close()
        lock.release()
    assert devices[2]["holder"]["kind"] == "run" and devices[2]["holder"]["label"] == "train-a"
    assert devices[0]["holder"]["kind"] == "frame"  # the store's word wins over a lock file


def test_once_and_json_through_the_executable(tmp_path):
    db = tmp_path / "store.db"
    frame_id = make_farm(db)
    env = dict(os.environ, CUECTL_LOCK_DIR=str(tmp_path / "locks"))
    res = subprocess.run(
        [*cuectl_exe(), "--db", str(db), "top", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    snap = json.loads(res.stdout)
    assert snap["frames"][0]["id"] == frame_id and snap["hosts"][0]["name"] == "node-7"
    for args in (["top", "--once"], ["top"]):  # piped: one plain snapshot either way
        res = subprocess.run(
            [*cuectl_exe(), "--db", str(db), *args], capture_output=True, text=True, env=env, timeout=60
        )
        assert res.returncode == 0, res.stderr
        out = res.stdout
        assert "\x1b" not in out
        assert "node-7" in out and f"frame {frame_id} shot010/0001-render" in out
        assert "42%" in out and "3.0 GiB / 16.0 GiB" in out and "other process" in out and "free" in out
        assert "shot010" in out.split("Waiting jobs")[1]


def test_top_without_a_store_is_an_error(tmp_path):
    res = subprocess.run(
        [*cuectl_exe(), "--db", str(tmp_path / "missing.db"), "top", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and res.stderr.startswith("error: no store at")
    assert not (tmp_path / "missing.db").exists()


def test_live_view_on_a_terminal_and_q_quits(tmp_path):
    db = tmp_path / "store.db"
    frame_id = make_farm(db)
    env = dict(os.environ, COLUMNS="160", LINES="40", TERM="xterm-256color", CUECTL_LOCK_DIR=str(tmp_path / "locks"))
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    try:
        proc = subprocess.Popen(
            [*cuectl_exe(), "--db", str(db), "top", "--interval", "0.2"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        out = bytearray()

        def read_until(pred, timeout: float) -> bool:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if pred(out.decode("utf-8", "replace")):
                    return True
                ready, _, _ = select.select([master], [], [], 0.1)
                if ready:
                    try:
                        out.extend(os.read(master, 65536))
                    except OSError:
                        return pred(out.decode("utf-8", "replace"))
                elif proc.poll() is not None:
                    return pred(out.decode("utf-8", "replace"))
            return False

        try:
            shown = read_until(lambda s: "node-7" in s and f"{frame_id} 0001-render" in s and "(q quits)" in s, 30)
            assert shown, out.decode("utf-8", "replace")[-3000:]
            # It keeps refreshing until told to stop.
            time.sleep(0.5)
            assert proc.poll() is None
            os.write(master, b"q")
            # Keep reading while it quits: a redraw written into a full pty buffer would
            # block it before it sees the key (seen under load).
            read_until(lambda s: proc.poll() is not None, 15)
            proc.wait(timeout=5)
            read_until(lambda s: False, 0.3)  # drain what it wrote on the way out
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, out.decode("utf-8", "replace")[-3000:]
        text = out.decode("utf-8", "replace")
        assert "Traceback" not in text and "error:" not in text
        # cbreak mode was undone: the terminal is as it was.
        after = termios.tcgetattr(slave)
        assert after[3] & termios.ICANON and after[3] & termios.ECHO
        assert after[3] == before[3]
    finally:
        os.close(master)
        os.close(slave)


def test_top_on_postgresql_through_the_executable(tmp_path, pg_url):
    """The same farm on a PostgreSQL store: the view reads it through the same store API
    (heartbeats and live values on the server's clock)."""
    frame_id = make_farm(pg_url)
    env = dict(os.environ, CUECTL_LOCK_DIR=str(tmp_path / "locks"))
    res = subprocess.run(
        [*cuectl_exe(), "--db", pg_url, "top", "--json"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    snap = json.loads(res.stdout)
    [host] = snap["hosts"]
    assert host["state"] == "UP" and [d["holder"]["kind"] if d["holder"] else None for d in host["devices"]] == [
        "frame",
        "foreign",
        None,
    ]
    assert snap["frames"][0]["id"] == frame_id and snap["frames"][0]["gpu_util_pct"] == 42.0
    res = subprocess.run(
        [*cuectl_exe(), "--db", pg_url, "top", "--once"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert f"frame {frame_id} shot010/0001-render" in res.stdout and "42%" in res.stdout
