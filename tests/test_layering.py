"""The layering docs/architecture.md describes, enforced: no module imports a part above its
own, and only cli/ speaks typer and rich, while cli/ and serve/ neither open databases nor
start processes (sqlite3, psycopg, subprocess) — they call the library, which does.

Imports are read from the source (``ast``), lazy ones inside functions included, since
cuectl imports most heavy things lazily and a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "cuectl"

#: Each part of the package and its rank: a module may import only parts of a lower rank
#: (and its own part). Parts of one rank are peers and do not import each other.
RANKS: dict[str, int] = {
    "errors": 0,
    "units": 1,
    "fsutil": 1,
    "config": 2,
    "gpu": 3,
    "sched": 4,
    "run": 5,
    "api": 6,
    "report": 6,
    "admin": 6,
    "top": 6,
    "serve": 7,
    "cuebot": 8,
    "cli": 9,
    "__main__": 10,
    "__init__": 10,  # the console entry and the package's face re-export
}

#: Modules of a part that sit below it: they import nothing of cuectl's but the leaves, so
#: a lower part may use them (config reads a libc function through run/libc.py).
LEAVES = {"run.libc": 1}

#: Packages only cli/ may import; and what neither cli/ nor serve/ may import themselves.
CLI_ONLY = {"typer", "rich", "click"}
NOT_IN_FRONTS = {"sqlite3", "psycopg", "subprocess"}
FRONTS = {"cli", "serve"}


def module_name(path: Path) -> str:
    """``run.lease.locks`` for src/cuectl/run/lease/locks.py, ``__init__`` for the face."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imported(source: str, module: str, is_package: bool) -> list[tuple[str, int]]:
    """Every module ``source`` imports, absolute, with its line; ``from cuectl import x``
    counts as ``cuectl.x``, since x is a module of its own (config, fsutil, ...)."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = ["cuectl", *module.split(".")]
                base = here if is_package else here[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "cuectl" or (node.level and not node.module):
                found += [(f"{name}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((name, node.lineno))
    return found


def rank_of(dotted: str) -> int | None:
    """The rank of cuectl module ``dotted`` (``cuectl.run.libc``), None for the package
    itself or a name that is no part (``cuectl.__version__``)."""
    inner = dotted.split(".")[1:]
    for length in range(len(inner), 0, -1):
        leaf = LEAVES.get(".".join(inner[:length]))
        if leaf is not None:
            return leaf
    return RANKS.get(inner[0]) if inner else None


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """What ``module`` (``run.worker``) imports against the rules, one line each."""
    part = module.split(".")[0]
    own = rank_of(f"cuectl.{module}")
    assert own is not None, f"{module}: a part of cuectl with no rank: add it to RANKS"
    found = []
    for name, line in imported(source, module, is_package):
        top = name.split(".")[0]
        if top == "cuectl":
            target = name.split(".")[1] if "." in name else ""
            rank = rank_of(name)
            if rank is not None and target != part and rank >= own:
                found.append(f"{module}:{line} imports {name} (rank {rank}, not below its own {own})")
        elif top in CLI_ONLY and part != "cli":
            found.append(f"{module}:{line} imports {top}: only cli/ speaks to the terminal")
        elif top in NOT_IN_FRONTS and part in FRONTS:
            found.append(f"{module}:{line} imports {top}: {part}/ calls the library for that")
    return found


def sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "_pb2" not in p.name)


@pytest.mark.parametrize("path", sources(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_imports_a_part_above_its_own(path: Path) -> None:
    found = violations(module_name(path), path.read_text(), is_package=path.name == "__init__.py")
    assert not found, "\n".join(found)


def test_every_part_has_a_rank() -> None:
    parts = {module_name(p).split(".")[0] for p in sources()}
    assert parts <= set(RANKS), sorted(parts - set(RANKS))


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("sched.spec", "from cuectl.run import launch\n", "imports cuectl.run"),
        ("gpu.nvml", "def f():\n    from cuectl import top\n", "imports cuectl.top"),
        ("run.worker.core", "from ...serve import app\n", "imports cuectl.serve ("),
        ("report", "import cuectl.top\n", "imports cuectl.top (rank 6"),
        ("run.spawn", "import rich.table\n", "only cli/ speaks"),
        ("serve.app", "def f():\n    import subprocess\n", "serve/ calls the library"),
        ("cli.job_cmd", "import sqlite3\n", "cli/ calls the library"),
    ],
)
def test_the_checker_finds_each_kind_of_breach(module: str, source: str, expected: str) -> None:
    """The rules are only as good as the reading of imports: each kind of breach, lazy
    and relative ones too, is found."""
    found = violations(module, source)
    assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize(
    "module, source",
    [
        ("config", "from cuectl.run.libc import prctl\n"),  # a leaf module of run/
        ("cli.root", "import typer\n"),
        ("run.worker", "from cuectl.sched.store import Store\nfrom cuectl import __version__, config\n"),
        ("run.lease.locks", "from . import queue\nfrom ..lockfile import x\n"),
    ],
)
def test_the_checker_lets_allowed_imports_pass(module: str, source: str) -> None:
    assert violations(module, source, is_package=False) == []
