"""Bulk job and frame actions end to end (issue 17, item 8): `job kill|pause|resume|retry|
priority` over several JOBs or the jobs --user/--state/--name select; `frame kill|retry|eat`
over several FRAMEs or the frames --job/--layer/--state/--range select. On a terminal a bulk
change asks first (not with --yes); without one (scripts) it goes ahead, as `admin prune`.
A real SQLite store, real subprocesses for the terminal and the other-user cases."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from cli.test_cli_jobs import store_digest
from conftest import cuectl_cmd
from ttydriver import on_terminal  # tests/ttydriver.py (tests/ is on sys.path)

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, open_store

NOW = time.time()


def submit(db: Path, name: str, *, user: str = "alice", range_: str = "1-3", layers=None) -> int:
    layers = layers or [{"name": "render", "command": ["true"], "range": range_}]
    store = open_store(str(db))
    try:
        return store.submit(spec_from_mapping({"name": name, "layers": layers}, user=user), now=NOW)
    finally:
        store.close()


def succeed_all(db: Path) -> None:
    store = open_store(str(db))
    try:
        while layers := store.runnable_layers():
            c = store.claim_frame(layers[0].layer_id, host="h1", worker="w", gpu_uuids=[], now=NOW, lease_s=60)
            assert c is not None
            store.complete_frame(
                c.frame_id, c.attempt, FrameResult(exit_code=0, started_at=NOW, ended_at=NOW + 1), now=NOW + 1
            )
    finally:
        store.close()


def job(cli, job_id: int) -> dict:
    return cli("job", "show", str(job_id), "--json").json()


def test_several_jobs_at_once(cli, db_path):
    a, b, c = (submit(db_path, n) for n in ("a", "b", "c"))
    res = cli("job", "kill", a, "b", "--json")
    assert res.exit_code == 0, res
    jobs = res.json()["jobs"]
    assert [(j["id"], j["outcome"], j["frame_counts"]) for j in jobs] == [
        (a, "KILLED", {"EATEN": 3}),
        (b, "KILLED", {"EATEN": 3}),
    ]
    assert "layers" not in jobs[0]  # job list's shape
    assert job(cli, c)["frame_counts"] == {"WAITING": 3}
    res = cli("job", "retry", a, b)
    assert res.exit_code == 0 and res.stdout.splitlines() == [
        f"retrying dead frames of job {a} a",
        f"retrying dead frames of job {b} b",
    ], res
    assert [j["paused"] for j in cli("job", "pause", a, b, c, "--json").json()["jobs"]] == [True] * 3
    assert cli("job", "resume", a, c).stdout.splitlines() == [f"resumed job {a} a", f"resumed job {c} c"]
    assert job(cli, b)["paused"] is True and job(cli, a)["paused"] is False
    # priority: JOB... then P; the one-job form keeps its shape (the job, as job show).
    assert [j["priority"] for j in cli("job", "priority", a, b, "7", "--json").json()["jobs"]] == [7, 7]
    single = cli("job", "priority", c, "42", "--json").json()
    assert single["priority"] == 42 and "layers" in single
    assert cli("job", "kill", c, "--json").json()["outcome"] == "KILLED"


def test_selectors_user_state_name(cli, db_path):
    mine = [submit(db_path, f"shot010-{i}") for i in range(3)]
    other = submit(db_path, "shot010-bob", user="bob")
    unrelated = submit(db_path, "comp-1")
    done = submit(db_path, "shot010-done", range_="1")
    # Finish `done` alone: pause the rest first so the claim loop only sees it.
    assert cli("job", "pause", *map(str, [*mine, other, unrelated])).exit_code == 0
    succeed_all(db_path)
    assert job(cli, done)["outcome"] == "SUCCEEDED"
    # --user: only bob's; --name: a glob; both: AND.
    res = cli("job", "resume", "--user", "bob", "--json")
    assert [j["id"] for j in res.json()["jobs"]] == [other]
    res = cli("job", "resume", "--name", "shot010-*", "--user", "alice", "--json")
    assert [j["id"] for j in res.json()["jobs"]] == mine  # not bob's, not the finished one
    assert job(cli, unrelated)["paused"] is True
    assert [j["id"] for j in cli("job", "priority", "--name", "comp-?", "5", "--json").json()["jobs"]] == [unrelated]
    # kill by selectors touches PENDING jobs only: a finished job is not relabelled KILLED.
    res = cli("job", "kill", "--name", "shot010-*", "--json")
    assert sorted(j["id"] for j in res.json()["jobs"]) == sorted([*mine, other])
    assert job(cli, done)["outcome"] == "SUCCEEDED" and job(cli, unrelated)["state"] == "PENDING"
    # --state picks how a finished job ended; retry with no --state: jobs with something to retry.
    assert [j["id"] for j in cli("job", "retry", "--state", "killed", "--user", "bob", "--json").json()["jobs"]] == [
        other
    ]
    res = cli("job", "retry", "--user", "alice", "--json")
    assert [j["id"] for j in res.json()["jobs"]] == mine  # not `done` (nothing dead or eaten), nor comp-1
    assert {j["state"] for j in res.json()["jobs"]} == {"PENDING"}
    # Nothing selected: nothing changed, said on stderr, exit 0.
    res = cli("job", "kill", "--user", "nobody-here")
    assert res.exit_code == 0 and "no jobs match" in res.stderr and res.stdout == "", res
    assert cli("job", "kill", "--user", "nobody-here", "--json").json() == {"jobs": []}


def test_frames_by_job_layer_state_and_range(cli, db_path):
    j = submit(
        db_path,
        "shot",
        layers=[
            {"name": "sim", "command": ["true"], "range": "1-4"},
            {"name": "render", "command": ["true"], "range": "1-20"},
        ],
    )
    res = cli("frame", "kill", "--job", "shot", "--layer", "render", "--range", "1-10x2", "--json")
    assert res.exit_code == 0, res
    killed = res.json()["frames"]
    assert [(f["layer"], f["number"], f["state"]) for f in killed] == [("render", n, "DEAD") for n in (1, 3, 5, 7, 9)]
    res = cli("frame", "retry", "--job", str(j), "--state", "dead")
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 5, res
    res = cli("frame", "eat", "--job", str(j), "--layer", "sim", "--json")
    assert [f["state"] for f in res.json()["frames"]] == ["EATEN"] * 4
    assert job(cli, j)["frame_counts"] == {"EATEN": 4, "WAITING": 20}
    ids = [f["id"] for f in cli("frame", "list", "--job", str(j), "--layer", "render", "--json").json()["frames"]]
    res = cli("frame", "eat", str(ids[0]), str(ids[1]), "--json")
    assert [f["id"] for f in res.json()["frames"]] == ids[:2]
    res = cli("frame", "kill", "--job", str(j), "--range", "500-600")
    assert res.exit_code == 0 and "no frames match" in res.stderr
    res = cli("frame", "kill", "--job", str(j), "--layer", "nope")
    assert res.exit_code == 1 and "no layer 'nope'" in res.stderr, res


@pytest.mark.parametrize(
    "args, needle",
    [
        (("job", "kill"), "which jobs"),
        (("job", "pause"), "which jobs"),
        (("job", "priority", "5"), "which jobs"),
        (("job", "kill", "1", "--user", "alice"), "not both"),
        (("job", "kill", "--state", "SLEEPING"), "SLEEPING"),
        (("job", "retry", "--name", ""), "--name"),
        (("job", "priority", "1", "2", "high"), "PRIORITY"),
        (("job", "priority", "--user", "alice", "2", "3"), "not both"),
        (("frame", "kill"), "which frames"),
        (("frame", "eat", "1", "--job", "1"), "not both"),
        (("frame", "kill", "--range", "1-3"), "--job"),
        (("frame", "kill", "--layer", "render"), "--job"),
        (("frame", "retry", "--job", "1", "--range", "1-3x0"), "--range"),
        (("frame", "retry", "--job", "1", "--state", "ASLEEP"), "ASLEEP"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(cli, db_path, args, needle):
    submit(db_path, "x")
    before = store_digest(db_path)
    res = cli(*args)
    assert res.exit_code == 2, res
    assert res.stderr.startswith("error: ") and needle in res.stderr, res
    assert store_digest(db_path) == before


def test_unknown_job_among_several_changes_nothing(cli, db_path):
    a = submit(db_path, "a")
    before = store_digest(db_path)
    res = cli("job", "kill", str(a), "nope")
    assert res.exit_code == 1 and "no job 'nope'" in res.stderr, res
    res = cli("frame", "eat", "1", "999999")
    assert res.exit_code == 1 and "no frame 999999" in res.stderr, res
    assert store_digest(db_path) == before


def test_no_terminal_no_question(db_path):
    """Scripts: stdin and stdout are not a terminal, so a bulk kill goes ahead without --yes."""
    ids = [submit(db_path, f"s{i}") for i in range(3)]
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db_path), "job", "kill", "--name", "s*"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"killed job {i} s{n}" for n, i in enumerate(ids)]
    assert "[y/N]" not in res.stderr


def _on_terminal(db: Path, *args: str, answer: bytes | None) -> tuple[int, str]:
    """Run `cuectl --db DB ARGS` on a pty; answer its question if one comes."""
    return on_terminal([*cuectl_cmd(), "--db", str(db), *args], answer=answer)


def test_on_a_terminal_a_bulk_change_asks_first(cli, db_path):
    ids = [submit(db_path, f"shot-{i}") for i in range(7)]
    before = store_digest(db_path)
    code, text = _on_terminal(db_path, "job", "kill", "--name", "shot-*", answer=b"n\n")
    assert f"kill 7 jobs ({ids[0]} shot-0, {ids[1]} shot-1" in text and "and 2 more)? [y/N]" in text, text
    assert code == 1 and "nothing changed" in text and "--yes" in text, text
    code, text = _on_terminal(db_path, "job", "kill", str(ids[0]), str(ids[1]), answer=b"\n")  # default: no
    assert code == 1 and f"kill 2 jobs ({ids[0]}, {ids[1]})? [y/N]" in text, text
    frames = [str(f["id"]) for f in cli("frame", "list", "--json").json()["frames"][:2]]
    code, text = _on_terminal(db_path, "frame", "eat", *frames, answer=b"n\n")
    assert code == 1 and "eat 2 frames" in text, text
    assert store_digest(db_path) == before
    # Pausing by id changes nothing lasting: not asked. One job: never asked.
    code, text = _on_terminal(db_path, "job", "pause", str(ids[0]), str(ids[1]), answer=None)
    assert code == 0 and "[y/N]" not in text, text
    code, text = _on_terminal(db_path, "job", "kill", str(ids[0]), answer=None)
    assert code == 0 and "[y/N]" not in text and f"killed job {ids[0]}" in text, text
    code, text = _on_terminal(db_path, "job", "kill", "--name", "shot-*", answer=b"y\n")
    assert code == 0 and "kill 6 jobs" in text and f"killed job {ids[6]} shot-6" in text, text
    code, text = _on_terminal(db_path, "job", "retry", "--name", "shot-*", "--yes", answer=None)
    assert code == 0 and "[y/N]" not in text and f"retrying dead frames of job {ids[6]}" in text, text


# -- another user's jobs: all or nothing (real throwaway users, root only) ---------------------------
@pytest.fixture
def group_store(os_users):
    """A store in a setgid directory the throwaway users' group shares (docs/security.md)."""
    path = Path(tempfile.mkdtemp(prefix="cuectl-bulk-", dir="/tmp"))
    os.chown(path, 0, os_users.group_gid)
    os.chmod(path, 0o2770)
    db = path / "cuectl.db"
    open_store(str(db)).close()  # root's file: root is the store's admin, alice and bob are not
    for file in path.glob("cuectl.db*"):
        file.chmod(0o660)
    yield db
    shutil.rmtree(path, ignore_errors=True)


