"""Notifications delivered by real workers (docs/notifications.md): a webhook to an HTTP
server on 127.0.0.1, a command hook, email through a fake sendmail; exactly once across a
worker killed while holding the claim, retried after a 500; as the job's user on a root
worker, never as root. Network: 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from farmlib import cuectl_cmd


class Hooks:
    """An HTTP server on 127.0.0.1 that records every POST; answers ``codes`` in turn, then 200."""

    def __init__(self, codes=()):
        self.posts: list[tuple[dict, dict]] = []
        self.codes = list(codes)
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hooks.posts.append((dict(self.headers), json.loads(body)))
                code = hooks.codes.pop(0) if hooks.codes else 200
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks():
    h = Hooks()
    yield h
    h.close()


def notifications(farm, job):
    return json.loads(farm.cuectl("admin", "notify", "history", "--job", str(job), "--json").stdout)["notifications"]


def test_webhook_is_delivered_once_though_the_worker_dies_holding_the_claim(farm, hooks):
    host = farm.host("h1", [], state=True)
    job = farm.submit(
        {
            "name": "shot010",
            "notify": [{"webhook": hooks.url}],
            "layers": [{"name": "l", "command": ["true"], "range": "1-2"}],
        }
    )
    # The worker finishes the job, claims its notification and dies at once (os._exit, as a
    # SIGKILL would): nothing was delivered, the claim is held.
    first = farm.start_worker(host, env={"CUECTL_TEST_CRASH_AT": "notify_claimed"})
    first.communicate(timeout=60)
    assert first.returncode == 99
    assert farm.job(job)["outcome"] == "SUCCEEDED" and hooks.posts == []
    [row] = notifications(farm, job)
    assert row["claimed_by"].startswith("h1:") and row["delivered_at"] is None
    assert row["target"].endswith("/***") and "secret-token" not in json.dumps(row)  # shown masked
    # Restarted, it releases its dead predecessor's claim and delivers, once.
    res = farm.run_worker(host, timeout=60)
    assert res.returncode == 0, res.stderr
    farm.wait_for(lambda: hooks.posts, what="the webhook")
    time.sleep(1.0)
    assert len(hooks.posts) == 1
    headers, body = hooks.posts[0]
    assert headers["Content-Type"] == "application/json" and headers["X-Cuectl-Event"] == "finished"
    assert body["id"] == job and body["name"] == "shot010" and body["outcome"] == "SUCCEEDED"
    assert body["notification"] == {"id": row["id"], "event": "finished", "frame_id": None}
    [row] = notifications(farm, job)
    assert row["delivered_at"] is not None and row["attempts"] == 0
    # Another worker later: nothing more.
    assert farm.run_worker(host, timeout=60).returncode == 0
    assert len(hooks.posts) == 1


def test_a_failed_webhook_is_retried_with_back_off(farm):
    hooks = Hooks(codes=[500])
    try:
        host = farm.host("h1", [], state=True)
        job = farm.submit(
            {
                "name": "fails",
                "notify": [{"webhook": hooks.url, "on": ["failed", "dead"]}],
                "layers": [{"name": "l", "command": ["false"], "retries": 0}],
            }
        )
        worker = farm.start_worker(host)
        farm.wait_for(lambda: len(hooks.posts) >= 1, timeout=30, what="the first try")
        (frame,) = farm.frames(job)
        assert frame["state"] == "DEAD"
        # Two events (the frame went DEAD, the job failed): one answered 500, retried ~10 s later.
        farm.wait_for(lambda: len(hooks.posts) >= 3, timeout=40, what="the retry")
        time.sleep(1.0)
        events = [h["X-Cuectl-Event"] for h, _ in hooks.posts]
        assert len(events) == 3 and events[0] in events[1:]  # the first one, again
        rows = notifications(farm, job)
        assert all(r["delivered_at"] for r in rows)
        assert sorted(r["attempts"] for r in rows) == [0, 1]
        assert next(r for r in rows if r["attempts"] == 1)["error"] is None
        assert {r["frame_id"] for r in rows} == {None, frame["id"]}
        worker.terminate()
        worker.communicate(timeout=30)
    finally:
        hooks.close()


def test_command_hook_runs_once_with_the_job_on_stdin(farm):
    out = farm.tmp / "hook.out"
    job = farm.submit(
        {
            "name": "cmd",
            "notify": [{"command": f'echo "$CUE_EVENT $CUE_JOB_ID $CUE_JOB" >> {out}; cat > {out}.json'}],
            "layers": [{"name": "l", "command": ["true"]}],
        }
    )
    res = farm.run_worker(None, timeout=60)
    assert res.returncode == 0, res.stderr
    assert out.read_text() == f"finished {job} cmd\n"
    assert json.loads(Path(f"{out}.json").read_text())["id"] == job
    assert farm.run_worker(None, timeout=60).returncode == 0
    assert out.read_text() == f"finished {job} cmd\n"


def test_email_goes_through_sendmail(farm):
    mailbox = farm.tmp / "mailbox"
    sendmail = farm.tmp / "sendmail"
    sendmail.write_text(f'#!/bin/sh\necho "ARGS $*" >> {mailbox}\ncat >> {mailbox}\n')
    sendmail.chmod(0o755)
    job = farm.submit(
        {
            "name": "mailme",
            "notify": [{"email": "artist@studio.example", "on": ["failed"]}],
            "layers": [{"name": "l", "command": ["false"], "retries": 0}],
        }
    )
    res = farm.run_worker(None, timeout=60, env={"CUECTL_SENDMAIL": str(sendmail)})
    assert res.returncode == 0, res.stderr
    text = mailbox.read_text()
    assert text.startswith("ARGS -t -i\n") and text.count("ARGS") == 1
    assert "To: artist@studio.example\n" in text
    assert f"Subject: cuectl: job {job} mailme failed\n" in text


def test_admin_notify_deliver_and_farm_defaults(farm, hooks):
    job = farm.submit({"name": "d", "layers": [{"name": "l", "command": ["true"]}]})
    # Defaults set after the submit still apply: they are read when the job finishes.
    farm.cuectl("admin", "notify", "set", "--webhook", hooks.url, "--on", "finished")
    assert json.loads(farm.cuectl("admin", "notify", "list", "--json").stdout)["notify_defaults"] == [
        {"on": ["finished"], "webhook": hooks.url}
    ]
    # Delivered by `admin notify deliver` rather than a worker: the worker stops at once.
    farm.cuectl("admin", "notify", "deliver")  # nothing due yet
    res = farm.run_worker(None, "--max-frames", "1", env={"CUECTL_TEST_CRASH_AT": "notify_claimed"}, timeout=60)
    assert res.returncode == 99
    assert hooks.posts == []
    # The dead worker's claim expires after its lease; the admin command delivers then.
    conn = sqlite3.connect(farm.db)
    conn.execute("UPDATE notifications SET claimed_until = 0")  # as if the lease (2 min) had run out
    conn.commit()
    conn.close()
    done = json.loads(farm.cuectl("admin", "notify", "deliver", "--json").stdout)
    assert done == {"delivered": 1, "failed": 0}
    assert len(hooks.posts) == 1 and hooks.posts[0][1]["id"] == job
    assert json.loads(farm.cuectl("admin", "notify", "deliver", "--json").stdout) == {"delivered": 0, "failed": 0}
    farm.cuectl("admin", "notify", "clear")
    assert json.loads(farm.cuectl("admin", "notify", "list", "--json").stdout)["notify_defaults"] == []


def test_submit_flags(farm, hooks):
    res = farm.cuectl(
        "submit",
        "--name",
        "flags",
        "--notify-webhook",
        hooks.url,
        "--notify-on",
        "finished",
        "--notify-on",
        "dead",
        "--notify-email",
        "a@b.example",
        "--",
        "true",
    )
    job = int(res.stdout)
    shown = farm.job(job)["notify"]
    assert shown == [
        {"on": ["finished", "dead"], "webhook": hooks.url.split("/hook")[0] + "/***"},
        {"on": ["finished", "dead"], "email": "a@b.example"},
    ]
    bad = farm.cuectl("submit", "--name", "x", "--notify-webhook", "gopher://x", "--", "true", check=False)
    assert bad.returncode == 2 and "--notify-webhook" in bad.stderr


# -- a root worker runs hooks as the job's user, never as root -----------------------------------
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="running hooks as another user needs a root worker")


@ROOT_ONLY
def test_root_worker_runs_the_hook_as_the_submitter_and_nothing_else(shared_farm, os_users):
    alice, bob = os_users("alice", "bob")
    farm = shared_farm
    out, marker = farm.tmp / "out" / "hook-uid", farm.tmp / "out" / "bob-was-here"  # sticky out/: alice writes there
    spec = farm.tmp / "alice.json"
    spec.write_text(
        json.dumps(
            {
                "name": "as-alice",
                "notify": [{"command": f"id -u > {out}"}],
                "layers": [{"name": "w", "command": ["true"]}],
            }
        )
    )
    spec.chmod(0o644)
    res = alice.run([*cuectl_cmd(), "--db", str(farm.db), "submit", str(spec)], env=farm.env(), cwd=farm.tmp)
    assert res.returncode == 0, res.stderr
    job = int(res.stdout)
    # bob adds a hook of his own to alice's job, hoping it runs as alice. The store has one
    # writer now, so his edit of the file is refused...
    hooks_json = json.dumps([{"command": f"id -u > {out}"}, {"command": f"touch {marker}"}])
    edit = (
        f"import sqlite3; c = sqlite3.connect({str(farm.db)!r}); "
        f"c.execute('UPDATE jobs SET notify = ? WHERE id = ?', ({hooks_json!r}, {job})); c.commit()"
    )
    res = bob.run([sys.executable, "-c", edit])
    assert res.returncode != 0 and "sqlite3.OperationalError" in res.stderr, res
    # ...and the same edit made by a writer of the store (root, standing for any) is not
    # vouched for by her receipt: it never runs.
    with closing(sqlite3.connect(farm.db)) as conn:
        assert conn.execute("UPDATE jobs SET notify = ? WHERE id = ?", (hooks_json, job)).rowcount == 1
        conn.commit()
    res = farm.run_worker(None, timeout=60)
    assert res.returncode == 0, res.stderr
    assert out.read_text().strip() == str(alice.uid)
    assert out.stat().st_uid == alice.uid
    assert not marker.exists()
    rows = {r["target"]: r for r in notifications(farm, job)}
    assert rows[f"id -u > {out}"]["delivered_at"] is not None
    refused = rows[f"touch {marker}"]
    assert refused["delivered_at"] is None and "never as root" in refused["error"]
    assert "gave up" in refused["error"] and "not one" in refused["error"]


# -- PostgreSQL: several workers, one delivery --------------------------------------------------
def test_postgres_farm_delivers_once(farm, hooks):
    pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import pgserver

    try:
        server = pgserver.shared_server()
    except pgserver.PgUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")
    name = server.create_database()
    try:
        farm.db = server.url(name)
        farm.worker_flags = ["--run-as-worker-user"]  # submitted by the superuser role: no proof
        out = farm.tmp / "hook.out"
        job = farm.submit(
            {
                "name": "pgjob",
                "notify": [
                    {"webhook": hooks.url, "on": ["finished", "failed", "dead"]},
                    {"command": f"echo $CUE_EVENT >> {out}"},
                ],
                "layers": [{"name": "l", "command": ["true"], "range": "1-12"}],
            }
        )
        procs = [farm.start_worker(farm.host(f"pg{i}", []), "--until-idle", "--name", f"node-{i}") for i in range(3)]
        for p in procs:
            p.communicate(timeout=120)
            assert p.returncode == 0
        farm.wait_for(lambda: hooks.posts and out.exists(), what="both notifications")
        time.sleep(1.0)
        assert [h["X-Cuectl-Event"] for h, _ in hooks.posts] == ["finished"]
        assert out.read_text() == "finished\n"
        assert all(r["delivered_at"] for r in notifications(farm, job))
    finally:
        farm.cleanup()
        server.drop_database(name)
