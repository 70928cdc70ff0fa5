"""`cuectl serve` over HTTP, against a real server process on a real SQLite store: every
endpoint of /api/v1 with its filters, paging and actions, ETags, who may do what
(tokens, roles, owners), bad input as RFC 9457 problems, and a log endpoint that never
reads outside the store's log directory.

One server for the module (started with ``--cache 0``: the response cache is tested on
its own in test_api_transport.py); each test submits jobs under its own names."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apiclient import (
    GIB,
    Api,
    Server,
    Token,
    check_problem,
    claim,
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
A100 = "NVIDIA A100-SXM4-80GB"


@dataclass
class Site:
    db: Path
    server: Server
    env: dict[str, str]
    tokens: dict[str, Token]
    secret: str

    def api(self, who: str | None = None) -> Api:
        return self.server.api.with_token(self.tokens[who] if who else None)


@pytest.fixture(scope="module")
def site(serve_dir: Path, serve_env: dict[str, str]):
    db = new_store(serve_dir / "store" / "cuectl.db")
    # One host, so pending reasons are about fit, not "no host registered".
    register_host(db, "main-h", [device(0, "GPU-main-0", A100, 80 * GIB)])
    tokens = {
        "boss": create_token(db, "boss", "admin", env=serve_env),
        "alice": create_token(db, "alice", "user", env=serve_env),
        "bob": create_token(db, "bob", "user", env=serve_env),
        "val": create_token(db, "val", "viewer", env=serve_env),
    }
    secret = f"TOP-SECRET-{os.urandom(6).hex()}"
    server = Server(db, env=serve_env, log=serve_dir / "server.log", extra=("--cache", "0"))
    yield Site(db, server, serve_env, tokens, secret)
    server.stop()


def submit(api: Api, spec: dict[str, Any]) -> dict[str, Any]:
    resp = api.post(f"{API}/jobs", spec)
    assert resp.status == 201, resp
    return resp.json()


def job(api: Api, ref: int | str) -> dict[str, Any]:
    return api.ok("GET", f"{API}/jobs/{ref}")


def frames(api: Api, job_id: int, query: str = "") -> dict[str, Any]:
    return api.ok("GET", f"{API}/jobs/{job_id}/frames{query}")


def db_rows(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(sql, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


# -- health, OpenAPI, who am I ---------------------------------------------------------------------------
def test_healthz_and_the_openapi_document_list_every_route(site):
    from cuectl import __version__

    anonymous = site.api()
    assert anonymous.ok("GET", "/healthz") == {"status": "ok", "version": __version__}
    doc = anonymous.ok("GET", f"{API}/openapi.json")
    assert doc["info"]["title"] == "cuectl" and doc["info"]["version"] == __version__

    from fastapi.routing import APIRoute

    from cuectl.serve.app import Settings, create_app

    app = create_app(Settings(db_url=str(site.db)))
    routes = [r for r in app.routes if isinstance(r, APIRoute) and r.include_in_schema]
    defined = {r.path for r in routes}
    assert {
        "/healthz",
        "/readyz",
        "/metrics",
        f"{API}/whoami",
        f"{API}/hosts",
        f"{API}/hosts/{{name}}/gpus",
        f"{API}/jobs",
        f"{API}/jobs/{{job}}",
        f"{API}/jobs/{{job}}/frames",
        f"{API}/jobs/{{job}}/priority",
        f"{API}/jobs/{{job}}/{{action}}",
        f"{API}/frames/{{frame_id}}",
        f"{API}/frames/{{frame_id}}/log",
        f"{API}/frames/{{frame_id}}/{{action}}",
        f"{API}/leases",
        f"{API}/report",
    } <= defined
    assert set(doc["paths"]) == defined
    for route in routes:
        for method in route.methods:
            assert method.lower() in doc["paths"][route.path], (route.path, method)
    assert "requestBody" in doc["paths"][f"{API}/jobs"]["post"]


def test_whoami_names_the_tokens_user_and_role(site):
    for who, role, read_only in (("boss", "admin", False), ("alice", "user", False), ("val", "viewer", True)):
        assert site.api(who).ok("GET", f"{API}/whoami") == {
            "user": who,
            "role": role,
            "via": "token",
            "token_id": site.tokens[who].id,
            "read_only": read_only,
        }


# -- jobs ----------------------------------------------------------------------------------------------------
GPU_SPEC = job_spec(
    "gpu-shot",
    layer_spec(
        "render",
        ["render", "-f", "#IFRAME#"],
        range="1-3",
        gpus=2,
        gpu_vendor="nvidia",
        gpu_models=["A100", "H100"],
        gpu_memory_min="40G",
    ),
    priority=7,
)


def test_submit_a_gpu_job_as_the_tokens_user(site):
    alice = site.api("alice")
    resp = alice.post(f"{API}/jobs", GPU_SPEC)
    assert resp.status == 201, resp
    out = resp.json()
    assert resp.headers["Location"] == f"{API}/jobs/{out['id']}"
    assert out["user"] == "alice" and out["name"] == "gpu-shot" and out["priority"] == 7
    assert out["state"] == "PENDING" and out["paused"] is False and out["frame_counts"] == {"WAITING": 3}
    assert "receipt" not in out
    (layer,) = out["layers"]
    assert (
        layer["name"],
        layer["command"],
        layer["range"],
        layer["gpus"],
        layer["gpu_vendor"],
        layer["gpu_models"],
        layer["gpu_memory_min_bytes"],
    ) == ("render", ["render", "-f", "#IFRAME#"], "1-3", 2, "NVIDIA", ["A100", "H100"], 40 * GIB)
    # main-h has one A100: a frame asking for two can never run there, and the reason says so.
    assert "layer render" in out["pending_reason"], out["pending_reason"]
    assert job(alice, out["id"]) == job(site.api("val"), resp.headers["Location"].rsplit("/", 1)[1])
    shown = site.api("val").ok("GET", resp.headers["Location"])
    assert shown["id"] == out["id"] and shown["layers"][0]["gpu_memory_min_bytes"] == 40 * GIB
    # The store agrees: the row's user is the token's.
    assert db_rows(site.db, 'SELECT "user", priority FROM jobs WHERE id = ?', (out["id"],)) == [("alice", 7)]


@pytest.mark.parametrize(
    "spec, field",
    [
        ({**GPU_SPEC, "user": "root"}, "user"),  # the spec has no user: the token says who
        ({**GPU_SPEC, "name": "x", "owner": "root"}, "owner"),
        (job_spec("x", layer_spec("l", gpus=1, gpu_mem="8G")), "layers[0].gpu_mem"),
        (job_spec("x", layer_spec("l", gpus=-1)), "layers[0].gpus"),
        (job_spec("x", layer_spec("l", gpus=1, gpu_vendor="Matrox")), "layers[0].gpu_vendor"),
        (job_spec("x", layer_spec("l", gpus=1, gpu_memory_min="12Q")), "layers[0].gpu_memory_min"),
        (job_spec("x", layer_spec("l", gpus=1, gpu_models=[""])), "layers[0].gpu_models[0]"),
        (job_spec("x", layer_spec("ok"), layer_spec("l", range="1-x")), "layers[1].range"),
        ({"layers": [layer_spec()]}, "name"),
        ({"name": "x", "layers": []}, "layers"),
        ({"name": "x", "priority": "high", "layers": [layer_spec()]}, "priority"),
    ],
)
def test_a_bad_spec_is_a_422_naming_the_field_and_submits_nothing(site, spec, field):
    alice = site.api("alice")
    before = alice.ok("GET", f"{API}/jobs?limit=1")["total"]
    body = check_problem(alice.post(f"{API}/jobs", spec), 422, field=field)
    assert field.split(".")[-1].split("[")[0] in body["detail"], body
    assert alice.ok("GET", f"{API}/jobs?limit=1")["total"] == before


def test_list_jobs_filters_globs_and_pages(site):
    alice, bob, val = site.api("alice"), site.api("bob"), site.api("val")
    a1 = submit(alice, job_spec("lj-render-a1"))["id"]
    a2 = submit(alice, job_spec("lj-render-a2", layer_spec("l", range="1-2")))["id"]
    a3 = submit(alice, job_spec("lj-comp-a3"))["id"]
    b1 = submit(bob, job_spec("lj-render-b1"))["id"]
    assert alice.ok("POST", f"{API}/jobs/{a2}/kill")["state"] == "FINISHED"

    def names(query: str) -> list[str]:
        return [j["name"] for j in val.ok("GET", f"{API}/jobs?{query}")["jobs"]]

    assert names("user=alice&name=lj-render-*") == ["lj-render-a1", "lj-render-a2"]
    assert names("name=lj-render-*") == ["lj-render-a1", "lj-render-a2", "lj-render-b1"]
    assert names("name=lj-?omp-*") == ["lj-comp-a3"]
    assert names("name=lj-comp-a3") == ["lj-comp-a3"]
    assert names("user=bob&name=lj-*") == ["lj-render-b1"]
    assert names("name=lj-*&state=FINISHED") == ["lj-render-a2"]
    assert names("name=lj-*&state=pending") == ["lj-render-a1", "lj-comp-a3", "lj-render-b1"]
    assert names("name=lj-*&active=true") == ["lj-render-a1", "lj-comp-a3", "lj-render-b1"]
    # RUNNING (issue 41 §4): the unfinished jobs with a running frame, as `job list --state running`.
    assert names("name=lj-*&state=running") == []
    layer = val.ok("GET", f"{API}/jobs/{a3}")["layers"][0]
    claim(site.db, layer["id"], host="lj-host")
    assert names("name=lj-*&state=RUNNING") == ["lj-comp-a3"]
    assert val.ok("GET", f"{API}/jobs/{a3}")["display_state"] == "RUNNING"
    assert "lj-comp-a3" in names("name=lj-*&state=pending")  # PENDING stays OpenCue's: running or not
    assert names("name=no-such-job") == []
    listed = {j["id"]: j for j in val.ok("GET", f"{API}/jobs?name=lj-*")["jobs"]}
    assert listed[a2]["frame_counts"] == {"EATEN": 2} and listed[a1]["frame_counts"] == {"WAITING": 1}
    assert listed[b1]["user"] == "bob" and "layers" not in listed[a1]
    # Pages: oldest first, `total` counts the whole match on every page.
    pages = [val.ok("GET", f"{API}/jobs?name=lj-*&limit=3&offset={o}") for o in (0, 3, 6)]
    assert [p["total"] for p in pages] == [4, 4, 4]
    assert [[j["id"] for j in p["jobs"]] for p in pages] == [[a1, a2, a3], [b1], []]
    assert (pages[0]["limit"], pages[0]["offset"], pages[1]["offset"]) == (3, 0, 3)
    # The same on the store's own paging (no glob).
    everyone = val.ok("GET", f"{API}/jobs?limit=10000")
    page = val.ok("GET", f"{API}/jobs?limit=2&offset=1")
    assert page["total"] == everyone["total"] == len(everyone["jobs"])
    assert [j["id"] for j in page["jobs"]] == [j["id"] for j in everyone["jobs"][1:3]]
    newest = val.ok("GET", f"{API}/jobs?limit=2&order=desc")
    assert newest["order"] == "desc" and [j["id"] for j in newest["jobs"]] == [
        j["id"] for j in everyone["jobs"][::-1][:2]
    ]
    assert [j["id"] for j in val.ok("GET", f"{API}/jobs?name=lj-*&order=desc")["jobs"]] == [b1, a3, a2, a1]
    bobs = val.ok("GET", f"{API}/jobs?user=bob&limit=1")
    assert bobs["total"] == len([j for j in everyone["jobs"] if j["user"] == "bob"]) and len(bobs["jobs"]) == 1


def test_show_a_job_with_layers_frame_counts_and_pending_reason(site):
    alice = site.api("alice")
    out = submit(
        alice,
        job_spec(
            "show-me",
            layer_spec("sim", range="1-4"),
            layer_spec("comp", range="1-4", depends=[{"layer": "sim", "type": "frame"}]),
        ),
    )
    shown = job(site.api("val"), out["id"])
    assert shown["frame_counts"] == {"WAITING": 4, "DEPEND": 4}
    assert [(layer["name"], layer["range"], layer["gpus"]) for layer in shown["layers"]] == [
        ("sim", "1-4", 0),
        ("comp", "1-4", 0),
    ]
    assert shown["layers"][1]["depends"] and "receipt" not in shown
    assert job(alice, "show-me")["id"] == out["id"]  # by its (unique) name too
    assert alice.ok("POST", f"{API}/jobs/{out['id']}/pause")["paused"] is True
    assert job(alice, out["id"])["pending_reason"] == "job is paused (`cuectl job resume`)"
    check_problem(alice.get(f"{API}/jobs/987654"), 404, detail="987654")
    check_problem(alice.get(f"{API}/jobs/no-such-name"), 404, detail="no-such-name")


def test_secret_looking_env_values_never_leave_the_server(site):
    """As in `cuectl job show`: names stay, values of credentials are masked, in every answer."""
    alice = site.api("alice")
    spec = job_spec(
        "secrets", layer_spec("l", env={"API_TOKEN": "s3cr3t-one", "MODE": "fast"}), env={"DB_PASSWORD": "s3cr3t-two"}
    )
    out = submit(alice, spec)
    answers = [out, job(alice, out["id"])]
    for action in ("pause", "resume", "kill", "retry"):
        answers.append(alice.ok("POST", f"{API}/jobs/{out['id']}/{action}"))
    answers.append(alice.ok("POST", f"{API}/jobs/{out['id']}/priority", {"priority": 1}))
    for answer in answers:
        assert answer["layers"][0]["env"] == {"API_TOKEN": "***", "DB_PASSWORD": "***", "MODE": "fast"}, answer
        assert "s3cr3t" not in json.dumps(answer)
    assert "s3cr3t" not in alice.get(f"{API}/jobs?name=secrets").text


def test_credential_values_are_masked_whatever_their_name(site):
    """Issue 35 item 14: masking goes by value too: a URL's password (only the password: the
    value still says where it points), a private key, a token of a known shape; and CREDS is
    a credential's name. Viewers, owners and the monitor (which reads this API) see the same."""
    alice = site.api("alice")
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
    env = {
        "DATABASE_URL": "postgresql://u:pw-s3cr3t@db.example:5432/farm",
        "CREDS": "s3cr3t-creds",
        "SSH_ID": key,
        "GH": "ghp_" + "s3cr3t" * 6,
        "MODE": "fast",
        "PAGE": "https://example.com/a?page=2",
    }
    out = submit(alice, job_spec("value-secrets", layer_spec("l", env=env)))
    for who in ("val", "alice", "boss"):
        shown = job(site.api(who), out["id"])["layers"][0]["env"]
        assert shown == {
            "DATABASE_URL": "postgresql://u:***@db.example:5432/farm",
            "CREDS": "***",
            "SSH_ID": "***",
            "GH": "***",
            "MODE": "fast",
            "PAGE": "https://example.com/a?page=2",
        }, (who, shown)
    assert out["layers"][0]["env"]["DATABASE_URL"] == "postgresql://u:***@db.example:5432/farm"
    assert "s3cr3t" not in json.dumps(out) and "PRIVATE KEY" not in json.dumps(out)
    assert "s3cr3t" not in site.api("val").get(f"{API}/jobs?name=value-secrets").text


