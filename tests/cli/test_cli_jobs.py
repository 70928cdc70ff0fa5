"""The CLI in-process: submit/job/frame/host on real SQLite stores, JSON shapes, and bad
input that must give one `error:` line, exit 2, and change nothing."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

JOB_KEYS = {"id", "name", "user", "priority", "state", "paused", "created_at", "frame_counts", "pending_reason"}
LAYER_KEYS = {
    "name",
    "command",
    "range",
    "chunk",
    "gpus",
    "gpu_vendor",
    "gpu_models",
    "gpu_memory_min_bytes",
    "cores",
    "memory_bytes",
    "retries",
    "timeout_s",
    "tags",
    "depends",
}
FRAME_KEYS = {
    "id",
    "job_id",
    "job",
    "layer",
    "number",
    "name",
    "state",
    "attempts",
    "host",
    "gpu_uuids",
    "exit_code",
    "exit_signal",
    "started_at",
    "ended_at",
    "gpu_util_mean_pct",
    "gpu_util_max_pct",
    "gpu_memory_peak_bytes",
    "gpu_seconds",
    "max_rss_bytes",
}
HOST_KEYS = {"name", "state", "locked", "last_heartbeat", "cores", "memory_bytes", "gpus"}


def store_digest(db: Path) -> str:
    """Contents of every table, so 'nothing changed' is checked on the data, not the file."""
    if not db.exists():
        return "absent"
    import sqlite3

    conn = sqlite3.connect(db)
    h = hashlib.sha256()
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name"):
        for row in conn.execute(f"SELECT * FROM {name} ORDER BY 1"):
            h.update(repr(row).encode())
    conn.close()
    return h.hexdigest()


@pytest.mark.store_file  # asserts that the file was never created
def test_reading_commands_never_create_a_store(cli, db_path):
    """A mistyped --db/CUECTL_DB is an error naming the path, not an empty queue forever."""
    for args in (
        ["job", "list"],
        ["frame", "list"],
        ["host", "list"],
        ["job", "show", "1"],
        ["admin", "report"],
        ["admin", "reap"],
    ):
        res = cli(*args)
        assert res.exit_code == 1, (args, res)
        assert res.stderr.startswith(f"error: no store at {db_path}"), (args, res)
    assert not db_path.exists() and not db_path.parent.exists()


def test_empty_store_lists(cli, db_path):
    from cuectl.sched.store import open_store

    open_store(str(db_path)).close()
    assert cli("job", "list", "--json").json() == {"jobs": []}
    assert cli("frame", "list", "--json").json() == {"frames": [], "total": 0, "truncated": False}
    assert cli("host", "list", "--json").json() == {"hosts": []}
    res = cli("job", "list")
    assert res.exit_code == 0 and "ID" in res.stdout


def test_submit_flags_and_show(cli):
    res = cli(
        "submit",
        "--name",
        "shot",
        "--range",
        "1-10",
        "--chunk",
        "2",
        "--gpus",
        "1",
        "--gpu-vendor",
        "nvidia",
        "--gpu-model",
        "A100",
        "--gpu-memory-min",
        "40G",
        "--priority",
        "5",
        "--env",
        "A=1",
        "--",
        "render",
        "-f",
        "#IFRAME#",
    )
    assert res.exit_code == 0, res
    job_id = int(res.stdout.strip())
    job = cli("job", "show", str(job_id), "--json").json()
    assert JOB_KEYS <= set(job) and LAYER_KEYS <= set(job["layers"][0])
    assert job["frame_counts"] == {"WAITING": 5} and job["priority"] == 5
    assert job["layers"][0]["command"] == ["render", "-f", "#IFRAME#"]
    assert job["layers"][0]["gpu_memory_min_bytes"] == 40 * 1024**3
    assert job["pending_reason"] == "layer main: no host registered (start `cuectl worker`)"
    frames = cli("frame", "list", "--job", "shot", "--json").json()["frames"]
    assert FRAME_KEYS <= set(frames[0]) and frames[0]["name"] == "0001-main"
    text = cli("job", "show", "shot")
    assert text.exit_code == 0 and "no host registered" in text.stdout


def test_submit_spec_file_and_json(cli, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        'name: comp\nlayers:\n  - name: a\n    command: "echo #IFRAME#"\n    range: 1-3\n'
        "  - name: b\n    command: [echo, b]\n    range: 1-3\n    depends: [{layer: a, type: frame}]\n"
    )
    res = cli("submit", str(spec), "--json")
    assert res.exit_code == 0, res
    job = res.json()
    assert job["frame_counts"] == {"WAITING": 3, "DEPEND": 3}
    assert job["layers"][1]["depends"] == [{"layer": "a", "type": "frame"}]
    assert "waiting" in cli("job", "list").stdout.lower()


def test_job_controls(cli):
    job_id = cli("submit", "--name", "ctl", "--range", "1-4", "--", "true").stdout.strip()
    assert cli("job", "pause", job_id, "--json").json()["paused"] is True
    assert "paused" in cli("job", "show", job_id, "--json").json()["pending_reason"]
    assert cli("job", "resume", job_id).exit_code == 0
    assert cli("job", "priority", job_id, "42", "--json").json()["priority"] == 42
    frames = cli("frame", "list", "--job", job_id, "--json").json()["frames"]
    res = cli("frame", "eat", str(frames[0]["id"]), "--json")
    assert res.json()["frames"][0]["state"] == "EATEN"
    assert cli("frame", "kill", str(frames[1]["id"])).exit_code == 0
    assert cli("frame", "show", str(frames[1]["id"]), "--json").json()["state"] == "DEAD"
    assert cli("frame", "retry", str(frames[1]["id"])).exit_code == 0
    assert cli("frame", "list", "--job", job_id, "--state", "waiting", "--json").json()["total"] == 3
    killed = cli("job", "kill", job_id, "--json").json()
    assert killed["state"] == "FINISHED" and killed["frame_counts"] == {"EATEN": 4}
    # A killed job says so, in words and in JSON; FINISHED alone looked like success.
    assert killed["outcome"] == "KILLED"
    listed = [
        line.split("\t") for line in cli("job", "list").stdout.splitlines() if line.split()[:2] == [job_id, "ctl"]
    ]
    assert len(listed) == 1 and "KILLED" in listed[0] and "FINISHED" not in listed[0]
    assert "KILLED" in cli("job", "show", job_id).stdout
    retried = cli("job", "retry", job_id, "--json").json()
    assert retried["frame_counts"] == {"WAITING": 4} and retried["state"] == "PENDING"
    assert retried["outcome"] is None


def test_frame_list_limit_says_it_cut(cli):
    cli("submit", "--name", "many", "--range", "1-30", "--", "true")
    res = cli("frame", "list", "--limit", "10")
    assert res.exit_code == 0 and "showing 10 of 30 frames" in res.stderr
    data = cli("frame", "list", "--limit", "10", "--json").json()
    assert len(data["frames"]) == 10 and data["total"] == 30 and data["truncated"] is True


def test_not_found_is_exit_1(cli):
    for args in (
        ("job", "show", "nope"),
        ("frame", "show", "99"),
        ("host", "show", "h"),
        ("host", "lock", "h"),
        ("frame", "retry", "5"),
    ):
        res = cli(*args)
        assert res.exit_code == 1, (args, res)
        assert res.stderr.startswith("error: ") and "Traceback" not in res.stderr


BAD_SPECS = {
    "malformed.yaml": ("name: x\nlayers: [\n", "YAML"),
    "unknown-key.yaml": ("name: x\nlayers:\n  - name: a\n    command: echo\n    gpu: 1\n", "unknown key 'gpu'"),
    "bad-range.yaml": ("name: x\nlayers:\n  - name: a\n    command: echo\n    range: 1-x\n", "1-x"),
    "negative.yaml": ("name: x\nlayers:\n  - name: a\n    command: echo\n    gpus: -1\n", "gpus"),
    "vendor.yaml": ("name: x\nlayers:\n  - name: a\n    command: echo\n    gpus: 1\n    gpu_vendor: NVIDA\n", "NVIDA"),
    "size.yaml": ("name: x\nlayers:\n  - name: a\n    command: echo\n    gpus: 1\n    gpu_memory_min: 8X\n", "8X"),
    "huge.yaml": ("name: x\nlayers:\n  - name: a\n    command: echo\n    range: 1-1000000000\n", "limit"),
    "not-a-mapping.yaml": ("- just\n- a list\n", "mapping"),
}


@pytest.mark.parametrize("name", sorted(BAD_SPECS))
def test_bad_specs_exit_2_and_change_nothing(cli, tmp_path, db_path, name):
    cli("submit", "--name", "existing", "--", "true")
    before = store_digest(db_path)
    text, needle = BAD_SPECS[name]
    spec = tmp_path / name
    spec.write_text(text)
    res = cli("submit", str(spec))
    assert res.exit_code == 2, res
    assert res.stderr.startswith("error: ") and needle.lower() in res.stderr.lower()
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert store_digest(db_path) == before


@pytest.mark.parametrize(
    "args,needle",
    [
        (("submit", "--name", "x", "--range", "5-", "--", "true"), "5-"),
        (("submit", "--name", "x", "--gpus", "-2", "--", "true"), "gpus"),
        (("submit", "--name", "x", "--gpus", "1", "--gpu-vendor", "3dfx", "--", "true"), "3dfx"),
        (("submit", "--name", "x", "--gpus", "1", "--gpu-memory-min", "lots", "--", "true"), "lots"),
        (("submit", "--name", "x", "--range", "1-999999999", "--", "true"), "limit"),
        (("submit", "--name", "x", "--env", "NOEQUALS", "--", "true"), "NOEQUALS"),
        (("submit", "--name", "x"), "command"),
        (("submit", "a.yaml", "b.yaml"), "one job spec"),
        (("submit", str(Path("/nonexistent/spec.yaml"))), "spec.yaml"),
        (("frame", "list", "--state", "BOGUS"), "BOGUS"),
        (("frame", "list", "--limit", "0"), "--limit"),
        (("frame", "retry", "abc"), "frame 'abc': expected a frame id or JOB/FRAME"),
        (("job", "priority", "1", "high"), "priority"),
        (
            (
                "job",
                "bogus",
            ),
            "bogus",
        ),
    ],
)
def test_bad_flags_exit_2_and_change_nothing(cli, db_path, args, needle):
    cli("submit", "--name", "existing", "--", "true")
    before = store_digest(db_path)
    res = cli(*args)
    assert res.exit_code == 2, res
    assert res.stderr.startswith("error: ") and needle.lower() in res.stderr.lower(), res.stderr
    assert "Traceback" not in res.stderr
    assert store_digest(db_path) == before


def test_hostile_names_are_stored_verbatim(cli):
    name = "shot 'A'; $(touch /tmp/cuectl-pwned) ../../etc"
    job_id = cli("submit", "--name", name, "--", "true").stdout.strip()
    assert cli("job", "show", job_id, "--json").json()["name"] == name
    assert not Path("/tmp/cuectl-pwned").exists()


def test_executable_error_mapping_and_version(tmp_path):
    exe = Path(sys.executable).with_name("cuectl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]
    from cuectl.sched.store import open_store

    open_store(str(tmp_path / "x.db")).close()
    res = subprocess.run([*cmd, "--db", str(tmp_path / "x.db"), "job", "show", "nope"], capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.startswith("error: no job 'nope'")
    res = subprocess.run([*cmd, "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.startswith("cuectl ")
    bad = tmp_path / "garbage.db"
    bad.write_bytes(b"\x00" * 100 + b"not sqlite" * 500)
    res = subprocess.run([*cmd, "--db", str(bad), "job", "list"], capture_output=True, text=True)
    assert res.returncode == 1 and "not a usable cuectl store" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([*cmd, "--debug", "--db", str(bad), "job", "list"], capture_output=True, text=True)
    assert res.returncode == 1 and "Traceback" in res.stderr
