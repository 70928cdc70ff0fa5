"""Issue 13 through the CLI: `admin backup` never clobbers, user data is never rich markup
on a real terminal, and small or odd inputs get one clear error (docs/security.md)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cuectl.sched.store import open_store

REPO = Path(__file__).resolve().parents[2]


def cuectl_exe() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def run(db: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, **env)
    return subprocess.run([*cuectl_exe(), "--db", str(db), *args], capture_output=True, text=True, env=full, timeout=60)


# ----------------------------------------------------------------------------- backup


def test_backup_refuses_what_is_not_a_new_or_regular_file(cli, db_path, tmp_path):
    cli("submit", "--name", "x", "--range", "1-3", "--", "true")
    store_bytes = db_path.read_bytes()
    old = tmp_path / "old.db"
    old.write_text("yesterday's backup\n")
    link = tmp_path / "link.db"
    link.symlink_to(old)
    (tmp_path / "a-dir").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        ("/dev/null", "is not a regular file (a character device)"),
        (str(db_path), "is the live store"),
        (f"{db_path}-wal", "is the live store"),
        (f"{db_path}-shm", "is the live store"),
        (str(db_path.parent / ".." / db_path.parent.name / db_path.name), "is the live store"),
        (str(tmp_path / "a-dir"), "is not a regular file (a directory)"),
        (str(fifo), "is not a regular file (a FIFO)"),
        (str(link), "is not a regular file (a symbolic link)"),
        (str(old), "already exists"),
    ]
    before = sorted(os.listdir(tmp_path))
    for target, needle in cases:
        for force in ((), ("--force",)):
            if needle == "already exists" and force:
                continue
            res = cli("admin", "backup", target, *force)
            assert res.exit_code == 2, (target, force, res)
            lines = res.stderr.splitlines()
            assert lines[0].startswith("error: backup target ") and needle in lines[0], (target, res.stderr)
            assert "nothing was written" in lines[0]
            assert all(not line.startswith("error:") for line in lines[1:])
    assert Path("/dev/null").is_char_device()
    assert old.read_text() == "yesterday's backup\n" and link.is_symlink()
    assert sorted(os.listdir(tmp_path)) == before  # no temporary files left behind
    assert db_path.read_bytes()[:100] == store_bytes[:100]
    assert cli("job", "list", "--json").exit_code == 0


def test_backup_replaces_an_existing_file_only_with_force(cli, tmp_path):
    cli("submit", "--name", "x", "--range", "1-3", "--", "true")
    dest = tmp_path / "backup.db"
    assert cli("admin", "backup", str(dest)).exit_code == 0
    cli("submit", "--name", "y", "--range", "1-2", "--", "true")
    assert cli("admin", "backup", str(dest)).exit_code == 2
    copy = open_store(str(dest))
    assert copy.list_frames()[1] == 3
    copy.close()
    assert cli("admin", "backup", str(dest), "--force").exit_code == 0
    copy = open_store(str(dest))
    assert copy.list_frames()[1] == 5
    copy.close()


# ----------------------------------------------------------------------------- markup


def run_on_a_terminal(argv: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal (as a user at a terminal
    would), return its exit status and everything it printed."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
    finally:
        os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the other side is closed
                    break
                if not chunk:
                    break
                out += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=10)
    finally:
        os.close(master)
    return code, out.decode("utf-8", "replace")


def test_user_data_is_never_rich_markup_on_a_terminal(tmp_path):
    db = tmp_path / "store.db"
    gpus = tmp_path / "gpus.yaml"
    gpus.write_text(
        yaml.safe_dump(
            {"host": "h1", "devices": [{"model": "Evil [bold]GPU[/bold] [/]", "vendor": "NVIDIA", "memory": "16G"}]}
        )
    )
    env = dict(os.environ, COLUMNS="200", TERM="xterm-256color", CUECTL_FAKE_GPUS=str(gpus))
    env.pop("NO_COLOR", None)
    names = ["oops[/]", "shot[bold]010", "[red]x[/red] [link=file:///etc/passwd]y"]
    for name in names:
        assert run(db, "submit", "--name", name, "--", "true", **env).returncode == 0
    # The worker's live view (stderr on a terminal) claims these frames and prints their names.
    code, shown = run_on_a_terminal([*cuectl_exe(), "--db", str(db), "worker", "--until-idle", "--poll", "0.05"], env)
    assert code == 0, shown
    for name in names:
        assert name in shown, (name, shown)
    frames = json.loads(run(db, "frame", "list", "--json").stdout)["frames"]
    assert [f["state"] for f in frames] == ["SUCCEEDED"] * 3
    for args in (["job", "list"], ["frame", "list"]):
        code, shown = run_on_a_terminal([*cuectl_exe(), "--db", str(db), *args], env)
        assert code == 0, (args, shown)
        for name in names:
            assert name in shown, (args, name, shown)
        assert "\x1b[1m010" not in shown and "\x1b]8;" not in shown  # no bold, no hyperlink
    code, shown = run_on_a_terminal([*cuectl_exe(), "--db", str(db), "host", "list"], env)
    assert code == 0, shown
    assert "Evil [bold]GPU[/bold] [/]" in shown


# ----------------------------------------------------------------------------- small inputs


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--cores", "0.001"], "--cores: must be at least 0.1"),
        (["--cores", "1e-7"], "--cores: must be at least 0.1"),
        (["--priority", "99999999999"], "--priority: must be at most 2147483647"),
        (["--log-limit", "100K", "--log-limit", "1K"], "--log-limit: must be at least 4K"),
        (["--log-limit", "lots"], "--log-limit"),
    ],
)
def test_small_and_large_submit_inputs_are_refused(cli, db_path, args, needle):
    res = cli("submit", "--name", "x", *args, "--", "true")
    assert res.exit_code == 2 and res.stderr.startswith(f"error: {needle}"), res
    assert not db_path.exists() or cli("job", "list", "--json").json()["jobs"] == []


def test_the_smallest_share_of_a_core_is_accepted(cli):
    job = cli("submit", "--name", "x", "--cores", "0.1", "--", "true")
    assert job.exit_code == 0, job


def test_job_priority_has_the_submit_range(cli):
    job = cli("submit", "--name", "x", "--priority", "2147483647", "--", "true").stdout.strip()
    for bad in ("99999999999", "-99999999999", "2147483648"):
        res = cli("job", "priority", job, "--", bad)
        assert res.exit_code == 2 and res.stderr.startswith("error: PRIORITY: must be"), res
    assert cli("job", "show", job, "--json").json()["priority"] == 2147483647
    assert cli("job", "priority", job, "--", "-2147483647").exit_code == 0


@pytest.mark.parametrize(
    "name",
    [
        "x\u202egnp.exe",
        "a\u200bb",
        "a\u2066b\u2069",
        "a\u2028b",
        "a\ue000b",
        "a\u00a0b",
        "a\ufeffb",
    ],
)
def test_names_with_invisible_characters_are_refused(cli, tmp_path, db_path, name):
    res = cli("submit", "--name", name, "--", "true")
    assert res.exit_code == 2 and res.stderr.startswith("error: --name: must contain only visible"), res
    assert "U+" in res.stderr
    spec = tmp_path / "job.yaml"
    for doc, label in (
        ({"name": name, "layers": [{"name": "a", "command": ["true"]}]}, "name"),
        ({"name": "ok", "layers": [{"name": name, "command": ["true"]}]}, "layers[0].name"),
        ({"name": "ok", "layers": [{"name": "a", "command": ["true"], "tags": [name]}]}, "layers[0].tags"),
        ({"name": "ok", "env": {name: "v"}, "layers": [{"name": "a", "command": ["true"]}]}, "env"),
    ):
        spec.write_text(json.dumps(doc))
        res = cli("submit", str(spec))
        assert res.exit_code == 2 and f"{label}" in res.stderr.splitlines()[0], (doc, res)
    assert not db_path.exists() or cli("job", "list", "--json").json()["jobs"] == []


def test_printable_unicode_names_are_fine(cli):
    res = cli("submit", "--name", "ショット 010 — élan", "--", "true")
    assert res.exit_code == 0, res


@pytest.mark.parametrize(
    "var,value,args",
    [
        ("CUECTL_KILL_GRACE", "abc", ["worker", "--until-idle"]),
        ("CUECTL_BUSY_TIMEOUT", "abc", ["job", "list"]),
        ("CUECTL_BUSY_TIMEOUT", "-1", ["job", "list"]),
        ("CUECTL_FRAME_LIMIT", "abc", ["submit", "--name", "x", "--", "true"]),
        ("CUECTL_FRAME_LIMIT", "0", ["submit", "--name", "x", "--", "true"]),
        ("CUECTL_LOG_LIMIT", "abc", ["worker", "--until-idle"]),
        ("CUECTL_LOG_LIMIT", "10", ["worker", "--until-idle"]),  # 10 MiB: fine
        ("CUECTL_LOG_LIMIT", "1K", ["worker", "--until-idle"]),
    ],
)
def test_bad_environment_values_are_one_error_naming_the_variable(tmp_path, var, value, args):
    db = tmp_path / "store.db"
    assert run(db, "submit", "--name", "seed", "--", "true").returncode == 0
    res = run(db, *args, **{var: value})
    if value == "10":
        assert res.returncode == 0, res.stderr
        return
    assert res.returncode == 2, res
    lines = res.stderr.splitlines()
    assert lines[0].startswith(f"error: {var}={value!r} is not valid: expected "), res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    assert len([line for line in lines if line.startswith("error:")]) == 1


def test_auto_migrate_is_a_yes_or_no(monkeypatch):
    from cuectl import config
    from cuectl.errors import InvalidInput

    for word, expected in (("0", False), ("off", False), ("yes", True), ("1", True)):
        monkeypatch.setenv("CUECTL_AUTO_MIGRATE", word)
        assert config.auto_migrate() is expected
    monkeypatch.setenv("CUECTL_AUTO_MIGRATE", "maybe")
    with pytest.raises(InvalidInput, match="CUECTL_AUTO_MIGRATE='maybe' is not valid"):
        config.auto_migrate()