def test_job_actions_and_priority_as_the_owner(site):
    alice = site.api("alice")
    job_id = submit(alice, job_spec("actions", layer_spec("l", range="1-3")))["id"]
    base = f"{API}/jobs/{job_id}"
    assert alice.ok("POST", f"{base}/pause")["paused"] is True
    assert job(alice, job_id)["paused"] is True
    assert alice.ok("POST", f"{base}/resume")["paused"] is False
    assert alice.ok("POST", f"{base}/priority", {"priority": 42})["priority"] == 42
    assert job(alice, job_id)["priority"] == 42
    assert alice.ok("POST", f"{base}/priority", {"priority": -5})["priority"] == -5
    killed = alice.ok("POST", f"{base}/kill")
    assert killed["state"] == "FINISHED" and killed["frame_counts"] == {"EATEN": 3}
    retried = alice.ok("POST", f"{base}/retry")
    assert retried["state"] == "PENDING" and retried["frame_counts"] == {"WAITING": 3}
    assert job(site.api("val"), job_id)["frame_counts"] == {"WAITING": 3}


def test_frame_actions_eat_retry_kill(site):
    alice = site.api("alice")
    job_id = submit(alice, job_spec("frame-acts", layer_spec("l", range="1-3")))["id"]
    ids = [f["id"] for f in frames(alice, job_id)["frames"]]
    out = alice.ok("POST", f"{API}/frames/{ids[0]}/eat")
    assert [(f["id"], f["state"]) for f in out["frames"]] == [(ids[0], "EATEN")]
    assert alice.ok("POST", f"{API}/frames/{ids[0]}/retry")["frames"][0]["state"] == "WAITING"
    killed = alice.ok("POST", f"{API}/frames/{ids[1]}/kill")["frames"][0]
    assert killed["id"] == ids[1] and killed["state"] == "DEAD"
    states = {f["id"]: f["state"] for f in frames(alice, job_id)["frames"]}
    assert states == {ids[0]: "WAITING", ids[1]: killed["state"], ids[2]: "WAITING"}
    check_problem(alice.post(f"{API}/frames/98765432/eat"), 404, detail="98765432")


