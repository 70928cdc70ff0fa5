"""A layer row rewritten in the store by a hostile writer fails its own frames; it never
stops the worker's claim path (the claim parses the row's JSON, cached per text)."""

from __future__ import annotations

import sqlite3
import time

import pytest

from cuectl import config
from cuectl.sched.spec import spec_from_flags


@pytest.mark.parametrize("env", ['["A=1"]', '"A=1"', "7", "null"])
def test_a_layer_env_that_is_not_an_object_fails_its_frames_and_the_worker_goes_on(solo, env):
    store, worker = solo
    user = config.current_user()
    bad = store.submit(
        spec_from_flags(name="bad", command=["true"], range="1-2", retries=0, user=user), now=time.time()
    )
    with sqlite3.connect(store.path) as con:
        con.execute("UPDATE layers SET env = ? WHERE job_id = ?", (env, bad))
    worker.loop()  # claims both, refuses to launch them: no exception escapes
    frames, _ = store.list_frames(job=bad)
    assert [f["state"] for f in frames] == ["DEAD", "DEAD"]
    assert worker.running == {}
    good = store.submit(spec_from_flags(name="good", command=["true"], range="1", user=user), now=time.time())
    stats = worker.loop()
    assert stats.claimed == 1 and store.list_frames(job=good)[0][0]["state"] == "RUNNING"


@pytest.mark.parametrize("number", ["x", "\x1b[2J", 7.5, "", b"\x01"])
def test_a_frame_number_that_is_not_an_integer_fails_that_frame_and_the_worker_goes_on(solo, number):
    """SQLite keeps any value in an INTEGER column: a frame whose number was rewritten is
    refused at launch (DEAD, as a hostile layer row's frames are), never an error that stops
    the claim path; the job's other frames run."""
    store, worker = solo
    user = config.current_user()
    job = store.submit(
        spec_from_flags(name="bad", command=["true"], range="1-2", retries=0, user=user), now=time.time()
    )
    warned: list[str] = []
    worker.warn = warned.append
    with sqlite3.connect(store.path) as con:
        con.execute("UPDATE frames SET number = ? WHERE job_id = ? AND number = 1", (number, job))
    worker.loop()
    frames, _ = store.list_frames(job=job)
    states = {f["name"]: f["state"] for f in frames}
    assert states[f"{number}-main"] == "DEAD" and states["0002-main"] in ("RUNNING", "SUCCEEDED"), states
    assert any("not an integer" in w for w in warned), warned


def test_the_real_worker_refuses_a_frame_number_that_is_not_an_integer_and_frame_list_shows_it(farm):
    """``cuectl worker --until-idle`` (a real process) reports the row and exits 0; `frame
    list`, `frame show` and `frame log` print the frame (``x-main``), no traceback."""
    job = farm.submit({"name": "bad", "layers": [{"name": "main", "command": ["true"], "range": "1-2", "retries": 0}]})
    with sqlite3.connect(farm.db) as con:
        con.execute("UPDATE frames SET number = 'x' WHERE job_id = ? AND number = 1", (job,))
    fake = farm.host("h", [])
    res = farm.run_worker(fake)
    assert res.returncode == 0, res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert "has the number 'x' in the store, not an integer" in res.stderr, res.stderr
    listed = farm.cuectl("frame", "list", "--job", str(job))
    assert "Traceback" not in listed.stderr and "x-main\tDEAD" in listed.stdout, listed.stdout
    frames = farm.frames(job)
    bad = next(f for f in frames if f["name"] == "x-main")
    assert [f["state"] for f in frames if f["name"] == "0002-main"] == ["SUCCEEDED"]
    shown = farm.cuectl("frame", "show", str(bad["id"]))
    assert "x-main" in shown.stdout
    log = farm.cuectl("frame", "log", str(bad["id"]), check=False)
    assert log.returncode == 0 and "not an integer" in log.stdout, (log.stdout, log.stderr)
