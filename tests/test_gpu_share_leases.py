"""Shares of one GPU by memory budget (docs/gpu-health.md): real lock files and ledgers,
real holder processes (`cuectl run --gpu-share`, killed with SIGKILL), and 100 racing
`cuectl run --gpu-share 4G` processes on one 24G fake device."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml

import cuectl
from cuectl.errors import DevicesBusy, InvalidInput
from cuectl.gpu import discover
from cuectl.run import lease as leases
from cuectl.run.lease.shares import (
    ENTRY_SUFFIX,
    ShareLock,
    ledger_path,
    live_shares,
    mps_running,
    share_env,
    take_share,
)

GIB = 1024**3
CUECTL = str(Path(sys.executable).parent / "cuectl")


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 32 GiB and a 24 GiB fake device with a live-state directory."""
    state = tmp_path / "state"
    state.mkdir()
    path = tmp_path / "gpus.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "host": "share-test",
                "state_dir": str(state),
                "devices": [
                    {"model": "NVIDIA A100 32GB", "vendor": "NVIDIA", "memory": "32GiB"},
                    {"model": "NVIDIA RTX 4090", "vendor": "NVIDIA", "memory": "24GiB"},
                ],
            }
        )
    )
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    leases.forget_discovery()
    yield path
    leases.forget_discovery()


def _lock_dir() -> Path:
    return Path(os.environ["CUECTL_LOCK_DIR"])