# -- frames -----------------------------------------------------------------------------------------------------
def test_frames_filter_and_page_with_after(site):
    alice, val = site.api("alice"), site.api("val")
    job_id = submit(alice, job_spec("paged", layer_spec("a", range="1-25"), layer_spec("b", range="1-5")))["id"]
    ids, after, pages = [], None, []
    while True:
        page = frames(val, job_id, "?layer=a&limit=10" + (f"&after={after}" if after is not None else ""))
        pages.append(page)
        assert page["total"] == 25 and page["limit"] == 10
        ids += [f["id"] for f in page["frames"]]
        after = page["next_after"]
        if after is None:
            break
        assert after == page["frames"][-1]["id"]
    assert [len(p["frames"]) for p in pages] == [10, 10, 5]
    assert ids == sorted(ids) and len(set(ids)) == 25
    everything = frames(val, job_id)
    assert everything["total"] == 30 and everything["next_after"] is None
    by_layer = [(f["layer"], f["number"]) for f in everything["frames"]]
    assert by_layer == [("a", n) for n in range(1, 26)] + [("b", n) for n in range(1, 6)]
    assert [f["id"] for f in everything["frames"] if f["layer"] == "a"] == ids
    assert all(f["attempt_history"] == [] for f in everything["frames"])
    assert "attempt_history" not in frames(val, job_id, "?attempts=false&limit=1")["frames"][0]
    for frame_id in ids[3:5]:
        alice.ok("POST", f"{API}/frames/{frame_id}/eat")
    eaten = frames(val, job_id, "?state=EATEN")
    assert [f["id"] for f in eaten["frames"]] == ids[3:5] and eaten["total"] == 2
    assert frames(val, job_id, "?state=waiting&layer=a")["total"] == 23
    assert frames(val, job_id, "?layer=b&state=WAITING")["total"] == 5
    assert frames(val, job_id, "?layer=nope")["total"] == 0
    check_problem(val.get(f"{API}/jobs/8765432/frames"), 404)


