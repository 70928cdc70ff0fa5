"""A lock-directory registry entry may name a directory this user cannot reach: another
user's lock directory under a private (0700) directory, say. Looking at it raised
``PermissionError`` (``Path.is_dir`` lets ``EACCES`` through), and every non-root
`cuectl worker` of the machine died at its start with ``internal error: PermissionError``
(issue 35, item 10). Such an entry is skipped with one warning line naming it; the worker,
`cuectl run` and `cuectl gpu leases` all go on. Real throwaway users; root only, as the
other security tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from .conftest import V100

EXE = str(Path(sys.executable).with_name("cuectl"))
LIMIT_S = 60  # a loaded machine's worst; a blocked open(2) never returns at all


@pytest.fixture(params=["private", "fifo"])
def alice_and_a_private_entry(request, os_users):
    """alice's own directory (store, lock dir, registry, fake GPUs), whose registry holds an
    entry naming a lock directory under root's private 0700 directory ("private"), or a
    FIFO entry ("fifo", another thing anyone can plant in the shared registry: the worker
    read entries with a blocking open, and hung at its start)."""
    (alice,) = os_users("alice")
    top = Path(tempfile.mkdtemp(prefix="cuectl-reg-alice-", dir="/tmp"))
    private = Path(tempfile.mkdtemp(prefix="cuectl-reg-private-", dir="/tmp"))
    hidden = private / "locks"
    hidden.mkdir()
    os.chmod(private, 0o700)  # root's: alice cannot search it
    registry = top / "registry"
    registry.mkdir()
    if request.param == "private":
        (registry / "private").write_text(str(hidden))
    else:
        os.mkfifo(registry / "fifo", 0o666)
    state = top / "gpus-state"
    state.mkdir()
    (top / "gpus.yaml").write_text(
        yaml.safe_dump({"host": "reg-test", "state_dir": str(state), "devices": [dict(V100)]})
    )
    subprocess.run(["chown", "-R", f"{alice.uid}:{alice.gid}", str(top)], check=True)
    os.chmod(registry, 0o1777)
    env = dict(os.environ)
    env.update(
        CUECTL_FAKE_GPUS=str(top / "gpus.yaml"),
        CUECTL_LOCK_DIR=str(top / "locks"),
        CUECTL_LOCK_REGISTRY=str(registry),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(top / "state"),
        CUECTL_RUN_CACHE=str(top / "run.cache"),
        CUECTL_DB=str(top / "q.db"),
    )
    yield alice, top, (hidden if request.param == "private" else registry / "fifo"), env
    shutil.rmtree(top, ignore_errors=True)
    shutil.rmtree(private, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="real throwaway users need root")
def test_a_worker_skips_an_entry_it_cannot_reach(alice_and_a_private_entry) -> None:
    alice, top, hidden, env = alice_and_a_private_entry
    res = alice.run([EXE, "worker", "--until-idle", "--poll", "0.05"], env=env, cwd=top, timeout=LIMIT_S)
    assert res.returncode == 0, res.stderr
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr, res.stderr
    warnings = [line for line in res.stderr.splitlines() if str(hidden) in line]
    assert len(warnings) == 1 and "warning" in warnings[0] and "skipped" in warnings[0], res.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="real throwaway users need root")
def test_run_and_gpu_leases_go_on_past_it(alice_and_a_private_entry) -> None:
    alice, top, _, env = alice_and_a_private_entry
    for argv in (
        [EXE, "run", "--gpus", "1", "--no-wait", "--", "echo", "leased"],  # the full path
        [EXE, "run", "--gpus", "1", "--no-wait", "--", "echo", "leased"],
    ):  # the quick path (its cache)
        res = alice.run(argv, env=env, cwd=top, timeout=LIMIT_S)
        assert res.returncode == 0 and res.stdout.strip() == "leased", res.stderr
        assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    res = alice.run([EXE, "gpu", "leases"], env=env, cwd=top, timeout=LIMIT_S)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