def _as(user, db: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("CUECTL_FAKE_GPUS", None)
    res = user.run([*cuectl_cmd(), "--db", str(db), *args], env=env, cwd=db.parent)
    for file in db.parent.glob(db.name + "*"):  # a group store: members write it
        file.chmod(0o660)
    return res


def test_a_bulk_action_over_someone_elses_jobs_changes_nothing(group_store, os_users):
    alice, bob = os_users("alice", "bob")
    ids = {}
    for user, name in ((alice, "a1"), (alice, "a2"), (bob, "b1"), (bob, "b2")):
        res = _as(user, group_store, "submit", "--name", name, "--range", "1-2", "--", "true")
        assert res.returncode == 0, res.stderr
        ids[name] = int(res.stdout)
    before = store_digest(group_store)
    res = _as(alice, group_store, "job", "kill", "--name", "*", "--yes")
    assert res.returncode == 1, res
    assert res.stderr.startswith(
        f"error: 2 of 4 jobs are not {alice.name}'s (job {ids['b1']} (b1) belongs to "
        f"{bob.name}, job {ids['b2']} (b2) belongs to {bob.name})"
    ), res.stderr
    assert "nothing changed" in res.stderr and "--force" in res.stderr
    for args in (
        ("job", "pause", str(ids["a1"]), str(ids["b1"])),
        ("job", "priority", "--user", bob.name, "9"),
        ("frame", "eat", "--job", str(ids["b2"]), "--yes"),
    ):
        res = _as(alice, group_store, *args)
        assert res.returncode == 1 and "Traceback" not in res.stderr, (args, res.stderr)
    assert store_digest(group_store) == before
    res = _as(alice, group_store, "job", "kill", "--user", alice.name, "--json")
    assert res.returncode == 0, res.stderr
    assert '"outcome": "KILLED"' in res.stdout