def test_show_a_frame_without_its_host_path(site):
    alice = site.api("alice")
    job_id = submit(alice, job_spec("one-frame", layer_spec("solo", range="7")))["id"]
    (listed,) = frames(alice, job_id)["frames"]
    shown = alice.ok("GET", f"{API}/frames/{listed['id']}")
    assert (shown["id"], shown["job_id"], shown["layer"], shown["number"], shown["name"], shown["state"]) == (
        listed["id"],
        job_id,
        "solo",
        7,
        "0007-solo",
        "WAITING",
    )
    assert shown["attempt_history"] == [] and "log_path" not in shown
    check_problem(alice.get(f"{API}/frames/99999999"), 404, detail="99999999")


def test_a_running_frame_shows_live_gpu_use_and_holds_its_device(site):
    from cuectl.sched.store import LiveUsage

    alice = site.api("alice")
    register_host(
        site.db,
        "live-h",
        [
            device(0, "GPU-live-0", "Tesla V100-SXM2-16GB", 16 * GIB),
            device(1, "GPU-live-1", "Tesla V100-SXM2-16GB", 16 * GIB),
        ],
    )
    out = submit(alice, job_spec("live", layer_spec("l", range="1-2", gpus=1, gpu_models=["V100"])))
    claimed = claim(site.db, out["layers"][0]["id"], host="live-h", gpu_uuids=("GPU-live-1",))
    with store_at(site.db) as store:
        now = time.time()
        assert store.record_live_usage(
            "live-h", [LiveUsage(claimed.frame_id, claimed.attempt, now, 61.5, 3 * GIB)], now=now
        ) == [claimed.frame_id]
    (running,) = frames(alice, out["id"], "?state=RUNNING")["frames"]
    assert (running["id"], running["host"], running["gpu_uuids"], running["attempts"]) == (
        claimed.frame_id,
        "live-h",
        ["GPU-live-1"],
        1,
    )
    assert running["gpu_util_pct"] == 61.5 and running["gpu_memory_used_bytes"] == 3 * GIB
    assert running["gpu_sampled_at"].endswith("Z")
    (waiting,) = frames(alice, out["id"], "?state=WAITING")["frames"]
    assert waiting["gpu_util_pct"] is None
    held = [lease for lease in alice.ok("GET", f"{API}/leases")["leases"] if lease["host"] == "live-h"]
    assert held == [
        {
            "host": "live-h",
            "uuid": "GPU-live-1",
            "index": 1,
            "model": "Tesla V100-SXM2-16GB",
            "kind": "frame",
            "frame_id": claimed.frame_id,
            "label": f"live/{running['name']}",
            "pid": None,
            "user": None,
        }
    ]
    gpus = alice.ok("GET", f"{API}/hosts/live-h/gpus")
    assert [(g["uuid"], (g["holder"] or {}).get("frame_id")) for g in gpus["gpus"]] == [
        ("GPU-live-0", None),
        ("GPU-live-1", claimed.frame_id),
    ]
    # Killing a RUNNING frame flags it for its worker (which kills the process group).
    assert alice.ok("POST", f"{API}/frames/{claimed.frame_id}/kill")["frames"][0]["pending_action"] == "kill"


