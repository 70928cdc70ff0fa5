"""Where and with what environment frames run (issue 17 item 1), and flags given with a spec
file (item 2): real `cuectl submit` and `cuectl worker` processes, each in its own directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml
from farmlib import cuectl_cmd

SHOW = "import json, os, sys; json.dump({'cwd': os.getcwd(), 'env': dict(os.environ)}, open(sys.argv[1], 'w'))"


def submit(farm, *args: str, cwd: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(farm.db), "submit", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**farm.env(), **(env or {})},
        timeout=60,
    )
    if check:
        assert res.returncode == 0, res.stderr
    return res


def test_frames_run_where_submit_ran_unless_told_otherwise(farm):
    project = farm.tmp / "project"
    (project / "sub").mkdir(parents=True)
    out = farm.tmp / "seen"
    out.mkdir()
    submit(farm, "--name", "here", "--", sys.executable, "-c", SHOW, str(out / "here.json"), cwd=project)
    submit(
        farm,
        "--name",
        "there",
        "--chdir",
        "sub",
        "--",
        sys.executable,
        "-c",
        SHOW,
        str(out / "there.json"),
        cwd=project,
    )
    spec = project / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "spec",
                "cwd": "sub",
                "layers": [
                    {"name": "a", "command": [sys.executable, "-c", SHOW, str(out / "spec-a.json")]},
                    {"name": "b", "cwd": "/", "command": [sys.executable, "-c", SHOW, str(out / "spec-b.json")]},
                ],
            }
        )
    )
    submit(farm, str(spec), cwd=project)
    res = farm.run_worker(None)  # the worker runs in the test's tmp dir, not in project/
    assert res.returncode == 0, res.stderr
    seen = {p.stem: json.loads(p.read_text())["cwd"] for p in out.iterdir()}
    assert seen == {"here": str(project), "there": str(project / "sub"), "spec-a": str(project / "sub"), "spec-b": "/"}


def test_a_missing_directory_fails_the_frame_with_a_reason(farm):
    gone = farm.tmp / "gone"
    gone.mkdir()
    res = submit(farm, "--name", "lost", "--retries", "1", "--retry-delay", "0", "--", "true", cwd=gone)
    job = int(res.stdout)
    gone.rmdir()
    assert farm.run_worker(None).returncode == 0
    frame = farm.frames(job)[0]
    assert frame["state"] == "DEAD" and frame["attempts"] == 2  # retried: another host may have it
    assert f"working directory {gone} does not exist on host" in frame["failure"]


def test_what_environment_travels_with_the_job(farm):
    out = farm.tmp / "env"
    out.mkdir()
    mine = {
        "PATH": "/opt/studio/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": "/opt/venvs/ml",
        "RENDER_QUALITY": "high",
        "HF_TOKEN": "hf_secret",
        "CUE_JOB": "leaked",
    }
    command = ["--", sys.executable, "-c", SHOW]
    submit(farm, "--name", "base", *command, str(out / "base.json"), cwd=farm.tmp, env=mine)
    submit(farm, "--name", "all", "--export", "ALL", *command, str(out / "all.json"), cwd=farm.tmp, env=mine)
    submit(farm, "--name", "none", "--export", "NONE", *command, str(out / "none.json"), cwd=farm.tmp, env=mine)
    submit(
        farm,
        "--name",
        "named",
        "--export",
        "HF_TOKEN,SEED=7",
        *command,
        str(out / "named.json"),
        cwd=farm.tmp,
        env=mine,
    )
    res = farm.run_worker(None, env={"RENDER_QUALITY": "worker's", "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    env = {p.stem: json.loads(p.read_text())["env"] for p in out.iterdir()}
    # Default BASE: the submitter's PATH and virtualenv, nothing else of theirs.
    assert env["base"]["PATH"] == mine["PATH"] and env["base"]["VIRTUAL_ENV"] == "/opt/venvs/ml"
    assert env["base"]["RENDER_QUALITY"] == "worker's" and "HF_TOKEN" not in env["base"]
    # ALL: everything but secret-looking names and cuectl's own variables.
    assert env["all"]["RENDER_QUALITY"] == "high" and "HF_TOKEN" not in env["all"]
    assert env["all"]["CUE_JOB"] == "all"
    # NONE: the worker's environment only.
    assert env["none"]["PATH"] == "/usr/bin:/bin" and "VIRTUAL_ENV" not in env["none"]
    # Named: exactly those (a secret only when asked for by name), and values given inline.
    assert env["named"]["HF_TOKEN"] == "hf_secret" and env["named"]["SEED"] == "7"
    assert env["named"]["PATH"] == "/usr/bin:/bin"
    bad = submit(farm, "--name", "x", "--export", "NONE,PATH", "--", "true", cwd=farm.tmp, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: --export: NONE cannot be combined"), bad.stderr


def test_flags_given_with_a_spec_override_it_or_are_refused(farm):
    one = farm.tmp / "one.yaml"
    one.write_text(
        yaml.safe_dump(
            {
                "name": "spec-name",
                "priority": 5,
                "layers": [{"name": "r", "command": ["true"], "range": "1-2", "env": {"A": "spec"}}],
            }
        )
    )
    two = farm.tmp / "two.yaml"
    two.write_text(
        yaml.safe_dump(
            {"name": "two", "layers": [{"name": "a", "command": ["true"]}, {"name": "b", "command": ["true"]}]}
        )
    )
    res = submit(
        farm,
        "--paused",
        "--priority",
        "90",
        "--name",
        "renamed",
        "--range",
        "1-5",
        "--gpus",
        "1",
        "--env",
        "A=flag",
        "--project",
        "p1",
        str(one),
        "--json",
        cwd=farm.tmp,
    )
    job = json.loads(res.stdout)
    assert (job["name"], job["priority"], job["paused"], job["project"]) == ("renamed", 90, True, "p1")
    layer = job["layers"][0]
    assert (layer["range"], layer["gpus"], layer["env"]["A"]) == ("1-5", 1, "flag")
    assert job["frame_counts"] == {"WAITING": 5}
    # Job-level flags apply to any spec; a layer flag to a two-layer spec is refused, naming it.
    assert json.loads(submit(farm, "--priority", "7", str(two), "--json", cwd=farm.tmp).stdout)["priority"] == 7
    before = farm.cuectl("job", "list", "--json").stdout
    for flags, message in (
        (["--gpus", "1"], "error: --gpus: a layer setting, and the spec has 2 layers"),
        (["--gpu-model", "A100"], "error: --gpu-model: a layer setting"),
        (["--priority", "x"], "error: Invalid value for '--priority'"),
        (["--gpus", "-1"], "error: --gpus: must be 0 or more"),
    ):
        bad = submit(farm, *flags, str(two), cwd=farm.tmp, check=False)
        assert bad.returncode == 2 and bad.stderr.startswith(message), (flags, bad.stderr)
    assert farm.cuectl("job", "list", "--json").stdout == before  # nothing was submitted
