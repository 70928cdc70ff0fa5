"""Helpers of the GPU tests: the real tool outputs of tests/fixtures/gpu, stub tools on PATH, sysfs trees.

Stub tools are real executables (``#!/bin/sh`` scripts) in a temp dir that becomes the
*only* entry of PATH, so the backends' real subprocess path runs and a real nvidia-smi on
the test machine can never answer instead. Each stub logs its arguments, so tests can
count spawns.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parents[1]


# Real tool outputs, kept with the tests (their provenance is in the folder's README.md), so
# a clone with nothing beside it has everything the GPU tests read.
FIXTURES = _REPO / "tests" / "fixtures" / "gpu"


def fixture_path(rel: str) -> Path:
    path = FIXTURES / rel
    assert path.is_file(), f"missing fixture {rel}"
    return path


@dataclass(frozen=True)
class Out:
    """What a stub prints for one argument pattern: a file or text, an exit code, a delay."""

    file: Path | None = None
    text: str | None = None
    exit: int = 0
    stderr: str | None = None
    hang: bool = False


class StubTools:
    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.data = root / "data"
        self.log = root / "log"
        for d in (self.bin, self.data, self.log):
            d.mkdir(parents=True, exist_ok=True)
        self._n = 0

    def add(self, name: str, rules: list[tuple[str, Out]] | Out) -> Path:
        """Install stub ``name``. ``rules``: (shell glob on "$*", Out) pairs, first match wins."""
        if isinstance(rules, Out):
            rules = [("*", rules)]
        log = self.log / f"{name}.log"
        lines = ["#!/bin/sh", f'printf "%s\\n" "$*" >> {shlex.quote(str(log))}', 'case "$*" in']
        for pattern, out in rules:
            glob = "*".join(shlex.quote(part) if part else "" for part in pattern.split("*"))
            lines.append(f"  {glob}) {self._action(out)} ;;")
        lines.append('  *) echo "stub: unexpected arguments: $*" >&2; exit 99 ;;')
        lines.append("esac")
        script = self.bin / name
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)
        return script

    def _action(self, out: Out) -> str:
        if out.hang:
            return "exec /bin/sleep 30"
        parts = []
        source = out.file
        if out.text is not None:
            self._n += 1
            source = self.data / f"out{self._n}.txt"
            source.write_text(out.text)
        if source is not None:
            parts.append(f"/bin/cat {shlex.quote(str(source))}")
        if out.stderr is not None:
            parts.append(f"echo {shlex.quote(out.stderr)} >&2")
        parts.append(f"exit {out.exit}")
        return "; ".join(parts)

    def calls(self, name: str) -> list[str]:
        log = self.log / f"{name}.log"
        return log.read_text().splitlines() if log.exists() else []


def materialise_sysfs(fixture: Path, root: Path) -> Path:
    """Write the JSON map of a ``/sys/class/drm`` tree into ``root``; returns ``root``."""
    data = json.loads(fixture.read_text())
    for rel, content in data["files"].items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
    for rel, target in data.get("symlinks", {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target)
    return root