def test_a_frames_log_whole_and_tail(site):
    alice = site.api("alice")
    out = submit(alice, job_spec("logs", layer_spec("l", range="1")))
    claimed = claim(site.db, out["layers"][0]["id"], host="main-h")
    frame_id = claimed.frame_id
    check_problem(alice.get(f"{API}/frames/{frame_id}/log"), 404)  # the worker has not written it (here)
    log = Path(claimed.log_path)
    assert log.is_relative_to(site.db.parent / f"{site.db.name}-logs")
    log.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"line {i} é" for i in range(50)]
    log.write_text("\n".join(lines) + "\n")
    whole = alice.get(f"{API}/frames/{frame_id}/log")
    assert whole.status == 200 and whole.content_type == "text/plain" and whole.text.splitlines() == lines
    assert alice.get(f"{API}/frames/{frame_id}/log?tail=3").text == "line 47 é\nline 48 é\nline 49 é\n"
    assert alice.get(f"{API}/frames/{frame_id}/log?tail=500").text.splitlines() == lines
    assert alice.get(f"{API}/frames/{frame_id}/log?tail=0").body == b""
    check_problem(alice.get(f"{API}/frames/{frame_id}/log?tail=many"), 422, field="tail")
    check_problem(alice.get(f"{API}/frames/{frame_id}/log?tail=-1"), 422, field="tail")
    waiting = submit(alice, job_spec("no-log-yet"))
    (frame,) = frames(alice, waiting["id"])["frames"]
    check_problem(alice.get(f"{API}/frames/{frame['id']}/log"), 404, detail="no log yet")
    check_problem(alice.get(f"{API}/frames/99999998/log"), 404)


def test_cli_and_api_give_the_same_bytes_of_a_log_whose_last_line_is_being_written(site):
    """One follower (run/framelog.py) for `cuectl frame log` and GET .../log: on a running
    attempt whose last line is still being written, the tail is the same bytes either way,
    and following it goes on inside that line rather than starting a new one."""
    import subprocess
    import threading

    from apiclient import CUECTL

    alice = site.api("alice")
    out = submit(alice, job_spec("partial", layer_spec("l", range="1")))
    claimed = claim(site.db, out["layers"][0]["id"], host="main-h")
    frame_id = claimed.frame_id
    log = Path(claimed.log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"one\ntwo\nthree-partial")
    for lines in ("1", "2", "5"):
        cli = cuectl(site.db, "frame", "log", str(frame_id), "--tail", lines, env=site.env)
        api = alice.get(f"{API}/frames/{frame_id}/log?tail={lines}")
        assert api.status == 200 and api.body == cli.stdout.encode(), (lines, api.body, cli.stdout)
    assert alice.get(f"{API}/frames/{frame_id}/log?tail=1").body == b"three-partial"
    # Follow: both start with the tail, the line goes on, then the frame ends.
    follower = subprocess.Popen(
        [*CUECTL, "--db", str(site.db), "frame", "log", str(frame_id), "-f", "--tail", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(site.env),
    )
    streamed: list[bytes] = []
    reader = threading.Thread(
        target=lambda: streamed.extend(c for _, c in alice.stream(f"{API}/frames/{frame_id}/log?follow=true&tail=1"))
    )
    reader.start()
    # Both have given the tail before the line goes on (a loaded machine starts the CLI late).
    cli_out = b""
    deadline = time.monotonic() + 30
    while not cli_out.endswith(b"three-partial") and time.monotonic() < deadline:
        chunk = os.read(follower.stdout.fileno(), 65536)
        if not chunk:
            break
        cli_out += chunk
    while b"".join(streamed) != b"three-partial" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cli_out == b"three-partial" and b"".join(streamed) == b"three-partial", (cli_out, streamed)
    with log.open("ab") as f:
        f.write(b"-rest\nfour\n")
    time.sleep(1.5)
    db_rows(site.db, "UPDATE frames SET state = 'SUCCEEDED' WHERE id = ?", (frame_id,))
    rest, cli_err = follower.communicate(timeout=30)
    cli_out += rest
    reader.join(timeout=30)
    assert not reader.is_alive() and follower.returncode == 0, cli_err
    assert cli_out == b"three-partial-rest\nfour\n", cli_err
    assert b"".join(streamed) == cli_out


def test_the_log_endpoint_never_reads_outside_the_log_directory(site, serve_dir):
    """Frame rows are written by clients: a log path that leads elsewhere, by a layer
    name, the column itself, or a link planted in the log directory, is a 404."""
    alice = site.api("alice")
    logs = site.db.parent / f"{site.db.name}-logs"
    secret_dir = serve_dir / "private"
    secret_dir.mkdir(exist_ok=True)
    secret_file = secret_dir / "secret.txt"
    secret_file.write_text(site.secret + "\n")

    def claimed_frame(name: str, layer: str = "l") -> Any:
        out = submit(alice, job_spec(name, layer_spec(layer)))
        return claim(site.db, out["layers"][0]["id"], host="main-h")

    def refused(frame_id: int, *, detail: str = "") -> None:
        for query in ("", "?tail=5", "?follow=true"):
            resp = alice.get(f"{API}/frames/{frame_id}/log{query}")
            check_problem(resp, 404, detail=detail)
            assert site.secret not in resp.text

    # 1. a layer renamed in the file to climb out: <logs>/<job>/0001-../../../../etc.1.log
    out = submit(alice, job_spec("climb", layer_spec("l")))
    db_rows(site.db, "UPDATE layers SET name = '../../../../etc' WHERE id = ?", (out["layers"][0]["id"],))
    climbed = claim(site.db, out["layers"][0]["id"], host="main-h")
    target = Path(os.path.normpath(climbed.log_path))
    assert not target.is_relative_to(logs), target
    target.write_text(site.secret + "\n")
    refused(climbed.frame_id, detail="not in the store's log directory")
    # 2. the column itself rewritten to a file elsewhere, absolute or relative to the logs
    moved = claimed_frame("moved")
    for path in (str(secret_file), f"{logs}/../../private/secret.txt", "/etc/passwd"):
        db_rows(site.db, "UPDATE frames SET log_path = ? WHERE id = ?", (path, moved.frame_id))
        refused(moved.frame_id, detail="not in the store's log directory")
    # 3. a link where the log file should be
    linked = claimed_frame("linked")
    Path(linked.log_path).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(secret_file, linked.log_path)
    refused(linked.frame_id)
    # 4. the job's log directory replaced by a link to another directory
    dir_linked = claimed_frame("dirlink")
    job_dir = Path(dir_linked.log_path).parent
    assert job_dir.parent == logs
    (secret_dir / Path(dir_linked.log_path).name).write_text(site.secret + "\n")
    os.symlink(secret_dir, job_dir)
    refused(dir_linked.frame_id)
    # 5. not a regular file (a FIFO would block a reader forever)
    fifo = claimed_frame("fifo")
    Path(fifo.log_path).parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo.log_path)
    refused(fifo.frame_id, detail="not a regular file")
    # ...while a real log in the same place reads fine.
    fine = claimed_frame("fine")
    Path(fine.log_path).parent.mkdir(parents=True, exist_ok=True)
    Path(fine.log_path).write_text("hello\n")
    assert alice.get(f"{API}/frames/{fine.frame_id}/log").text == "hello\n"


