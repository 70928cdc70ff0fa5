"""Run the console script's own code (``cuectl = cuectl.cli.entry:run``) as a real process
and tell which way it went: a note written at exit says whether typer was loaded (the full
CLI) or not (one of entry's fast paths). The tests of both fast paths use it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENTRY = ("import atexit, os, sys\n"
         "def _note():\n"
         "    with open(os.environ['ENTRY_PROBE'], 'a') as fh:\n"
         "        fh.write('typer\\n' if 'typer' in sys.modules else 'fast\\n')\n"
         "atexit.register(_note)\n"
         "from cuectl.cli.entry import run\n"
         "sys.exit(run())\n")


def run_entry(tmp_path: Path, args: list[str], *, full: bool,
              env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    """``cuectl ARGS``; (the result, "fast" or "typer"). ``full`` forces the full CLI
    (``CUECTL_FULL_CLI=1``)."""
    probe = tmp_path / f"probe-{os.getpid()}-{len(list(tmp_path.glob('probe-*')))}"
    child_env = {**os.environ, **(env or {}), "ENTRY_PROBE": str(probe)}
    child_env.pop("CUECTL_FULL_CLI", None)
    if full:
        child_env["CUECTL_FULL_CLI"] = "1"
    out = subprocess.run([sys.executable, "-c", ENTRY, *args], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, env=child_env, timeout=120)
    path = probe.read_text().split() if probe.exists() else ["?"]
    return out, path[-1]
