"""A root worker delivers notifications as the job's proven user, never as root (issue 35,
item 8): sendmail runs as her, like her command hook; a job nothing proves to be its user's
gets no mail at all. Root only, with real throwaway users on a machine several people use
(the ``shared_farm`` fixture: a root-owned store, users through its socket)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from farmlib import cuectl_cmd

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root worker switching users needs root")


def test_mail_and_hooks_leave_a_root_worker_as_the_job_user(shared_farm, os_users):
    alice, bob = os_users("alice", "bob")
    farm = shared_farm
    out = farm.tmp / "out"  # sticky and writable by all, like /tmp
    sendmail = farm.tmp / "sendmail"
    sendmail.write_text(f"#!/bin/sh\nid -u >> {out}/mail-uids\ncat >> {out}/mailbox\n")
    sendmail.chmod(0o755)
    spec = out / "alice.json"
    spec.write_text(
        json.dumps(
            {
                "name": "hers",
                "notify": [
                    {"email": "alice@studio.example", "on": ["finished"]},
                    {"command": f"id -u > {out}/hook-uid", "on": ["finished"]},
                ],
                "layers": [{"name": "w", "command": ["true"]}],
            }
        )
    )
    spec.chmod(0o644)
    res = alice.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(spec)], env=farm.env(), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    hers = int(res.stdout)
    # A job labelled bob's that root queued: nothing proves bob submitted it (its receipt is
    # root's). Killed, it fails and asks for mail: not sent as bob, and never as root.
    labelled = subprocess.run(
        [
            *cuectl_cmd(),
            "--db",
            str(farm.db),
            "submit",
            "--name",
            "labelled",
            "--notify-email",
            "ops@studio.example",
            "--notify-on",
            "failed",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        env=farm.env(CUECTL_USER=bob.name),
        cwd=farm.tmp,
        timeout=60,
    )
    assert labelled.returncode == 0, labelled.stderr
    labelled_id = int(labelled.stdout)
    assert farm.job(labelled_id)["user"] == bob.name
    farm.cuectl("job", "kill", "--force", str(labelled_id))
    res = farm.run_worker(None, timeout=120, env={"CUECTL_SENDMAIL": str(sendmail)})
    assert res.returncode == 0, res.stderr
    assert (out / "mail-uids").read_text().split() == [str(alice.uid)]
    assert "To: alice@studio.example\n" in (out / "mailbox").read_text()
    assert (out / "hook-uid").read_text().split() == [str(alice.uid)]
    history = json.loads(farm.cuectl("admin", "notify", "history", "--json").stdout)["notifications"]
    assert all(r["delivered_at"] for r in history if r["job_id"] == hers)
    [refused] = [r for r in history if r["job_id"] == labelled_id]
    assert refused["delivered_at"] is None
    assert refused["error"].startswith(f"gave up after 1 attempt(s): not sent as {bob.name}, and never as root"), (
        refused["error"]
    )
