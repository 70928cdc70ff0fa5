"""`cuectl submit job.xml`: OpenCue job specs (issue 18 item 8), --dry-run and --strict."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "opencue"
sys.path.insert(0, str(Path(__file__).parents[1] / "worker"))

from farmlib import Farm  # noqa: E402


@pytest.mark.store_file  # asserts that the file was never created
def test_dry_run_json_creates_no_store(cli, db_path, tmp_path):
    spec = tmp_path / "job.xml"
    shutil.copy(FIXTURES / "jobspec_gpus_test.xml", spec)
    res = cli("submit", "--dry-run", str(spec), "--json")
    assert res.exit_code == 0, res
    out = json.loads(res.stdout)
    assert out["dry_run"] is True
    assert [j["name"] for j in out["jobs"]] == ["test0", "test1", "test2", "min_mem_test", "test_depend"]
    assert out["jobs"][1]["layers"][0]["gpus"] == 3
    assert "id" not in out["jobs"][0]
    assert "warning: " in res.stderr and "<facility>: not honoured" in res.stderr
    assert not Path(db_path).exists()


@pytest.mark.store_file  # asserts that the file was never created
def test_dry_run_yaml_too(cli, db_path, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: y\nlayers:\n  - {name: a, command: [echo, x], range: 1-3}\n")
    res = cli("submit", "--dry-run", str(spec))
    assert res.exit_code == 0 and "would submit job 'y': 1 layer(s), 3 frame(s)" in res.stdout
    assert not Path(db_path).exists()


def test_submit_creates_every_job(cli, tmp_path):
    spec = tmp_path / "job.xml"
    shutil.copy(FIXTURES / "jobspec_depend_test.xml", spec)
    res = cli("submit", str(spec))
    assert res.exit_code == 0, res
    ids = res.stdout.split()
    assert len(ids) == 2
    names = [cli("job", "show", i, "--json").json()["name"] for i in ids]
    assert names == ["pipe-dev.cue-testuser_depend_test_a", "pipe-dev.cue-testuser_depend_test_b"]


@pytest.mark.store_file  # asserts that the file was never created
def test_strict_refuses_and_submits_nothing(cli, db_path, tmp_path):
    spec = tmp_path / "job.xml"
    shutil.copy(FIXTURES / "autoeat.xml", spec)
    res = cli("submit", "--strict", str(spec))
    assert res.exit_code == 2 and "cannot be honoured" in res.stderr and "<autoeat>" in res.stderr
    assert not Path(db_path).exists()


def test_malformed_xml_is_one_error(cli, tmp_path):
    spec = tmp_path / "job.xml"
    spec.write_text('<?xml version="1.0"?><!DOCTYPE spec [<!ENTITY a "x">]><spec>&a;</spec>')
    res = cli("submit", str(spec))
    assert res.exit_code == 2 and res.stderr.count("error:") == 1 and "refused" in res.stderr


def test_opencue_gpu_spec_runs_end_to_end_on_fake_gpus(tmp_path):
    farm = Farm(tmp_path)
    try:
        fake = farm.host(
            "gpu-01",
            [
                {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"},
                {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"},
            ],
        )
        spec = tmp_path / "gpu.xml"
        # pyoutline-style CJSL 1.15 spec with <gpus> and <gpu_memory>; the tag is the worker's.
        spec.write_text((FIXTURES / "pyoutline_gpu.xml").read_text().replace("<tags>gpu</tags>", ""))
        res = farm.cuectl("submit", str(spec))
        (job_id,) = [int(x) for x in res.stdout.split()]
        farm.run_worker(fake, "--until-idle")
        job = farm.job(job_id)
        assert job["frame_counts"] == {"SUCCEEDED": 5}, job
        log = farm.cuectl(
            "frame", "log", str([f for f in farm.frames(job_id) if f["layer"] == "render"][0]["id"])
        ).stdout
        assert "frame=1" in log and any(f"gpu={i}" in log for i in "01")
        for frame in farm.frames(job_id):
            if frame["layer"] == "render":
                assert len(frame["gpu_uuids"]) == 1
    finally:
        farm.cleanup()


def test_frame_level_depends_are_honoured_at_submit(cli, tmp_path):
    """FRAME_ON_JOB, FRAME_ON_LAYER and FRAME_ON_FRAME, within and across jobs (issue 41 §7):
    each waiting frame is DEPEND from the start (never runnable early), the rest of its
    layer runs on, and the jobs are not left paused."""
    a, b = "pipe-dev.cue-testuser_depend_test_a", "pipe-dev.cue-testuser_depend_test_b"

    def depend(kind, er, er_frame, on, on_layer="", on_frame=""):
        parts = [f"<depjob>{er}</depjob>", f"<depframe>{er_frame}</depframe>", f"<onjob>{on}</onjob>"]
        parts += [f"<{tag}>{value}</{tag}>" for tag, value in (("onlayer", on_layer), ("onframe", on_frame)) if value]
        return f'<depend type="{kind}">{"".join(parts)}</depend>'

    depends = "".join(
        [
            depend("FRAME_ON_JOB", b, "0001-pass_1", a),
            depend("FRAME_ON_LAYER", b, "0002-pass_1", a, on_layer="pass_2"),
            depend("FRAME_ON_FRAME", a, "0003-pass_2", a, on_frame="0001-pass_1"),
            depend("FRAME_ON_FRAME", b, "0004-pass_2", a, on_frame="0005-pass_1"),
        ]
    )
    spec = tmp_path / "job.xml"
    spec.write_text(
        (FIXTURES / "jobspec_depend_test.xml").read_text().replace("</spec>", f"<depends>{depends}</depends></spec>")
    )
    res = cli("submit", str(spec))
    assert res.exit_code == 0, res
    assert "<depend" not in res.stderr and "FRAME_ON" not in res.stderr, res.stderr  # honoured, not noted
    id_a, id_b = res.stdout.split()
    waiting = {}
    for job_id in (id_a, id_b):
        job = cli("job", "show", job_id, "--json").json()
        assert job["paused"] is False
        frames = cli("frame", "list", "--job", job_id, "--json").json()["frames"]
        waiting[job["name"]] = sorted(f["name"] for f in frames if f["state"] == "DEPEND")
        assert {f["state"] for f in frames} == {"WAITING", "DEPEND"}
        if job["name"] == b:
            assert sorted((d["type"], d["frame"], d["on_layer"], d["on_frame"]) for d in job["depends"]) == [
                ("frame-on-frame", 4, "pass_1", 5),
                ("frame-on-job", 1, None, None),
                ("frame-on-layer", 2, "pass_2", None),
            ]
            assert all(d["on_job"]["name"] == a and d["state"] == "waiting" for d in job["depends"])
    assert waiting == {a: ["0003-pass_2"], b: ["0001-pass_1", "0002-pass_1", "0004-pass_2"]}


@pytest.mark.parametrize(
    "kind,er,er_frame,on,on_layer,on_frame,needle",
    [
        ("FRAME_ON_FRAME", "b", "0004-pass_2", "a", "", "0999-pass_1", "has no frame 999"),
        ("FRAME_ON_LAYER", "b", "0999-pass_1", "a", "pass_2", "", "has no frame 999"),
        ("FRAME_ON_JOB", "a", "0001-pass_1", "a", "", "", "its own job"),
    ],
)
def test_a_frame_level_depend_that_cannot_be_met_is_refused_before_anything_is_submitted(
    cli, db_path, tmp_path, kind, er, er_frame, on, on_layer, on_frame, needle
):
    """One `error:` line and exit 2, and no job in the store: the store would refuse the
    wait only after the spec's jobs were in, leaving them there paused."""
    names = {"a": "pipe-dev.cue-testuser_depend_test_a", "b": "pipe-dev.cue-testuser_depend_test_b"}
    parts = [f"<depjob>{names[er]}</depjob>", f"<depframe>{er_frame}</depframe>", f"<onjob>{names[on]}</onjob>"]
    parts += [f"<{tag}>{value}</{tag}>" for tag, value in (("onlayer", on_layer), ("onframe", on_frame)) if value]
    spec = tmp_path / "job.xml"
    spec.write_text(
        (FIXTURES / "jobspec_depend_test.xml")
        .read_text()
        .replace("</spec>", f'<depends><depend type="{kind}">{"".join(parts)}</depend></depends></spec>')
    )
    res = cli("submit", str(spec))
    assert res.exit_code == 2 and res.stderr.count("error:") == 1 and needle in res.stderr, res
    assert not db_path.exists() or cli("job", "list", "--json").json()["jobs"] == []
