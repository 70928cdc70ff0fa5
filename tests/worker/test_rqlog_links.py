"""OpenCue's log names (issue 34 §4): CueGUI opens ``<Job.log_dir>/<job name>.<frame name>.rqlog``,
so each job directory has ``rqlog/`` with one relative link per frame, kept by the worker on
the frame's latest attempt's log. Real ``cuectl worker`` subprocesses on a fake GPU host."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cuectl.run import logs

# Fails its first attempt and succeeds on the second; each attempt prints its number, and
# the second waits for the file ``go`` (in the frame's directory, the farm's tmp) when asked.
ATTEMPTS = (
    "import os, sys, time\n"
    "n = int(open('count').read()) + 1 if os.path.exists('count') else 1\n"
    "open('count', 'w').write(str(n))\n"
    "print(f'output of attempt {n}', flush=True)\n"
    "if n == 1:\n"
    "    sys.exit(3)\n"
    "while sys.argv[1:] == ['wait'] and not os.path.exists('go'):\n"
    "    time.sleep(0.05)\n"
)


def _layer(*args: str, **extra: object) -> dict[str, object]:
    return {"name": "w", "command": [sys.executable, "-c", ATTEMPTS, *args], "retries": 1, "retry_delay": "0", **extra}


def _log_env(farm) -> dict[str, str]:
    return {"CUECTL_LOG_DIR": str(farm.tmp / "logs")}


def _show(farm, frame_id: int) -> dict:
    return json.loads(farm.cuectl("frame", "show", str(frame_id), "--json").stdout)


def test_the_link_names_the_latest_attempts_log(farm) -> None:
    job = farm.submit({"name": "shot-a", "layers": [_layer()]})
    res = farm.run_worker(None, env=_log_env(farm), timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(job)
    shown = _show(farm, frame["id"])
    assert (shown["state"], shown["attempts"]) == ("SUCCEEDED", 2), shown
    latest = Path(shown["log_path"])
    job_dir = logs.job_log_dir(farm.tmp / "logs", job)
    assert latest.parent == job_dir  # the one layout the gRPC server and the worker share
    link = job_dir / "rqlog" / "shot-a.0001-w.rqlog"
    assert logs.rqlog_path(job_dir, "shot-a", "0001-w") == link
    assert logs.rqlog_dir(job_dir) == link.parent
    assert link.is_symlink()
    assert os.readlink(link) == "../0001-w.2.log"  # relative: resolves wherever the share is mounted
    text = link.read_text()
    assert "output of attempt 2" in text and "output of attempt 1" not in text, text
    assert text == latest.read_text()
    assert "output of attempt 1" in (job_dir / "0001-w.1.log").read_text()  # each attempt keeps its own
    assert [p.name for p in link.parent.iterdir()] == [link.name]  # no temporary link left behind
    assert "OpenCue log link" not in res.stderr


def test_a_running_frames_link_names_its_running_attempt(farm) -> None:
    job = farm.submit({"name": "shot-b", "layers": [_layer("wait")]})
    worker = farm.start_worker(None, "--until-idle", env=_log_env(farm))
    link = logs.job_log_dir(farm.tmp / "logs", job) / "rqlog" / "shot-b.0001-w.rqlog"
    try:
        # Attempt 1 failed at once; attempt 2 runs until told to stop: the link already
        # follows it, and reading it shows what the running frame has written so far.
        farm.wait_for(
            lambda: link.is_symlink() and os.readlink(link) == "../0001-w.2.log",
            timeout=30,
            what="the link to attempt 2's log",
        )
        farm.wait_for(lambda: "output of attempt 2" in link.read_text(), timeout=30, what="attempt 2's output")
        (frame,) = farm.frames(job)
        assert frame["state"] == "RUNNING", frame
        assert _show(farm, frame["id"])["attempts"] == 2
    finally:
        (farm.tmp / "go").touch()
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED"]
    assert os.readlink(link) == "../0001-w.2.log"


@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_a_planted_rqlog_is_not_used_and_the_frames_still_run(farm, planted: str) -> None:
    job = farm.submit({"name": "shot-c", "layers": [_layer(range="1-2")]})
    job_dir = logs.job_log_dir(farm.tmp / "logs", job)
    job_dir.mkdir(parents=True, mode=0o750)
    elsewhere = farm.tmp / "elsewhere"
    elsewhere.mkdir()
    if planted == "symlink":
        (job_dir / "rqlog").symlink_to(elsewhere)  # someone's link to a directory of their choice
    else:
        (job_dir / "rqlog").write_text("not a directory\n")
    res = farm.run_worker(None, env=_log_env(farm), timeout=60)
    assert res.returncode == 0, res.stderr
    assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED", "SUCCEEDED"]
    assert list(elsewhere.iterdir()) == []  # nothing was made through the link
    if planted == "symlink":
        assert os.readlink(job_dir / "rqlog") == str(elsewhere)  # left as it was
    else:
        assert (job_dir / "rqlog").read_text() == "not a directory\n"
    # Said once for the job, not once per frame attempt (two frames, two attempts each).
    assert res.stderr.count("no OpenCue log link") == 1, res.stderr
    assert f"job {job}:" in res.stderr


def test_a_link_cannot_be_replaced_by_a_planted_directory(farm) -> None:
    job = farm.submit({"name": "shot-d", "layers": [_layer()]})
    rq = logs.rqlog_dir(logs.job_log_dir(farm.tmp / "logs", job))
    (rq / "shot-d.0001-w.rqlog").mkdir(parents=True)  # a directory where the link goes
    res = farm.run_worker(None, env=_log_env(farm), timeout=60)
    assert res.returncode == 0, res.stderr
    assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED"]
    assert (rq / "shot-d.0001-w.rqlog").is_dir()
    assert [p.name for p in rq.iterdir()] == ["shot-d.0001-w.rqlog"]  # the temporary link was removed
    assert res.stderr.count("no OpenCue log link") == 1, res.stderr


@pytest.mark.parametrize("name", ["a/b", "é" * 130])  # 130 characters, 260 bytes: over NAME_MAX
def test_a_job_name_that_cannot_be_a_file_name_gets_no_link(farm, name: str) -> None:
    job = farm.submit({"name": name, "layers": [_layer()]})
    res = farm.run_worker(None, env=_log_env(farm), timeout=60)
    assert res.returncode == 0, res.stderr
    assert [f["state"] for f in farm.frames(job)] == ["SUCCEEDED"]
    job_dir = logs.job_log_dir(farm.tmp / "logs", job)
    assert (job_dir / "0001-w.2.log").is_file()
    assert not (job_dir / "rqlog").exists()
    assert logs.rqlog_path(job_dir, name, "0001-w") is None
    assert "no OpenCue log link" not in res.stderr  # a documented limit, not a fault


def test_dot_job_names_stay_one_file_name(farm) -> None:
    job = farm.submit({"name": "..", "layers": [_layer()]})
    res = farm.run_worker(None, env=_log_env(farm), timeout=60)
    assert res.returncode == 0, res.stderr
    rq = logs.rqlog_dir(logs.job_log_dir(farm.tmp / "logs", job))
    assert [p.name for p in rq.iterdir()] == ["...0001-w.rqlog"]
    assert "output of attempt 2" in (rq / "...0001-w.rqlog").read_text()


def test_rqlog_name() -> None:
    assert logs.rqlog_name("show-shot-user_job", "0007-render") == "show-shot-user_job.0007-render.rqlog"
    assert logs.rqlog_name(".", "0001-w") == "..0001-w.rqlog"  # one component, never "." or ".."
    assert logs.rqlog_name("..", "0001-w") == "...0001-w.rqlog"
    assert logs.rqlog_name("a/b", "0001-w") is None
    assert logs.rqlog_name("/", "0001-w") is None
    assert logs.rqlog_name("a\0b", "0001-w") is None
    assert logs.rqlog_name("\ud800x", "0001-w") is None  # a lone surrogate encodes to no bytes
    long_ok = "j" * (255 - len(".0001-w.rqlog"))
    assert logs.rqlog_name(long_ok, "0001-w") == f"{long_ok}.0001-w.rqlog"
    assert logs.rqlog_name(long_ok + "j", "0001-w") is None
    assert logs.rqlog_name("é" * 200, "0001-w") is None  # 400 bytes: NAME_MAX counts bytes


@pytest.mark.skipif(os.geteuid() != 0, reason="a root worker and real users need root (CI runs as root)")
def test_a_root_worker_hands_the_links_to_the_frames_user_and_never_links_through_hers(shared_farm, os_users):
    """alice's frames run as alice under a root worker: her job's ``rqlog/`` and its links are
    hers, like her logs. The log root is root's, so she cannot make a job's directory there
    herself; but a job's directory is hers once the worker has made it, and a link she plants
    at ``rqlog`` in it to a root-owned directory gets no link made inside that directory
    (root would make it there if it followed)."""
    import subprocess
    import tempfile

    from test_trust import job_dir_as_a_root_worker_makes_it, submit_as

    (alice,) = os_users("alice")
    victim = Path(tempfile.mkdtemp(prefix="cuectl-victim-", dir="/tmp"))  # root's, 0700
    try:
        frame = {"name": "w", "command": ["sh", "-c", "echo FRAME-OUTPUT"]}
        fine = submit_as(alice, shared_farm, {"name": "fine", "layers": [frame]})
        planted = submit_as(alice, shared_farm, {"name": "planted", "layers": [frame]})
        root = shared_farm.tmp / f"{shared_farm.db.name}-logs"  # the store's own log root
        res = alice.run(["sh", "-c", f"mkdir -p -m 2770 {root} && mkdir -m 0750 {root}/{planted}"])
        assert res.returncode != 0 and "Permission denied" in res.stderr, res
        assert not (root / str(planted)).exists()
        job_dir_as_a_root_worker_makes_it(root, planted, alice)
        res = alice.run(["ln", "-s", str(victim), str(root / str(planted) / "rqlog")])
        assert res.returncode == 0, res.stderr
        res = shared_farm.run_worker(None)
        assert res.returncode == 0, res.stderr
        for job in (fine, planted):
            assert [f["state"] for f in shared_farm.frames(job)] == ["SUCCEEDED"]
        assert list(victim.iterdir()) == []
        assert os.readlink(root / str(planted) / "rqlog") == str(victim)  # left as it was
        rq = logs.rqlog_dir(logs.job_log_dir(root, fine))
        link = rq / "fine.0001-w.rqlog"
        assert "FRAME-OUTPUT" in link.read_text()
        assert rq.stat().st_uid == alice.uid and link.lstat().st_uid == alice.uid
        assert os.stat(rq).st_mode & 0o007 == 0
        assert res.stderr.count("no OpenCue log link") == 1, res.stderr
        assert f"job {planted}:" in res.stderr
    finally:
        subprocess.run(["rm", "-rf", str(victim)])


def test_a_frame_that_never_started_links_the_note_that_says_why(farm) -> None:
    missing = farm.tmp / "not-mounted-here"
    job = farm.submit(
        {"name": "shot-e", "layers": [{"name": "w", "command": ["true"], "retries": 0, "cwd": str(missing)}]}
    )
    res = farm.run_worker(None, env=_log_env(farm), timeout=60)
    assert [f["state"] for f in farm.frames(job)] == ["DEAD"], res.stderr
    link = logs.rqlog_path(logs.job_log_dir(farm.tmp / "logs", job), "shot-e", "0001-w")
    assert link is not None and os.readlink(link) == "../0001-w.1.log"
    assert "cuectl: frame not started" in link.read_text()
