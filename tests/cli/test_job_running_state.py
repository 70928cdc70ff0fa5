"""A job with a running frame reads RUNNING in the text views, not OpenCue's PENDING
(issue 41, section 4); `state` in JSON stays as documented, `display_state` is the word the
text shows, and `job list --state running` selects those jobs. A real SQLite store; the
frame is claimed as a worker claims it."""

from __future__ import annotations

import time
from pathlib import Path

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store

NOW = time.time()


def submit(db: Path, name: str) -> int:
    store = open_store(str(db))
    try:
        return store.submit(
            spec_from_mapping(
                {"name": name, "layers": [{"name": "render", "command": ["true"], "range": "1-2"}]}, user="alice"
            ),
            now=NOW,
        )
    finally:
        store.close()


def start_one_frame(db: Path, job_id: int) -> None:
    store = open_store(str(db))
    try:
        layer = [layer for layer in store.runnable_layers() if layer.job_id == job_id][0]
        assert store.claim_frame(layer.layer_id, host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=600)
    finally:
        store.close()


def rows(text: str) -> dict[str, list[str]]:
    """`job list`'s TSV (stdout is not a terminal here): name -> cells."""
    lines = [line.split("\t") for line in text.splitlines()]
    return {cells[1]: cells for cells in lines[1:]}


def test_a_job_with_a_running_frame_reads_running(cli, db_path):
    running, waiting = submit(db_path, "running"), submit(db_path, "waiting")
    start_one_frame(db_path, running)

    listed = rows(cli("job", "list").stdout)
    assert listed["running"][4] == "RUNNING" and listed["waiting"][4] == "PENDING", listed

    shown = cli("job", "show", str(running))
    assert "RUNNING" in next(line for line in shown.stdout.splitlines() if line.startswith("state")), shown

    data = cli("job", "show", str(running), "--json").json()
    assert data["state"] == "PENDING" and data["display_state"] == "RUNNING"  # `state` as documented
    assert cli("job", "show", str(waiting), "--json").json()["display_state"] == "PENDING"


def test_job_list_state_running_selects_jobs_with_running_frames(cli, db_path):
    running, _ = submit(db_path, "running"), submit(db_path, "waiting")
    start_one_frame(db_path, running)

    res = cli("job", "list", "--state", "running", "--json")
    assert res.exit_code == 0, res
    assert [j["id"] for j in res.json()["jobs"]] == [running]
    # PENDING keeps OpenCue's meaning: every unfinished job, running or not.
    assert len(cli("job", "list", "--state", "PENDING", "--json").json()["jobs"]) == 2


def test_job_pause_selects_running_jobs_too(cli, db_path):
    running, waiting = submit(db_path, "running"), submit(db_path, "waiting")
    start_one_frame(db_path, running)
    res = cli("job", "pause", "--state", "running", "--json")
    assert res.exit_code == 0, res
    assert [j["id"] for j in res.json()["jobs"]] == [running]
    assert cli("job", "show", str(waiting), "--json").json()["paused"] is False


def test_a_finished_job_reads_its_outcome(cli, db_path):
    job_id = submit(db_path, "done")
    assert cli("job", "kill", str(job_id)).exit_code == 0
    data = cli("job", "show", str(job_id), "--json").json()
    assert (data["state"], data["outcome"], data["display_state"]) == ("FINISHED", "KILLED", "KILLED")


def test_an_unknown_state_is_refused_naming_running(cli, db_path):
    submit(db_path, "x")
    res = cli("job", "list", "--state", "runing")
    assert res.exit_code == 2 and "RUNNING" in res.stderr, res
