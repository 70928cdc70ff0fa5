"""Run the console script's own code (``bin/cuectl``: ``cuectl.cli.entry.run``) as a real
process and tell which way it went: a note written at exit says whether typer was loaded
(the full CLI) or not (one of entry's fast paths), and whether a GPU backend was (the
devices were discovered: not `cuectl run`'s quick path). The fast-path tests use it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

#: The modules of the GPU backends (cuectl.gpu.get_backend loads one to discover).
BACKENDS = ("cuectl.gpu.fake", "cuectl.gpu.nvml", "cuectl.gpu.smi", "cuectl.gpu.amd", "cuectl.gpu.apple")
ENTRY = (
    "import atexit, os, sys\n"
    "def _note():\n"
    "    way = 'typer' if 'typer' in sys.modules else 'fast'\n"
    f"    found = any(m in sys.modules for m in {BACKENDS!r})\n"
    "    with open(os.environ['ENTRY_PROBE'], 'a') as fh:\n"
    "        fh.write(way + (' discovered' if found else '') + '\\n')\n"
    "atexit.register(_note)\n"
    "from cuectl.cli.entry import run\n"
    "sys.exit(run())\n"
)


def noted(probe: Path) -> tuple[str, bool]:
    """What the last process run with ``ENTRY_PROBE=probe`` noted: ("fast" or "typer", whether
    it discovered devices); ("?", False) if it noted nothing."""
    lines = probe.read_text().split("\n") if probe.exists() else []
    words = ([line.split() for line in lines if line.strip()] or [["?"]])[-1]
    return words[0], "discovered" in words[1:]


def run_entry_noting(
    tmp_path: Path, args: list[str], *, full: bool, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], str, bool]:
    """``cuectl ARGS``; (the result, "fast" or "typer", whether it discovered devices).
    ``full`` forces the full CLI (``CUECTL_FULL_CLI=1``)."""
    probe = tmp_path / f"probe-{os.getpid()}-{len(list(tmp_path.glob('probe-*')))}"
    child_env = {**os.environ, **(env or {}), "ENTRY_PROBE": str(probe)}
    child_env.pop("CUECTL_FULL_CLI", None)
    if full:
        child_env["CUECTL_FULL_CLI"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", ENTRY, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=child_env,
        timeout=120,
    )
    way, discovered = noted(probe)
    return out, way, discovered


def run_entry(
    tmp_path: Path, args: list[str], *, full: bool, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``cuectl ARGS``; (the result, "fast" or "typer")."""
    out, way, _ = run_entry_noting(tmp_path, args, full=full, env=env)
    return out, way
