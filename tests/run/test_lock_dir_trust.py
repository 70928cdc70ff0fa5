"""Device lock files that no user can remove while another process holds them, and lock
directories a root cuectl will not use (issue 35 item 5).

Before: a device's lock file belonged to whoever leased it first, so that user could
delete it while a frame held it, and a third user then locked a new file of the same name
and used the GPU at the same time (`cuectl gpu leases` showed it free); and a root
`cuectl run` accepted a lock directory a user owned, or a link to one. Now, in a shared
lock directory (root's), only root makes lock files and users only open them; root
refuses a lock directory anyone else could change. Real throwaway users; root only, as the
other security tests (docs/leases.md, "Who makes the lock files").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from .conftest import V100, make_fake_host

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="real throwaway users need root")

EXE = str(Path(sys.executable).with_name("cuectl"))
LIMIT_S = 60


class Machine:
    """A machine several people use: a fake GPU every user can see, a lock directory root
    made as deploy/systemd/cuectl-tmpfiles.conf does (1777, root's), and three users."""

    def __init__(self, top: Path, store: Path, users: list[Any]) -> None:
        import osusers

        self.osusers = osusers
        self.top = top
        self.alice, self.bob, self.carol = users
        self.locks = top / "locks"
        self.locks.mkdir()
        os.chmod(self.locks, 0o1777)
        registry = top / "registry"
        registry.mkdir()
        os.chmod(registry, 0o1777)
        self.host = make_fake_host(top, [dict(V100)])
        self.lock_file = self.locks / f"{self.host.uuids[0]}.lock"
        self.env = {
            **os.environ,
            "CUECTL_FAKE_GPUS": str(self.host.yaml_path),
            "CUECTL_LOCK_DIR": str(self.locks),
            "CUECTL_LOCK_REGISTRY": str(registry),
            "CUECTL_RUN_CACHE": "0",
            "CUECTL_DB": str(store / "q.db"),
        }
        self.env.pop("CUECTL_CREATE_LOCK_DIR", None)
        self.env.pop("CUECTL_USER", None)

    def as_root(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([EXE, *args], env=env or self.env, capture_output=True, text=True, timeout=LIMIT_S)

    def as_user(self, user: Any, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return user.run([EXE, *args], env=env or self.env, timeout=LIMIT_S)

    def shell(self, user: Any, script: str) -> subprocess.CompletedProcess:
        return user.run(["sh", "-c", script], env=self.env, timeout=LIMIT_S)

    def hold(self, user: Any) -> subprocess.Popen:
        """``user`` holds the GPU through `cuectl run` until killed."""
        env = {**self.env, "USER": user.name, "LOGNAME": user.name, "HOME": "/nonexistent"}
        argv = self.osusers.as_user(
            user,
            [EXE, "run", "--gpus", "1", "--no-wait", "--label", "held", "--", "sh", "-c", "echo held; exec sleep 120"],
        )
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "held":
            proc.kill()
            raise AssertionError(
                f"{user.name} could not hold the GPU: {line!r} {proc.stderr.read() if proc.stderr else ''}"
            )
        return proc


@pytest.fixture
def machine(os_users) -> Iterator[Machine]:
    top = Path(tempfile.mkdtemp(prefix="cuectl-lock-trust-", dir="/tmp"))
    os.chmod(top, 0o755)  # root's; every user may look inside
    store = Path(
        tempfile.mkdtemp(prefix="cuectl-lock-trust-store-", dir="/tmp")
    )  # root's alone, as a root worker requires
    yield Machine(top, store, os_users("alice", "bob", "carol"))
    shutil.rmtree(top, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()  # `cuectl run` forwards it to the command and exits with its status
    try:
        proc.wait(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def set_up_by_root(m: Machine, how: str) -> None:
    """What makes a shared lock directory ready: a root worker's start, one root `cuectl run`,
    or `cuectl admin lease setup` (what a worker service running as another account runs
    as root before it starts)."""
    if how == "worker":
        res = m.as_root("worker", "--until-idle", "--poll", "0.05")
    elif how == "setup":
        res = m.as_root("admin", "lease", "setup")
    else:
        res = m.as_root("run", "--gpus", "0", "--", "true")
    assert res.returncode == 0, res.stderr


# ============================================================================ a shared lock directory


@pytest.mark.parametrize("how", ["run", "worker", "setup"])
def test_nobody_can_delete_a_held_lock_file_so_nobody_leases_the_gpu_twice(machine: Machine, how: str) -> None:
    m = machine
    set_up_by_root(m, how)
    # alice leases first (before: she made the lock file, and it was hers).
    res = m.as_user(m.alice, "run", "--gpus", "1", "--no-wait", "--", "true")
    assert res.returncode == 0, res.stderr
    bob = m.hold(m.bob)
    try:
        inode = m.lock_file.stat().st_ino
        res = m.shell(m.alice, f"rm -f {m.lock_file}")
        assert res.returncode != 0 and "Operation not permitted" in res.stderr, (res.returncode, res.stderr)
        assert m.lock_file.stat().st_ino == inode  # the very file bob holds
        res = m.as_user(m.carol, "run", "--gpus", "1", "--no-wait", "--", "true")
        assert res.returncode == 1, res.stderr
        assert res.stderr.startswith("error: cannot lease 1 device now: gpu 0 held by pid"), res.stderr
        leases = json.loads(m.as_user(m.carol, "gpu", "leases", "--json").stdout)["leases"]
        assert [(lease["user"], lease["label"]) for lease in leases] == [(m.bob.name, "held")], leases
    finally:
        stop(bob)
    st = m.lock_file.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o666), "root made the lock file of the device it saw"


def _one_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, res.stderr
    return errors[0]


def test_a_user_never_makes_a_lock_file_in_a_shared_lock_dir(machine: Machine) -> None:
    m = machine
    fix = f"sudo cuectl admin lease setup --lock-dir {m.locks}"
    # Nothing set up yet (tmpfiles made the directory at boot, no root cuectl ran since).
    line = _one_error(m.as_user(m.alice, "run", "--gpus", "1", "--no-wait", "--", "true"))
    assert line.startswith(f"error: lock directory {m.locks} is not set up: ") and fix in line, line
    assert list(m.locks.iterdir()) == []
    set_up_by_root(m, "setup")  # what the line says to do
    # A device root has not seen yet (hot-plugged, a new MIG instance): its lock file is missing.
    m.lock_file.unlink()
    line = _one_error(m.as_user(m.alice, "run", "--gpus", "1", "--no-wait", "--", "true"))
    assert line.startswith(f"error: lock file {m.lock_file} does not exist yet") and fix in line, line
    assert not m.lock_file.exists()
    set_up_by_root(m, "run")
    res = m.as_user(m.alice, "run", "--gpus", "1", "--no-wait", "--", "true")
    assert res.returncode == 0, res.stderr
    assert m.lock_file.stat().st_uid == 0


def test_root_takes_over_a_lock_file_a_user_made_by_hand(machine: Machine) -> None:
    """The directory is world-writable (sticky): alice can make a device's lock file
    before root has (a device root has not seen yet). Until root takes it over nobody uses
    it; then it is root's, the same file, and she can no longer delete it."""
    m = machine
    set_up_by_root(m, "run")
    m.lock_file.unlink()
    res = m.shell(m.alice, f"umask 0 && : > {m.lock_file}")
    assert res.returncode == 0, res.stderr
    inode = m.lock_file.stat().st_ino
    res = m.as_user(m.bob, "run", "--gpus", "1", "--no-wait", "--", "true")
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith(f"error: lock file {m.lock_file} belongs to {m.alice.name}"), res.stderr
    set_up_by_root(m, "run")
    st = m.lock_file.stat()
    assert (st.st_ino, st.st_uid, st.st_mode & 0o777) == (inode, 0, 0o666)
    bob = m.hold(m.bob)
    try:
        res = m.shell(m.alice, f"rm -f {m.lock_file}")
        assert res.returncode != 0 and m.lock_file.stat().st_ino == inode, res.stderr
    finally:
        stop(bob)


def test_lease_setup_is_roots_waits_for_nobody_and_says_what_it_left(machine: Machine) -> None:
    """`cuectl admin lease setup`: a user may not make a shared directory's lock files
    (exit 1, nothing made); root makes them while a GPU is held (no waiting), takes over one
    alice made by hand (the same file, so a holder would keep its lock), and names a lock file nobody can use (exit 1)."""
    m = machine
    line = _one_error(m.as_user(m.alice, "admin", "lease", "setup"))
    assert (
        line.startswith(f"error: lock directory {m.locks} is not set up: ") and "sudo cuectl admin lease setup" in line
    )
    assert list(m.locks.iterdir()) == []
    set_up_by_root(m, "setup")
    m.lock_file.unlink()
    line = _one_error(m.as_user(m.alice, "admin", "lease", "setup"))
    assert line == f"error: only root makes the lock files of {m.locks} (so that no user can delete one a lease holds)"
    assert not m.lock_file.exists()
    set_up_by_root(m, "setup")
    bob = m.hold(m.bob)
    try:
        res = m.as_root("admin", "lease", "setup", "--json")  # while bob holds the GPU: at once
        assert res.returncode == 0, res.stderr
        done = json.loads(res.stdout)
        assert (done["lock_dir"], done["owner_uid"], done["mode"], done["ready"]) == (str(m.locks), 0, "1777", True)
        assert [(d["uuid"], d["lock_file"], d["ready"]) for d in done["devices"]] == [
            (m.host.uuids[0], str(m.lock_file), True)
        ]
    finally:
        stop(bob)
    m.lock_file.unlink()
    res = m.shell(m.alice, f"umask 0 && : > {m.lock_file}")  # a device root has not seen yet: alice is first
    assert res.returncode == 0, res.stderr
    inode = m.lock_file.stat().st_ino
    res = m.as_root("admin", "lease", "setup")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"lock directory {m.locks} (root (uid 0), mode 1777): 1 of 1 lock file(s) ready")
    st = m.lock_file.stat()
    assert (st.st_ino, st.st_uid) == (inode, 0), "the same file, root's now"
    m.lock_file.unlink()
    os.mkfifo(m.lock_file)
    res = m.as_root("admin", "lease", "setup", "--json")
    assert res.returncode == 1, res.stderr
    assert json.loads(res.stdout)["devices"][0]["problem"] == "not a regular file: remove it, then run this again"


def test_doctor_says_which_devices_nobody_but_root_can_lease_yet(machine: Machine) -> None:
    m = machine

    def lock_checks() -> dict[str, tuple[str, str]]:
        res = m.as_user(m.alice, "admin", "doctor", "--json")
        checks = json.loads(res.stdout)["checks"]
        return {c["name"]: (c["status"], c["detail"]) for c in checks if c["name"] in ("lock dir", "lock files")}

    before = lock_checks()
    assert before["lock dir"] == (
        "ok",
        f"{m.locks} (root (uid 0), mode 1777): shared; only its owner or root makes lock files",
    )
    assert before["lock files"] == (
        "warn",
        f"gpu 0: no usable lock file, so only root can lease it: `sudo cuectl admin lease setup --lock-dir {m.locks}`",
    )
    set_up_by_root(m, "setup")
    assert lock_checks()["lock files"] == ("ok", "1 device(s), each with its lock file")


def test_leases_inside_frames_of_two_users_each_get_their_own_sublocks(machine: Machine) -> None:
    """A lease inside a frame takes sub-locks in a directory of its user's own
    (``nested/<uid>/<level>``): one under the shared lock directory that alice's frame made
    would be refused to bob's frame, whose sub-leases would then all fail."""
    m = machine
    outer = subprocess.Popen(
        [EXE, "run", "--gpus", "1", "--no-wait", "--", "sh", "-c", "echo held; exec sleep 120"],
        env=m.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert outer.stdout is not None and outer.stdout.readline().strip() == "held"
        frame = {**m.env, "CUE_FRAME_ID": "7", "CUE_GPUS": "1", "CUE_GPU_UUIDS": m.host.uuids[0]}
        for user in (m.alice, m.bob):
            res = m.as_user(user, "run", "--gpus", "1", "--no-wait", "--", "true", env=frame)
            assert res.returncode == 0, (user.name, res.stderr)
            sub = m.locks / "nested" / str(user.uid) / "1" / m.lock_file.name
            assert sub.stat().st_uid == user.uid
    finally:
        stop(outer)


# ============================================================================ what root refuses


def _alices_dir(m: Machine) -> Path:
    """A lock directory alice made (1777, as cuectl makes one), in a directory of hers."""
    hers = m.top / "alice" / "locks"
    if not hers.exists():
        res = m.shell(m.alice, f"mkdir -m 755 {hers.parent} && mkdir -m 1777 {hers}")
        assert res.returncode == 0, res.stderr
    return hers


def _make(m: Machine, case: str) -> Path:
    """A lock directory root must refuse, of the kind ``case`` names."""
    os.chmod(m.top, 0o1777)  # like /tmp: alice may make things here
    if case == "owned by a user":
        return _alices_dir(m)
    if case == "link to a user's":
        target = _alices_dir(m)
        link = m.top / "link-to-alice"
        res = m.shell(m.alice, f"ln -s {target} {link}")
        assert res.returncode == 0, res.stderr
        return link
    if case == "link to root's":
        link = m.top / "link-to-root"
        link.symlink_to(m.locks)
        return link
    if case == "under a user's directory":
        inside = _alices_dir(m).parent / "root-locks"
        inside.mkdir(exist_ok=True)
        os.chmod(inside, 0o1777)  # root's, but alice can rename it away and put her own there
        return inside
    assert case == "group-writable, not sticky"
    loose = m.top / "group-locks"
    loose.mkdir(exist_ok=True)
    os.chown(loose, 0, m.alice.gid)
    os.chmod(loose, 0o775)
    return loose


def _snapshot(path: Path) -> list[tuple[str, int, int]]:
    return (
        sorted((str(p), p.lstat().st_uid, p.lstat().st_mode) for p in [path, *path.rglob("*")]) if path.exists() else []
    )


@pytest.mark.parametrize(
    "case",
    ["owned by a user", "link to a user's", "link to root's", "under a user's directory", "group-writable, not sticky"],
)
@pytest.mark.parametrize("entry", ["run", "lease", "worker"])
def test_root_refuses_a_lock_dir_another_user_could_change(machine: Machine, case: str, entry: str) -> None:
    m = machine
    given = _make(m, case)
    real = given.resolve()
    before = _snapshot(real)
    env = {**m.env, "CUECTL_LOCK_DIR": str(given)}
    if entry == "lease":
        res = subprocess.run(
            [
                sys.executable,
                "-c",
                "import cuectl\ntry:\n cuectl.lease(1)\nexcept Exception as e:\n print(type(e).__name__, e)",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
        assert res.stdout.startswith(f"LeaseError lock directory {given} is not safe for a root cuectl: "), res
        return
    res = m.as_root(*(["run", "--gpus", "1", "--", "true"] if entry == "run" else ["worker", "--until-idle"]), env=env)
    assert res.returncode == 1, res.stderr
    lines = res.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[:1], res.stderr
    assert lines[0].startswith(f"error: lock directory {given} is not safe for a root cuectl: "), res.stderr
    assert any(line.startswith("hint: root leases only in a directory that root") for line in lines), res.stderr
    assert _snapshot(real) == before  # nothing made in it, nothing taken over


def test_root_names_what_is_wrong(machine: Machine) -> None:
    m = machine
    for case, why in [
        ("owned by a user", f"belongs to {m.alice.name}"),
        ("link to root's", "it is a symbolic link"),
        ("under a user's directory", f"{m.top / 'alice'} belongs to {m.alice.name}"),
        ("group-writable, not sticky", "is writable by its group but not sticky"),
    ]:
        given = _make(m, case)
        res = m.as_root("run", "--gpus", "1", "--", "true", env={**m.env, "CUECTL_LOCK_DIR": str(given)})
        assert res.returncode == 1 and why in res.stderr.splitlines()[0], (case, res.stderr)


def test_root_accepts_its_own_lock_dir_in_a_sticky_directory(machine: Machine) -> None:
    """/tmp and /dev/shm are world-writable but sticky: a directory of root's there is
    root's alone, as under root's own directories."""
    m = machine
    os.chmod(m.top, 0o1777)
    res = m.as_root("run", "--gpus", "1", "--", "true")
    assert res.returncode == 0, res.stderr


# ============================================================================ users' own lock directories


def test_a_users_own_lock_dir_works_as_before(machine: Machine) -> None:
    """One user, her own lock directory (made by her first lease, as /dev/shm/cuectl-locks
    on a workstation): no root, no set-up; her lock files are hers."""
    m = machine
    os.chmod(m.top, 0o1777)
    res = m.shell(m.alice, f"mkdir -m 700 {m.top / 'alice'}")
    assert res.returncode == 0, res.stderr
    own = m.top / "alice" / "locks"
    env = {
        **m.env,
        "CUECTL_LOCK_DIR": str(own),
        "CUECTL_CREATE_LOCK_DIR": "1",
        "CUECTL_RUN_CACHE": str(m.top / "alice" / "run.cache"),
    }
    for _ in range(2):  # the full path, then the quick path (its cache)
        res = m.as_user(m.alice, "run", "--gpus", "1", "--no-wait", "--", "true", env=env)
        assert res.returncode == 0, res.stderr
    lock = own / m.lock_file.name
    assert (own.stat().st_uid, own.stat().st_mode & 0o7777) == (m.alice.uid, 0o1777)
    assert (lock.stat().st_uid, lock.stat().st_mode & 0o777) == (m.alice.uid, 0o666)


def test_another_user_refuses_a_users_own_lock_dir(machine: Machine) -> None:
    """alice's lock directory is hers: she could delete the lock file of a GPU bob holds."""
    m = machine
    os.chmod(m.top, 0o1777)
    hers = _alices_dir(m)
    env = {**m.env, "CUECTL_LOCK_DIR": str(hers)}
    res = m.as_user(m.bob, "run", "--gpus", "1", "--no-wait", "--", "true", env=env)
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith(f"error: lock directory {hers} belongs to {m.alice.name}"), res.stderr
    assert list(hers.iterdir()) == []
