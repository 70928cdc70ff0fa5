"""The console script runs a command of ``cuectl.cli.entry._COMMAND_MODULES`` on a root
that has only its module's commands (``cuectl.cli.root.new_app`` plus that module's
``register``): the same command, options, help, output, errors and exit codes as in the
whole tree (``cuectl.cli.main.app``, forced with ``CUECTL_FULL_CLI=1``). Behaviour only,
never timing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from cuectl.cli import entry
from cuectl.cli.main import app as full_app
from cuectl.cli.root import new_app

try:
    from typer._click import Context
except ImportError:  # pragma: no cover - older typer depends on click
    from click import Context

#: Notes at exit whether the whole tree was built (``cuectl.cli.main`` loaded).
ENTRY = (
    "import atexit, os, sys\n"
    "atexit.register(lambda: open(os.environ['ENTRY_PROBE'], 'w').write(\n"
    "    'whole' if 'cuectl.cli.main' in sys.modules else 'one'))\n"
    "from cuectl.cli.entry import run\n"
    "sys.exit(run())\n"
)


def _param(param: Any) -> tuple[Any, ...]:
    return (
        param.name,
        param.opts,
        param.secondary_opts,
        param.required,
        param.multiple,
        param.nargs,
        repr(param.default),
        type(param.type).__name__,
        getattr(param, "help", None),
    )


def _tree(command: Any, ctx: Any) -> dict[str, Any]:
    """A command as a user meets it: its help, its parameters, its sub-commands."""
    out: dict[str, Any] = {"help": command.get_help(ctx), "params": [_param(p) for p in command.params]}
    if hasattr(command, "list_commands"):
        out["commands"] = {
            name: _tree(sub, Context(sub, parent=ctx, info_name=name))
            for name in command.list_commands(ctx)
            for sub in [command.get_command(ctx, name)]
        }
    return out


def _described(app: typer.Typer, name: str) -> dict[str, Any]:
    group = typer.main.get_command(app)
    ctx = Context(group, info_name="cuectl")
    command = group.get_command(ctx, name)  # type: ignore[attr-defined]
    assert command is not None, name
    return _tree(command, Context(command, parent=ctx, info_name=name))


@pytest.mark.parametrize("name", sorted(entry._COMMAND_MODULES))
def test_the_one_command_root_has_the_command_as_the_whole_tree_has_it(name: str) -> None:
    import importlib

    one = new_app()
    importlib.import_module(f"cuectl.cli.{entry._COMMAND_MODULES[name]}").register(one)
    assert _described(one, name) == _described(full_app, name)
    assert [_param(p) for p in typer.main.get_command(one).params] == [
        _param(p) for p in typer.main.get_command(full_app).params
    ]


@pytest.mark.parametrize(
    "args, word",
    [
        (["worker", "--until-idle"], "worker"),
        (["--db", "x.db", "job", "ls"], "job"),
        (["--db=x.db", "--debug", "host", "ls"], "host"),
        (["--debug", "--db", "--weird-path", "admin"], "admin"),  # --db's value may start with -
        (["--help", "worker"], None),
        (["-h"], None),
        (["--db"], None),
        (["--verbose", "worker"], None),  # an option the root does not have: typer words the error
        ([], None),
    ],
)
def test_the_command_word_comes_after_the_roots_own_options(args: list[str], word: str | None) -> None:
    assert entry._command_word(args) == word


def _cuectl(tmp_path: Path, args: list[str], *, full: bool) -> tuple[subprocess.CompletedProcess[str], str]:
    probe = tmp_path / "probe"
    env = {**os.environ, "ENTRY_PROBE": str(probe), "XDG_STATE_HOME": str(tmp_path / "state")}
    env.pop("CUECTL_FULL_CLI", None)
    if full:
        env["CUECTL_FULL_CLI"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", ENTRY, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=env,
        timeout=120,
    )
    return out, probe.read_text() if probe.exists() else "?"


@pytest.mark.parametrize(
    "args",
    [
        ["job", "ls"],
        ["job", "ls", "--json"],
        ["job", "show", "no-such-job"],
        ["worker", "--no-such-option"],
        ["worker", "--cores", "lots"],
        ["host", "ls", "--json"],
        ["admin", "--help"],
        ["frame", "--help"],
        ["submit", "--help"],
        ["top", "--help"],
        ["serve", "--help"],
        ["--debug", "job", "ls"],
    ],
)
def test_a_command_answers_the_same_on_its_own_root(tmp_path: Path, args: list[str]) -> None:
    db = tmp_path / "store.db"
    subprocess.run(
        [sys.executable, "-c", ENTRY, "--db", str(db), "submit", "--name", "a", "--", "true"],
        env={**os.environ, "ENTRY_PROBE": str(tmp_path / "setup-probe")},
        check=True,
        capture_output=True,
        timeout=120,
    )
    one, way_one = _cuectl(tmp_path, ["--db", str(db), *args], full=False)
    whole, way_whole = _cuectl(tmp_path, ["--db", str(db), *args], full=True)
    assert (way_one, way_whole) == ("one", "whole")
    assert (one.returncode, one.stdout, one.stderr) == (whole.returncode, whole.stdout, whole.stderr), args


def test_other_commands_and_the_roots_help_still_build_the_whole_tree(tmp_path: Path) -> None:
    for args in (["--help"], ["gpu", "list", "--json"], ["completion", "bash"], ["no-such-command"]):
        _, way = _cuectl(tmp_path, args, full=False)
        assert way == "whole", args
