"""A device leased through one lock directory while another lock directory of the machine
holds it: every lease path says so (issue 41 §7), not only `cuectl worker` at its start —
`cuectl run` (its full path and its quick path) and `cuectl.lease()`."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import cuectl
from cuectl.run.lease.acquire import LeaseWarning

from .conftest import STEP_TIMEOUT_S, V100, make_fake_host

EXE = str(Path(sys.executable).with_name("cuectl"))


@pytest.fixture
def one_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    host = make_fake_host(tmp_path, [dict(V100)])
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(host.yaml_path))
    return host


def hold_elsewhere(tmp_path: Path) -> subprocess.Popen[str]:
    """`cuectl run` holding the GPU through a second lock directory, until killed."""
    env = {**os.environ, "CUECTL_LOCK_DIR": str(tmp_path / "other-locks")}
    proc = subprocess.Popen(
        [
            EXE,
            "run",
            "--gpus",
            "1",
            "--no-wait",
            "--",
            sys.executable,
            "-c",
            "import sys; print('held', flush=True); sys.stdin.read()",
        ],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n", proc.stderr
    return proc


def release(holder: subprocess.Popen[str]) -> None:
    """End the held command (its stdin closes) and with it that lease."""
    assert holder.stdin is not None
    holder.stdin.close()
    assert holder.wait(STEP_TIMEOUT_S) == 0


def run_once() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, "run", "--gpus", "1", "--no-wait", "--", "true"], capture_output=True, text=True, timeout=STEP_TIMEOUT_S
    )


def test_cuectl_run_warns_on_both_paths(tmp_path: Path, one_gpu) -> None:
    first = run_once()  # nothing elsewhere: no warning (and the quick path's cache is written)
    assert first.returncode == 0 and "warning" not in first.stderr, first.stderr
    holder = hold_elsewhere(tmp_path)
    try:
        for _ in range(2):  # the quick path (cache from the first run), then it again
            res = run_once()
            assert res.returncode == 0, res.stderr
            warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
            assert len(warned) == 1, res.stderr
            assert one_gpu.uuids[0] in warned[0] and str(tmp_path / "other-locks") in warned[0]
            assert f"pid {holder.pid}" in warned[0] or "used twice" in warned[0]
        os.environ["CUECTL_RUN_CACHE"] = "0"  # the full path
        res = run_once()
        assert res.returncode == 0 and res.stderr.count("warning: GPU ") == 1, res.stderr
    finally:
        release(holder)
    after = run_once()  # the other lease ended: quiet again
    assert after.returncode == 0 and "warning" not in after.stderr, after.stderr


def test_the_lease_api_warns(tmp_path: Path, one_gpu) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with cuectl.lease(1) as held:
            assert held.uuids == (one_gpu.uuids[0],)
    assert not [w for w in caught if issubclass(w.category, LeaseWarning)]
    holder = hold_elsewhere(tmp_path)
    try:
        for _ in range(2):  # the first call, then the remembered one (acquire's quick lease)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with cuectl.lease(1):
                    pass
            said = [str(w.message) for w in caught if issubclass(w.category, LeaseWarning)]
            assert len(said) == 1 and one_gpu.uuids[0] in said[0] and "other-locks" in said[0], said
    finally:
        release(holder)
