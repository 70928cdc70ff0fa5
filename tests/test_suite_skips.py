"""Skips cannot hide (tests/conftest.py): a run ends with one line counting its skips by
reason, and under CI=true a skipped test fails the run. Checked on a real skip: the
browser bench, skipped on request with CUECTL_SKIP_BROWSER=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _run(ci: bool, *options: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["CUECTL_SKIP_BROWSER"] = "1"
    if ci:
        env["CI"] = "true"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            *options,
            "tests/test_bench_smoke.py",
            "-k",
            "web",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_skip_is_counted_and_passes_outside_ci():
    res = _run(ci=False)
    assert res.returncode == 0, res.stdout
    assert "skipped: 1 (1 x CUECTL_SKIP_BROWSER=1: browser benches skipped on request)" in res.stdout


def test_under_ci_a_skip_fails_the_run():
    res = _run(ci=True)
    assert res.returncode == 1, res.stdout
    assert "CI=true: a skipped test fails the run" in res.stdout


def test_under_ci_a_skip_fails_a_run_on_several_workers_too():
    # scripts/test.sh runs pytest on several workers (pytest-xdist): the skips they report
    # are counted, with their reasons, and fail the run all the same.
    res = _run(True, "-n", "2")
    assert res.returncode == 1, res.stdout
    assert "skipped: 1 (1 x CUECTL_SKIP_BROWSER=1: browser benches skipped on request)" in res.stdout
    assert "CI=true: a skipped test fails the run" in res.stdout
