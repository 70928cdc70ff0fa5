"""A reservation is published as it starts (issue 41 §7), as inventory changes are: pending
reasons read it from the heartbeat, which otherwise comes a quarter lease later."""

from __future__ import annotations

import json
import signal
import subprocess

from farmlib import V100, Farm, cuectl_cmd


def dispatch(farm: Farm, name: str) -> dict:
    res = farm.cuectl("host", "show", name, "--json", check=False)
    live = (json.loads(res.stdout).get("live") or {}) if res.returncode == 0 else {}
    return live.get("dispatch") or {}


def test_a_reservation_is_published_when_it_starts_not_at_the_next_heartbeat(farm: Farm) -> None:
    fake = farm.host("resv-pub", [V100, V100])
    env = farm.env(CUECTL_FAKE_GPUS=str(fake))
    holder = subprocess.Popen(
        [*cuectl_cmd(), "run", "--gpus", "1", "--no-wait", "--", "sleep", "120"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    farm.procs.append(holder)
    farm.wait_for(lambda: json.loads(farm.cuectl("gpu", "leases", "--json", fake=fake).stdout), what="the lease")
    # A 600 s lease and samples 300 s apart: heartbeats 150 s apart, so only publishing at
    # once can show it in time.
    proc = farm.start_worker(fake, "--reservation-timeout", "300", "--sample-interval", "300", lease="600")
    farm.wait_for(lambda: dispatch(farm, "resv-pub"), what="the first dispatch state")
    pair = farm.submit({"name": "pair", "layers": [{"name": "p", "command": ["true"], "gpus": 2}]})
    held = farm.wait_for(
        lambda: dispatch(farm, "resv-pub").get("reservation"), timeout=60, what="the reservation to be published"
    )
    assert (held["job_id"], held["layer"]) == (pair, "p")
    why = farm.cuectl("job", "why", str(pair)).stdout
    assert "holding 1 free GPU on host resv-pub until 2 are free" in why, why
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
