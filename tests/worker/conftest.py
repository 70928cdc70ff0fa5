"""Fixtures for the worker tests (helpers live in farmlib.py beside this file)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from farmlib import Farm  # noqa: E402


@pytest.fixture
def farm(tmp_path: Path):
    f = Farm(tmp_path)
    yield f
    f.cleanup()


@pytest.fixture
def shared_farm(os_users):
    """A farm as a machine several people use has it (docs/deploy.md): the store and its
    directory belong to root alone, and a root ``cuectl serve --socket`` beside the store
    (``farm.db.sock``) is how the throwaway users' commands reach it (found there by
    ``--db farm.db``). Frames write their ledger into ``out/`` (sticky, like /tmp). Root only."""
    import shutil
    import tempfile
    import time

    from farmlib import cuectl_cmd

    from cuectl.sched.store import open_store

    path = Path(tempfile.mkdtemp(prefix="cuectl-shared-", dir="/tmp"))
    os.chmod(path, 0o755)
    out = path / "out"
    out.mkdir()
    os.chmod(out, 0o1777)
    f = Farm(path)
    f.ledger = out / "ledger.jsonl"
    open_store(str(f.db)).close()
    sock = Path(f"{f.db}.sock")
    server = subprocess.Popen(
        [*cuectl_cmd(), "--db", str(f.db), "serve", "--socket", str(sock), "--no-access-log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not sock.exists() or not os.stat(sock).st_mode & 0o002:  # uvicorn binds, then opens it to all
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"cuectl serve --socket did not start: {server.stderr.read() if server.stderr else ''}")
        time.sleep(0.05)
    f.server_proc = server
    yield f
    f.cleanup()
    server.terminate()
    server.wait(10)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pg_farm(farm, pg_server):
    """The farm on a fresh database of the session's PostgreSQL server (``pg_server``)."""
    name = pg_server.create_database()
    farm.db = pg_server.url(name)  # every `cuectl --db` of the farm now names the database
    # Jobs here are submitted through the superuser role, which proves nothing about the OS
    # user they are labelled with (test_identity covers that): root workers run them as root.
    farm.worker_flags = ["--run-as-worker-user"]
    farm.server = pg_server
    yield farm
    farm.cleanup()  # workers first: they hold connections
    pg_server.drop_database(name)


@pytest.fixture
def solo(tmp_path: Path, monkeypatch):
    """An in-process worker on a GPU-less host "h" (2 CPU slots) over a SQLite store in
    ``tmp_path``: returns (store, worker); the store is closed afterwards."""
    from cuectl.run.service import build_worker
    from cuectl.sched.store import open_store

    monkeypatch.setenv("CUECTL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CUECTL_CREATE_LOCK_DIR", "1")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    fake = tmp_path / "gpus.yaml"
    fake.write_text("host: h\ndevices: []\n")
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(fake))
    monkeypatch.chdir(tmp_path)
    store = open_store(str(tmp_path / "q.db"))
    worker, _ = build_worker(
        store,
        name="h",
        until_idle=True,
        max_frames=None,
        poll=0.05,
        sample_interval=10,
        lease_timeout=60,
        gpu_only=False,
        lock_dir=None,
        tags=[],
        cores=2,
    )
    yield store, worker
    store.close()


@pytest.fixture
def small_log_fs(tmp_path: Path):
    """A 2 MiB tmpfs for the logs (the store stays on the normal disk). Root only; skipped
    where mounting is not allowed (unprivileged containers)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mount = tmp_path / "logfs"
    mount.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)
