"""The lock directory: a mistyped one is an error, not a second set of locks; two in use
on one machine are pointed out; the default is what the docs and --help say."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuectl import config
from cuectl.errors import LeaseError
from cuectl.run.lease import locks


@pytest.fixture
def no_create(monkeypatch):
    monkeypatch.delenv("CUECTL_CREATE_LOCK_DIR", raising=False)
    locks._prepared.clear()


def test_a_missing_lock_dir_outside_the_documented_places_is_not_created(tmp_path, no_create):
    typo = tmp_path / "etc" / "cuectl-lcoks"
    with pytest.raises(LeaseError, match="does not exist, and cuectl creates only its default ones") as err:
        locks.prepare_lock_dir(typo)
    assert "install -d -m 1777" in (err.value.hint or "")
    assert not typo.exists() and not typo.parent.exists()
    assert locks.prepare_lock_dir(typo, create=True) == typo and typo.is_dir()  # told to


def test_an_existing_lock_dir_is_used_as_it_is(tmp_path, no_create):
    made = tmp_path / "locks-here"
    made.mkdir(mode=0o1777)
    made.chmod(0o1777)
    assert locks.prepare_lock_dir(made) == made


def test_cuectl_run_refuses_a_mistyped_lock_dir_with_one_line(tmp_path, no_create, fake_gpus):
    fake = fake_gpus([{"model": "Tesla V100-SXM2-16GB", "vendor": "NVIDIA", "memory": "16160MiB"}])
    env = {**os.environ, "CUECTL_FAKE_GPUS": str(fake), "CUECTL_LOCK_DIR": str(tmp_path / "nope" / "x")}
    exe = Path(sys.executable).with_name("cuectl")
    res = subprocess.run(
        [str(exe), "run", "--gpus", "1", "--", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 1, res.stderr
    assert res.stderr.startswith(f"error: lock directory {tmp_path / 'nope' / 'x'} does not exist"), res.stderr
    assert not (tmp_path / "nope").exists()


def test_another_lock_dir_holding_leases_is_pointed_out(tmp_path, monkeypatch):
    from cuectl.gpu.device import Device

    one, two = tmp_path / "one", tmp_path / "two"
    locks.prepare_lock_dir(one, create=True)
    locks.prepare_lock_dir(two, create=True)
    assert locks.other_lock_dirs_in_use(two) == []  # nothing held in `one` yet
    device = Device(index=0, uuid="GPU-x", vendor="NVIDIA", model="m", memory_total_bytes=1 << 30, backend="fake")
    held = locks.try_lock(one, device, holder="test")
    try:
        assert locks.other_lock_dirs_in_use(two) == [one.resolve()]
        assert locks.other_lock_dirs_in_use(one) == []
    finally:
        held.release()


def test_entries_for_lock_dirs_that_are_gone_leave_the_registry(tmp_path):
    """Every lock directory ever used is noted in the registry; one deleted since (a test's,
    a CI job's) is dropped by the next look, so a worker's start does not read them forever."""
    kept, gone = tmp_path / "kept", tmp_path / "gone"
    locks.prepare_lock_dir(kept, create=True)
    locks.prepare_lock_dir(gone, create=True)
    registry = config.lock_dir_registry()
    assert len(list(registry.iterdir())) == 2
    shutil.rmtree(gone)
    assert locks.other_lock_dirs_in_use(tmp_path / "third") == []
    assert [p.read_text() for p in registry.iterdir()] == [str(kept.resolve())]


def test_pruning_never_follows_a_planted_registry_link(tmp_path, monkeypatch):
    """The registry path is shared (/dev/shm): one planted there as a symbolic link to
    another directory must not make the look delete the files it finds there."""
    victim = tmp_path / "etc"
    victim.mkdir()
    (victim / "hostname").write_text("not-a-lock-dir\n")
    (victim / "config").write_text(str(tmp_path / "no-such-dir"))
    link = tmp_path / "registry-link"
    link.symlink_to(victim)
    monkeypatch.setenv("CUECTL_LOCK_REGISTRY", str(link))
    assert locks.other_lock_dirs_in_use(tmp_path / "mine") == []
    assert sorted(p.name for p in victim.iterdir()) == ["config", "hostname"]


def test_another_users_stale_entry_is_theirs_to_drop(tmp_path, os_users):
    """Root prunes only its own entries: the registry is sticky, and root could delete
    anyone's, but an entry that is not root's is left alone."""
    (alice,) = os_users("alice")
    registry = config.lock_dir_registry()
    registry.mkdir(mode=0o1777)
    os.chmod(registry, 0o1777)
    theirs, own = registry / "theirs", registry / "own"
    theirs.write_text(str(tmp_path / "gone-theirs"))
    os.chown(theirs, alice.uid, alice.gid)
    own.write_text(str(tmp_path / "gone-own"))
    assert locks.other_lock_dirs_in_use(tmp_path / "mine") == []
    assert sorted(p.name for p in registry.iterdir()) == ["theirs"]


def test_help_docs_and_code_agree_on_the_default():
    exe = Path(sys.executable).with_name("cuectl")
    for command in (["worker", "--help"], ["run", "--help"]):
        out = subprocess.run(
            [str(exe), *command], capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"}
        ).stdout
        assert "/run/cuectl/locks if it exists, else /dev/shm/cuectl-locks" in " ".join(out.split()), command
    doc = (Path(__file__).resolve().parents[2] / "docs" / "environment.md").read_text()
    assert "`/run/cuectl/locks` if it exists, else `/dev/shm/cuectl-locks`" in doc
    provisioned, shm, _ = config.default_lock_dirs()
    assert (str(provisioned), str(shm)) == ("/run/cuectl/locks", "/dev/shm/cuectl-locks")
