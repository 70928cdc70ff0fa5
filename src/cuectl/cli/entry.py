"""Console-script entry point, kept import-light.

Four commands are answered here without building the typer command tree (typer, click
and the modules of every command: ~180 ms for `run`, ~45 ms of a report's ~350):

- ``cuectl --version``;
- an ordinary ``cuectl run [OPTIONS] [--] COMMAND...`` (``_parse_run``): the lease
  machinery is imported and run directly — the same ``cuectl.run.adhoc.run_command`` the
  typer command calls, errors printed as ``cuectl.cli.main`` prints them — or, for a plain
  ``--gpus 0|1`` run on a host it knows, ``cuectl.run.quick`` (no discovery at all);
- an ordinary ``cuectl [--db URL] admin report [OPTIONS]`` (``_parse_report``): the same
  ``cuectl.cli.report_view.show_report`` the typer command calls (a report scraped for
  Prometheus every few seconds, or run from cron);
- an ordinary ``cuectl [--db URL] submit [FLAGS] -- COMMAND...`` (``_parse_submit``): the
  same ``cuectl.cli.submit_flags.flag_spec`` the typer command calls (a pipeline submitting
  a job per shot). Spec files, notifications, ``--dry-run`` and ``--json`` go to the full CLI.

Anything else — help, completion, other root options (``--debug``), an unknown or repeated
option, a value typer would convert or refuse (``--gpus x``, ``--gpus -1``), a value that
starts with ``-``, no command — goes to the full CLI, which answers it (or prints its
error) itself. ``CUECTL_FULL_CLI=1`` sends every invocation there (tests compare the two
paths with it).
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # ``typing`` costs `cuectl run`'s ~25 ms quick path ~4 ms: annotations only
if TYPE_CHECKING:
    from typing import Any, Callable

#: `cuectl run` options taking one value -> the keyword of ``run_command`` (``--gpus`` is an int).
_RUN_VALUE_OPTIONS = {
    "--gpus": "gpus",
    "--gpu-vendor": "gpu_vendor",
    "--gpu-model": "gpu_models",
    "--gpu-memory-min": "gpu_memory_min",
    "--gpu-memory-free-min": "gpu_memory_free_min",
    "--min-free-memory": "gpu_memory_free_min",
    "--gpu-capability-min": "gpu_capability_min",
    "--gpu-driver-min": "gpu_driver_min",
    "--gpu-cuda-min": "gpu_cuda_min",
    "--device": "devices",
    "--gpu-share": "gpu_share",
    "--timeout": "timeout",
    "--label": "label",
    "--lock-dir": "lock_dir",
}
#: Repeatable options (lists); every other option may appear once on the fast path.
_RUN_LIST_OPTIONS = frozenset({"gpu_models", "devices"})
_RUN_FLAGS = {"--wait": True, "--no-wait": False}
#: `cuectl admin report` options taking one value -> the keyword of ``show_report``.
_REPORT_VALUE_OPTIONS = {
    "--since": "since",
    "--until": "until",
    "--by": "by",
    "--format": "format_",
    "--output": "output",
    "-o": "output",
}
_ASCII_DIGITS = frozenset("0123456789")


def run() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:
        from cuectl import __version__

        sys.stdout.write(f"cuectl {__version__}\n")
        return
    if "--opencue" in args and _command_word(args) == "serve":
        from cuectl.cli.serve_cmd import serve_args

        sys.argv[1:] = args = serve_args(args)
    if not os.environ.get("CUECTL_FULL_CLI") and "_CUECTL_COMPLETE" not in os.environ:
        if args[:1] == ["run"]:
            parsed = _parse_run(args[1:])
            if parsed is not None:
                sys.exit(_run_fast(parsed))
        else:
            report = _parse_report(args) if "report" in args[:4] else None
            if report is not None:
                sys.exit(_report_fast(*report))
            submit = _parse_submit(args) if "submit" in args[:3] else None
            if submit is not None:
                sys.exit(_submit_fast(*submit))
        module = _COMMAND_MODULES.get(_command_word(args) or "")
        if module is not None:
            _run_one_command(module)
            return
    from cuectl.cli.main import app

    app()


#: The top-level commands whose module registers them on a bare root (``register(app)``),
#: so that running one builds that module's commands alone, not all of them: typer turns
#: every command's signature into click parameters before it parses anything (~0.1 s of
#: `cuectl worker`'s start, as much again to import the other modules).
_COMMAND_MODULES = {
    "worker": "worker_cmd",
    "submit": "job_cmd",
    "job": "job_cmd",
    "frame": "job_cmd",
    "host": "host_cmd",
    "admin": "admin_cmd",
    "top": "top_cmd",
    "serve": "serve_cmd",
}


def _command_word(args: list[str]) -> str | None:
    """The sub-command ``args`` name after the root's own options, or None when anything
    else comes first (help, ``--version``, an unknown option: the full CLI answers)."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--db":
            i += 2
        elif arg.startswith("--db=") or arg == "--debug":
            i += 1
        elif arg.startswith("-"):
            return None
        else:
            return arg
    return None


