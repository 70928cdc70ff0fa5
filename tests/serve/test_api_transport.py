"""How callers reach `cuectl serve`: anonymous reads (--allow-anonymous-read) and the shared
response cache, a local Unix socket whose callers the kernel names (SO_PEERCRED), TLS,
and a CLI that never loads the web framework."""

from __future__ import annotations

import os
import pwd
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
from apiclient import (
    CUECTL,
    Api,
    Server,
    check_problem,
    create_token,
    free_port,
    job_spec,
    layer_spec,
    new_store,
    store_at,
)

API = "/api/v1"


@pytest.fixture(scope="module")
def store(serve_dir: Path, serve_env: dict[str, str]) -> Path:
    return new_store(serve_dir / "store" / "cuectl.db")


# -- anonymous reads and the cache -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def open_server(store: Path, serve_dir: Path, serve_env: dict[str, str]):
    """--allow-anonymous-read, and the default 1 s response cache."""
    server = Server(store, env=serve_env, log=serve_dir / "open.log", extra=("--allow-anonymous-read",))
    yield server
    server.stop()


def test_without_the_flag_reads_need_a_token(store, serve_dir, serve_env):
    server = Server(store, env=serve_env, log=serve_dir / "closed.log")
    try:
        for path in (f"{API}/whoami", f"{API}/jobs", f"{API}/hosts", "/metrics"):
            check_problem(server.api.get(path), 401)
    finally:
        server.stop()


def test_anonymous_callers_read_but_never_change(open_server, store, serve_env):
    anonymous = open_server.api
    assert anonymous.ok("GET", f"{API}/whoami") == {
        "user": "anonymous",
        "role": "viewer",
        "via": "anonymous",
        "token_id": None,
        "read_only": True,
    }
    owner = anonymous.with_token(create_token(store, "ann", "user", env=serve_env))
    job = owner.post(f"{API}/jobs", job_spec("open-1", layer_spec("l", range="1-2"))).json()
    listed = anonymous.ok("GET", f"{API}/jobs?name=open-*")
    assert [j["id"] for j in listed["jobs"]] == [job["id"]]
    assert anonymous.ok("GET", f"{API}/jobs/{job['id']}")["user"] == "ann"
    frame_id = anonymous.ok("GET", f"{API}/jobs/{job['id']}/frames")["frames"][0]["id"]
    assert anonymous.ok("GET", f"{API}/frames/{frame_id}")["state"] == "WAITING"
    for path in (f"{API}/hosts", f"{API}/leases", f"{API}/report"):
        anonymous.ok("GET", path)
    assert anonymous.get("/metrics").status == 200
    # Changes: an anonymous caller is a viewer, so 403 (not 401: it is known who asks).
    check_problem(anonymous.post(f"{API}/jobs", job_spec("open-2")), 403, detail="viewer role of anonymous")
    for path, body in (
        (f"{API}/jobs/{job['id']}/kill", None),
        (f"{API}/jobs/{job['id']}/pause", None),
        (f"{API}/jobs/{job['id']}/priority", {"priority": 5}),
        (f"{API}/frames/{frame_id}/eat", None),
    ):
        check_problem(anonymous.post(path, body), 403)
    shown = anonymous.ok("GET", f"{API}/jobs/{job['id']}")
    assert (shown["state"], shown["paused"], shown["priority"]) == ("PENDING", False, 0)
    assert anonymous.ok("GET", f"{API}/jobs?name=open-2")["jobs"] == []
    # A bad token is still refused: anonymity is for callers who send none.
    check_problem(anonymous.with_token("nope").get(f"{API}/jobs"), 401)


