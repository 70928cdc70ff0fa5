"""Shell completion for bash, zsh and fish (docs/completion.md).

Two halves, both loaded only when asked for, so ``cuectl --help`` pays nothing:

- ``cuectl completion SHELL`` prints the script the user's shell sources
  (``completion_script``).
- The script runs ``cuectl`` with ``_CUECTL_COMPLETE=bash_complete`` (``zsh_complete``,
  ``fish_complete``) and ``COMP_WORDS``/``COMP_CWORD``: click's completion protocol.
  ``CuectlGroup`` hands such a request to ``shell_complete``, which attaches completers to
  the parameters of the click command tree by name (job, frame and host arguments, ``--job``,
  ``--state``, ``--gpu-vendor``, ``--backend``, ``--by``, …) and answers in the shell's format.

The scripts are cuectl's own and speak click 8's completion protocol, which both typer's
vendored click and the click package answer. Completion never
creates a store, never prints a traceback (any error means no suggestions) and opens the
store only to complete a job, frame or host.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, MutableMapping, Sequence

from cuectl.errors import InvalidInput

if TYPE_CHECKING:
    from typer._click.core import Command, Context, Parameter
    from typer._click.shell_completion import CompletionItem
else:
    try:  # typer >= 0.2x vendors click; older releases depend on the click package
        from typer._click.shell_completion import CompletionItem
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.shell_completion import CompletionItem

SHELLS = ("bash", "zsh", "fish")
LIMIT = 200  # most jobs, frames or hosts offered at one <TAB>
GPU_VENDORS = ("NVIDIA", "AMD", "Apple", "Intel")
BACKENDS = ("auto", "nvml", "smi", "apple", "amd", "fake")
REPORT_FORMATS = ("table", "csv", "json", "prometheus")
TOKEN_ROLES = ("admin", "user", "viewer")
QUOTA_KINDS = ("user", "project")

# -- the scripts: each asks `cuectl` itself, with the words typed so far ----------------------
# The protocol (click 8's, which typer's click speaks): the request is the environment
# %(complete_var)s=<shell>_complete with COMP_WORDS/COMP_CWORD; the answer is one item per
# line — bash: "type,value"; zsh: three lines "type", "value", "help" ("_": none); fish:
# "type,value" with a tab and the help. Types: plain (a value), file, dir.

_SOURCE_BASH = """\
# cuectl completion for bash: eval "$(cuectl completion bash)"
%(complete_func)s() {
    local IFS=$'\\n' line kind value
    COMPREPLY=()
    for line in $(COMP_WORDS="${COMP_WORDS[*]}" COMP_CWORD="$COMP_CWORD" \\
                  %(complete_var)s=bash_complete "$1" 2>/dev/null); do
        kind=${line%%%%,*}
        value=${line#*,}
        case $kind in
            plain) COMPREPLY+=("$value") ;;
            file) compopt -o default; COMPREPLY=() ;;
            dir) compopt -o dirnames; COMPREPLY=() ;;
        esac
    done
}
complete -o nosort -F %(complete_func)s %(prog_name)s
"""

_SOURCE_ZSH = """\
#compdef %(prog_name)s
# cuectl completion for zsh: eval "$(cuectl completion zsh)" (after compinit)
%(complete_func)s() {
    local -a answer described bare
    local kind value help i
    answer=("${(@f)$(COMP_WORDS="${words[*]}" COMP_CWORD=$((CURRENT - 1)) \\
                     %(complete_var)s=zsh_complete %(prog_name)s 2>/dev/null)}")
    for (( i = 1; i + 2 <= ${#answer}; i += 3 )); do
        kind=${answer[i]} value=${answer[i+1]} help=${answer[i+2]}
        case $kind in
            plain) if [[ $help == _ ]]; then bare+=("$value"); else described+=("$value:$help"); fi ;;
            file) _path_files -f ;;
            dir) _path_files -/ ;;
        esac
    done
    (( ${#described} )) && _describe -V unsorted described -U
    (( ${#bare} )) && compadd -U -V unsorted -a bare
    return 0
}
if [[ ${zsh_eval_context[-1]} == loadautofunc ]]; then
    %(complete_func)s "$@"
else
    compdef %(complete_func)s %(prog_name)s
fi
"""

_SOURCE_FISH = """\
# cuectl completion for fish: cuectl completion fish > ~/.config/fish/completions/cuectl.fish
function %(complete_func)s
    set -l line
    for line in (env %(complete_var)s=fish_complete COMP_WORDS=(commandline -cp) \\
                     COMP_CWORD=(commandline -t) %(prog_name)s 2>/dev/null)
        set -l parts (string split -m 1 "," -- $line)
        switch $parts[1]
            case plain
                printf '%%s\\n' $parts[2]
            case file
                __fish_complete_path $parts[2]
            case dir
                __fish_complete_directories $parts[2]
        end
    end
end
complete --no-files --command %(prog_name)s --arguments "(%(complete_func)s)"
"""

_SOURCES = {"bash": _SOURCE_BASH, "zsh": _SOURCE_ZSH, "fish": _SOURCE_FISH}


def completion_script(shell: str, *, prog_name: str = "cuectl", complete_var: str = "_CUECTL_COMPLETE") -> str:
    """The script for ``shell`` (bash, zsh or fish); anything else is InvalidInput."""
    template = _SOURCES.get(shell.strip().lower())
    if template is None:
        raise InvalidInput(f"unknown shell {shell!r}: expected one of {', '.join(SHELLS)}")
    func = "_" + "".join(c for c in prog_name.replace("-", "_") if c.isalnum() or c == "_") + "_completion"
    return template % {"complete_func": func, "complete_var": complete_var, "prog_name": prog_name}


# -- click's protocol: what the shell sent, and the answer in its format ----------------------


def _split(text: str) -> list[str]:
    try:
        from typer._click.shell_completion import split_arg_string
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.shell_completion import split_arg_string
    return split_arg_string(text)


def _words() -> tuple[list[str], str]:
    """(complete args after ``cuectl``, the word being completed) for bash and zsh."""
    from cuectl import config

    cwords = _split(config.env("COMP_WORDS") or "")
    cword = int(config.env("COMP_CWORD") or len(cwords))
    return cwords[1:cword], cwords[cword] if cword < len(cwords) else ""


def _fish_words() -> tuple[list[str], str]:
    """Fish sends the whole line up to the cursor and the word being completed on its own."""
    from cuectl import config

    args = _split(config.env("COMP_WORDS") or "")[1:]
    incomplete = config.env("COMP_CWORD") or ""
    if incomplete:
        incomplete = (_split(incomplete) or [""])[0]
    if incomplete and args and args[-1] == incomplete:
        args.pop()
    return args, incomplete


def _format(shell: str, item: CompletionItem) -> str:
    from cuectl.cli.term import safe

    # The help (a job's name, a frame's): shown by zsh and fish, its control characters
    # escaped as every view escapes them (term.safe).
    value, help_ = str(item.value), safe(" ".join(str(item.help or "").split()))
    if shell == "bash":
        return f"{item.type},{value}"
    if shell == "zsh":
        if not help_:
            return f"{item.type}\n{value}\n_"
        return f"{item.type}\n{value.replace(':', chr(92) + ':')}\n{help_}"
    return f"{item.type},{value}\t{help_}" if help_ else f"{item.type},{value}"


def shell_complete(
    cli: Command, ctx_args: MutableMapping[str, Any], prog_name: str, complete_var: str, instruction: str
) -> int:
    """Answer one ``_CUECTL_COMPLETE=<shell>_<source|complete>`` request; the exit code."""
    shell, _, action = instruction.strip().lower().partition("_")
    if shell in ("source", "complete"):  # typer's older order (complete_bash) reads the same
        shell, action = action, shell
    if shell not in SHELLS or action not in ("source", "complete"):
        sys.stderr.write(
            f"cuectl: unsupported completion request {complete_var}={instruction!r} "
            f"(expected <bash|zsh|fish>_complete)\n"
        )
        return 1
    if action == "source":
        sys.stdout.write(completion_script(shell, prog_name=prog_name, complete_var=complete_var))
        return 0
    lines: list[str] = []
    sink = io.StringIO()
    try:
        # Nothing but the answer may reach the shell: no warning, no traceback, no callback's echo.
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            attach_completers(cli)
            args, incomplete = _fish_words() if shell == "fish" else _words()
            lines = [_format(shell, item) for item in _completions(cli, ctx_args, prog_name, args, incomplete)]
    except Exception:  # noqa: BLE001 - completion must never fail loudly: no suggestions instead
        lines = []
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _completions(
    cli: Command, ctx_args: MutableMapping[str, Any], prog_name: str, args: list[str], incomplete: str
) -> list[CompletionItem]:
    try:
        from typer._click.shell_completion import _resolve_context, _resolve_incomplete
    except ImportError:  # pragma: no cover - depends on the installed typer
        from click.shell_completion import _resolve_context, _resolve_incomplete  # type: ignore[assignment]
    ctx = _resolve_context(cli, dict(ctx_args), prog_name, args)
    obj, incomplete = _resolve_incomplete(ctx, args, incomplete)
    return list(obj.shell_complete(ctx, incomplete))


# -- which parameter completes what ------------------------------------------------------------

Completer = Callable[["Context", "Parameter", str], list[CompletionItem]]


def _walk(command: Command, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Command]]:
    yield path, command
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from _walk(sub, (*path, name))


def attach_completers(cli: Command) -> None:
    """Give the parameters that name jobs, frames, hosts or fixed choices a completer (the
    commands' modules stay as they are: this runs only when completion is requested)."""
    for path, command in _walk(cli):
        for param in command.params:
            completer = completer_for(path, param)
            if completer is not None and getattr(param, "_custom_shell_complete", None) is None:
                param._custom_shell_complete = _quiet(completer)


def completer_for(path: Sequence[str], param: Parameter) -> Completer | None:
    name = param.name or ""
    opts = set(getattr(param, "opts", ()))
    argument = param.param_type_name == "argument"
    if (argument and name in ("job", "jobs")) or opts & {"--job", "--on-job"}:
        return _jobs
    if argument and name in ("frame", "frames"):
        return _frames
    if argument and name == "host":
        return _hosts
    if "--db" in opts:
        return _files
    if "--state" in opts:
        return _frame_states if path[:1] == ("frame",) else _job_states
    if opts & {"--gpu-vendor", "--vendor"}:
        return _choices(GPU_VENDORS)
    if "--backend" in opts:
        return _choices(BACKENDS)
    if "--by" in opts:
        return _report_groupings
    if "--type" in opts and tuple(path[-2:]) == ("job", "depend"):
        from cuectl.sched.model import OPENCUE_DEPEND_TYPES

        return _choices(OPENCUE_DEPEND_TYPES)
    if "--format" in opts and tuple(path[-2:]) == ("admin", "report"):
        return _choices(REPORT_FORMATS)
    if "--role" in opts:
        return _choices(TOKEN_ROLES)
    if argument and name == "kind" and "quota" in path:
        return _choices(QUOTA_KINDS)
    if argument and name == "shell" and tuple(path) == ("completion",):
        return _choices(SHELLS)
    return None


def _quiet(completer: Completer) -> Completer:
    def complete(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            return completer(ctx, param, incomplete)
        except Exception:  # noqa: BLE001 - a missing or broken store: no suggestions
            return []

    return complete


def _matching(values: Iterable[tuple[str, str | None]], incomplete: str) -> list[CompletionItem]:
    low = incomplete.lower()
    # A value with control characters (a name edited into the store) would forge an answer
    # line or reach the shell's line raw: not offered (its id still is).
    return [
        CompletionItem(value, help=help_)
        for value, help_ in values
        if value.lower().startswith(low) and value.isprintable()
    ]


def _choices(values: Sequence[str]) -> Completer:
    def complete(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
        return _matching(((v, None) for v in values), incomplete)

    return complete


def _files(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    """A store path: the shell completes file names."""
    return [CompletionItem(incomplete, type="file")]


def _job_states(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    from cuectl.cli import job_cmd

    return _matching(((s, None) for s in getattr(job_cmd, "JOB_LIST_STATES", ("PENDING", "FINISHED"))), incomplete)


def _frame_states(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    from cuectl.sched.model import FRAME_STATES

    return _matching(((s, None) for s in FRAME_STATES), incomplete)


def _report_groupings(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    from cuectl.sched.usage_sql import GROUPINGS

    return _matching(((g, None) for g in GROUPINGS), incomplete)


@contextlib.contextmanager
def _store(ctx: Context) -> Iterator[Any]:
    """The store the command line being completed names (``--db``), else the configured one;
    never created, and given a short busy timeout (a <TAB> must not hang)."""
    from cuectl import config
    from cuectl.sched.store import open_store

    url = ctx.find_root().params.get("db") or config.default_db_url()
    store = open_store(url, create=False, busy_timeout_s=min(config.busy_timeout(), 1.0))
    try:
        yield store
    finally:
        store.close()


def _given(ctx: Context, param: Parameter) -> set[str]:
    """Values this parameter already has on the line (``frame retry 3 4 <TAB>`` skips 3, 4)."""
    value = ctx.params.get(param.name or "")
    if isinstance(value, (list, tuple)):
        return {str(v) for v in value}
    return set()


def _jobs(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    """Job ids (with the name as help), unfinished first, newest first; then the names."""
    with _store(ctx) as store:
        jobs = store.list_jobs(include_finished=False, newest_first=True, limit=LIMIT)
        if len(jobs) < LIMIT:
            known = {j["id"] for j in jobs}
            jobs += [j for j in store.list_jobs(newest_first=True, limit=LIMIT) if j["id"] not in known]
    jobs = jobs[:LIMIT]
    given = _given(ctx, param)
    ids: list[tuple[str, str | None]] = []
    names: dict[str, list[int]] = {}
    for job in jobs:
        state = str(job.get("display_state") or job.get("outcome") or job.get("state") or "").lower() + (
            ", paused" if job.get("paused") else ""
        )
        if str(job["id"]) not in given:
            ids.append((str(job["id"]), f"{job['name']} ({state})"))
        names.setdefault(str(job["name"]), []).append(job["id"])
    named = [
        (n, f"job {found[0]}" if len(found) == 1 else f"{len(found)} jobs: use an id")
        for n, found in names.items()
        if n not in given
    ]
    return _matching(ids, incomplete) + _matching(named, incomplete)


def _frames(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    """Frame ids: running, waiting and depend frames first, then dead ones (what `frame retry`
    and `frame log` are for), at most LIMIT, each with its job, name and state as help.
    After ``JOB/``: that job's frames by name (``sweep2/0003-main``)."""
    from cuectl.sched import model as m

    given = _given(ctx, param)
    if "/" in incomplete:
        return _frame_names(ctx, incomplete, given)
    found: list[tuple[str, str | None]] = []
    with _store(ctx) as store:
        for state in (m.RUNNING, m.WAITING, m.DEPEND, m.DEAD):
            if len(found) >= LIMIT:
                break
            frames, _total = store.list_frames(state=state, limit=LIMIT - len(found))
            found += [
                (str(f["id"]), f"{f.get('job')} {f.get('name')} ({str(f.get('state')).lower()})")
                for f in frames
                if str(f["id"]) not in given
            ]
    return _matching(found, incomplete)


def _frame_names(ctx: Context, incomplete: str, given: set[str]) -> list[CompletionItem]:
    """``JOB/FRAME`` for the frames of the job before the last ``/`` (nothing for an unknown
    or ambiguous job: a <TAB> never prints an error)."""
    from cuectl.errors import CuectlError

    job = incomplete.rpartition("/")[0]
    try:
        with _store(ctx) as store:
            frames, _total = store.list_frames(job=job, limit=LIMIT)
    except CuectlError:
        return []
    return _matching(
        ((f"{job}/{f['name']}", str(f.get("state")).lower()) for f in frames if f"{job}/{f['name']}" not in given),
        incomplete,
    )


def _hosts(ctx: Context, param: Parameter, incomplete: str) -> list[CompletionItem]:
    from cuectl.sched import model as m

    with _store(ctx) as store:
        hosts = store.list_hosts(now=store.clock(), down_after=m.HOST_DOWN_AFTER_S)
    return _matching(
        (
            (str(h["name"]), str(h.get("state", "")).lower() + (", locked" if h.get("locked") else ""))
            for h in hosts[:LIMIT]
        ),
        incomplete,
    )
