"""`cuectl job depend|undepend`, dependencies in `job show`, and an OpenCue spec whose jobs
wait on each other run end to end by a real worker (issue 18 item 4)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "opencue"
sys.path.insert(0, str(Path(__file__).parents[1] / "worker"))

from farmlib import Farm  # noqa: E402

TWO_PASS = (
    "name: {name}\nlayers:\n  - {{name: pass_1, command: [echo, x], range: 1-4}}\n"
    "  - {{name: pass_2, command: [echo, y], range: 1-4}}\n"
)


def submit(cli, tmp_path, name: str) -> str:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(TWO_PASS.format(name=name))
    res = cli("submit", str(spec))
    assert res.exit_code == 0, res
    return res.stdout.strip()


def states(cli, job: str) -> dict[str, str]:
    res = cli("frame", "list", "--job", job, "--json")
    data = json.loads(res.stdout)
    return {f["name"]: f["state"] for f in (data["frames"] if isinstance(data, dict) else data)}


def test_depend_show_and_undepend(cli, tmp_path):
    a, b = submit(cli, tmp_path, "comp"), submit(cli, tmp_path, "render")
    res = cli("job", "depend", "comp", "--layer", "pass_1", "--on-job", "render", "--on-frame", "0002-pass_2")
    assert res.exit_code == 0, res
    assert res.stdout.strip() == (
        f"dependency 1: layer-on-frame, job {a} comp layer pass_1 on job {b} render layer pass_2 frame 2: waiting"
    )
    res = cli(
        "job",
        "depend",
        a,
        "--layer",
        "pass_2",
        "--on-job",
        b,
        "--on-layer",
        "pass_1",
        "--type",
        "previous-frame",
        "--json",
    )
    assert res.exit_code == 0 and json.loads(res.stdout)["type"] == "previous-frame"
    assert states(cli, a) == {
        **{f"000{n}-pass_1": "DEPEND" for n in range(1, 5)},
        "0001-pass_2": "WAITING",
        **{f"000{n}-pass_2": "DEPEND" for n in range(2, 5)},
    }
    shown = cli("job", "show", a).stdout
    assert "DEPEND\tTYPE\tWAITING\tON\tSTATE" in shown
    assert f"1\tlayer-on-frame\tlayer pass_1\tjob {b} render layer pass_2 frame 2\twaiting" in shown
    assert "WAITED ON BY" in cli("job", "show", b).stdout
    data = json.loads(cli("job", "show", a, "--json").stdout)
    assert [d["type"] for d in data["depends"]] == ["layer-on-frame", "previous-frame"]
    assert json.loads(cli("job", "show", b, "--json").stdout)["dependents"][0]["job"]["name"] == "comp"
    why = cli("job", "why", a).stdout
    assert f"frame 2 of layer pass_2 of job {b} render" in why
    res = cli("job", "undepend", a, "1")
    assert res.exit_code == 0 and res.stdout.strip() == "dropped 1 dependency of job " + a
    assert set(states(cli, a)[f"000{n}-pass_1"] for n in range(1, 5)) == {"WAITING"}
    res = cli("job", "undepend", a, "--all")
    assert res.exit_code == 0 and set(states(cli, a).values()) == {"WAITING"}


def test_bad_input_is_one_error_line_and_changes_nothing(cli, tmp_path):
    a, b = submit(cli, tmp_path, "comp"), submit(cli, tmp_path, "render")
    before = states(cli, a)
    for args, text in (
        (["--frame", "2"], "--frame: a frame needs its --layer"),
        (["--on-job", b, "--type", "bogus"], "not a dependency type"),
        (["--on-job", b, "--on-frame", "x-y"], "expected a frame number or a frame name"),
        (["--layer", "pass_1", "--frame", "0002-pass_2", "--on-job", b], "is of layer 'pass_2'"),
        (["--on-job", b, "--any-frame"], "--any-frame"),
        ([], "on itself"),
    ):
        res = cli("job", "depend", a, *args)
        assert res.exit_code == 2, (args, res)
        assert res.stderr.count("error:") == 1 and text in res.stderr and "Traceback" not in res.stderr
    res = cli("job", "depend", a, "--on-job", b, "--on-layer", "nope")
    assert res.exit_code != 0 and "no layer 'nope'" in res.stderr
    res = cli("job", "undepend", a)
    assert res.exit_code == 2 and "give dependency ids or --all" in res.stderr
    assert states(cli, a) == before and json.loads(cli("job", "show", a, "--json").stdout)["depends"] == []


def test_an_opencue_spec_of_jobs_waiting_on_each_other_runs_in_order(tmp_path):
    """jobspec_depend_test.xml with job A waiting (JOB_ON_JOB) on job B, written after it:
    B is submitted first, A waits on *that* B (not an older job of the same name), and the
    worker runs every frame of B before any of A."""
    farm = Farm(tmp_path)
    try:
        fake = farm.host("node-01", [])
        a, b = "pipe-dev.cue-testuser_depend_test_a", "pipe-dev.cue-testuser_depend_test_b"
        spec = tmp_path / "deps.xml"
        shutil.copy(FIXTURES / "jobspec_depend_test.xml", spec)
        text = spec.read_text().replace("/shots/pipe/usr_testuser/logs/help.py", "true")
        older = tmp_path / "older.xml"
        older.write_text(text)
        (old_a, old_b) = [int(x) for x in farm.cuectl("submit", str(older)).stdout.split()]
        farm.cuectl("job", "pause", str(old_a), str(old_b))
        spec.write_text(
            text.replace(
                "</spec>",
                f'<depends><depend type="JOB_ON_JOB"><depjob>{a}</depjob><onjob>{b}</onjob></depend></depends></spec>',
            )
        )
        ids = [int(x) for x in farm.cuectl("submit", str(spec)).stdout.split()]
        jobs = {farm.job(i)["name"]: i for i in ids}
        assert ids == [jobs[b], jobs[a]]  # B first: A names it by id
        depends = json.loads(farm.cuectl("job", "show", str(jobs[a]), "--json").stdout)["depends"]
        assert [(d["type"], d["on_job"]["id"]) for d in depends] == [("job-on-job", jobs[b])]
        farm.run_worker(fake, "--until-idle")
        frames_a, frames_b = farm.frames(jobs[a]), farm.frames(jobs[b])
        assert {f["state"] for f in frames_a + frames_b} == {"SUCCEEDED"}
        assert max(f["ended_at"] for f in frames_b) <= min(f["started_at"] for f in frames_a)
        assert farm.job(old_a)["frame_counts"] == {"WAITING": 20}  # the older namesakes were never involved
    finally:
        farm.cleanup()
