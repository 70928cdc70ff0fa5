"""The built package carries its PEP 561 marker, so type checkers of code that imports
cuectl (``cuectl.lease()`` users) see its inline types."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_py_typed_is_shipped_as_package_data(tmp_path: Path) -> None:
    assert (REPO / "src" / "cuectl" / "py.typed").is_file()
    # setuptools' build_py step is what fills a wheel with modules and package data; run
    # it on a copy so that the checkout gets no build/ or egg-info from the test.
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(
        REPO / "src" / "cuectl", project / "src" / "cuectl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    out = tmp_path / "lib"
    subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            "-c",
            "from setuptools import setup; setup()",
            "-q",
            "build_py",
            "--build-lib",
            str(out),
        ],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert (out / "cuectl" / "__init__.py").is_file()
    assert (out / "cuectl" / "py.typed").is_file(), "py.typed is missing from the built package"
