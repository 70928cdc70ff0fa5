"""`cuectl job wait`: blocks until the jobs finish, then exit 0 only if every frame
succeeded (or was eaten); 1 for DEAD frames, a killed job or --timeout; 2 for bad input.
A real `cuectl job wait` process on a real SQLite store, while this test finishes frames."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from storedriver import finish_all  # tests/storedriver.py (tests/ is on sys.path)

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store


def _exe() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def _submit(db: Path, name: str, frames: str = "1-2", retries: int = 0) -> int:
    store = open_store(str(db))
    try:
        return store.submit(
            spec_from_mapping(
                {"name": name, "layers": [{"name": "a", "command": ["true"], "range": frames, "retries": retries}]},
                user="ann",
            ),
            now=time.time(),
        )
    finally:
        store.close()


def _wait(db: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*_exe(), "--db", str(db), "job", "wait", "--poll", "0.1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _still_waiting(proc: subprocess.Popen[str]) -> None:
    time.sleep(1.0)
    assert proc.poll() is None, proc.communicate()


def test_waits_until_the_jobs_finish_and_succeeds(db_path):
    a, b = _submit(db_path, "render-a"), _submit(db_path, "render-b")
    proc = _wait(db_path, str(a), "render-b", "--json")
    _still_waiting(proc)
    finish_all(db_path)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    data = json.loads(out)
    assert data["succeeded"] is True and [j["id"] for j in data["jobs"]] == [a, b]
    assert {j["outcome"] for j in data["jobs"]} == {"SUCCEEDED"}


def test_dead_frames_exit_1_naming_the_job(db_path):
    job_id = _submit(db_path, "broken")
    proc = _wait(db_path, str(job_id))
    _still_waiting(proc)
    finish_all(db_path, exit_code=3)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert f"job {job_id} broken: FAILED" in out
    assert err.startswith("error: 1 of 1 job(s) did not succeed") and "2 DEAD frames" in err


def test_a_killed_job_exit_1(db_path, cli):
    job_id = _submit(db_path, "stopped")
    proc = _wait(db_path, "stopped")
    _still_waiting(proc)
    assert cli("job", "kill", str(job_id), "--force").exit_code == 0
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "KILLED" in out and "KILLED" in err


def test_timeout_exit_1_and_names_what_still_runs(db_path):
    job_id = _submit(db_path, "slow")
    proc = _wait(db_path, str(job_id), "--timeout", "0.5")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "timed out after 0.5 s" in err and f"{job_id} slow" in err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--timeout", "soon"], "--timeout"),
        (["--poll", "0"], "--poll"),
    ],
)
def test_bad_input_exit_2(db_path, args, needle):
    job_id = _submit(db_path, "any")
    res = subprocess.run(
        [*_exe(), "--db", str(db_path), "job", "wait", str(job_id), *args], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2 and res.stderr.startswith("error:") and needle in res.stderr


def test_unknown_job_is_bad_input_at_once(db_path):
    # 2, not 1 (a job failed): `job wait $ID || page-oncall` must not page for a typo.
    _submit(db_path, "known")
    res = subprocess.run(
        [*_exe(), "--db", str(db_path), "job", "wait", "known", "nope"], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2 and res.stderr.startswith("error:") and "nope" in res.stderr
    res = subprocess.run(
        [*_exe(), "--db", str(db_path), "job", "wait", "999"], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2 and "999" in res.stderr


def test_a_name_several_jobs_have_is_bad_input_too(db_path):
    """A name two jobs share names no one job: exit 2 with the ids to choose from, not 1."""
    first, second = _submit(db_path, "twice"), _submit(db_path, "twice")
    res = subprocess.run(
        [*_exe(), "--db", str(db_path), "job", "wait", "twice"], capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 2 and res.stderr.startswith("error:"), res.stderr
    assert "twice" in res.stderr and f"{first}, {second}" in res.stderr and "Traceback" not in res.stderr
