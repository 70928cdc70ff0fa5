"""The ``cuectl`` root command: global options, and how every invocation is run. Library
errors become ``error: …`` lines and exit codes in one place, ``cuectl.cli.guard`` (DESIGN
§6), which ``_guarded`` extends with click's usage errors.

Exit codes: 0 success; 1 the operation failed (``CuectlError``); 2 bad usage or invalid
input (``InvalidInput`` and click usage errors). No traceback reaches a user unless
``--debug`` is given.

``new_app`` makes a root without sub-commands: ``cuectl.cli.main`` adds them all (the
command tree of help, completion and tests), ``cuectl.cli.entry`` only the one invoked.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, MutableMapping, Optional, Sequence

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    # Type-check against the typer that pyproject.toml resolves to (it vendors click);
    # the runtime fallback below is for older typer releases that depend on click.
    from typer._click import exceptions as _click_exc

    from cuectl.sched.store import Store
else:
    try:  # typer >= 0.2x vendors click; older releases depend on the click package
        from typer._click import exceptions as _click_exc
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click import exceptions as _click_exc

from cuectl import __version__


class CuectlGroup(TyperGroup):
    """Runs every invocation (the console script and typer's CliRunner alike) through
    ``_guarded`` so error handling is identical in tests and for users."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not windows_expand_args:  # passed on only when set: not every click knows it
            extra["windows_expand_args"] = False
        code = _guarded(
            lambda: super(CuectlGroup, self).main(
                args=argv, prog_name=prog_name or "cuectl", complete_var=complete_var, standalone_mode=False, **extra
            ),
            debug=_debug_requested(argv),
        )
        if standalone_mode:
            sys.exit(code)
        return code

    def _main_shell_completion(
        self, ctx_args: MutableMapping[str, Any], prog_name: str, complete_var: str | None = None
    ) -> None:
        """A shell's <TAB> (``_CUECTL_COMPLETE=bash_complete`` …, click's protocol): answered
        by cuectl.cli.complete, which is imported only then (docs/completion.md)."""
        from cuectl import config

        var = complete_var or "_CUECTL_COMPLETE"
        instruction = config.completion_request(var)
        if instruction:
            from cuectl.cli.complete import shell_complete

            raise typer.Exit(shell_complete(self, ctx_args, prog_name, var, instruction))


_NO_ARGS = getattr(_click_exc, "NoArgsIsHelpError", None) or getattr(_click_exc, "NoArgsIsHelp")  # noqa: B009 - click < 8.2 only


def _debug_requested(argv: Sequence[str]) -> bool:
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--debug":
            return True
    return False


def _guarded(call: Callable[[], Any], *, debug: bool) -> int:
    """``cuectl.cli.guard.guarded``, plus click's own usage errors (exit 2), exits and aborts."""
    from cuectl.cli import term
    from cuectl.cli.guard import guarded

    def with_click_errors() -> Any:
        try:
            return call()
        except _NO_ARGS as exc:
            exc.show()
            return 2
        except _click_exc.UsageError as exc:
            hint = None
            if exc.ctx is not None:
                hint = f"see '{exc.ctx.command_path} --help'"
            term.error(exc.format_message(), hint)
            return 2
        except typer.Exit as exc:
            return exc.exit_code
        except typer.Abort:
            term.error("aborted")
            return 130

    return guarded(with_click_errors, debug=debug)


@dataclass
class AppState:
    """What the global options decide, shared by every command through ``ctx.obj``."""

    db: Optional[str] = None
    debug: bool = False
    _store: Any = field(default=None, repr=False)

    def store(self, *, create: bool = False) -> Store:
        """Open the store once per invocation (lazily: `gpu list` needs none); which one,
        and whether a missing one is created: ``cuectl.cli.entry.open_cli_store``."""
        if self._store is None:
            from cuectl.cli.entry import open_cli_store

            self._store = open_cli_store(self.db, create=create)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cuectl {__version__}")
        raise typer.Exit()


def root(
    ctx: typer.Context,
    db: Optional[str] = typer.Option(
        None,
        "--db",
        metavar="URL",
        help="Store: a path, sqlite:///path or postgresql://… (default: $CUECTL_DB or "
        "$XDG_STATE_HOME/cuectl/cuectl.db).",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    state = AppState(db=db, debug=debug)
    ctx.obj = state
    ctx.call_on_close(state.close)


def new_app() -> typer.Typer:
    """The root command with its global options and no sub-commands yet."""
    app = typer.Typer(
        cls=CuectlGroup,
        help="A GPU-aware job queue: OpenCue-style jobs, layers and frames on a workstation or a farm.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    app.callback()(root)
    return app
