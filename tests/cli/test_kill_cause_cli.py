"""`job show` and `job wait` name why a job FAILED when a user killed one of its frames
(issue 41, section 4): "1 frame killed by alice", not a bare FAILED."""

from __future__ import annotations

from cuectl.sched.store import open_store


def test_job_show_and_wait_name_the_kill(cli, db_path):
    job = cli("submit", "--name", "sweep", "--range", "1-3", "--", "true").stdout.strip()
    assert cli("frame", "kill", "sweep/0002-main").exit_code == 0
    assert cli("frame", "eat", "sweep/1", "sweep/3").exit_code == 0
    store = open_store(str(db_path), create=False)
    try:
        me = store.actor().name
    finally:
        store.close()

    shown = cli("job", "show", job)
    state = next(line for line in shown.stdout.splitlines() if line.startswith("state"))
    assert state.split(None, 1)[1] == f"FAILED: 1 frame killed by {me}", shown

    waited = cli("job", "wait", job)
    assert waited.exit_code == 1, waited
    assert f"job {job} sweep: FAILED: 1 frame killed by {me} (2/3 done, 1 dead)" in waited.stdout
    assert f"{job} sweep FAILED (1 DEAD frame: 1 frame killed by {me})" in waited.stderr

    data = cli("job", "show", job, "--json").json()
    assert data["outcome_reason"] == f"1 frame killed by {me}"
