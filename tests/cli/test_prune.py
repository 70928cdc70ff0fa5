"""`cuectl admin prune` (issue 17): --dry-run lists what would go and changes nothing; on a
terminal it asks before deleting (not with --yes, never without a terminal); job and frame
ids are never reused after a prune, on either backend."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from conftest import cuectl_cmd
from ttydriver import on_terminal  # tests/ttydriver.py (tests/ is on sys.path)

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, open_store

OLD = time.time() - 3 * 86400


def finished_jobs(url: str, *names: str, frames: str = "1-2") -> tuple[list[int], list[int]]:
    """Submit a job per name and run every frame to success, 3 days ago; return job ids and frame ids."""
    store = open_store(url)
    try:
        job_ids = [
            store.submit(
                spec_from_mapping(
                    {"name": n, "layers": [{"name": "a", "command": ["true"], "range": frames}]}, user="alice"
                ),
                now=OLD,
            )
            for n in names
        ]
        frame_ids = []
        while layers := store.runnable_layers():
            claimed = store.claim_frame(layers[0].layer_id, host="h1", worker="w", gpu_uuids=[], now=OLD, lease_s=60)
            assert claimed is not None
            store.complete_frame(
                claimed.frame_id,
                claimed.attempt,
                FrameResult(exit_code=0, started_at=OLD, ended_at=OLD + 1),
                now=OLD + 1,
            )
            frame_ids.append(claimed.frame_id)
        assert all(store.get_job(j)["state"] == "FINISHED" for j in job_ids)
        return job_ids, sorted(frame_ids)
    finally:
        store.close()


def log_dir(url: str) -> Path:
    store = open_store(url)
    try:
        return store.log_dir
    finally:
        store.close()


def job_ids(cli, url: str) -> list[int]:
    return [j["id"] for j in cli("--db", url, "job", "list", "--json", db=False).json()["jobs"]]


def test_ids_are_never_reused_after_a_prune(cli, store_url: str) -> None:
    jobs1, frames1 = finished_jobs(store_url, "a", "b")
    res = cli("--db", store_url, "admin", "prune", "--older-than", "1d", "--json", db=False)
    assert res.exit_code == 0, res
    assert res.json()["jobs"] == jobs1
    assert job_ids(cli, store_url) == []
    jobs2, frames2 = finished_jobs(store_url, "c")
    assert min(jobs2) > max(jobs1) and min(frames2) > max(frames1), (jobs1, frames1, jobs2, frames2)
    # Again, with the store reopened in between (SQLite: ids past sqlite_sequence, not MAX(id)).
    cli("--db", store_url, "admin", "prune", "--older-than", "1d", db=False)
    jobs3, frames3 = finished_jobs(store_url, "d")
    assert min(jobs3) > max(jobs2) and min(frames3) > max(frames2)


def test_dry_run_lists_jobs_and_log_dirs_and_deletes_nothing(cli, db_path: Path) -> None:
    url = str(db_path)
    (first, second), _ = finished_jobs(url, "old-one", "old-two")
    logs = log_dir(url) / str(first)
    logs.mkdir(parents=True)
    (logs / "frame.log").write_text("x\n")
    res = cli("admin", "prune", "--older-than", "1d", "--dry-run", "--json")
    assert res.exit_code == 0, res
    data = res.json()
    assert data["dry_run"] is True
    assert [(j["id"], j["name"], j["user"], j["log_dir"]) for j in data["jobs"]] == [
        (first, "old-one", "alice", str(logs)),
        (second, "old-two", "alice", None),
    ]
    assert all(j["finished_at"].endswith("Z") for j in data["jobs"])
    res = cli("admin", "prune", "--older-than", "1d", "--dry-run")
    assert res.exit_code == 0, res
    assert "old-one" in res.stdout and str(logs) in res.stdout
    assert res.stdout.splitlines()[-1] == "would prune 2 finished job(s) and 1 log dir(s) (dry run: nothing deleted)"
    assert sorted(job_ids(cli, url)) == [first, second]
    assert logs.is_dir()
    # Nothing old enough: an empty list.
    assert cli("admin", "prune", "--older-than", "30d", "--dry-run", "--json").json() == {"dry_run": True, "jobs": []}
    # The real prune deletes exactly what was listed, logs too.
    data = cli("admin", "prune", "--older-than", "1d", "--json").json()
    assert data == {"jobs": [first, second], "log_dirs_removed": 1}
    assert not logs.exists() and job_ids(cli, url) == []


def test_no_terminal_no_question(db_path: Path) -> None:
    """Scripts and cron: stdin and stdout are not a terminal, so prune deletes without asking."""
    finished_jobs(str(db_path), "old")
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db_path), "admin", "prune", "--older-than", "1d"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == "pruned 1 finished job(s)\n" and "[y/N]" not in res.stderr


def _on_terminal(db: Path, *args: str, answer: bytes | None) -> tuple[int, str]:
    """Run `cuectl --db DB admin prune ARGS` on a pty; answer its question if one comes."""
    return on_terminal([*cuectl_cmd(), "--db", str(db), "admin", "prune", *args], answer=answer)


def test_on_a_terminal_it_asks_first(cli, db_path: Path) -> None:
    url = str(db_path)
    jobs, _ = finished_jobs(url, "old-one", "old-two")
    code, text = _on_terminal(db_path, "--older-than", "1d", answer=b"n\n")
    assert "delete 2 jobs? [y/N]" in text
    assert code == 1 and "nothing deleted" in text, text
    assert sorted(job_ids(cli, url)) == jobs
    code, text = _on_terminal(db_path, "--older-than", "1d", answer=b"\n")  # the default is no
    assert code == 1 and sorted(job_ids(cli, url)) == jobs, text
    code, text = _on_terminal(db_path, "--older-than", "1d", answer=b"y\n")
    assert code == 0 and "pruned 2 finished job(s)" in text, text
    assert job_ids(cli, url) == []


def test_on_a_terminal_yes_and_dry_run_do_not_ask(cli, db_path: Path) -> None:
    url = str(db_path)
    finished_jobs(url, "old")
    code, text = _on_terminal(db_path, "--older-than", "1d", "--dry-run", answer=None)
    assert code == 0 and "[y/N]" not in text and "would prune 1" in text, text
    code, text = _on_terminal(db_path, "--older-than", "1d", "--yes", answer=None)
    assert code == 0 and "[y/N]" not in text and "pruned 1 finished job(s)" in text, text
    # Nothing to delete: nothing to ask.
    code, text = _on_terminal(db_path, "--older-than", "1d", answer=None)
    assert code == 0 and "[y/N]" not in text and "pruned 0" in text, text
