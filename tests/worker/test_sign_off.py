"""A worker that stops cleanly signs off (issue 41): its host reads DOWN at once rather than
UP for HOST_DOWN_AFTER_S with a dead worker_pid, `host forget` takes it without --force,
and a waiting job's pending reason says no worker is alive."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from farmlib import V100, Farm


def host(farm: Farm, name: str) -> dict:
    return json.loads(farm.cuectl("host", "show", name, "--json").stdout)


def test_an_until_idle_worker_signs_off_and_its_host_can_be_forgotten(farm: Farm) -> None:
    fake = farm.host("idle-01", [V100])
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    data = host(farm, "idle-01")
    assert (data["state"], data["worker_pid"]) == ("DOWN", None)
    # Waiting work now has no worker to run it, and says so (not "-", not "could run now").
    job = farm.submit({"name": "later", "layers": [{"name": "a", "command": ["true"], "gpus": 1}]})
    why = farm.cuectl("job", "why", str(job)).stdout
    assert "no worker alive" in why, why
    res = farm.cuectl("host", "forget", "idle-01", check=False)
    assert res.returncode == 0, res.stderr
    assert json.loads(farm.cuectl("host", "list", "--json").stdout)["hosts"] == []


def test_a_drained_worker_signs_off(farm: Farm) -> None:
    fake = farm.host("drain-01", [V100])
    proc = farm.start_worker(fake)
    # The worker creates the store as it starts: until then `host list` finds none (exit 1).
    farm.wait_for(
        lambda: (
            (r := farm.cuectl("host", "list", "--json", check=False)).returncode == 0 and json.loads(r.stdout)["hosts"]
        ),
        what="registration",
    )
    assert host(farm, "drain-01")["state"] == "UP"
    proc.send_signal(signal.SIGTERM)  # systemctl stop: drain, then exit 0
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert host(farm, "drain-01")["state"] == "DOWN"


def test_a_worker_of_the_same_host_started_again_is_up(farm: Farm, tmp_path: Path) -> None:
    fake = farm.host("again-01", [V100])
    assert farm.run_worker(fake).returncode == 0
    proc = farm.start_worker(fake)
    farm.wait_for(lambda: host(farm, "again-01")["state"] == "UP", what="the new worker's registration")
    assert host(farm, "again-01")["worker_pid"] == proc.pid
