"""`POST /api/v1/jobs` takes every format `cuectl submit` takes, told by the Content-Type
(cuectl.sched.intake.FORMATS): a job spec as JSON or YAML, an Open Job Description
template as YAML or JSON (its parameters as ?param=NAME=VALUE), and an OpenCue XML spec
(answered as a list of its jobs). Real example files, a real server on a real SQLite
store; a bad body of any format is one problem, never a 500."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from apiclient import Server, check_problem, create_token, new_store, store_at

API = "/api/v1"
FIXTURES = Path(__file__).parent.parent / "fixtures"
SIMPLE_XML = FIXTURES / "opencue" / "jobspec_simple.xml"
TWO_JOBS_XML = FIXTURES / "opencue" / "jobspec_depend_test.xml"
TEMPLATE = FIXTURES / "openjd" / "gpu-train.yaml"
XML, YAML = {"Content-Type": "application/xml"}, {"Content-Type": "application/yaml"}


@pytest.fixture(scope="module")
def site(serve_dir: Path, serve_env: dict[str, str]):
    db = new_store(serve_dir / "store" / "cuectl.db")
    tokens = {who: create_token(db, who, role, env=serve_env) for who, role in (("ann", "user"), ("vic", "viewer"))}
    server = Server(db, env=serve_env, log=serve_dir / "formats.log", extra=("--cache", "0"))
    yield db, server, tokens
    server.stop()


def _api(site, who: str = "ann"):
    _db, server, tokens = site
    return server.api.with_token(tokens[who])


def test_a_job_spec_as_yaml(site):
    body = "name: yaml-job\nlayers:\n  - name: a\n    command: [echo, '#IFRAME#']\n    range: 1-3\n"
    resp = _api(site).post(f"{API}/jobs", body, headers=YAML)
    assert resp.status == 201, resp
    job = resp.json()
    assert job["name"] == "yaml-job" and job["user"] == "ann" and job["frame_counts"]["WAITING"] == 3
    assert resp.headers["Location"] == f"{API}/jobs/{job['id']}"
    assert "warnings" not in job


def test_an_opencue_xml_spec_is_answered_with_its_jobs(site):
    api = _api(site)
    resp = api.post(f"{API}/jobs", SIMPLE_XML.read_bytes(), headers=XML)
    assert resp.status == 201, resp
    out = resp.json()
    assert [job["user"] for job in out["jobs"]] == ["ann"]  # the token's user, not the spec's <user>
    assert resp.headers["Location"] == f"{API}/jobs/{out['jobs'][0]['id']}"
    assert out["warnings"] and all(w.startswith("body: ") for w in out["warnings"])
    two = api.post(f"{API}/jobs", TWO_JOBS_XML.read_bytes(), headers={"Content-Type": "text/xml; charset=utf-8"})
    assert two.status == 201, two
    jobs = two.json()["jobs"]
    assert len(jobs) == 2
    db, _server, _tokens = site
    with store_at(db) as store:  # as `cuectl submit jobspec_depend_test.xml`: the second waits on the first
        assert [store.get_job(job["id"])["name"] for job in jobs] == [job["name"] for job in jobs]
    # strict: what cannot be honoured is refused, nothing submitted
    before = len(api.ok("GET", f"{API}/jobs")["jobs"])
    check_problem(api.post(f"{API}/jobs?strict=true", SIMPLE_XML.read_bytes(), headers=XML), 422)
    assert len(api.ok("GET", f"{API}/jobs")["jobs"]) == before


def test_an_openjd_template_as_yaml_and_as_json_with_its_parameters(site):
    api = _api(site)
    text = TEMPLATE.read_text()
    as_yaml = api.post(f"{API}/jobs?param=Epochs=2", text, headers=YAML)
    assert as_yaml.status == 201, as_yaml
    as_json = api.post(f"{API}/jobs?param=Epochs=2", yaml.safe_load(text))
    assert as_json.status == 201, as_json
    a, b = as_yaml.json(), as_json.json()
    assert a["name"] == b["name"] and [layer["name"] for layer in a["layers"]] == [
        layer["name"] for layer in b["layers"]
    ]
    assert a["warnings"] and b["warnings"]
    # a parameter the template does not have, and one given to a plain spec: 422
    check_problem(api.post(f"{API}/jobs?param=Nope=1", text, headers=YAML), 422)
    plain = {"name": "plain", "layers": [{"name": "a", "command": "true"}]}
    body = check_problem(api.post(f"{API}/jobs?param=A=1", plain), 422)
    assert "Open Job Description" in body["detail"]


def test_bad_bodies_of_each_format_are_one_problem(site):
    api = _api(site)
    body = check_problem(api.post(f"{API}/jobs", "<spec><job name='x'>", headers=XML), 422, field="body")
    assert "\n" not in body["detail"]
    check_problem(api.post(f"{API}/jobs", "<!DOCTYPE spec [<!ENTITY a 'b'>]><spec/>", headers=XML), 422, field="body")
    body = check_problem(api.post(f"{API}/jobs", "name: [unclosed\n", headers=YAML), 422, field="body")
    assert "invalid YAML" in body["detail"]
    check_problem(api.post(f"{API}/jobs", "name: x\nlayers: []\n", headers=YAML), 422)
    check_problem(api.post(f"{API}/jobs", b"name: \xff\n", headers=YAML), 400, field="body")  # not UTF-8
    body = check_problem(api.post(f"{API}/jobs", b"x", headers={"Content-Type": "text/plain"}), 415)
    assert "application/yaml" in body["detail"] and "application/xml" in body["detail"]
    # a viewer may not submit, whatever the format
    check_problem(_api(site, "vic").post(f"{API}/jobs", SIMPLE_XML.read_bytes(), headers=XML), 403)
    check_problem(_api(site, "vic").post(f"{API}/jobs", json.dumps({"name": "v"}), headers=YAML), 403)
