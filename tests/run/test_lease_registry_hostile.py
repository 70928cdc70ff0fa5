"""The lock-directory registry is writable by every user of the machine (a sticky
directory in /dev/shm): what another user plants there must not stop a lease. A FIFO read
without O_NONBLOCK blocks open(2) until a writer comes, so a FIFO as a registry entry, or
as the lock file of a directory an entry names, hung every `cuectl run` and
`cuectl.lease()` of the machine, root's too (issue 41 review). Real throwaway users; root
only, as the other security tests."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .conftest import V100, make_fake_host

EXE = str(Path(sys.executable).with_name("cuectl"))
# Long enough for a loaded machine; a blocked open(2) never returns at all.
LIMIT_S = 60


@pytest.fixture
def hostile_registry(os_users, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A registry (mode 1777, as the real one) where alice planted a FIFO entry, and an
    entry naming a directory of hers whose lock file of our GPU is a FIFO."""
    (alice,) = os_users("alice")
    host = make_fake_host(tmp_path, [dict(V100)])
    top = Path(tempfile.mkdtemp(prefix="cuectl-registry-", dir="/tmp"))
    os.chmod(top, 0o1777)  # alice makes her own directory here, as in /tmp
    registry, hers = top / "registry", top / "alice-locks"
    registry.mkdir(mode=0o1777)
    os.chmod(registry, 0o1777)
    lock = hers / f"{host.uuids[0]}.lock"
    res = alice.run(
        [
            "sh",
            "-c",
            f"mkdir -m 755 {hers} && mkfifo -m 666 {lock} && mkfifo -m 666 {registry}/fifo "
            f"&& printf %s {hers} > {registry}/hers",
        ]
    )
    assert res.returncode == 0, res.stderr
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(host.yaml_path))
    monkeypatch.setenv("CUECTL_LOCK_REGISTRY", str(registry))
    monkeypatch.setenv("CUECTL_LOCK_DIR", str(tmp_path / "locks"))
    yield host
    subprocess.run(["rm", "-rf", str(top)])


@pytest.mark.skipif(os.geteuid() != 0, reason="real throwaway users need root")
@pytest.mark.parametrize("path", ["quick", "full", "api"])
def test_a_fifo_planted_in_the_registry_does_not_hang_a_lease(hostile_registry, path: str) -> None:
    env = dict(os.environ)
    if path == "full":
        env["CUECTL_RUN_CACHE"] = "0"
    argv = (
        [sys.executable, "-c", "import cuectl; cuectl.lease(1).release(); print('leased')"]
        if path == "api"
        else [EXE, "run", "--gpus", "1", "--no-wait", "--", "echo", "leased"]
    )
    if path == "quick":  # a first run leaves the cache the quick path reads
        subprocess.run(argv, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=LIMIT_S)
    assert res.returncode == 0 and res.stdout.strip() == "leased", res.stderr
    assert "Traceback" not in res.stderr
