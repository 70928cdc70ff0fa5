"""Errors to exit codes, in one place for every way into the CLI (the typer command tree
and ``cuectl run``'s fast path in ``cuectl.cli.entry``): a ``CuectlError`` is one
``error:`` line and its exit code, Ctrl-C is 130, a closed pipe is quiet, and a bug is one
``internal error:`` line (the traceback only with ``--debug``). Import-light on purpose:
the fast path must not load typer."""

from __future__ import annotations

TYPE_CHECKING = False  # ``typing`` costs `cuectl run`'s ~25 ms quick path ~4 ms: annotations only
if TYPE_CHECKING:
    from typing import Any, Callable


def guarded(call: Callable[[], Any], *, debug: bool) -> int:
    """Run ``call``; its exit status (an int result, else 0), or the status of what it raised."""
    from cuectl.errors import CuectlError

    try:
        result = call()
        return result if isinstance(result, int) else 0
    except CuectlError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        _error(exc.message, exc.hint)
        return exc.exit_code
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: say so briefly, full traceback only with --debug
        if debug:
            raise
        _error(f"internal error: {type(exc).__name__}: {exc}", "rerun with --debug for the traceback")
        return 1


def _error(message: str, hint: str | None = None) -> None:
    from cuectl.cli import term

    term.error(message, hint)