# -- caching ----------------------------------------------------------------------------------------------------------
def test_etags_give_304_until_a_change_through_the_api(site):
    alice = site.api("alice")
    submit(alice, job_spec("etag-1"))
    first = alice.get(f"{API}/jobs?name=etag-*")
    etag = first.headers["ETag"]
    assert first.status == 200 and etag.startswith('"') and first.headers["Cache-Control"] == "no-cache"
    again = alice.get(f"{API}/jobs?name=etag-*", headers={"If-None-Match": etag})
    assert again.status == 304 and again.body == b"" and again.headers["ETag"] == etag
    assert alice.get(f"{API}/jobs?name=etag-*", headers={"If-None-Match": '"other", ' + etag}).status == 304
    assert alice.get(f"{API}/jobs?name=etag-*", headers={"If-None-Match": '"other"'}).status == 200
    submit(alice, job_spec("etag-2"))
    changed = alice.get(f"{API}/jobs?name=etag-*", headers={"If-None-Match": etag})
    assert changed.status == 200 and changed.headers["ETag"] != etag
    assert [j["name"] for j in changed.json()["jobs"]] == ["etag-1", "etag-2"]
    for path in (f"{API}/hosts", f"{API}/hosts?vendor=nvidia", f"{API}/jobs/{changed.json()['jobs'][0]['id']}/frames"):
        first = alice.get(path)
        time.sleep(0.002)  # the host list says when it was read (`at`): a new time is no change
        again = alice.get(path, headers={"If-None-Match": first.headers["ETag"]})
        assert again.status == 304 and again.body == b"", (path, again)
        assert alice.get(path, headers={"If-None-Match": "*"}).status == 304


# -- who may do what ----------------------------------------------------------------------------------------------
def test_no_wrong_or_malformed_token_is_a_401(site):
    anonymous = site.api()
    for method, path in (
        ("GET", f"{API}/whoami"),
        ("GET", f"{API}/jobs"),
        ("GET", f"{API}/hosts"),
        ("GET", f"{API}/leases"),
        ("GET", f"{API}/report"),
        ("GET", "/metrics"),
        ("GET", f"{API}/frames/1/log"),
        ("POST", f"{API}/jobs"),
        ("POST", f"{API}/jobs/1/kill"),
        ("POST", f"{API}/frames/1/eat"),
    ):
        resp = anonymous.request(method, path, {} if method == "POST" else None)
        check_problem(resp, 401, detail="authentication required")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer"), resp.headers
    wrong = site.api().with_token("cuectl_" + "A" * 43)
    body = check_problem(wrong.get(f"{API}/jobs"), 401, detail="not valid")
    assert "token create" in body["hint"]
    assert 'error="invalid_token"' in wrong.get(f"{API}/whoami").headers["WWW-Authenticate"]
    check_problem(site.api().with_token("x" * 5000).get(f"{API}/whoami"), 401)
    alice = site.tokens["alice"].secret
    for header in (f"Basic {alice}", "Bearer", "Bearer    ", f"Token {alice}", alice):
        resp = anonymous.get(f"{API}/whoami", headers={"Authorization": header})
        check_problem(resp, 401)
        assert "WWW-Authenticate" in resp.headers
    assert anonymous.get(f"{API}/whoami", headers={"Authorization": f"bearer {alice}"}).json()["user"] == "alice"


