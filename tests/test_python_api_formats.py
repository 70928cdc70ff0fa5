"""`cuectl.api` takes every spec format `cuectl submit` takes, through the same front door
(cuectl.sched.intake): an OpenCue XML spec and an Open Job Description template, real
example files, give the jobs the CLI gives; a spec of several jobs is refused by the
one-job calls with a pointer to the all-jobs ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cuectl import api
from cuectl.errors import InvalidInput
from cuectl.sched.store import open_store

FIXTURES = Path(__file__).parent / "fixtures"
SIMPLE_XML = FIXTURES / "opencue" / "jobspec_simple.xml"
TWO_JOBS_XML = FIXTURES / "opencue" / "jobspec_depend_test.xml"
TEMPLATE = FIXTURES / "openjd" / "gpu-train.yaml"
# What these real specs ask that cuectl cannot honour is a UserWarning (the CLI's warning);
# the test about warnings catches them itself.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_USER", "ann")


def _cli_dry_run(path: Path, *args: str) -> list[dict]:
    """What `cuectl submit PATH --dry-run --json` would create."""
    out = subprocess.run(
        [sys.executable, "-m", "cuectl", "submit", str(path), *args, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "CUECTL_USER": "ann"},
    )
    return json.loads(out.stdout)["jobs"]


def _preview(job_specs: list) -> list[dict]:
    from cuectl.sched.preview import spec_json

    return [spec_json(job_spec) for job_spec in job_specs]


def test_build_spec_reads_an_opencue_xml_file_as_the_cli_does() -> None:
    job_spec = api.build_spec(str(SIMPLE_XML))
    assert api.build_spec(SIMPLE_XML) == job_spec  # a Path too
    assert job_spec.user == "ann"
    assert _preview([job_spec]) == _cli_dry_run(SIMPLE_XML)


def test_an_opencue_spec_of_several_jobs_is_all_or_one_call_refuses(tmp_path: Path) -> None:
    job_specs = api.build_specs(TWO_JOBS_XML)
    assert _preview(job_specs) == _cli_dry_run(TWO_JOBS_XML)
    with pytest.raises(InvalidInput, match="holds 2 jobs") as refused:
        api.build_spec(TWO_JOBS_XML)
    assert "build_specs" in (refused.value.hint or "")
    db = tmp_path / "q.db"
    with pytest.raises(InvalidInput, match="holds 2 jobs"):
        api.submit(TWO_JOBS_XML, db=db)
    assert not db.exists()  # refused before any store
    ids = api.submit_all(TWO_JOBS_XML, db=db)
    assert len(ids) == 2
    store = open_store(str(db), create=False)
    try:
        assert [store.get_job(i)["name"] for i in ids] == [j.name for j in job_specs]
        assert all(store.get_job(i)["user"] == "ann" for i in ids)
    finally:
        store.close()


def test_submit_takes_an_xml_file_and_an_openjd_template(tmp_path: Path) -> None:
    db = tmp_path / "q.db"
    xml_id = api.submit(SIMPLE_XML, db=db)
    template_id = api.submit(TEMPLATE, db=db, params={"Epochs": "2"})
    store = open_store(str(db), create=False)
    try:
        assert store.get_job(xml_id)["user"] == "ann"
        template_job = store.get_job(template_id)
    finally:
        store.close()
    expected = _cli_dry_run(TEMPLATE, "--param", "Epochs=2")[0]
    assert template_job["name"] == expected["name"]


def test_an_openjd_template_as_a_mapping_and_its_parameters() -> None:
    template = yaml.safe_load(TEMPLATE.read_text())
    from_file = api.build_spec(TEMPLATE, params=["Epochs=2"])
    from_mapping = api.build_spec(template, params={"Epochs": "2"})
    assert _preview([from_file]) == _preview([from_mapping])
    with pytest.raises(InvalidInput, match="--param: only for Open Job Description templates"):
        api.build_spec({"name": "plain", "layers": [{"name": "a", "command": "true"}]}, params=["A=1"])


def test_what_cannot_be_honoured_is_a_warning_or_with_strict_an_error() -> None:
    with pytest.warns(UserWarning):
        api.build_spec(SIMPLE_XML)
    with pytest.raises(InvalidInput, match="cannot be honoured"):
        api.build_spec(SIMPLE_XML, strict=True)


def test_a_bad_xml_file_is_one_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<spec><job name='x'>")
    with pytest.raises(InvalidInput, match=r"bad\.xml"):
        api.build_spec(bad)
    missing = tmp_path / "missing.xml"
    with pytest.raises(InvalidInput, match="cannot read job spec"):
        api.build_spec(missing)
