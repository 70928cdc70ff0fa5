"""Issue 35 item 4: a root worker enters a frame's working directory as the frame's user, not
as root — a job cannot run in, or read from, a directory its user may not enter
(docs/security.md, "Who runs what")."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from farmlib import cuectl_cmd

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="a root worker and real users need root")
SECRET = "bob's private notes 7f3a"


def submit_in(user, farm, directory: Path, *command: str, path: str | None = None) -> int:
    env = farm.env(**({"PATH": path} if path else {}))
    res = user.run(
        [
            *cuectl_cmd(),
            "--db",
            str(farm.db),
            "submit",
            "--name",
            f"in-{user.name}",
            "--retries",
            "2",
            "-D",
            str(directory),
            "--",
            *command,
        ],
        env=env,
        cwd=farm.tmp,
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def shown(farm, frame: dict) -> dict:
    return json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)


def log_of(farm, frame: dict) -> str:
    return Path(shown(farm, frame)["log_path"]).read_text()


@ROOT_ONLY
def test_a_job_cannot_run_in_a_directory_its_user_may_not_enter(shared_farm, os_users):
    """alice submits `-D <bob's 0700 home>/proj -- cat notes.txt`: the root worker used to
    change into it as root and then run `cat` as alice, handing her bob's notes. Now the
    frame is not started, says why, and is not retried; bob's own job there runs."""
    alice, bob = os_users("alice", "bob")
    home = Path(tempfile.mkdtemp(prefix="cuectl-bobhome-", dir="/tmp"))
    try:
        project = home / "proj"
        project.mkdir()
        (project / "notes.txt").write_text(SECRET + "\n")
        for path in (home, project, project / "notes.txt"):
            os.chown(path, bob.uid, bob.gid)
        home.chmod(0o700)
        project.chmod(0o755)  # open itself: only the home above it keeps alice out
        (project / "notes.txt").chmod(0o644)
        stolen = submit_in(alice, shared_farm, project, "cat", "notes.txt")
        own = submit_in(bob, shared_farm, project, "cat", "notes.txt")
        res = shared_farm.run_worker(None)
        assert res.returncode == 0, res.stderr
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr

        (frame,) = shared_farm.frames(stolen)
        assert frame["state"] == "DEAD" and frame["attempts"] == 1  # permanent: no retries burnt
        assert shown(shared_farm, frame)["attempt_history"][-1]["failure_kind"] == "launch"
        assert f"user {alice.name} may not enter working directory {project}" in frame["failure"]
        assert "permission denied" in frame["failure"]
        log = log_of(shared_farm, frame)
        assert SECRET not in log
        assert log.count(f"cuectl: frame not started: user {alice.name} may not enter working directory {project}") == 1

        (frame,) = shared_farm.frames(own)
        assert frame["state"] == "SUCCEEDED"
        assert SECRET in log_of(shared_farm, frame)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@ROOT_ONLY
def test_a_frame_run_as_its_user_keeps_its_directory_environment_and_errors(shared_farm, os_users):
    """Where the user may enter it, the frame runs there with the environment it was given
    (the step that enters it leaves no PWD/OLDPWD of its own), and a missing command still
    fails as one (exit 127, permanent)."""
    (alice,) = os_users("alice")
    place = shared_farm.tmp / "alice's dir"
    place.mkdir()
    os.chown(place, alice.uid, alice.gid)
    place.chmod(0o700)
    show = "import json, os; print('SEEN', json.dumps([os.getcwd(), os.environ.get('PWD'), os.environ.get('OLDPWD')]))"
    ran = submit_in(alice, shared_farm, place, "python3", "-c", show)
    # (on a PATH the user may search: an entry under /root would make it exit 126, as before)
    missing = submit_in(alice, shared_farm, place, "no-such-command-here", path="/usr/bin:/bin")
    res = shared_farm.run_worker(None, env={"PWD": "/the-workers-pwd", "OLDPWD": "/the-workers-oldpwd"})
    assert res.returncode == 0, res.stderr
    (frame,) = shared_farm.frames(ran)
    assert frame["state"] == "SUCCEEDED", log_of(shared_farm, frame)
    line = next(ln for ln in log_of(shared_farm, frame).splitlines() if ln.startswith("SEEN "))
    cwd, pwd, oldpwd = json.loads(line[5:])
    assert (cwd, pwd, oldpwd) == (str(place), "/the-workers-pwd", "/the-workers-oldpwd")
    (frame,) = shared_farm.frames(missing)
    assert frame["state"] == "DEAD", log_of(shared_farm, frame)
    assert shown(shared_farm, frame)["attempt_history"][-1]["failure_kind"] == "not-found", log_of(shared_farm, frame)
