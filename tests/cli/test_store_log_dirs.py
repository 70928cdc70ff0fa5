"""Each SQLite store keeps its frame logs apart by default (issue 41, section 4): two
stores in one directory wrote frame 2 of one store's job 1 into frame 2 of the other's.
Logs go to ``<store file>-logs/`` beside the store; ``logs/``, where they went before (one
for every store of the directory), is still read, never written. Real workers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from conftest import cuectl_cmd, subprocess_env

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store


def cuectl(db: Path, *args: str) -> subprocess.CompletedProcess:
    env = subprocess_env()
    env.pop("CUECTL_LOG_DIR", None)
    env.pop("CUECTL_FAKE_GPUS", None)
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), *args], capture_output=True, text=True, env=env, timeout=120, cwd=db.parent
    )
    assert res.returncode == 0, (args, res.stderr)
    return res


def test_two_stores_in_one_directory_write_their_own_logs(tmp_path):
    first, second = tmp_path / "first.db", tmp_path / "second.db"
    for db in (first, second):
        # The same job id and frame names in both stores: job 1, frames 0001-main, 0002-main.
        cuectl(db, "submit", "--range", "1-2", "--", "sh", "-c", f"echo {db.stem} frame $CUE_IFRAME")
        cuectl(db, "worker", "--until-idle", "--poll", "0.05")
    for db, other in ((first, second), (second, first)):
        log = cuectl(db, "frame", "log", "1/0002-main").stdout
        assert f"{db.stem} frame 2" in log and other.stem not in log, log
        path = Path(cuectl(db, "frame", "show", "1/0002-main", "--json").stdout.split('"log_path": "')[1].split('"')[0])
        assert path.parent == tmp_path / f"{db.name}-logs" / "1", path
    assert not (tmp_path / "logs").exists()


def test_logs_written_before_in_the_shared_logs_dir_are_still_read(tmp_path):
    db = tmp_path / "cuectl.db"
    legacy = tmp_path / "logs"
    store = open_store(str(db), log_dir=legacy)  # as an older release opened it
    try:
        store.submit(
            spec_from_mapping({"name": "old", "layers": [{"name": "main", "command": ["true"]}]}, user="alice"),
            now=time.time(),
        )
        claimed = store.claim_frame(
            store.runnable_layers()[0].layer_id, host="h", worker="w", gpu_uuids=[], now=time.time(), lease_s=600
        )
    finally:
        store.close()
    assert Path(claimed.log_path).parent == legacy / "1"
    Path(claimed.log_path).parent.mkdir(parents=True)
    Path(claimed.log_path).write_text("written by an older release\n")
    assert cuectl(db, "frame", "log", "old/0001-main").stdout == "written by an older release\n"
    reopened = open_store(str(db), create=False)
    try:
        assert reopened.log_dir == tmp_path / "cuectl.db-logs" and reopened.older_log_dirs == (legacy,)
    finally:
        reopened.close()
