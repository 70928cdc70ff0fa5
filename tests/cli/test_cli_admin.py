"""`cuectl admin` reap/prune/backup/doctor through the CLI on real stores."""

from __future__ import annotations

import os
import time

from cuectl.sched.store import FrameResult, open_store


def test_doctor_reports_a_healthy_store(cli, monkeypatch, tmp_path):
    cli("submit", "--name", "x", "--", "true")
    res = cli("admin", "doctor", "--json")
    assert res.exit_code == 0, res
    checks = {c["name"]: c for c in res.json()["checks"]}
    assert checks["store"]["status"] == "ok" and "schema version" in checks["store"]["detail"]
    assert checks["store integrity"]["status"] == "ok"
    assert any(name.startswith("gpu backend ") for name in checks)
    assert "lock dir" in checks


def test_doctor_explains_a_broken_store(cli, db_path):
    db_path.parent.mkdir(parents=True, exist_ok=True)
    db_path.write_bytes(os.urandom(8192))
    res = cli("admin", "doctor")
    assert res.exit_code == 1
    assert "FAIL" in res.stdout and "not a usable cuectl store" in res.stdout


def test_prune_deletes_old_finished_jobs_and_logs(cli, db_path):
    job_id = int(cli("submit", "--name", "old", "--", "true").stdout)
    keep = int(cli("submit", "--name", "running", "--", "true").stdout)
    store = open_store(str(db_path))
    layer = [r for r in store.runnable_layers() if r.job_id == job_id][0]
    c = store.claim_frame(layer.layer_id, host="h", worker="w", gpu_uuids=[], now=time.time() - 90000, lease_s=60)
    log_dir = db_path.parent / f"{db_path.name}-logs" / str(job_id)
    log_dir.mkdir(parents=True)
    (log_dir / "0001-main.1.log").write_text("hello\n")
    store.complete_frame(c.frame_id, 1, FrameResult(exit_code=0), now=time.time() - 86400 * 2)
    store.close()
    assert cli("admin", "prune", "--older-than", "bogus").exit_code == 2
    res = cli("admin", "prune", "--older-than", "1d", "--json")
    assert res.json() == {"jobs": [job_id], "log_dirs_removed": 1}
    assert not log_dir.exists()
    assert [j["id"] for j in cli("job", "list", "--json").json()["jobs"]] == [keep]


def test_backup_and_reap(cli, tmp_path):
    cli("submit", "--name", "x", "--range", "1-3", "--", "true")
    dest = tmp_path / "b.db"
    assert cli("admin", "backup", str(dest)).exit_code == 0
    copy = open_store(str(dest))
    assert copy.list_frames()[1] == 3
    copy.close()
    assert cli("admin", "reap", "--json").json() == {"reaped": []}
