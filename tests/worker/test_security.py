"""Security posture (docs/security.md): whose work a worker runs, as whom, what output
shows, and hostile names that must never reach a shell or leave the log directory."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="running frames as another user needs a root worker")


@ROOT_ONLY
def test_unknown_submitter_is_never_run_as_root(farm):
    import subprocess

    from farmlib import cuectl_cmd

    marker = farm.tmp / "ran"
    spec = farm.tmp / "job.yaml"
    spec.write_text(
        json.dumps({"name": "ghost", "layers": [{"name": "w", "command": ["touch", str(marker)], "retries": 0}]})
    )
    env = farm.env(CUECTL_USER="no-such-user-cuectl")
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(farm.db), "submit", str(spec)], env=env, capture_output=True, text=True
    )
    job = int(res.stdout)
    assert farm.run_worker(None).returncode == 0
    (frame,) = farm.frames(job)
    assert frame["state"] == "WAITING" and not marker.exists()
    assert "user 'no-such-user-cuectl' does not exist" in farm.job(job)["pending_reason"]


def test_worker_runs_only_allowed_users_jobs(farm):
    import subprocess

    from farmlib import cuectl_cmd

    jobs = {}
    for user in ("alice", "mallory"):
        res = subprocess.run(
            [*cuectl_cmd(), "--db", str(farm.db), "submit", "--name", f"{user}-job", "--", *farm.probe()],
            env=farm.env(CUECTL_USER=user),
            capture_output=True,
            text=True,
        )
        jobs[user] = int(res.stdout)
    res = farm.run_worker(None, "--allow-user", "alice", "--run-as-worker-user")
    assert res.returncode == 0, res.stderr
    assert [f["state"] for f in farm.frames(jobs["alice"])] == ["SUCCEEDED"]
    assert [f["state"] for f in farm.frames(jobs["mallory"])] == ["WAITING"]


def test_secret_env_values_are_masked_unless_asked(farm):
    job = farm.submit(
        {
            "name": "creds",
            "env": {"API_TOKEN": "s3cr3t", "DB_PASSWORD": "hunter2"},
            "export": "NONE",
            "layers": [{"name": "a", "command": ["true"], "env": {"SHOT": "010"}}],
        }
    )
    shown = farm.cuectl("job", "show", str(job), "--json").stdout
    assert "s3cr3t" not in shown and "hunter2" not in shown
    env = json.loads(shown)["layers"][0]["env"]
    assert env == {"API_TOKEN": "***", "DB_PASSWORD": "***", "SHOT": "010"}
    revealed = json.loads(farm.cuectl("job", "show", str(job), "--json", "--show-secrets").stdout)
    assert revealed["layers"][0]["env"]["API_TOKEN"] == "s3cr3t"


def test_hostile_names_never_reach_a_shell_or_escape_the_log_dir(farm):
    canary = farm.tmp / "pwned"  # frames run in farm.tmp: a relative `touch pwned` would land here
    name = "x'; touch pwned; echo '$(touch pwned)`touch pwned`../../../tmp/evil"
    job = farm.submit(
        {
            "name": name,
            "layers": [
                {"name": "shell", "command": "echo job=#JOB# frame=#IFRAME# > /dev/null"},
                {"name": "argv", "command": ["echo", "#JOB#"]},
            ],
        }
    )
    assert farm.run_worker(None).returncode == 0
    assert not canary.exists()
    frames = farm.frames(job)
    assert {f["state"] for f in frames} == {"SUCCEEDED"}
    logs_root = (farm.db.parent / f"{farm.db.name}-logs").resolve()
    for f in frames:
        path = Path(json.loads(farm.cuectl("frame", "show", str(f["id"]), "--json").stdout)["log_path"]).resolve()
        assert logs_root in path.parents
        assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0, "logs are not world-readable"
    assert name in farm.cuectl("frame", "log", str(frames[1]["id"])).stdout


def test_layer_names_that_could_escape_are_refused(farm):
    spec = farm.tmp / "bad.yaml"
    spec.write_text(json.dumps({"name": "x", "layers": [{"name": "../../etc", "command": ["true"]}]}))
    res = farm.cuectl("submit", str(spec), check=False)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and "layers[0].name" in res.stderr
