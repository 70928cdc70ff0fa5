"""``cuectl submit [FLAGS] -- COMMAND [ARGS...]``, the one-layer form, without typer.

Both ways into it call :func:`flag_spec` with the flags given as one
``cuectl.sched.intake.SubmitFlags``: the typer command (``cuectl.cli.job_cmd.submit``,
which also takes spec files, notifications, ``--dry-run`` and ``--json``) and the console
script's fast path (``cuectl.cli.entry``, its option tables derived from ``SubmitFlags``),
which answers an ordinary flag-form submit
without loading typer, click and the command tree (~50 ms of a ~200 ms submit; a pipeline
that submits a job per shot pays it every time).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from cuectl.errors import InvalidInput
from cuectl.sched.intake import SPEC_SUFFIXES, SubmitFlags

if TYPE_CHECKING:
    from cuectl.sched.model import JobSpec

# Interpreters: `python3 train.py` is named after train.py, not python3.
_INTERPRETERS = r"(python|pypy|bash|sh|zsh|dash|ksh|node|perl|ruby|php|lua|julia|rscript)[0-9.]*"


def is_spec_form(args: Sequence[str], name: str | None, *, after_dashdash: bool = False) -> bool:
    """Whether ``cuectl submit ARGS`` names a job spec (a file, or - for standard input)
    rather than a command: one argument, and no --name, or a spec's suffix, or ``-``.
    Words after ``--`` are always a command, even one (``submit --gpus 1 -- nvidia-smi``),
    as for every program that takes ``--`` (POSIX utility syntax guideline 10)."""
    if after_dashdash:
        return False
    return len(args) == 1 and (name is None or args[0] == "-" or args[0].lower().endswith(SPEC_SUFFIXES))


def name_from_command(argv: Sequence[str]) -> str:
    """The job name of ``cuectl submit -- CMD ARGS`` without --name (docs/job-spec.md):
    the basename of the command, or of the script when the command is an interpreter
    (``python3 train.py`` -> ``train.py``); invisible characters become ``_``, a name of
    only digits gets a ``job-`` prefix (digits mean a job id)."""
    import re

    from cuectl.sched.fields import invisible_character
    from cuectl.sched.spec import MAX_JOB_NAME

    def base(word: str) -> str:
        return word.rstrip("/").rsplit("/", 1)[-1]

    word = base(argv[0])
    script = argv[1] if len(argv) > 1 else ""
    if re.fullmatch(_INTERPRETERS, word, re.IGNORECASE) and script and not script.startswith("-"):
        word = base(script)
    word = "".join(c if c == " " or invisible_character(c) is None else "_" for c in word).strip()
    if not word:
        word = "job"
    if word.isdigit():
        word = f"job-{word}"
    return word[:MAX_JOB_NAME].strip()


def flag_spec(
    args: Sequence[str], flags: SubmitFlags, *, param: Sequence[str] = (), after_dashdash: bool = False
) -> "JobSpec":
    """The job of ``cuectl submit [FLAGS] -- ARGS`` (``flags``: those given), validated;
    ``InvalidInput`` names the flag at fault. ``after_dashdash``: the words came after
    ``--``, so they are a command whatever they look like."""
    from cuectl.sched.intake import SubmitContext

    if not args:
        raise InvalidInput(
            "give one job spec file, - for standard input, or a command after --",
            hint="cuectl submit job.yaml | cuectl submit - < job.yaml | "
            "cuectl submit [--name N] --range 1-10 -- CMD ARGS",
        )
    if param:
        raise InvalidInput("--param: only for Open Job Description templates (a spec file)")
    # Two words without `--`, the first a spec's name: two spec files, not a command.
    if not after_dashdash and len(args) > 1 and args[0].lower().endswith(SPEC_SUFFIXES):
        raise InvalidInput(
            "give one job spec file (one job per submit)",
            hint="cuectl submit job.yaml; for a command: cuectl submit -- CMD ARGS",
        )
    return flags.job_spec(
        list(args), SubmitContext.here(), name=name_from_command(args) if flags.name is None else None
    )


def submit_flags(
    store: Callable[[], Any], args: Sequence[str], flags: SubmitFlags, *, after_dashdash: bool = False
) -> None:
    """Submit the job of ``cuectl submit [FLAGS] -- ARGS`` to ``store()`` (opened only once
    the flags are valid) and print its id, as the typer command does."""
    from cuectl.cli import term

    spec = flag_spec(args, flags, after_dashdash=after_dashdash)  # (before the store: bad flags create no store file)
    job_id = store().submit(spec, now=time.time())
    term.line(str(job_id))