class Holder:
    """A real `cuectl run --gpu-share` whose command says ``ready`` with its environment
    and then holds the share until its stdin closes (or it is killed)."""

    def __init__(self, *args: str) -> None:
        script = 'printf "ready %s %s %s\\n" "$CUE_GPU_CORES" "${CUE_GPU_SHARE_BYTES:-0}" $$; exec cat >/dev/null'
        self.proc = subprocess.Popen(
            [CUECTL, "run", *args, "--", "sh", "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def ready(self) -> tuple[int, int]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith("ready"), (line, self.proc.wait(30), self.proc.stderr.read())  # type: ignore[union-attr]
        _, index, budget, pid = line.split()
        self.command_pid = int(pid)
        return int(index), int(budget)

    def finish(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)

    def kill(self) -> None:
        """SIGKILL `cuectl run` and the command holding the share (its own process group)."""
        for group in (self.proc.pid, getattr(self, "command_pid", None)):
            try:
                if group is not None:
                    os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(30)
        # SIGKILL is delivered, not done: the command (in a group of its own, no longer
        # `cuectl run`'s child to wait for) holds the share until it has exited.
        pid = getattr(self, "command_pid", None)
        deadline = time.monotonic() + 30
        while pid is not None and time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                break  # gone
            if state in ("Z", "X"):
                break  # exited (a zombie holds no descriptors, no lock)
            time.sleep(0.01)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for h in started:
        if h.proc.poll() is None:
            h.kill()


def test_three_10g_shares_fit_a_32g_device_and_keep_out_an_exclusive_lease(fake, holders):
    for _ in range(3):
        holders.append(Holder("--device", "0", "--gpu-share", "10G"))
    assert [h.ready() for h in holders] == [(0, 10 * GIB)] * 3
    # A fourth does not fit (2 GiB left), and no exclusive lease gets the device.
    with pytest.raises(DevicesBusy, match=r"2\.0 GiB of 32\.0 GiB left"):
        cuectl.lease(devices=[0], gpu_share="10G")
    with pytest.raises(DevicesBusy, match=r"gpu 0 shared by") as busy:
        cuectl.lease(devices=[0])
    assert {h["pid"] for h in busy.value.holders} == {h.command_pid for h in holders}
    # Each share is listed with its budget.
    listed = json.loads(subprocess.run([CUECTL, "gpu", "leases", "--json"], capture_output=True, text=True).stdout)
    assert [s["share_bytes"] for s in listed["devices"][0]["shares"]] == [10 * GIB] * 3
    assert listed["devices"][0]["lease"] is None
    # One ends: a 10G share fits again; all end: the device is whole again.
    assert holders[0].finish() == 0
    with cuectl.lease(devices=[0], gpu_share="10G") as held:
        assert held.env["CUE_GPU_SHARE_BYTES"] == str(10 * GIB)
        assert held.env["CUE_GPU_MEMORY"] == str(10 * GIB)
    for h in holders[1:]:
        assert h.finish() == 0
    with cuectl.lease(devices=[0]) as whole:
        assert whole.devices[0].index == 0
    assert live_shares(_lock_dir(), whole.devices[0].uuid) == []


def test_an_exclusive_lease_keeps_shares_out(fake, holders):
    holders.append(Holder("--device", "1"))
    assert holders[0].ready() == (1, 0)
    with pytest.raises(DevicesBusy, match="gpu 1 is leased whole|held by"):
        cuectl.lease(devices=[1], gpu_share="1G")
    # The other device is free for a share meanwhile.
    with cuectl.lease(gpu_share="1G") as held:
        assert [d.index for d in held.devices] == [0]


def test_a_killed_holders_share_is_free_at_once(fake, holders):
    holders.append(Holder("--device", "1", "--gpu-share", "20G"))
    assert holders[0].ready() == (1, 20 * GIB)
    with pytest.raises(DevicesBusy):
        cuectl.lease(devices=[1], gpu_share="8G")
    holders[0].kill()  # cuectl run and its command, SIGKILL: nothing released cleanly
    with cuectl.lease(devices=[1], gpu_share="24G") as held:
        assert held.env["CUE_GPU_SHARE_BYTES"] == str(24 * GIB)
    # The dead entry was pruned by the taker; ours went with its release.
    assert [n for n in os.listdir(ledger_path(_lock_dir(), held.uuids[0])) if n.endswith(ENTRY_SUFFIX)] == []


def test_foreign_memory_use_counts_against_the_budgets(fake):
    device = discover("fake", fake_file=fake).devices[1]  # 24 GiB
    lock_dir = leases.prepare_lock_dir(_lock_dir())
    first = take_share(lock_dir, device, 8 * GIB, holder="a", used_bytes=0)
    assert isinstance(first, ShareLock)
    # 8 GiB booked; 14 GiB in use, so 6 GiB of it is another program's: 10 GiB left.
    assert not isinstance(take_share(lock_dir, device, 11 * GIB, holder="b", used_bytes=14 * GIB), ShareLock)
    second = take_share(lock_dir, device, 10 * GIB, holder="b", used_bytes=14 * GIB)
    assert isinstance(second, ShareLock)
    first.release()
    second.release()


def test_cuectl_lease_reads_foreign_use_from_the_device(fake):
    state = fake.parent / "state"
    (state / "1.json").write_text(json.dumps({"memory_used_bytes": 20 * GIB}))
    with pytest.raises(DevicesBusy, match=r"4\.0 GiB of 24\.0 GiB left"):
        cuectl.lease(devices=[1], gpu_share="5G")
    with cuectl.lease(devices=[1], gpu_share="4G") as held:
        assert held.uuids


def test_a_forged_entry_counts_for_no_more_than_the_device(fake, tmp_path):
    device = discover("fake", fake_file=fake).devices[0]  # 32 GiB
    lock_dir = leases.prepare_lock_dir(_lock_dir())
    ledger = ledger_path(lock_dir, device.uuid)
    ledger.mkdir(mode=0o1777, exist_ok=True)
    # A live entry claiming a petabyte, and a link planted as an entry.
    forged = ledger / f"0-1-forged{ENTRY_SUFFIX}"
    forged.write_text(json.dumps({"budget_bytes": 2**50, "pid": 1}))
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"budget_bytes": 1}))
    (ledger / f"0-2-link{ENTRY_SUFFIX}").symlink_to(secret)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys; f=open(sys.argv[1]); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); sys.stdin.read()", str(forged)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        [entry] = live_shares(lock_dir, device.uuid, device.memory_total_bytes)
        assert entry.budget_bytes == 32 * GIB  # capped: the device is full, as one real whole share
        assert not isinstance(take_share(lock_dir, device, 1 * GIB, holder="x"), ShareLock)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    got = take_share(lock_dir, device, 1 * GIB, holder="x")
    assert isinstance(got, ShareLock)  # the forger let go: its entry is dead
    got.release()
    assert secret.read_text() == json.dumps({"budget_bytes": 1})  # never followed nor deleted


