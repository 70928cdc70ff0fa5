"""Many real processes at once: exactly as many winners as devices, and never two on one."""

from __future__ import annotations

import time
from collections import Counter


def _exit_codes_of_all_but_one(children, timeout: float = 60.0) -> dict[int, int]:
    """Exit statuses once all but one child have ended (the one left is the winner)."""
    deadline = time.monotonic() + timeout
    codes: dict[int, int] = {}
    while len(codes) < len(children) - 1 and time.monotonic() < deadline:
        for child in children:
            if child.pid not in codes and child.proc.poll() is not None:
                codes[child.pid] = child.proc.returncode
        time.sleep(0.01)
    return codes


def test_10_cuectl_run_processes_race_for_one_device(gpus4, spawn, lease_cli):
    # Real `cuectl run --no-wait` processes; the winner's command holds the device until
    # every loser has given up, so each loser really met a held device.
    racers = [
        spawn.argv(
            lease_cli(
                "run",
                "--no-wait",
                "--device",
                "0",
                "--label",
                f"racer{i}",
                "--",
                "sh",
                "-c",
                "echo won; exec cat >/dev/null",
            )
        )
        for i in range(10)
    ]
    codes = _exit_codes_of_all_but_one(racers)
    assert Counter(codes.values()) == {1: 9}, codes
    [winner] = [r for r in racers if r.pid not in codes]
    assert winner.line() == "won"
    for racer in racers:
        if racer is not winner:
            assert "held by pid" in racer.proc.stderr.read()
    winner.close_stdin()
    assert winner.wait() == 0


def test_100_processes_race_for_4_devices_without_waiting(gpus4, race):
    result = race(n=100, wait=False)
    assert result["errors"] == []
    assert sorted(result["won"]) == sorted(gpus4.uuids)  # 4 winners, one per device
    assert result["busy"] == 96
    assert result["exit_codes"] == {"0": 4, "1": 96}


def test_100_waiting_processes_all_run_and_never_share_a_device(gpus4, race, tmp_path):
    occupancy = tmp_path / "occupancy"
    occupancy.mkdir()
    result = race(n=100, wait=True, timeout=60, work_s=0.01, occupancy_dir=str(occupancy))
    assert result["errors"] == [] and result["overlaps"] == []
    assert len(result["done"]) == 100 and result["exit_codes"] == {"0": 100}
    assert set(result["done"]) == set(gpus4.uuids)  # the work spread over every device


def test_waiting_cuectl_run_processes_take_turns(gpus4, spawn, lease_cli, tmp_path):
    occupancy = tmp_path / "occupancy"
    occupancy.mkdir()
    # noclobber: `>` fails if the file exists, so two commands on one device would exit 99.
    work = f'set -C; : > "{occupancy}/$CUE_GPU_UUIDS" || exit 99; sleep 0.05; rm "{occupancy}/$CUE_GPU_UUIDS"'
    runners = [
        spawn.argv(
            lease_cli("run", "--wait", "--timeout", "60", "--device", "0", "--device", "1", "--", "sh", "-c", work)
        )
        for _ in range(6)
    ]
    assert [r.wait(timeout=60) for r in runners] == [0] * 6
    assert list(occupancy.iterdir()) == []
