"""A root `cuectl serve` with real throwaway users (root only; CI runs as root): what a
token's user submits is proven theirs (the receipt belongs to their uid), so a root worker
runs it as them; a token for a name with no account here submits, but nothing runs it as
anyone. On the Unix socket, the kernel names the caller (SO_PEERCRED)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

import pytest
from apiclient import CUECTL, Server, check_problem, create_token, job_spec, layer_spec, new_store

API = "/api/v1"
ID_U = ["sh", "-c", 'echo "uid=$(id -u) user=$USER"']


@pytest.fixture(scope="module")
def shared(os_users, serve_dir: Path, serve_env: dict[str, str]):
    """A store only root writes, served by root: its users come through the API (issue 35:
    one writer; a root worker refuses a store others can write)."""
    (user,) = os_users("apiu")
    path = Path(tempfile.mkdtemp(prefix="cuectl-serve-", dir="/tmp"))
    os.chmod(path, 0o755)
    db = new_store(path / "cuectl.db")
    ghost = f"ghost{os.getpid()}"
    with pytest.raises(KeyError):
        pwd.getpwnam(ghost)
    tokens = {
        "user": create_token(db, user.name, "user", env=serve_env),
        "ghost": create_token(db, ghost, "user", env=serve_env),
    }
    server = Server(db, env=serve_env, log=serve_dir / "server.log", extra=("--cache", "0"))
    yield {
        "dir": path,
        "db": db,
        "user": user,
        "ghost": ghost,
        "tokens": tokens,
        "server": server,
        "env": serve_env,
        "serve_dir": serve_dir,
    }
    server.stop()
    shutil.rmtree(path, ignore_errors=True)


def receipt_owner(db: Path, job_id: int) -> int:
    conn = sqlite3.connect(db)
    (name,) = conn.execute("SELECT receipt FROM jobs WHERE id = ?", (job_id,)).fetchone()
    conn.close()
    assert name, f"job {job_id} has no receipt"
    return (db.parent / "receipts" / name).lstat().st_uid


def test_a_tokens_job_is_proven_its_users_and_a_strangers_is_not(shared):
    user, api = shared["user"], shared["server"].api
    mine = api.with_token(shared["tokens"]["user"]).post(f"{API}/jobs", job_spec("root-receipt", layer_spec("l", ID_U)))
    assert mine.status == 201 and mine.json()["user"] == user.name, mine
    assert receipt_owner(shared["db"], mine.json()["id"]) == user.uid
    assert "root workers will not run it" not in (mine.json()["pending_reason"] or "")
    theirs = api.with_token(shared["tokens"]["ghost"]).post(f"{API}/jobs", job_spec("ghost-receipt"))
    assert theirs.status == 201 and theirs.json()["user"] == shared["ghost"], theirs
    assert receipt_owner(shared["db"], theirs.json()["id"]) == 0  # nobody to give it to: it stays root's
    reason = theirs.json()["pending_reason"]
    assert f"root workers will not run it as {shared['ghost']}" in reason and "does not exist" in reason, reason


def python_for(user) -> str:
    """A Python the throwaway user may run (ours may live in root's home)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", os.path.realpath(shutil.which("python3") or "")):
        if candidate and os.path.exists(candidate) and user.run([candidate, "-c", "pass"], timeout=30).returncode == 0:
            return candidate
    pytest.skip("no Python interpreter here that another user may run")


def test_a_socket_peer_is_the_os_user_the_kernel_names(shared):
    """The throwaway user connects to the socket with no token: the server knows who it is."""
    user = shared["user"]
    sock = shared["dir"] / "api.sock"
    server = Server(shared["db"], env=shared["env"], log=shared["serve_dir"] / "socket.log", socket_path=sock)
    try:
        local = server.api  # this process: root, an admin
        assert local.ok("GET", f"{API}/whoami")["role"] == "admin"
        roots = local.post(f"{API}/jobs", job_spec("roots-job"))
        assert roots.status == 201 and roots.json()["user"] == "root"
        script = (
            "import http.client, json, socket, sys\n"
            "class C(http.client.HTTPConnection):\n"
            "    def connect(self):\n"
            "        self.sock = socket.socket(socket.AF_UNIX); self.sock.connect(sys.argv[1])\n"
            "def ask(method, path, body=None):\n"
            "    c = C('localhost'); c.request(method, path, body=body, headers={'Content-Type': 'application/json'})\n"
            "    r = c.getresponse(); return [r.status, json.loads(r.read())]\n"
            "print(json.dumps({'whoami': ask('GET', '/api/v1/whoami'),\n"
            "                  'kill': ask('POST', f'/api/v1/jobs/{sys.argv[2]}/kill'),\n"
            "                  'submit': ask('POST', '/api/v1/jobs', sys.argv[3])}))\n"
        )
        spec = json.dumps(job_spec("peer-job", layer_spec("l", ID_U)))
        res = user.run(
            [python_for(user), "-c", script, str(sock), str(roots.json()["id"]), spec], cwd=shared["dir"], timeout=60
        )
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out["whoami"] == [
            200,
            {"user": user.name, "role": "user", "via": "peer", "token_id": None, "read_only": False},
        ]
        assert out["kill"][0] == 403 and f"belongs to root, not {user.name}" in out["kill"][1]["detail"], out
        assert out["submit"][0] == 201 and out["submit"][1]["user"] == user.name, out
        assert receipt_owner(shared["db"], out["submit"][1]["id"]) == user.uid
        assert local.ok("GET", f"{API}/jobs/{roots.json()['id']}")["state"] == "PENDING"
        assert local.ok("POST", f"{API}/jobs/{roots.json()['id']}/kill")["state"] == "FINISHED"
    finally:
        server.stop()


def test_a_root_worker_runs_a_tokens_job_as_its_user_and_a_strangers_never(shared):
    user, api = shared["user"], shared["server"].api
    mine = api.with_token(shared["tokens"]["user"]).post(f"{API}/jobs", job_spec("as-user", layer_spec("l", ID_U)))
    marker = shared["dir"] / "ghost-ran"
    ghost = api.with_token(shared["tokens"]["ghost"]).post(
        f"{API}/jobs", job_spec("as-ghost", layer_spec("l", ["sh", "-c", f"id -u > {marker}"]))
    )
    assert mine.status == 201 and ghost.status == 201
    fake = shared["serve_dir"] / "no-gpus.yaml"
    fake.write_text("devices: []\n")
    env = {**shared["env"], "CUECTL_FAKE_GPUS": str(fake)}
    res = subprocess.run(
        [
            *CUECTL,
            "--db",
            str(shared["db"]),
            "worker",
            "--until-idle",
            "--poll",
            "0.05",
            "--lease-timeout",
            "5",
            "--sample-interval",
            "0.2",
            "--name",
            "root-worker",
        ],
        env=env,
        cwd=shared["dir"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    viewer = api.with_token(shared["tokens"]["user"])
    (frame,) = viewer.ok("GET", f"{API}/jobs/{mine.json()['id']}/frames")["frames"]
    assert frame["state"] == "SUCCEEDED", frame
    log = viewer.get(f"{API}/frames/{frame['id']}/log")
    assert f"uid={user.uid} user={user.name}" in log.text, log.text
    # The stranger's job: submitted, never run, and it says why.
    assert not marker.exists()
    (waiting,) = viewer.ok("GET", f"{API}/jobs/{ghost.json()['id']}/frames")["frames"]
    assert (waiting["state"], waiting["attempts"]) == ("WAITING", 0)
    reason = viewer.ok("GET", f"{API}/jobs/{ghost.json()['id']}")["pending_reason"]
    assert f"user '{shared['ghost']}' does not exist on this host" in reason, reason
    assert f"not running job {ghost.json()['id']}" in res.stderr, res.stderr
    check_problem(viewer.get(f"{API}/frames/{waiting['id']}/log"), 404, detail="no log yet")
