"""A stand-in for the root app: registers the lease commands the way ``cuectl.cli.main``
does and maps errors to exit codes like it, so the tests can drive them (in-process or as
a real process: ``python tests/run/lease_cli_app.py run --no-wait -- cmd``) without the
rest of the command tree."""

from __future__ import annotations

import sys
from typing import Sequence

import typer

from cuectl.cli import term
from cuectl.cli.lease_cmds import RUN_CONTEXT_SETTINGS, leases_cmd, run_cmd
from cuectl.errors import CuectlError


def build() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True)
    gpu_app = typer.Typer(no_args_is_help=True)
    gpu_app.command("leases")(leases_cmd)
    app.add_typer(gpu_app, name="gpu")
    app.command("run", context_settings=RUN_CONTEXT_SETTINGS)(run_cmd)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    try:
        result = build()(args=list(sys.argv[1:] if argv is None else argv), prog_name="cuectl", standalone_mode=False)
    except CuectlError as exc:
        term.error(exc.message, exc.hint)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # click usage errors (vendored by typer): exit 2 like the real CLI
        if type(exc).__name__.endswith(("UsageError", "BadParameter", "NoSuchOption", "MissingParameter")):
            term.error(str(exc))
            return 2
        raise
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
