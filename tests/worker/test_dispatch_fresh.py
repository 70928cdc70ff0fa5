"""The dispatch state a real `cuectl worker` publishes is fresh where readers cannot check it
against the store (issue 41 §2, "pending reasons must be true now"): its first dispatch
pass is published at once (no "older cuectl" until a later heartbeat), and a lease that
starts or ends changes the published holders at once, not at the heartbeat's own pace.

The workers here heartbeat every 150 s on their own (--lease-timeout 600) and sample every
300 s, so anything the tests see within their 30 s waits was published because it changed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from farmlib import V100

import cuectl

SLOW = ("--sample-interval", "300", "--reservation-timeout", "0")


def _dispatch(farm, host: str) -> dict[str, Any] | None:
    res = farm.cuectl("host", "show", host, "--json", check=False)
    if res.returncode != 0:
        return None
    return ((json.loads(res.stdout).get("live") or {}).get("dispatch")) or None


def _why(farm, job: int) -> str:
    return json.loads(farm.cuectl("job", "why", str(job), "--json").stdout)["pending_reason"] or ""


def test_the_first_dispatch_pass_is_published_at_once(farm):
    fake = farm.host("fresh", [V100], state=True)
    worker = farm.start_worker(fake, *SLOW, lease="600")
    doc = farm.wait_for(lambda: _dispatch(farm, "fresh"), timeout=30, what="the first dispatch state")
    assert doc["accepting"] is True and doc["run_as_submitter"] in (True, False)
    job = farm.submit({"name": "j", "layers": [{"name": "l", "gpus": 2, "command": ["true"]}]})
    assert "no dispatch state" not in json.dumps(json.loads(farm.cuectl("job", "why", str(job), "--json").stdout))
    worker.terminate()
    worker.wait(30)


def test_a_lease_that_ends_is_no_longer_named(farm, tmp_path: Path):
    """Two GPUs leased by two notebooks, a job that needs both: its reason names both
    holders; the first notebook lets go and, within the wait, the reason names only the
    second — the worker published the change, not its next heartbeat 150 s later."""
    fake = farm.host("pair", [V100, V100], state=True)
    locks = tmp_path / "locks"
    worker = farm.start_worker(fake, *SLOW, "--lock-dir", str(locks), lease="600")
    farm.wait_for(lambda: _dispatch(farm, "pair"), timeout=30, what="the first dispatch state")
    first = cuectl.lease(gpus=1, devices=[0], fake_file=fake, lock_dir=locks, label="notebook-a")
    second = cuectl.lease(gpus=1, devices=[1], fake_file=fake, lock_dir=locks, label="notebook-b")
    first.__enter__()
    second.__enter__()
    try:
        job = farm.submit({"name": "both", "layers": [{"name": "l", "gpus": 2, "command": ["true"]}]})
        farm.wait_for(
            lambda: "notebook-a" in _why(farm, job) and "notebook-b" in _why(farm, job),
            timeout=30,
            what="both leases named",
        )
        first.__exit__(None, None, None)
        text = farm.wait_for(
            lambda: (lambda t: t if "notebook-a" not in t else None)(_why(farm, job)),
            timeout=30,
            what="the ended lease gone from the reason",
        )
        assert "gpu 1 held by notebook-b" in text and "1 of 2 fitting free" in text, text
    finally:
        second.__exit__(None, None, None)
    farm.wait_for(lambda: farm.frames(job)[0]["state"] == "SUCCEEDED", timeout=60, what="the job to run")
    worker.terminate()
    worker.wait(30)
