"""The Python submission API (cuectl.submit, cuectl.Job, cuectl.wait) on a real SQLite store:
the same validation as `cuectl submit` (errors name the field, nothing is written), the
submitting user, GPU constraints as stored, waiting by the rule of `cuectl job wait`, and
`import cuectl` staying light."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from storedriver import finish_all  # tests/storedriver.py (tests/ is on sys.path)

import cuectl
from cuectl.errors import InvalidInput, NotFound
from cuectl.sched.store import open_store

SWEEP = {
    "name": "lr-sweep",
    "priority": 7,
    "env": {"PROJECT": "demo"},
    "layers": [
        {
            "name": "train",
            "command": ["python", "train.py", "--seed", "#IFRAME#"],
            "range": "1-4",
            "gpus": 1,
            "gpu_vendor": "nvidia",
            "gpu_models": ["A100", "H100"],
            "gpu_memory_min": "24G",
            "memory": "8G",
            "retries": 1,
            "timeout": "2h",
            "tags": ["gpu"],
        },
        {"name": "report", "command": "python report.py", "depends": [{"layer": "train", "type": "layer"}]},
    ],
}


@pytest.fixture(autouse=True)
def _user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_USER", "ann")


def _job(db: Path, job_id: int) -> dict:
    store = open_store(str(db), create=False)
    try:
        job = store.get_job(job_id)
        job["frames"] = store.list_frames(job=job_id)[0]
        return job
    finally:
        store.close()


def _own(env: dict) -> dict:
    """A layer's env less what travelled from the submitter's (BASE export, as `cuectl submit`)."""
    from cuectl.sched.spec import BASE_EXPORT

    return {k: v for k, v in env.items() if k not in BASE_EXPORT}


def _check_sweep(job: dict) -> None:
    assert job["name"] == "lr-sweep" and job["user"] == "ann" and job["priority"] == 7
    train, report = job["layers"]
    assert train["name"] == "train" and train["command"] == ["python", "train.py", "--seed", "#IFRAME#"]
    assert (train["gpus"], train["gpu_vendor"], train["gpu_models"]) == (1, "NVIDIA", ["A100", "H100"])
    assert train["gpu_memory_min_bytes"] == 24 * 1024**3 and train["memory_bytes"] == 8 * 1024**3
    assert (train["retries"], train["timeout_s"], train["tags"]) == (1, 7200.0, ["gpu"])
    assert _own(train["env"]) == {"PROJECT": "demo"}
    assert report["command"] == "python report.py" and report["gpus"] == 0
    assert report["depends"] == [{"layer": "train", "type": "layer"}]
    assert [f["name"] for f in job["frames"]] == ["0001-train", "0002-train", "0003-train", "0004-train", "0001-report"]


def test_submit_a_mapping(db_path: Path) -> None:
    job_id = cuectl.submit(SWEEP, db=str(db_path))
    assert isinstance(job_id, int)
    _check_sweep(_job(db_path, job_id))


def test_submit_a_yaml_file_by_path_or_str(db_path: Path, tmp_path: Path) -> None:
    import yaml

    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump(SWEEP))
    first = cuectl.submit(spec, db=db_path)
    second = cuectl.submit(str(spec), db=str(db_path))
    assert second == first + 1
    _check_sweep(_job(db_path, first))
    _check_sweep(_job(db_path, second))


def test_job_builder(db_path: Path) -> None:
    job = (
        cuectl.Job("lr-sweep", priority=7, env={"PROJECT": "demo"})
        .layer(
            "train",
            ["python", "train.py", "--seed", "#IFRAME#"],
            range="1-4",
            gpus=1,
            gpu_vendor="nvidia",
            gpu_models=("A100", "H100"),
            gpu_memory_min="24G",
            memory="8G",
            retries=1,
            timeout="2h",
            tags=["gpu"],
        )
        .layer("report", "python report.py", depends="train")
    )
    spec = job.to_spec()
    assert spec["name"] == "lr-sweep" and spec["paused"] is False and len(spec["layers"]) == 2
    assert spec["layers"][1] == {
        "name": "report",
        "command": "python report.py",
        "range": "1",
        "chunk": 1,
        "gpus": 0,
        "depends": ["train"],
    }
    spec["layers"].clear()  # a copy: the builder is unchanged
    assert len(job.to_spec()["layers"]) == 2
    job_id = job.submit(db=str(db_path))
    _check_sweep(_job(db_path, job_id))
    assert cuectl.submit(job, db=str(db_path)) == job_id + 1  # a Job is also accepted by cuectl.submit


def test_builder_paused_chunks_and_frame_dependencies(db_path: Path) -> None:
    job_id = (
        cuectl.Job("chunked", paused=True)
        .layer("sim", ["sim", "#FRAME_START#", "#FRAME_END#"], range="1-10", chunk=5, cores=2)
        .layer("mesh", ["mesh"], range="1-10", chunk=5, env={"K": "v"}, depends=[{"layer": "sim", "type": "frame"}])
        .submit(db=str(db_path))
    )
    job = _job(db_path, job_id)
    assert job["paused"] is True
    sim, mesh = job["layers"]
    assert sim["chunk"] == 5 and sim["cores"] == 2.0
    assert _own(mesh["env"]) == {"K": "v"} and mesh["depends"] == [{"layer": "sim", "type": "frame"}]
    assert len(job["frames"]) == 4


def test_submitting_user_is_the_os_user_not_the_spec(db_path: Path) -> None:
    with pytest.raises(InvalidInput, match="unknown key 'user'"):
        cuectl.submit({**SWEEP, "user": "root"}, db=str(db_path))
    assert _job(db_path, cuectl.submit(SWEEP, db=str(db_path)))["user"] == "ann"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: cuectl.Job("j").layer("a", ["true"], gpus=-1), r"^layers\[0\]\.gpus: must be 0 or more"),
        (
            lambda: cuectl.Job("j").layer("a", ["true"]).layer("b", ["true"], gpu_vendor="NVIDA", gpus=1),
            r"^layers\[1\]\.gpu_vendor: unknown vendor 'NVIDA'",
        ),
        (lambda: cuectl.Job("j").layer("a", ["true"], gpu_models=["A100"]), r"^layers\[0\]\.gpu_models: only applies"),
        (lambda: cuectl.Job("j").layer("a", ["true"], depends="x"), r"^layers\[0\]\.depends\[0\]: unknown layer 'x'"),
        (lambda: cuectl.Job("j").layer("a", ["true"], range="5-1x"), r"^layers\[0\]\.range: "),
        (lambda: cuectl.Job("j").layer("a", ["true"], timeout="soon"), r"^layers\[0\]\.timeout: "),
        (lambda: cuectl.Job("42").layer("a", ["true"]), r"^name: a job name must not be only digits"),
        (lambda: cuectl.Job("j"), r"^layers: needs at least one layer"),
        (
            lambda: {"name": "j", "layers": [{"name": "a", "command": ["true"], "gpu": 1}]},
            r"^layers\[0\]: unknown key 'gpu' \(did you mean 'gpus'\?\)",
        ),
        (lambda: {"name": "j", "layers": [{"name": "a"}]}, r"^layers\[0\]\.command: required"),
        (lambda: 42, r"expected a mapping, a path to a job spec file or a cuectl.Job"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(db_path: Path, make, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        cuectl.submit(make(), db=str(db_path))
    assert not db_path.exists()  # not even an empty store


def test_bad_input_adds_nothing_to_an_existing_store(db_path: Path) -> None:
    job_id = cuectl.submit(SWEEP, db=str(db_path))
    with pytest.raises(InvalidInput, match=r"layers\[0\]\.chunk"):
        cuectl.Job("j").layer("a", ["true"], chunk=0).submit(db=str(db_path))
    store = open_store(str(db_path), create=False)
    try:
        assert [j["id"] for j in store.list_jobs()] == [job_id]
    finally:
        store.close()


def test_bad_yaml_file_errors_start_with_the_path(db_path: Path, tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text('name: j\nlayers:\n  - name: a\n    command: ["true"]\n    gpus: -2\n')
    with pytest.raises(InvalidInput, match=r"bad\.yaml: layers\[0\]\.gpus: must be 0 or more"):
        cuectl.submit(spec, db=str(db_path))
    with pytest.raises(InvalidInput, match="cannot read job spec"):
        cuectl.submit(tmp_path / "missing.yaml", db=str(db_path))
    assert not db_path.exists()


def test_default_store_is_the_clis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "env" / "cuectl.db"
    monkeypatch.setenv("CUECTL_DB", str(db))
    job_id = cuectl.Job("env-store").layer("a", ["true"]).submit()
    assert _job(db, job_id)["name"] == "env-store"


# -- wait ----------------------------------------------------------------------------------
def _small(db: Path, name: str) -> int:
    return cuectl.Job(name).layer("a", ["true"], range="1-3", retries=0).submit(db=str(db))


def test_wait_blocks_until_the_frames_finish(db_path: Path) -> None:
    a, b = _small(db_path, "wait-a"), _small(db_path, "wait-b")
    finisher = threading.Timer(0.5, finish_all, args=(db_path,))
    started = time.monotonic()
    finisher.start()
    try:
        jobs = cuectl.wait([a, "wait-b"], timeout=30, db=str(db_path), poll=0.05)
    finally:
        finisher.join()
    assert time.monotonic() - started >= 0.4
    assert [j["id"] for j in jobs] == [a, b]
    assert {j["outcome"] for j in jobs} == {"SUCCEEDED"}
    assert cuectl.wait(a, db=str(db_path))[0]["id"] == a  # a finished job: at once


def test_wait_raises_jobs_failed_for_dead_frames(db_path: Path) -> None:
    job_id = _small(db_path, "broken")
    finish_all(db_path, exit_code=3)
    with pytest.raises(cuectl.JobsFailed, match="broken FAILED"):
        cuectl.wait(job_id, db=str(db_path), poll=0.05)
    jobs = cuectl.wait(job_id, db=str(db_path), check=False)
    assert jobs[0]["outcome"] == "FAILED" and jobs[0]["frame_counts"]["DEAD"] == 3


def test_wait_timeout_and_unknown_job(db_path: Path) -> None:
    job_id = _small(db_path, "slow")
    with pytest.raises(cuectl.WaitTimeout, match="slow"):
        cuectl.wait(job_id, timeout="0.2s", db=str(db_path), poll=0.05)
    with pytest.raises(NotFound):
        cuectl.wait(job_id + 100, db=str(db_path))
    with pytest.raises(InvalidInput, match="^timeout: "):
        cuectl.wait(job_id, timeout="soon", db=str(db_path))


# -- import cost ---------------------------------------------------------------------------
def test_import_cuectl_stays_light() -> None:
    code = (
        "import sys, cuectl\n"
        "heavy = ('cuectl.sched', 'cuectl.api', 'yaml', 'typing', 'sqlite3')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
        "cuectl.Job, cuectl.submit, cuectl.wait\n"  # the API itself loads nothing heavy either
        "print(sorted(m for m in sys.modules if m.startswith(('cuectl.sched', 'yaml', 'sqlite3'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "[]"]
    timed = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import cuectl"], capture_output=True, text=True, check=True
    ).stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in timed.splitlines() if "|" in line]
    assert "cuectl" in imported
    assert not [m for m in imported if m.startswith(("cuectl.", "yaml", "typing"))]


def test_a_job_built_in_python_carries_caps_limits_and_back_off(tmp_path):
    import cuectl
    from cuectl.sched.store import open_store

    db = tmp_path / "caps.db"
    store = open_store(str(db))
    store.set_limit("nuke", 2)
    store.close()
    job = cuectl.Job("comp", project="show-a", max_running=4, max_gpus=2)
    job.layer("nk", ["true"], range="1-3", limits="nuke", max_running=1, retry_delay="10s")
    job_id = job.submit(db=str(db))
    store = open_store(str(db))
    try:
        got = store.get_job(job_id)
    finally:
        store.close()
    assert (got["project"], got["max_running"], got["max_gpus"]) == ("show-a", 4, 2)
    assert (got["layers"][0]["limits"], got["layers"][0]["max_running"], got["layers"][0]["retry_delay_s"]) == (
        ["nuke"],
        1,
        10.0,
    )
    bad = cuectl.Job("x", max_running=0)  # validated as a YAML spec is: the error names the field
    bad.layer("a", ["true"])
    with pytest.raises(InvalidInput, match="^max_running: must be 1 or more"):
        bad.submit(db=str(db))


def test_python_submit_captures_the_directory_and_base_environment_as_the_cli(
    db_path: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VIRTUAL_ENV", "/opt/venvs/ml")
    monkeypatch.setenv("HF_TOKEN", "secret")
    job_id = cuectl.Job("where").layer("a", ["true"]).submit(db=str(db_path))
    layer = _job(db_path, job_id)["layers"][0]
    assert layer["cwd"] == str(tmp_path)
    assert layer["env"]["VIRTUAL_ENV"] == "/opt/venvs/ml" and "HF_TOKEN" not in layer["env"]
