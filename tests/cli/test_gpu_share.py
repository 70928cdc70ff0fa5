"""`cuectl run --gpu-share` and `cuectl gpu leases` as a user meets them (issue 39 §5): the
real console script, on its fast path and through the full CLI (``CUECTL_FULL_CLI=1``);
bad input is one ``error:`` line and exit 2 with nothing taken; shares are listed with
their budgets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CUECTL = str(Path(sys.executable).parent / "cuectl")
GIB = 1024**3


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    fake = tmp_path / "gpus.yaml"
    fake.write_text(
        yaml.safe_dump({"devices": [{"model": "NVIDIA GeForce RTX 4090", "vendor": "NVIDIA", "memory": "24GiB"}]})
    )
    return {**os.environ, "CUECTL_FAKE_GPUS": str(fake)}


def _run(env: dict[str, str], *args: str, full: bool = False) -> subprocess.CompletedProcess[str]:
    e = {**env, **({"CUECTL_FULL_CLI": "1"} if full else {})}
    return subprocess.run([CUECTL, *args], env=e, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("full", [False, True], ids=["fast-path", "full-cli"])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu-share", "0"], "error: --gpu-share: must be more than 0 (leave it out for whole devices)"),
        (["--gpu-share", "abc"], "error: --gpu-share: invalid size 'abc'"),
        (
            ["--gpu-share", "8G", "--gpus", "2"],
            "error: --gpu-share: a share is part of one GPU; --gpus is 2, set it to 1",
        ),
        (
            ["--gpu-share", "40G"],
            "error: --gpu-share: 40.0 GiB is more than the memory of every matching device here "
            "(the largest has 24.0 GiB)",
        ),
    ],
)
def test_bad_share_requests_are_one_error_line_and_exit_2_with_nothing_taken(env, tmp_path, flags, message, full):
    marker = tmp_path / "ran"
    res = _run(env, "run", *flags, "--", "touch", str(marker), full=full)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(message), res.stderr
    assert [line for line in lines if line.startswith("error:")] == [lines[0]]
    assert not marker.exists()
    locks = Path(os.environ["CUECTL_LOCK_DIR"])
    assert not (locks.exists() and list(locks.rglob("*.share")))


def test_gpu_leases_lists_each_share_with_its_budget(env):
    holders = [
        subprocess.Popen(
            [CUECTL, "run", "--gpu-share", size, "--label", f"eval-{size}", "--", "sh", "-c", "echo ready; exec cat"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for size in ("8G", "6G")
    ]
    try:
        for h in holders:
            assert h.stdout is not None and h.stdout.readline().strip() == "ready"
        text = _run(env, "gpu", "leases").stdout
        assert "eval-8G (share 8.0 GiB)" in text and "eval-6G (share 6.0 GiB)" in text, text
        listed = json.loads(_run(env, "gpu", "leases", "--json").stdout)
        (device,) = listed["devices"]
        assert device["lease"] is None
        assert sorted((s["label"], s["share_bytes"]) for s in device["shares"]) == [
            ("eval-6G", 6 * GIB),
            ("eval-8G", 8 * GIB),
        ]
        assert sorted(s["share_bytes"] for s in listed["leases"]) == [6 * GIB, 8 * GIB]
        # A whole lease of the shared device is refused, naming the shares; so is a share that does not fit.
        whole = _run(env, "run", "--no-wait", "--", "true")
        assert whole.returncode == 1 and "gpu 0 shared by pid" in whole.stderr, whole.stderr
        big = _run(env, "run", "--no-wait", "--gpu-share", "11G", "--", "true")
        assert big.returncode == 1 and "10.0 GiB of 24.0 GiB left" in big.stderr, big.stderr
        fits = _run(env, "run", "--no-wait", "--gpu-share", "10G", "--", "sh", "-c", "echo $CUE_GPU_SHARE_BYTES")
        assert fits.returncode == 0 and fits.stdout.strip() == str(10 * GIB), fits.stderr
        assert "a share of 10.0 GiB" in fits.stderr
    finally:
        for h in holders:
            assert h.stdin is not None
            h.stdin.close()
            h.wait(30)
    assert json.loads(_run(env, "gpu", "leases", "--json").stdout)["devices"][0]["shares"] == []