def test_the_cache_is_shared_and_a_change_through_the_api_empties_it(open_server, store, serve_env):
    anonymous = open_server.api
    owner = anonymous.with_token(create_token(store, "cal", "user", env=serve_env))
    owner.post(f"{API}/jobs", job_spec("cached-1"))
    first = anonymous.get(f"{API}/jobs?name=cached-*")
    etag = first.headers["ETag"]
    assert [j["name"] for j in first.json()["jobs"]] == ["cached-1"]
    assert anonymous.get(f"{API}/jobs?name=cached-*", headers={"If-None-Match": etag}).status == 304
    # A job submitted behind the server's back (the CLI, a script) shows within the cache's
    # second; one submitted through the API shows at once.
    assert owner.post(f"{API}/jobs", job_spec("cached-2")).status == 201
    fresh = anonymous.get(f"{API}/jobs?name=cached-*", headers={"If-None-Match": etag})
    assert fresh.status == 200 and fresh.headers["ETag"] != etag
    assert [j["name"] for j in fresh.json()["jobs"]] == ["cached-1", "cached-2"]
    with store_at(store) as s:
        from cuectl.sched.spec import spec_from_mapping

        s.submit(spec_from_mapping(job_spec("cached-3"), user="cal"), now=time.time())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        names = [j["name"] for j in anonymous.ok("GET", f"{API}/jobs?name=cached-*")["jobs"]]
        if "cached-3" in names:
            break
        time.sleep(0.1)
    assert names == ["cached-1", "cached-2", "cached-3"]


def test_a_poller_slower_than_the_cache_never_reads_an_answer_older_than_the_cache(open_server, store, serve_env):
    """docs/api.md promises answers at most --cache seconds old (1 s here): a monitor that
    polls every 1.3 s must see a change made behind the server's back on its next poll,
    not the page cached before it (a stale page once more while it rebuilds)."""
    anonymous = open_server.api
    owner = anonymous.with_token(create_token(store, "slow", "user", env=serve_env))
    job_id = owner.post(f"{API}/jobs", job_spec("slow-poll", layer_spec("l", range="1-2"))).json()["id"]
    with store_at(store) as s:
        for change, state in (("kill", "FINISHED"), ("retry", "PENDING"), ("kill", "FINISHED")):
            before = anonymous.ok("GET", f"{API}/jobs/{job_id}")["state"]  # cached from here on
            assert before != state
            if change == "kill":  # as the CLI or a worker would: the server's cache is not told
                s.kill_job(job_id, now=time.time(), force=True)
            else:
                s.retry_job(job_id, now=time.time(), force=True)
            time.sleep(1.3)  # the poller's interval, longer than the cache's 1 s
            assert anonymous.ok("GET", f"{API}/jobs/{job_id}")["state"] == state, change


# -- a Unix socket -----------------------------------------------------------------------------------------------
def test_a_unix_socket_caller_is_the_os_user_the_kernel_names(store, serve_dir, serve_env):
    path = serve_dir / "api.sock"
    server = Server(store, env=serve_env, log=serve_dir / "socket.log", socket_path=path)
    try:
        me = pwd.getpwuid(os.getuid()).pw_name
        local = server.api
        assert local.port is None and path.is_socket()
        # This process created the store: it owns the file, so it is an admin (as root is).
        assert local.ok("GET", f"{API}/whoami") == {
            "user": me,
            "role": "admin",
            "via": "peer",
            "token_id": None,
            "read_only": False,
        }
        job = local.post(f"{API}/jobs", job_spec("via-socket"))
        assert job.status == 201 and job.json()["user"] == me, job
        assert local.ok("POST", f"{API}/jobs/{job.json()['id']}/kill")["state"] == "FINISHED"
        # A token, when sent, says who calls, on the socket too.
        viewer = local.with_token(create_token(store, "sock-viewer", "viewer", env=serve_env))
        assert viewer.ok("GET", f"{API}/whoami")["user"] == "sock-viewer"
        check_problem(viewer.post(f"{API}/jobs/{job.json()['id']}/retry"), 403)
        check_problem(local.with_token("bogus").get(f"{API}/whoami"), 401)
    finally:
        server.stop()