def test_a_revoked_token_fails_on_the_very_next_request(site):
    carol = create_token(site.db, "carol", "user", env=site.env)
    api = site.api().with_token(carol)
    assert api.ok("GET", f"{API}/whoami")["user"] == "carol"
    cuectl(site.db, "admin", "token", "revoke", str(carol.id), env=site.env)
    check_problem(api.get(f"{API}/whoami"), 401, detail="not valid")
    check_problem(api.post(f"{API}/jobs", job_spec("after-revoke")), 401)
    listed = json.loads(cuectl(site.db, "admin", "token", "list", "--json", env=site.env).stdout)["tokens"]
    (mine,) = [t for t in listed if t["id"] == carol.id]
    assert mine["revoked_at"] and mine["last_used_at"]


def _every_change(api: Api, job_id: int, frame_id: int) -> list[tuple[str, Any]]:
    base = f"{API}/jobs/{job_id}"
    return (
        [(f"{base}/{action}", None) for action in ("pause", "resume", "kill", "retry")]
        + [(f"{base}/priority", {"priority": 99})]
        + [(f"{API}/frames/{frame_id}/{action}", None) for action in ("retry", "kill", "eat")]
    )


def _snapshot(api: Api, job_id: int) -> tuple:
    shown = job(api, job_id)
    return shown["state"], shown["paused"], shown["priority"], shown["frame_counts"]


def test_a_viewer_reads_but_changes_nothing(site):
    alice, val = site.api("alice"), site.api("val")
    job_id = submit(alice, job_spec("viewed", layer_spec("l", range="1-2")))["id"]
    frame_id = frames(alice, job_id)["frames"][0]["id"]
    before = _snapshot(alice, job_id)
    body = check_problem(val.post(f"{API}/jobs", job_spec("by-viewer")), 403)
    assert "viewer" in body["detail"]
    for path, body in _every_change(val, job_id, frame_id):
        problem = check_problem(val.post(path, body), 403)
        assert "viewer role of val" in problem["detail"], problem
    assert _snapshot(alice, job_id) == before
    assert val.ok("GET", f"{API}/jobs?name=by-viewer")["jobs"] == []


def test_a_user_changes_only_their_own_jobs_and_an_admin_anyones(site):
    alice, bob, boss = site.api("alice"), site.api("bob"), site.api("boss")
    job_id = submit(alice, job_spec("hers", layer_spec("l", range="1-2")))["id"]
    frame_id = frames(alice, job_id)["frames"][0]["id"]
    before = _snapshot(alice, job_id)
    for path, body in _every_change(bob, job_id, frame_id):
        problem = check_problem(bob.post(path, body), 403)
        assert f"job {job_id} (hers) belongs to alice, not bob" in problem["detail"], problem
    assert _snapshot(alice, job_id) == before
    assert alice.ok("POST", f"{API}/jobs/{job_id}/priority", {"priority": 3})["priority"] == 3
    # An admin changes anyone's job; the job stays its owner's.
    bobs = submit(bob, job_spec("his"))["id"]
    assert boss.ok("POST", f"{API}/jobs/{bobs}/pause")["paused"] is True
    assert boss.ok("POST", f"{API}/jobs/{job_id}/priority", {"priority": 11})["priority"] == 11
    assert boss.ok("POST", f"{API}/frames/{frame_id}/eat")["frames"][0]["state"] == "EATEN"
    killed = boss.ok("POST", f"{API}/jobs/{bobs}/kill")
    assert killed["state"] == "FINISHED" and killed["user"] == "bob"
    # An admin's own submission is the admin's.
    assert submit(boss, job_spec("bosss"))["user"] == "boss"


# -- bad input --------------------------------------------------------------------------------------------------------
def test_bad_bodies_are_400_and_415(site):
    alice = site.api("alice")
    body = check_problem(
        alice.post(f"{API}/jobs", b"{not json", headers={"Content-Type": "application/json"}), 400, field="body"
    )
    assert "not valid JSON" in body["detail"]
    check_problem(
        alice.post(f"{API}/jobs/1/priority", b"[1,", headers={"Content-Type": "application/json"}), 400, field="body"
    )
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/octet-stream"):
        resp = alice.post(f"{API}/jobs", json.dumps(job_spec("typed")).encode(), headers={"Content-Type": content_type})
        assert "field" not in check_problem(resp, 415, detail="application/json")  # a header, not a field
    assert alice.ok("GET", f"{API}/jobs?name=typed")["jobs"] == []
    check_problem(alice.post(f"{API}/jobs", b"[]", headers={"Content-Type": "application/json"}), 422)
    check_problem(alice.post(f"{API}/jobs", b"", headers={"Content-Type": "application/json"}), 422)


def test_deeply_nested_json_is_a_400_not_a_500(site):
    """Issue 35 item 14: a body nested past the parser's recursion limit (RecursionError)
    and one nested deeper than any spec needs are one-line 400 problems."""
    alice = site.api("alice")
    json_type = {"Content-Type": "application/json"}
    for depth in (100_000, 1000, 65):
        for path in (f"{API}/jobs", f"{API}/jobs/1/priority"):
            body = check_problem(alice.post(path, b"[" * depth + b"]" * depth, headers=json_type), 400, field="body")
            assert "nested" in body["detail"] and "\n" not in body["detail"], body
    deep = {"x": 1}
    for _ in range(70):
        deep = {"x": deep}
    check_problem(alice.post(f"{API}/jobs", job_spec("too-deep", layer_spec("l"), labels=deep)), 400, field="body")
    assert alice.ok("GET", f"{API}/jobs?name=too-deep")["jobs"] == []
    # A real spec, with nesting to spare, is fine.
    assert submit(alice, job_spec("nested-ok", layer_spec("l", env={"A": "1"})))["name"] == "nested-ok"


