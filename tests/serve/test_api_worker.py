"""The API beside a real `cuectl worker` with fake GPUs: live GPU use of a RUNNING frame,
its device lease, following its log while it prints (the stream ends with the frame),
attempt history after a retry, and /report against `cuectl admin report` for the same
window."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from apiclient import CUECTL, GIB, check_problem, create_token, cuectl, job_spec, layer_spec, new_store

API = "/api/v1"
A100 = "NVIDIA A100-SXM4-80GB"
PRINTER = "import time\nfor i in range(10):\n    print('line', i, flush=True)\n    time.sleep(0.25)\n"


@pytest.fixture(scope="module")
def run(serve_dir: Path, serve_env: dict[str, str]):
    """A server, two jobs submitted through it, and a worker running them: the tests
    below look at the farm while it works and after."""
    from apiclient import Server

    from cuectl.units import iso

    db = new_store(serve_dir / "store" / "cuectl.db")
    token = create_token(db, "render", "user", env=serve_env)
    server = Server(db, env=serve_env, log=serve_dir / "server.log")
    api = server.api.with_token(token)
    state = serve_dir / "gpu-state"
    state.mkdir()
    (state / "0.json").write_text(json.dumps({"utilization_pct": 73, "memory_used_bytes": 5 * GIB}))
    fake = serve_dir / "gpus.yaml"
    fake.write_text(
        yaml.safe_dump(
            {
                "host": "wk-h",
                "state_dir": str(state),
                "devices": [{"model": A100, "vendor": "NVIDIA", "memory": "80GiB", "uuid": "GPU-wk-0"}],
            }
        )
    )
    started = time.time() - 1
    stream = api.post(
        f"{API}/jobs",
        job_spec("stream", layer_spec("gpu", [sys.executable, "-c", PRINTER], gpus=1, gpu_models=["A100"])),
    )
    flaky = api.post(
        f"{API}/jobs",
        job_spec(
            "flaky",
            layer_spec("cpu", ["sh", "-c", 'echo "attempt $CUE_ATTEMPT"; test "$CUE_ATTEMPT" -ge 2'], retries=2),
        ),
    )
    assert stream.status == 201 and flaky.status == 201, (stream, flaky)
    env = {**serve_env, "CUECTL_FAKE_GPUS": str(fake)}
    worker = subprocess.Popen(
        [
            *CUECTL,
            "--db",
            str(db),
            "worker",
            "--until-idle",
            "--poll",
            "0.05",
            "--lease-timeout",
            "5",
            "--sample-interval",
            "0.1",
            "--run-as-worker-user",
        ],
        env=env,
        cwd=serve_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    farm = {
        "db": db,
        "api": api,
        "server": server,
        "worker": worker,
        "env": serve_env,
        "started": started,
        "stream": stream.json()["id"],
        "flaky": flaky.json()["id"],
        "iso": iso,
    }
    yield farm
    if worker.poll() is None:
        worker.kill()
        worker.communicate(timeout=10)
    server.stop()


def wait_for(predicate, *, timeout: float = 20.0, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_running_frame_live_then_its_log_followed_to_the_end(run):
    api = run["api"]

    def running_with_sample():
        page = api.ok("GET", f"{API}/jobs/{run['stream']}/frames?state=RUNNING")
        frames = [f for f in page["frames"] if f["gpu_util_pct"] is not None]
        return frames[0] if frames else None

    frame = wait_for(running_with_sample, what="the GPU frame RUNNING with a live sample")
    assert frame["gpu_util_pct"] == 73.0 and frame["gpu_memory_used_bytes"] == 5 * GIB
    assert frame["host"] == "wk-h" and frame["gpu_uuids"] == ["GPU-wk-0"]
    (lease,) = api.ok("GET", f"{API}/leases")["leases"]
    assert (lease["host"], lease["uuid"], lease["kind"], lease["frame_id"]) == (
        "wk-h",
        "GPU-wk-0",
        "frame",
        frame["id"],
    )
    gpus = run["server"].api.ok("GET", "/readyz")["gpus"]
    assert gpus.pop("active_jobs") in (1, 2)  # the flaky CPU job may be done already
    assert gpus == {"total": 1, "leased": 1, "foreign_busy": 0, "available": 0, "unavailable": 0}
    wait_for(lambda: api.get(f"{API}/frames/{frame['id']}/log").status == 200, what="the log file")
    chunks = list(api.stream(f"{API}/frames/{frame['id']}/log?follow=true"))
    ended = api.ok("GET", f"{API}/frames/{frame['id']}")
    assert ended["state"] == "SUCCEEDED" and ended["exit_code"] == 0
    text = b"".join(c for _, c in chunks).decode()
    lines = text.splitlines()
    assert lines[0].startswith(f"=== cuectl frame {frame['id']} attempt 1 on wk-h")
    assert [line for line in lines if line.startswith("line ")] == [f"line {i}" for i in range(10)], text
    # It streamed while the frame ran (not one body once it had ended)...
    assert len(chunks) > 1 and chunks[-1][0] - chunks[0][0] > 0.8, [(round(t, 2), c) for t, c in chunks]
    # ...and what it streamed is the whole log.
    assert api.get(f"{API}/frames/{frame['id']}/log").text == text
    # The last line is the worker's footer (launch.log_footer).
    tail = api.get(f"{API}/frames/{frame['id']}/log?tail=3").text.splitlines()
    assert tail[:2] == ["line 8", "line 9"] and tail[2].startswith(f"=== cuectl frame {frame['id']} attempt 1 ended ")
    # Following a finished frame's log gives it all and ends at once.
    t0 = time.monotonic()
    assert (
        b"".join(c for _, c in api.stream(f"{API}/frames/{frame['id']}/log?follow=true&tail=1"))
        == (tail[2] + "\n").encode()
    )
    assert time.monotonic() - t0 < 5


def test_attempt_history_after_a_retry(run):
    worker = run["worker"]
    out, err = worker.communicate(timeout=90)
    assert worker.returncode == 0, err
    api = run["api"]
    page = api.ok("GET", f"{API}/jobs/{run['flaky']}/frames")
    (frame,) = page["frames"]
    assert (frame["state"], frame["attempts"], frame["exit_code"]) == ("SUCCEEDED", 2, 0)
    history = frame["attempt_history"]
    assert [(a["attempt"], a["outcome"], a["exit_code"], a["host"]) for a in history] == [
        (1, "failed", 1, "wk-h"),
        (2, "succeeded", 0, "wk-h"),
    ]
    assert all(a["started_at"].endswith("Z") and a["ended_at"] >= a["started_at"] for a in history)
    assert api.ok("GET", f"{API}/frames/{frame['id']}")["attempt_history"] == history
    # The latest attempt's log (its last line is the worker's footer, launch.log_footer).
    assert api.get(f"{API}/frames/{frame['id']}/log?tail=2").text.splitlines()[0] == "attempt 2"
    (gpu_frame,) = api.ok("GET", f"{API}/jobs/{run['stream']}/frames")["frames"]
    (attempt,) = gpu_frame["attempt_history"]
    assert attempt["gpu_uuids"] == ["GPU-wk-0"] and attempt["gpu_util_mean_pct"] == 73.0
    assert api.ok("GET", f"{API}/jobs/{run['stream']}")["state"] == "FINISHED"
    assert api.ok("GET", f"{API}/jobs?state=FINISHED")["total"] == 2


@pytest.mark.parametrize("by", ["job", "user", "gpu-model", "host"])
def test_report_matches_admin_report(run, by):
    api, iso = run["api"], run["iso"]
    if run["worker"].poll() is None:
        run["worker"].communicate(timeout=90)
    since, until = iso(run["started"]), iso(time.time() + 1)
    from urllib.parse import quote

    resp = api.get(f"{API}/report?by={by}&since={quote(since)}&until={quote(until)}")
    assert resp.status == 200 and resp.content_type == "application/json", resp
    served = resp.json()
    cli = json.loads(
        cuectl(
            run["db"],
            "admin",
            "report",
            "--by",
            by,
            "--since",
            since,
            "--until",
            until,
            "--format",
            "json",
            env=run["env"],
        ).stdout
    )
    served.pop("generated_at")
    cli.pop("generated_at")
    assert served == cli
    assert served["by"] == by and served["total"]["frames"] == 2 and served["total"]["succeeded"] == 2
    groups = {row["group"]: row for row in served["rows"]}
    if by == "job":
        stream = next(row for group, row in groups.items() if "stream" in group)
        assert stream["gpu_seconds_allocated"] > 1.5 and stream["gpu_util_mean_pct"] == 73.0
    if by == "user":
        assert list(groups) == ["render"]
    if by == "gpu-model":
        assert A100 in groups


def test_report_defaults_and_bad_values(run):
    api = run["api"]
    data = api.ok("GET", f"{API}/report")
    assert data["by"] == "job" and data["total"]["frames"] == 2
    check_problem(api.get(f"{API}/report?by=planet"), 422, field="by")
    check_problem(api.get(f"{API}/report?until=soonish"), 422, field="until")