def test_bad_share_requests_are_refused_before_anything_is_taken(fake):
    for kwargs, message in (
        ({"gpu_share": "0"}, "must be more than 0"),
        ({"gpu_share": "abc"}, "invalid size"),
        ({"gpu_share": "8G", "gpus": 2}, "a share is part of one GPU"),
        ({"gpu_share": "40G"}, r"more than the memory of every"),
    ):
        with pytest.raises(InvalidInput, match=message):
            cuectl.lease(**kwargs)
    assert not any(p.name.endswith(ENTRY_SUFFIX) for p in _lock_dir().rglob("*"))


def test_share_environment_and_mps_detection(tmp_path):
    assert share_env(8 * GIB, mps=False) == {"CUE_GPU_SHARE_BYTES": str(8 * GIB)}
    assert share_env(8 * GIB, mps=True)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    pipe = tmp_path / "mps"
    pipe.mkdir()
    assert not mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    import socket

    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(pipe / "control"))
    try:
        assert mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    finally:
        sock.close()


def test_100_racing_cuectl_run_shares_never_exceed_the_device(tmp_path, monkeypatch):
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump({"devices": [{"model": "NVIDIA RTX 4090", "vendor": "NVIDIA", "memory": "24GiB"}]}))
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(path))
    marks = tmp_path / "marks"
    marks.mkdir()
    # Each command notes when it started and ended with its budget (nanoseconds, one
    # clock): inside its share's lifetime, so overlapping notes are overlapping shares.
    work = 'f="$MARKS/$$"; echo "$(date +%s%N) $CUE_GPU_SHARE_BYTES" > "$f.start"; sleep 0.2; date +%s%N > "$f.end"'
    env = {**os.environ, "MARKS": str(marks)}
    racers = [
        subprocess.Popen(
            [CUECTL, "run", "--gpu-share", "4G", "--timeout", "600", "--", "sh", "-c", work],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(100)
    ]
    codes = [r.wait(900) for r in racers]
    errors = [r.stderr.read() for r in racers if r.returncode]  # type: ignore[union-attr]
    assert codes == [0] * 100, errors[:3]
    events: list[tuple[int, int]] = []
    for start in marks.glob("*.start"):
        at, budget = start.read_text().split()
        end = int(start.with_suffix(".end").read_text())
        events += [(int(at), int(budget)), (end, -int(budget))]
    assert len(events) == 200
    booked = peak = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same ns
        booked += change
        peak = max(peak, booked)
    assert peak <= 24 * GIB, peak / GIB
    assert booked == 0


def test_async_lease_takes_a_share_too(fake):
    import asyncio

    from cuectl.run.lease import async_lease

    async def main() -> tuple[str, str]:
        async with async_lease(devices=[1], gpu_share="6G") as first:
            with pytest.raises(DevicesBusy, match=r"18\.0 GiB of 24\.0 GiB left"):
                await async_lease(devices=[1], gpu_share="19G")
            return first.env["CUE_GPU_SHARE_BYTES"], first.uuids[0]

    budget, uuid = asyncio.run(main())
    assert budget == str(6 * GIB)
    assert live_shares(_lock_dir(), uuid) == []


def test_a_share_leaves_a_drained_device_out(fake):
    from cuectl.run.lease import outofservice

    lock_dir = leases.prepare_lock_dir(_lock_dir())
    first, second = (d.uuid for d in discover("fake", fake_file=fake).devices)
    outofservice.publish(lock_dir, {first}, {first: "Xid 79"})
    with cuectl.lease(gpu_share="4G") as held:
        assert held.uuids == (second,)
    with pytest.raises(DevicesBusy):
        cuectl.lease(devices=[0], gpu_share="4G")
