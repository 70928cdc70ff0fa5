"""`cuectl serve` is as strict as the CLI: a query parameter no route takes is a 400 that
names it (a misspelt filter must not answer as if unfiltered), a vendor no device can have
is refused with the vendors there are, `by` takes `gpu_model` and `gpu-model`, and an
action that changes nothing (killing a finished frame) is a 409 that says so, not a 200
that reads as done. A real server on a real SQLite store, with the default 1 s cache
turned off so each answer shows the store as it is."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from apiclient import (
    GIB,
    Api,
    Server,
    check_problem,
    create_token,
    cuectl,
    device,
    job_spec,
    layer_spec,
    new_store,
    register_host,
    store_at,
)

API = "/api/v1"


@pytest.fixture(scope="module")
def site(serve_dir: Path, serve_env: dict[str, str]):
    db = new_store(serve_dir / "store" / "cuectl.db")
    register_host(db, "strict-nv", [device(0, "GPU-strict-nv", "NVIDIA A100-SXM4-80GB", 80 * GIB)])
    register_host(db, "strict-amd", [device(0, "GPU-strict-amd", "AMD Instinct MI250X", 64 * GIB, vendor="AMD")])
    server = Server(db, env=serve_env, log=serve_dir / "strict.log", extra=("--cache", "0"))
    tokens = {
        who: create_token(db, who, role, env=serve_env)
        for who, role in (("sam", "user"), ("tess", "user"), ("root-ish", "admin"))
    }
    yield db, server, tokens, serve_env
    server.stop()


def _api(site, who: str) -> Api:
    _db, server, tokens, _env = site
    return server.api.with_token(tokens[who])


def _submit(api: Api, name: str, frames: str = "1-3") -> tuple[int, list[int]]:
    resp = api.post(f"{API}/jobs", job_spec(name, layer_spec("l", range=frames)))
    assert resp.status == 201, resp
    job_id = resp.json()["id"]
    ids = [f["id"] for f in api.ok("GET", f"{API}/jobs/{job_id}/frames")["frames"]]
    return job_id, ids


# -- unknown query parameters -----------------------------------------------------------------------------------
def test_an_unknown_query_parameter_is_a_400_naming_it_on_every_route(site):
    sam = _api(site, "sam")
    job_id, ids = _submit(sam, "strict-query")
    for path, takes in (
        (f"{API}/jobs?stat=PENDING", "state"),
        (f"{API}/hosts?vendr=NVIDIA", "vendor"),
        (f"{API}/jobs/{job_id}/frames?stat=DEAD", "state"),
        (f"{API}/jobs/{job_id}?stat=x", "none"),
        (f"{API}/frames/{ids[0]}?stat=x", "none"),
        (f"{API}/frames/{ids[0]}/log?tial=5", "tail"),
        (f"{API}/report?group=job", "by"),
        (f"{API}/leases?stat=x", "none"),
        (f"{API}/whoami?stat=x", "none"),
        ("/healthz?stat=x", "none"),
        ("/metrics?stat=x", "none"),
    ):
        problem = check_problem(sam.get(path), 400, detail="unknown query parameter")
        assert problem["field"] in path and takes in problem["hint"], (path, problem)
    # Several at once: all named, the declared one beside them is fine.
    problem = check_problem(sam.get(f"{API}/jobs?state=PENDING&zeta=1&alpha=2"), 400)
    assert problem["detail"] == "unknown query parameters 'alpha', 'zeta'" and problem["field"] == "alpha"
    # A change is refused before anything happens.
    check_problem(sam.post(f"{API}/jobs/{job_id}/kill?force=true"), 400, field="force")
    assert sam.ok("GET", f"{API}/jobs/{job_id}")["state"] == "PENDING"
    # The declared ones still work, in any combination.
    listed = sam.ok("GET", f"{API}/jobs?state=PENDING&name=strict-query&active=true&limit=5&offset=0&order=desc")
    assert [j["id"] for j in listed["jobs"]] == [job_id]


def test_the_monitors_page_and_files_take_a_links_query_as_any_web_page(site):
    """The strictness is the API's: a link with ?utm_source= or a proxy's cache-buster
    still opens the web monitor."""
    sam = _api(site, "sam")
    for path, kind in (("/?utm_source=mail", "text/html"), ("/static/app.js?v=2", "javascript")):
        resp = sam.get(path)
        assert resp.status == 200 and kind in resp.headers.get("content-type", ""), (path, resp)


# -- vendor and by ----------------------------------------------------------------------------------------------
def test_an_unknown_vendor_is_refused_with_the_vendors_there_are(site):
    sam = _api(site, "sam")
    problem = check_problem(sam.get(f"{API}/hosts?vendor=nvidai"), 422, field="vendor")
    assert "'nvidai'" in problem["detail"] and "NVIDIA, AMD, Apple, Intel" in problem["detail"]
    for spelling in ("NVIDIA", "nvidia", "0x10de"):  # any spelling the library knows
        hosts = sam.ok("GET", f"{API}/hosts?vendor={spelling}")["hosts"]
        assert [h["name"] for h in hosts] == ["strict-nv"], spelling
    assert [h["name"] for h in sam.ok("GET", f"{API}/hosts?vendor=amd")["hosts"]] == ["strict-amd"]
    assert sam.ok("GET", f"{API}/hosts?vendor=Intel")["hosts"] == []  # a real vendor with no device: empty


def test_the_cli_host_list_refuses_the_same_vendor(site):
    db, _server, _tokens, env = site
    res = cuectl(db, "host", "list", "--vendor", "nvidai", env=env, check=False)
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.startswith("error: --vendor: unknown vendor 'nvidai' (expected one of NVIDIA"), res.stderr
    assert "Traceback" not in res.stderr
    assert "strict-nv" in cuectl(db, "host", "list", "--vendor", "nvidia", env=env).stdout


def test_report_by_takes_gpu_model_and_gpu_dash_model(site):
    db, _server, _tokens, env = site
    sam = _api(site, "sam")
    dashed = sam.ok("GET", f"{API}/report?by=gpu-model")
    underscored = sam.ok("GET", f"{API}/report?by=gpu_model")
    assert dashed["by"] == underscored["by"] == "gpu-model", dashed
    assert dashed["rows"] == underscored["rows"]
    check_problem(sam.get(f"{API}/report?by=gpu_modle"), 422, field="by", detail="gpu_modle")
    res = cuectl(db, "admin", "report", "--by", "gpu_model", "--format", "json", env=env, check=False)
    assert res.returncode == 0, res.stderr


# -- actions that change nothing --------------------------------------------------------------------------------
def test_a_frame_action_that_changes_nothing_is_a_409_saying_so(site):
    sam = _api(site, "sam")
    _job_id, ids = _submit(sam, "strict-frames")
    killed = sam.ok("POST", f"{API}/frames/{ids[0]}/kill")["frames"][0]
    assert killed["state"] == "DEAD"
    problem = check_problem(sam.post(f"{API}/frames/{ids[0]}/kill"), 409, detail="is DEAD: nothing to kill")
    assert problem["state"] == "DEAD"
    assert sam.ok("POST", f"{API}/frames/{ids[1]}/eat")["frames"][0]["state"] == "EATEN"
    check_problem(sam.post(f"{API}/frames/{ids[1]}/eat"), 409, detail="EATEN already")
    check_problem(sam.post(f"{API}/frames/{ids[1]}/kill"), 409, detail="is EATEN: nothing to kill")
    check_problem(sam.post(f"{API}/frames/{ids[2]}/retry"), 409, detail="WAITING already")
    # Actions that do something still answer 200 with the frame.
    assert sam.ok("POST", f"{API}/frames/{ids[0]}/retry")["frames"][0]["state"] == "WAITING"
    assert sam.ok("POST", f"{API}/frames/{ids[1]}/retry")["frames"][0]["state"] == "WAITING"
    assert sam.ok("POST", f"{API}/frames/{ids[2]}/eat")["frames"][0]["state"] == "EATEN"
    # Someone else's finished frame: the owner check answers first (403, not "nothing to do").
    tess = _api(site, "tess")
    check_problem(tess.post(f"{API}/frames/{ids[2]}/kill"), 403)


def test_a_finished_frame_stays_as_it_was_after_the_409(site):
    db, _server, _tokens, _env = site
    sam = _api(site, "sam")
    _job_id, ids = _submit(sam, "strict-done", "1")
    with store_at(db) as store:  # eaten behind the server's back (the CLI)
        store.frame_action([ids[0]], "eat", now=time.time(), force=True)
    before = sam.ok("GET", f"{API}/frames/{ids[0]}")
    check_problem(sam.post(f"{API}/frames/{ids[0]}/kill"), 409, detail="nothing to kill")
    after = sam.ok("GET", f"{API}/frames/{ids[0]}")
    assert (after["state"], after["ended_at"], after["pending_action"]) == (
        before["state"],
        before["ended_at"],
        before["pending_action"],
    )


def test_a_job_action_that_changes_nothing_is_a_409_saying_so(site):
    sam = _api(site, "sam")
    job_id, _ids = _submit(sam, "strict-job")
    check_problem(sam.post(f"{API}/jobs/{job_id}/retry"), 409, detail="no DEAD or EATEN frame: nothing to retry")
    assert sam.ok("POST", f"{API}/jobs/{job_id}/kill")["state"] == "FINISHED"
    problem = check_problem(sam.post(f"{API}/jobs/{job_id}/kill"), 409, detail="is FINISHED: nothing to kill")
    assert problem["state"] == "FINISHED"
    assert sam.ok("POST", f"{API}/jobs/{job_id}/retry")["state"] == "PENDING"
    # pause and resume are idempotent: the job is in the state asked for either way.
    assert sam.ok("POST", f"{API}/jobs/{job_id}/pause")["paused"] is True
    assert sam.ok("POST", f"{API}/jobs/{job_id}/pause")["paused"] is True
    check_problem(_api(site, "tess").post(f"{API}/jobs/{job_id}/retry"), 403)