def test_a_socket_path_that_is_not_a_socket_is_refused(store, serve_dir, serve_env):
    path = serve_dir / "not-a-socket"
    path.write_text("precious\n")
    res = subprocess.run(
        [*CUECTL, "--db", str(store), "serve", "--socket", str(path)],
        env=serve_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2 and res.stderr.startswith("error: --socket:"), res
    assert path.read_text() == "precious\n"


# -- TLS --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certificate(serve_dir: Path) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl command is not installed")
    cert, key = serve_dir / "cert.pem", serve_dir / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_tls_with_a_certificate_and_key(store, serve_dir, serve_env, certificate):
    cert, key = certificate
    context = ssl.create_default_context(cafile=str(cert))
    server = Server(store, env=serve_env, log=serve_dir / "tls.log", certfile=cert, keyfile=key, tls=context)
    try:
        from cuectl import __version__

        assert server.api.ok("GET", "/healthz") == {"status": "ok", "version": __version__}
        token = create_token(store, "tls-user", "user", env=serve_env)
        assert server.api.with_token(token).ok("GET", f"{API}/whoami")["user"] == "tls-user"
        # Plain HTTP to the TLS port gets no answer; an untrusted client refuses the server.
        plain = Api(port=server.port, timeout=5)
        with pytest.raises(Exception):  # noqa: B017 - a reset, a timeout or a bad status line: any failure will do
            plain.get("/healthz")
        with pytest.raises(ssl.SSLCertVerificationError):
            Api(port=server.port, tls=ssl.create_default_context(), timeout=5).get("/healthz")
    finally:
        server.stop()


def test_a_certificate_without_a_key_is_one_error_line(store, serve_env, certificate):
    cert, key = certificate
    for args in (
        ["--certfile", str(cert)],
        ["--keyfile", str(key)],
        ["--certfile", str(cert), "--keyfile", str(cert.with_name("missing.pem"))],
    ):
        res = subprocess.run(
            [*CUECTL, "--db", str(store), "serve", "--port", str(free_port()), *args],
            env=serve_env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert res.returncode == 2, res
        errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and ("--certfile" in errors[0] or "--keyfile" in errors[0]), res.stderr
        assert "Traceback" not in res.stderr


def test_bad_serve_options_exit_2(store, serve_env):
    for args in (["--port", "0"], ["--port", "70000"], ["--cache", "-1"]):
        res = subprocess.run(
            [*CUECTL, "--db", str(store), "serve", *args], env=serve_env, capture_output=True, text=True, timeout=30
        )
        assert res.returncode == 2 and res.stderr.startswith("error: "), (args, res)
    missing = store.parent / "nope" / "cuectl.db"
    res = subprocess.run(
        [*CUECTL, "--db", str(missing), "serve"], env=serve_env, capture_output=True, text=True, timeout=30
    )
    assert res.returncode == 1 and res.stderr.startswith(f"error: no store at {missing}"), res
    assert not missing.parent.exists()


# -- the CLI stays light ------------------------------------------------------------------------------------------
WEB = (
    "fastapi",
    "uvicorn",
    "starlette",
    "prometheus_client",
    "pydantic",
    "cuectl.serve.app",
    "cuectl.serve.auth",
    "cuectl.serve.metrics",
)


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["job", "list", "--json"],
        ["frame", "list", "--json"],
        ["host", "list"],
        ["admin", "token", "list", "--json"],
        ["serve", "--help"],
    ],
)
def test_the_cli_never_imports_the_web_framework(store, serve_env, args):
    argv = args if args == ["--version"] else ["--db", str(store), *args]
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cuectl", *argv],
        env=serve_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "cuectl" in imported or args == ["--version"], res.stderr[-500:]
    loaded = sorted(m for m in imported if any(m == w or m.startswith(w + ".") for w in WEB))
    assert loaded == [], f"cuectl {' '.join(args)} imported {loaded}"
    if args == ["--version"]:
        assert "typer" not in imported and res.stdout.startswith("cuectl ")


def test_the_import_check_would_see_fastapi(serve_env):
    """The check above can fail: a module that imports fastapi shows in -X importtime."""
    res = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import cuectl.serve.app"],
        env=serve_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.rsplit("|", 1)[1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert {"fastapi", "starlette", "cuectl.serve.app"} <= imported
