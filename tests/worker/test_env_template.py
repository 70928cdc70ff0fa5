"""A worker makes the environment a layer's frames share once (``launch.EnvTemplate``,
``FrameTable.frame_env``) and puts each frame's own values in: every frame still gets exactly
its own variables, and its own layer's, whatever ran before it."""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path

import pytest

from cuectl import config
from cuectl.run import launch
from cuectl.run.worker import Supervisor
from cuectl.sched.spec import spec_from_mapping


def _env_in_log(path: str) -> dict[str, str]:
    """The variables ``env`` printed into a frame's log (its header and footer lines left out)."""
    pairs = (line.partition("=") for line in Path(path).read_text().splitlines() if not line.startswith("==="))
    return {key: value for key, _, value in pairs if key}


def _attempt_logs(store, job_id: int) -> list[tuple[dict, int, str]]:
    """(frame, attempt, log path) for every attempt of the job's frames."""
    frames, _ = store.list_frames(job=job_id)
    out = []
    for frame in frames:
        log = Path(store.get_frame(frame["id"])["log_path"])
        for attempt in range(1, frame["attempts"] + 1):
            out.append(
                (frame, attempt, str(log.with_name(log.name.replace(f".{frame['attempts']}.log", f".{attempt}.log"))))
            )
    return out


def test_each_frame_gets_its_own_values_and_its_own_layers(solo, tmp_path):
    store, worker = solo
    # Two layers of one job, then a second job: three templates; a retried frame shows the
    # attempt it is. A layer's env may not forge a frame's own variables.
    flaky = f"env; test -e {tmp_path}/$CUE_IFRAME-once || {{ touch {tmp_path}/$CUE_IFRAME-once; exit 1; }}"
    first = store.submit(
        spec_from_mapping(
            {
                "name": "one",
                "layers": [
                    {"name": "a", "command": ["env"], "range": "1-3", "env": {"WHO": "a", "CUE_FRAME": "forged"}},
                    {
                        "name": "b",
                        "command": flaky,
                        "range": "4-5",
                        "retries": 1,
                        "retry_delay": 0,
                        "env": {"WHO": "b", "CUE_IFRAME": "forged"},
                    },
                ],
            },
            user=config.current_user(),
        ),
        now=time.time(),
    )
    second = store.submit(
        spec_from_mapping(
            {
                "name": "two",
                "layers": [{"name": "a", "command": ["env"], "range": "1-2", "cores": 2, "env": {"WHO": "two"}}],
            },
            user=config.current_user(),
        ),
        now=time.time(),
    )
    assert Supervisor(worker).run() == 0
    seen = 0
    for job_id, job in ((first, "one"), (second, "two")):
        for frame, attempt, log in _attempt_logs(store, job_id):
            env = _env_in_log(log)
            layer = frame["layer"]
            assert env["CUE_JOB"] == job and env["CUE_LAYER"] == layer
            assert env["WHO"] == ("two" if job == "two" else layer)
            assert env["CUE_FRAME_ID"] == str(frame["id"]) and env["CUE_IFRAME"] == str(frame["number"])
            assert env["CUE_FRAME"] == launch.frame_name(frame["number"], layer)
            assert env["CUE_ATTEMPT"] == str(attempt) and env["CUE_LOG_PATH"] == log
            assert env["CUE_THREADS"] == ("2" if job == "two" else "1")
            seen += 1
    assert seen == 3 + 2 * 2 + 2  # layer b's frames ran twice each
    assert len(worker.frames.env_templates) == 3


@pytest.mark.parametrize("env", ['{"A": 1}', '{"A": [1]}', '{"A": "x\\u0000y"}', '{"A=B": "1"}'])
def test_a_layer_env_with_values_execve_cannot_carry_fails_its_frames_each_time(solo, env):
    # Written into the store behind the submit's checks (a hostile writer): whether the
    # value can be a template's key or not, every frame is refused, none is started with a
    # template made for another, and the worker goes on. A worker that runs frames as
    # itself (not root) has no receipt to hold the row against: its launch refuses it.
    store, worker = solo
    worker.opts = dataclasses.replace(worker.opts, run_as_submitter=False)
    user = config.current_user()
    bad = store.submit(
        spec_from_mapping(
            {
                "name": "bad",
                "layers": [{"name": "r", "command": ["true"], "range": "1-3", "retries": 0, "env": {"A": "ok"}}],
            },
            user=user,
        ),
        now=time.time(),
    )
    with sqlite3.connect(store.path) as con:
        con.execute("UPDATE layers SET env = ? WHERE job_id = ?", (env, bad))
    good = store.submit(
        spec_from_mapping(
            {"name": "good", "layers": [{"name": "r", "command": ["true"], "range": "1", "env": {"A": "ok"}}]},
            user=user,
        ),
        now=time.time(),
    )
    assert Supervisor(worker).run() == 0
    frames, _ = store.list_frames(job=bad)
    assert [f["state"] for f in frames] == ["DEAD"] * 3
    for frame in frames:
        log = Path(store.get_frame(frame["id"])["log_path"]).read_text()
        assert "cuectl: frame not started: layer env:" in log
    assert store.list_frames(job=good)[0][0]["state"] == "SUCCEEDED"
