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
    bad = store.submit(spec_from_flags(name="bad", command=["true"], range="1-2", retries=0, user=user),
                       now=time.time())
    with sqlite3.connect(store.path) as con:
        con.execute("UPDATE layers SET env = ? WHERE job_id = ?", (env, bad))
    worker.loop()  # claims both, refuses to launch them: no exception escapes
    frames, _ = store.list_frames(job=bad)
    assert [f["state"] for f in frames] == ["DEAD", "DEAD"]
    assert worker.running == {}
    good = store.submit(spec_from_flags(name="good", command=["true"], range="1", user=user), now=time.time())
    stats = worker.loop()
    assert stats.claimed == 1 and store.list_frames(job=good)[0][0]["state"] == "RUNNING"