def _run_one_command(module: str) -> None:
    """The root with one module's commands, run as ``cuectl.cli.main.app`` runs."""
    import importlib

    from cuectl.cli.root import new_app

    app = new_app()
    importlib.import_module(f"cuectl.cli.{module}").register(app)
    app()


def _parse_run(args: list[str]) -> dict[str, Any] | None:
    """``run_command``'s keywords for ``cuectl run ARGS``, exactly as typer would give them;
    None unless ``args`` are plainly ordinary (then the full CLI parses them)."""
    kw: dict[str, Any] = {}
    value: Any
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the command: options stop at its first word (allow_interspersed_args=False)
        if arg in _RUN_FLAGS:
            key, value = "wait", _RUN_FLAGS[arg]
            i += 1
        else:
            # None: -h, --help, an unknown option, a flag given a value (--no-wait=x), ...
            found = _option_value(args, i, _RUN_VALUE_OPTIONS)
            if found is None:
                return None
            key, text, i = found
            value = text
            if key == "gpus":
                if not set(text) <= _ASCII_DIGITS:
                    return None  # typer's int conversion decides, and words its refusal
                value = int(text)
            elif key == "lock_dir":
                from pathlib import Path

                value = Path(text)  # what typer makes of a Path option
        if not _put_option(kw, key, value, _RUN_LIST_OPTIONS):
            return None
    command = args[i:]
    if not command:
        return None  # typer's path says "no command given"
    kw["command"] = command
    return kw


def _put_option(kw: dict[str, Any], key: str, value: Any, lists: frozenset[str]) -> bool:
    """Add an option's value to ``kw``, appended for a repeatable one (``lists``); False
    when any other is given twice: typer keeps the last one, and that is left to it."""
    if key in lists:
        kw.setdefault(key, []).append(value)
        return True
    if key in kw:
        return False
    kw[key] = value
    return True


def _option_value(args: list[str], i: int, options: dict[str, str]) -> tuple[str, str, int] | None:
    """(keyword, value, index after it) of the option taking a value at ``args[i]``,
    ``--name value`` or ``--name=value`` (a short name only as ``-o value``); None where
    typer should decide: not one of ``options``, no value, an empty one, or one that
    starts with ``-``."""
    name, eq, text = args[i].partition("=")
    key = options.get(name) if not eq or name.startswith("--") else None
    if key is None:
        return None
    if not eq:
        if i + 1 >= len(args):
            return None
        text = args[i + 1]
    if not text or text.startswith("-"):
        return None
    return key, text, i + (1 if eq else 2)


def _run_fast(kw: dict[str, Any]) -> int:
    """``run_command(**kw)`` with the CLI's error handling (``cuectl.cli.guard``; no
    --debug here: it sends the invocation to the full CLI)."""
    from cuectl.cli.guard import guarded

    def call() -> int:
        from cuectl.run import quick

        status = quick.run(kw, _info)  # None: not a run it can do; nothing taken or started
        if status is not None:
            return status
        from cuectl.run.adhoc import run_command

        return run_command(**kw, say=_info)

    return guarded(call, debug=False)


def _info(text: str) -> None:
    from cuectl.cli import term

    term.info(text)


def _split_db(args: list[str]) -> tuple[str | None, list[str]] | None:
    """(``--db``'s value or None, the arguments after it) of ``cuectl [--db URL] ...``;
    None where typer should decide (an empty value, or one that starts with ``-``)."""
    db: str | None = None
    if args[:1] == ["--db"] and len(args) > 1:
        db, args = args[1], args[2:]
    elif args[:1] and args[0].startswith("--db="):
        db, args = args[0][len("--db=") :], args[1:]
    if db is not None and (not db or db.startswith("-")):
        return None
    return db, args


