"""The ``cuectl`` root command: global options and sub-commands. Library errors become
``error: …`` lines and exit codes in one place, ``cuectl.cli.guard`` (DESIGN §6), which
``_guarded`` extends with click's usage errors.

Exit codes: 0 success; 1 the operation failed (``CuectlError``); 2 bad usage or invalid
input (``InvalidInput`` and click usage errors). No traceback reaches a user unless
``--debug`` is given.
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

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        if not windows_expand_args:  # passed on only when set: not every click knows it
            extra["windows_expand_args"] = False
        code = _guarded(lambda: super(CuectlGroup, self).main(
            args=argv, prog_name=prog_name or "cuectl", complete_var=complete_var,
            standalone_mode=False, **extra), debug=_debug_requested(argv))
        if standalone_mode:
            sys.exit(code)
        return code

    def _main_shell_completion(self, ctx_args: MutableMapping[str, Any], prog_name: str,
                               complete_var: str | None = None) -> None:
        """A shell's <TAB> (``_CUECTL_COMPLETE=bash_complete`` …, click's protocol): answered
        by cuectl.cli.complete, which is imported only then (docs/completion.md)."""
        from cuectl import config

        var = complete_var or "_CUECTL_COMPLETE"
        instruction = config.completion_request(var)
        if instruction:
            from cuectl.cli.complete import shell_complete

            raise typer.Exit(shell_complete(self, ctx_args, prog_name, var, instruction))


_NO_ARGS = getattr(_click_exc, "NoArgsIsHelpError", None) or getattr(_click_exc, "NoArgsIsHelp")


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


app = typer.Typer(
    cls=CuectlGroup,
    help="A GPU-aware job queue: OpenCue-style jobs, layers and frames on a workstation or a farm.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cuectl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    db: Optional[str] = typer.Option(None, "--db", metavar="URL",
                                     help="Store: a path, sqlite:///path or postgresql://… (default: $CUECTL_DB or "
                                          "$XDG_STATE_HOME/cuectl/cuectl.db)."),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    state = AppState(db=db, debug=debug)
    ctx.obj = state
    ctx.call_on_close(state.close)


def _completion(shell: str = typer.Argument(..., metavar="bash|zsh|fish", help="The shell to complete for.")) -> None:
    """Print the shell completion script for bash, zsh or fish.

    Job ids and names, frame ids, hosts, states and sub-commands then complete on <TAB>.
    bash: eval "$(cuectl completion bash)" in ~/.bashrc; zsh: eval "$(cuectl completion zsh)"
    in ~/.zshrc; fish: cuectl completion fish > ~/.config/fish/completions/cuectl.fish
    (docs/completion.md)."""
    from cuectl.cli.complete import completion_script

    typer.echo(completion_script(shell), nl=False)


def _register() -> None:
    from cuectl.cli import admin_cmd, gpu_cmd, host_cmd, job_cmd, lease_cmds, serve_cmd, top_cmd, worker_cmd

    job_cmd.register(app)
    host_cmd.register(app)
    top_cmd.register(app)
    serve_cmd.register(app)
    worker_cmd.register(app)
    admin_cmd.register(app)
    gpu_cmd.app.command("leases", help="Who holds which local device (worker frames, `cuectl run`, the Python API).")(
        lease_cmds.leases_cmd)
    app.add_typer(gpu_cmd.app, name="gpu", help="This machine's GPUs and their leases (no store needed).")
    app.command("run", context_settings={"allow_interspersed_args": False},
                help="Run a command with an exclusive lease on local GPUs (ad-hoc work beside queued frames).")(
        lease_cmds.run_cmd)
    app.command("completion")(_completion)


_register()