def test_a_nul_or_control_character_in_a_path_is_refused_without_a_traceback(site):
    """Issue 35 item 14: ``GET /static/a%00.js`` was a 500 with a traceback, to anyone. A NUL
    (or another control character) in a path or query names nothing: 404 for the monitor's
    files, 400 for the API, before authentication and before the store or filesystem."""
    anonymous = site.server.api.with_token(None)
    for path in (
        "/static/a%00.js",
        "/static/app.js%00",
        "/static/%00",
        "/static/a%0a.js",
        "/static/a%1b.js",
        "/static/a%7f.js",
    ):
        check_problem(anonymous.get(path), 404)
    alice = site.api("alice")
    for who in (anonymous, alice, site.api("val")):
        for method, path in (
            ("GET", "/jobs/%00"),
            ("GET", "/jobs/a%00b"),
            ("GET", "/jobs/%00/frames"),
            ("POST", "/jobs/%00/pause"),
            ("POST", "/jobs/%00/priority"),
            ("GET", "/hosts/%00"),
            ("GET", "/hosts/%00/gpus"),
            ("POST", "/hosts/%00/lock"),
            ("GET", "/frames/1%00"),
            ("GET", "/jobs?name=%00"),
            ("GET", "/jobs?user=a%00"),
            ("GET", "/hosts?model=%00"),
            ("GET", "/jobs/%0a"),
            ("GET", "/hosts/a%0db"),
        ):
            body = check_problem(who.request(method, API + path), 400)
            assert "control character" in body["detail"], (path, body)
    assert alice.get("/static/app.js").status == 200  # the monitor's files are still served


@pytest.mark.parametrize(
    "path, field",
    [
        ("/jobs?limit=0", "limit"),
        ("/jobs?limit=abc", "limit"),
        ("/jobs?limit=10001", "limit"),
        ("/jobs?offset=-1", "offset"),
        ("/jobs?state=BOGUS", "state"),
        ("/jobs?order=up", "order"),
        ("/jobs?active=maybe", "active"),
        ("/hosts?gpu_memory_min=12Q", "gpu_memory_min"),
        ("/hosts?state=SIDEWAYS", "state"),
        ("/jobs/1/frames?state=BOGUS", "state"),
        ("/jobs/1/frames?limit=0", "limit"),
        ("/jobs/1/frames?after=x", "after"),
        ("/jobs/1/frames?after=-1", "after"),
        ("/frames/abc", "frame_id"),
        ("/frames/1/log?tail=x", "tail"),
        ("/report?by=planet", "by"),
        ("/report?since=yesterdayish", "since"),
        ("/jobs?offset=99999999999999999999", "offset"),
        ("/jobs/1/frames?after=99999999999999999999", "after"),
        ("/jobs/1/frames?ids=99999999999999999999", "ids"),
    ],
)
def test_bad_query_values_are_422_naming_the_field(site, path, field):
    # Values are checked before anything is looked up: job 1 and frame 1 need not exist.
    check_problem(site.api("val").get(API + path), 422, field=field)


def test_unknown_things_are_404_and_wrong_methods_405(site):
    alice = site.api("alice")
    job_id = submit(alice, job_spec("known"))["id"]
    check_problem(alice.post(f"{API}/jobs/{job_id}/explode"), 404, detail="no job action 'explode'")
    check_problem(alice.post(f"{API}/frames/1/explode"), 404, detail="no frame action 'explode'")
    check_problem(alice.post(f"{API}/jobs/7777777/kill"), 404, detail="7777777")
    check_problem(alice.post(f"{API}/jobs/7777777/priority", {"priority": 1}), 404)
    check_problem(alice.get(f"{API}/nothing-here"), 404)
    check_problem(alice.get(f"{API}/hosts/no-such-host/gpus"), 404, detail="no-such-host")
    # Ids beyond 64 bits name nothing (the database cannot even compare them): 404, not a 500.
    huge = "99999999999999999999"
    for method, path in (
        ("GET", f"/jobs/{huge}"),
        ("GET", f"/jobs/{huge}/frames"),
        ("POST", f"/jobs/{huge}/kill"),
        ("GET", f"/frames/{huge}"),
        ("GET", f"/frames/-{huge}"),
        ("GET", f"/frames/{huge}/log"),
        ("POST", f"/frames/{huge}/eat"),
    ):
        check_problem(alice.request(method, API + path), 404, detail=huge)
    check_problem(alice.post(f"{API}/jobs/{huge}/priority", {"priority": 1}), 404, detail=huge)
    check_problem(alice.request("DELETE", f"{API}/jobs/{job_id}"), 405)
    check_problem(alice.request("PUT", f"{API}/jobs"), 405)
    for body in ({}, {"priority": "9"}, {"priority": 1.5}, {"priority": True}, [], {"priority": 2**40}):
        check_problem(alice.post(f"{API}/jobs/{job_id}/priority", body), 422, field="priority")
    assert job(alice, job_id)["priority"] == 0


def test_the_server_logged_no_unexpected_error(site):
    """Runs last: no request of this module made the server log a bug."""
    assert site.server.api.seen_errors, "the error checks above ran"
    out = site.server.output()
    assert "Traceback" not in out and "unexpected error" not in out, out[-3000:]