def _parse_report(args: list[str]) -> tuple[str | None, dict[str, Any]] | None:
    """(``--db``'s value, ``show_report``'s keywords) for ``cuectl [--db URL] admin report
    [OPTIONS]``, exactly as typer would give them; None unless plainly ordinary."""
    split = _split_db(args)
    if split is None:
        return None
    db, args = split
    if args[:2] != ["admin", "report"]:
        return None
    kw: dict[str, Any] = {}
    value: Any
    i = 2
    while i < len(args):
        if args[i] == "--json":
            key, value, i = "as_json", True, i + 1
        else:
            found = _option_value(args, i, _REPORT_VALUE_OPTIONS)
            if found is None:
                return None  # -h, --help, a positional argument, an unknown option, -oFILE, ...
            key, value, i = found
        if not _put_option(kw, key, value, frozenset()):
            return None
    return db, kw


def _report_fast(db: str | None, kw: dict[str, Any]) -> int:
    """``show_report(**kw)`` with the CLI's error handling and the store of ``--db``."""

    def call(store: Callable[[], Any]) -> None:
        from cuectl.cli.report_view import show_report

        show_report(store, **kw)

    return _with_store(db, call, create=False)


def _with_store(db: str | None, call: Callable[[Callable[[], Any]], None], *, create: bool) -> int:
    """``call(store)`` with the CLI's error handling (``cuectl.cli.guard``; no --debug here:
    it sends the invocation to the full CLI); ``store()`` opens the store of ``--db`` on
    first use and hands it back after, as the full CLI's ``AppState.store`` does, and it is
    closed at the end."""
    from cuectl.cli.guard import guarded

    opened: list[Any] = []

    def store() -> Any:
        if not opened:
            opened.append(open_cli_store(db, create=create))
        return opened[0]

    def run_call() -> None:
        try:
            call(store)
        finally:
            for s in opened:
                s.close()

    return guarded(run_call, debug=False)


def _parse_submit(args: list[str]) -> tuple[str | None, dict[str, Any]] | None:
    """(``--db``'s value, {"args": the command, "flags": the given ``SubmitFlags`` fields})
    for ``cuectl [--db URL] submit [FLAGS] -- COMMAND...``, exactly as typer would give
    them; None unless plainly ordinary (then the full CLI parses it)."""
    split = _split_db(args)
    if split is None:
        return None
    db, args = split
    if args[:1] != ["submit"]:
        return None
    # The option tables, made from cuectl.sched.intake.SubmitFlags: every flag of it is here.
    from cuectl.sched.intake import FLAG_KINDS, LIST_FLAGS, SWITCHES, VALUE_OPTIONS

    kw: dict[str, Any] = {}
    value: Any
    i = 1
    while i < len(args) and args[i] != "--":
        if args[i] in SWITCHES:
            key, value, i = SWITCHES[args[i]], True, i + 1
        else:
            # None: a spec file, -h, --json, --dry-run, notifications, an unknown option, ...
            found = _option_value(args, i, VALUE_OPTIONS)
            if found is None:
                return None
            key, value, i = found
            kind = FLAG_KINDS[key]
            if kind in ("int", "float"):
                # int and float: plain decimals only, as typer reads them; anything else
                # goes to typer, which converts it or words its refusal.
                whole, dot, part = value.partition(".")
                if not (
                    set(whole) <= _ASCII_DIGITS
                    and whole
                    and set(part) <= _ASCII_DIGITS
                    and (not dot or (kind == "float" and part))
                ):
                    return None
                value = float(value) if kind == "float" else int(value)
        if not _put_option(kw, key, value, LIST_FLAGS):
            return None
    command = args[i + 1 :]
    if i >= len(args) or not command:
        return None  # no `--` (a spec file, or the command without it), or no command
    return db, {"args": command, "flags": kw}  # after `--`, always a command (submit_flags.is_spec_form)


def _submit_fast(db: str | None, kw: dict[str, Any]) -> int:
    """``submit_flags.submit_flags`` of ``kw`` (the command and the flags' fields) with the
    CLI's error handling; the store of ``--db`` is opened (created if missing) only once
    the flags are valid."""

    def call(store: Callable[[], Any]) -> None:
        from cuectl.cli.submit_flags import submit_flags
        from cuectl.sched.intake import SubmitFlags

        submit_flags(store, kw["args"], SubmitFlags(**kw["flags"]), after_dashdash=True)

    return _with_store(db, call, create=True)


def open_cli_store(db: str | None, *, create: bool) -> Any:
    """The store a command names: ``--db``, else ``$CUECTL_DB`` or the default path. Only
    commands that add work (``submit``, ``worker``) create a missing one: a mistyped --db or
    CUECTL_DB must be an error naming the path, not an empty queue forever."""
    from cuectl import config
    from cuectl.sched.store import open_store

    return open_store(db or config.default_db_url(), busy_timeout_s=config.busy_timeout(), create=create)
