"""``cuectl submit``, ``cuectl job …`` and ``cuectl frame …``: parse, call the library, render."""

import time
from typing import Any, List, Optional

import typer
from typer.core import TyperCommand

from cuectl.cli import submit_flags, term
from cuectl.errors import InvalidInput
from cuectl.sched import model as m

job_app = typer.Typer(help="Inspect and control jobs.", no_args_is_help=True)
frame_app = typer.Typer(help="Inspect and control frames.", no_args_is_help=True)

JSON_OPT = typer.Option(False, "--json", help="Print JSON (stable keys, see docs/json.md).")
FORCE_OPT = typer.Option(False, "--force", help="Change another user's job (SQLite stores only; see docs/security.md).")


def _store(ctx: typer.Context):
    return ctx.obj.store()


# -- submit ------------------------------------------------------------------------------
_AFTER_DASHDASH = "cuectl.submit.after_dashdash"


class SubmitCommand(TyperCommand):
    """``cuectl submit``, remembering whether its words came after ``--``: click drops the
    ``--``, and after it one word is a command (``submit --gpus 1 -- nvidia-smi``), never
    a spec file. Those words are the last ones given, right after the ``--``."""

    def parse_args(self, ctx: Any, args: List[str]) -> List[str]:
        given = list(args)  # click consumes the list it parses
        rest = super().parse_args(ctx, args)
        words = list(ctx.params.get("args") or [])
        n = len(words)
        ctx.meta[_AFTER_DASHDASH] = bool(n) and len(given) > n and given[-n - 1] == "--" and given[-n:] == words
        return rest


def submit(
    ctx: typer.Context,
    args: Optional[List[str]] = typer.Argument(
        None,
        metavar="SPEC.yaml | - | -- COMMAND [ARGS...]",
        help="A job spec file (YAML or JSON), - to read it from standard input, or the command after --.",
    ),
    name: Optional[str] = typer.Option(
        None, "--name", help="Job name (flag form: one layer; default: named after the command, see docs/job-spec.md)."
    ),
    range_: str = typer.Option("1", "--range", help="Frame range (OpenCue FrameSet: 1-100, 1-100x2, 1-10:5…)."),
    chunk: int = typer.Option(1, "--chunk", help="Frames per chunk."),
    layer: Optional[str] = typer.Option(None, "--layer", help="Layer name (default: main)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="Devices per frame (default 0, or the service's)."),
    gpu_vendor: Optional[str] = typer.Option(None, "--gpu-vendor", help="NVIDIA, AMD, Apple or Intel."),
    gpu_model: List[str] = typer.Option(
        [], "--gpu-model", help="Allowed model (repeatable): A100, 'RTX 4090', '*V100*'."
    ),
    gpu_memory_min: Optional[str] = typer.Option(None, "--gpu-memory-min", help="Memory per device, e.g. 24G."),
    gpu_capability_min: Optional[str] = typer.Option(
        None, "--gpu-capability-min", metavar="X.Y", help="CUDA compute capability per device, at least (8.9)."
    ),
    gpu_driver_min: Optional[str] = typer.Option(
        None, "--gpu-driver-min", metavar="VERSION", help="Driver version per device, at least (535.104.05)."
    ),
    gpu_cuda_min: Optional[str] = typer.Option(
        None, "--gpu-cuda-min", metavar="X.Y", help="The driver's CUDA version, at least (12.2)."
    ),
    cores: Optional[float] = typer.Option(None, "--cores", help="CPU cores reserved per frame (at least 0.1)."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Host RAM reserved per frame, e.g. 8G."),
    priority: int = typer.Option(0, "--priority", help="Higher runs first."),
    retries: Optional[int] = typer.Option(None, "--retries", help="Retries after a failure (default 3)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Per-frame timeout, e.g. 30m."),
    env: List[str] = typer.Option([], "--env", help="K=V for the frame environment (repeatable)."),
    tag: List[str] = typer.Option([], "--tag", help="Only hosts with this tag (repeatable)."),
    paused: bool = typer.Option(False, "--paused", help="Submit paused."),
    log_limit: Optional[str] = typer.Option(
        None, "--log-limit", help="Bytes each attempt's log may keep, head and tail (e.g. 100M; default: the worker's)."
    ),
    project: Optional[str] = typer.Option(
        None,
        "--project",
        metavar="NAME",
        help="The job's project, for quotas and reports (with a spec: replaces its project).",
    ),
    show: Optional[str] = typer.Option(
        None,
        "--show",
        metavar="NAME",
        help="The job's show (OpenCue's; CUE_SHOW, `job list --show`, `admin report "
        "--by show`; with a spec: replaces its show).",
    ),
    shot: Optional[str] = typer.Option(
        None,
        "--shot",
        metavar="NAME",
        help="The job's shot (CUE_SHOT, `job list --shot`; with a spec: replaces its shot).",
    ),
    service: Optional[str] = typer.Option(
        None,
        "--service",
        metavar="NAME",
        help="The layer's service: its defaults fill the resources not given (`cuectl admin service list`).",
    ),
    max_running: Optional[int] = typer.Option(
        None,
        "--max-running",
        metavar="N",
        help="At most N frames of the job running at once, farm-wide (with a spec: replaces its max_running).",
    ),
    max_cores: Optional[float] = typer.Option(
        None,
        "--max-cores",
        metavar="N",
        help="At most N cores held by the job's running frames (with a spec: replaces its max_cores).",
    ),
    max_gpus: Optional[int] = typer.Option(
        None,
        "--max-gpus",
        metavar="N",
        help="At most N GPUs held by the job's running frames (with a spec: replaces its max_gpus).",
    ),
    limit: List[str] = typer.Option(
        [],
        "--limit",
        metavar="NAME",
        help="A named limit each running frame holds (repeatable; `cuectl admin limit list`).",
    ),
    retry_delay: Optional[str] = typer.Option(
        None,
        "--retry-delay",
        metavar="DUR",
        help="Wait before a failed frame runs again, doubled per further failure (default 2s; 0: at once).",
    ),
    retry_on_gpu_oom: Optional[str] = typer.Option(
        None,
        "--retry-on-gpu-oom",
        metavar="same|bigger",
        help="bigger: a frame that ran out of GPU memory runs again only on a device with more "
        "memory (DEAD at once when the farm has none); same (default): on any fitting device.",
    ),
    gpu_escape: Optional[str] = typer.Option(
        None,
        "--gpu-escape",
        metavar="warn|kill",
        help="A frame's process on a GPU it was not given: warn (the worker's default) or kill "
        "(failure gpu-escape, not retried on that host); docs/gpu-health.md.",
    ),
    gpu_idle_limit: Optional[str] = typer.Option(
        None,
        "--gpu-idle-limit",
        metavar="DUR",
        help="Flag a frame whose every GPU stays under --gpu-idle-util for this long (e.g. 30m).",
    ),
    gpu_idle_action: Optional[str] = typer.Option(
        None,
        "--gpu-idle-action",
        metavar="warn|kill",
        help="What an idle frame gets: warn (default) or kill (gpu-idle).",
    ),
    gpu_idle_util: Optional[float] = typer.Option(
        None, "--gpu-idle-util", metavar="PCT", help="Utilisation under which a held GPU counts as idle (default 5)."
    ),
    gpu_share: Optional[str] = typer.Option(
        None,
        "--gpu-share",
        metavar="SIZE",
        help="Part of one GPU by memory budget (e.g. 10G): frames share a device while their budgets fit it.",
    ),
    gpu_share_enforce: Optional[str] = typer.Option(
        None,
        "--gpu-share-enforce",
        metavar="warn|kill",
        help="A share over its budget: kill (default, after two samples over) or warn.",
    ),
    chdir: Optional[str] = typer.Option(
        None, "--chdir", "-D", metavar="DIR", help="Directory the frames run in (default: this one, as sbatch)."
    ),
    export: Optional[str] = typer.Option(
        None,
        "--export",
        metavar="VARS",
        help="Which of your environment variables travel with the job: BASE "
        "(default: PATH, virtualenv/conda, PYTHONPATH, LD_LIBRARY_PATH, "
        "locale, TZ), NONE, ALL (but secret-looking names), names, "
        "NAME=VALUE; comma separated.",
    ),
    notify_command: List[str] = typer.Option(
        [],
        "--notify-command",
        metavar="CMD",
        help="Run this shell command (as you) when the job finishes or fails; the job's JSON on stdin (repeatable).",
    ),
    notify_webhook: List[str] = typer.Option(
        [], "--notify-webhook", metavar="URL", help="POST the job's JSON to this http(s) URL (repeatable)."
    ),
    notify_email: List[str] = typer.Option(
        [], "--notify-email", metavar="ADDR", help="Mail this address through the local MTA (repeatable)."
    ),
    notify_on: List[str] = typer.Option(
        [],
        "--notify-on",
        metavar="EVENT",
        help="When to notify: finished, failed, dead (a frame went DEAD); repeatable; default finished and failed.",
    ),
    param: List[str] = typer.Option(
        [],
        "--param",
        metavar="NAME=VALUE",
        help="A job parameter of an Open Job Description template (repeatable; docs/openjd.md).",
    ),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse a spec with anything cuectl cannot honour (each is otherwise a warning; docs/opencue-xml.md).",
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Validate and print what would be created; create nothing (no store is opened)."
    ),
    as_json: bool = JSON_OPT,
) -> None:
    """Submit a job: a YAML/JSON spec (a file, or - for standard input) with several layers,
    or one layer from flags and the command after -- (named after the command without --name)."""
    import dataclasses

    from cuectl.sched import intake

    args = list(args or [])
    after_dashdash = bool(ctx.meta.get(_AFTER_DASHDASH))
    flags = _given_flags(ctx)
    if submit_flags.is_spec_form(args, name, after_dashdash=after_dashdash):
        # A spec (a file, or - for standard input); flags given too override it (SubmitFlags.adjuster).
        context = intake.SubmitContext.here()
        flags.adjuster()  # the flags are checked before the spec is read: errors name the flag
        loaded = intake.load(_read_source(args[0]), context, flags=flags, params=param, strict=strict, warn=term.warn)
        job_specs = list(loaded.jobs)
    else:  # one layer from the flags, the command after -- (the console script's fast path too)
        loaded = None
        job_specs = [submit_flags.flag_spec(args, flags, param=param, after_dashdash=after_dashdash)]
    if notify_command or notify_webhook or notify_email or notify_on:  # added to a spec's notify:
        from cuectl.sched import notify as nt

        added = nt.from_flags(commands=notify_command, webhooks=notify_webhook, emails=notify_email, on=notify_on)
        job_specs = [
            dataclasses.replace(job_spec, notify=nt.entries([*job_spec.notify, *added])) for job_spec in job_specs
        ]
        if loaded is not None:
            loaded = loaded._replace(jobs=tuple(job_specs))
    if dry_run:
        return _print_dry_run(job_specs, as_json)
    store = ctx.obj.store(create=True)
    if loaded is None:
        ids = [store.submit(job_specs[0], now=time.time())]
    else:
        ids = intake.submit(store, loaded, now=time.time(), warn=term.warn)
    many = loaded is not None and loaded.format == intake.OPENCUE_XML  # an OpenCue spec: a list, always
    if as_json:
        from cuectl.sched.pending import describe_job

        described = [describe_job(store, job_id) for job_id in ids]
        term.emit_json({"jobs": described} if many else described[0])
    else:
        for job_id in ids:
            term.line(str(job_id))


def _given_flags(ctx: typer.Context) -> Any:
    """The job flags given on the command line (not a default), as one ``SubmitFlags``:
    each typer option is matched to its field by its flag name."""
    from cuectl.sched.intake import FLAG_OPTIONS, SubmitFlags

    given: dict[str, Any] = {}
    for parameter in ctx.command.params:
        source = ctx.get_parameter_source(parameter.name or "")
        if source is None or source.name not in ("COMMANDLINE", "ENVIRONMENT"):
            continue
        option = next((o for o in parameter.opts if o in FLAG_OPTIONS), None)
        if option is not None:
            given[option] = ctx.params[parameter.name or ""]
    return SubmitFlags.from_options(given)


def _read_source(word: str) -> Any:
    """The spec ``cuectl submit WORD`` names (``-``: standard input); a word that names no
    file, and not a spec's either, may be a one-word command that needed ``--``."""
    from pathlib import Path

    from cuectl.sched import intake

    try:
        return intake.read_source(word)
    except InvalidInput as exc:
        if (
            exc.hint is None
            and word != intake.STDIN
            and not word.lower().endswith(submit_flags.SPEC_SUFFIXES)
            and not word.lower().endswith(intake.XML_SUFFIX)
            and not Path(word).exists()
        ):
            raise InvalidInput(
                exc.message,
                hint="one argument is a job spec file; to run a one-word "
                f"command, put it after --: cuectl submit -- {word}",
            ) from None
        raise


def _print_dry_run(job_specs: List[Any], as_json: bool) -> None:
    """``submit --dry-run``: what would be created (docs/json.md shape without ids)."""
    from cuectl.sched.preview import spec_json

    shown = [spec_json(job_spec) for job_spec in job_specs]
    if as_json:
        term.emit_json({"dry_run": True, "jobs": shown})
        return
    for job in shown:
        term.line(
            f"would submit job {job['name']!r}: {len(job['layers'])} layer(s), {job['frames']} frame(s) "
            f"({', '.join(layer['name'] + ': ' + str(layer['frames']) for layer in job['layers'])})"
        )


# -- job ---------------------------------------------------------------------------------
def _state(job: dict) -> str:
    """A finished job by how it ended (KILLED, FAILED, SUCCEEDED): FINISHED alone said
    the same of a killed job as of a successful one; an unfinished one RUNNING while a
    frame of it runs (views.job_display_state), else PENDING."""
    return (job.get("display_state") or job.get("outcome") or job["state"]) + (" (paused)" if job["paused"] else "")


def _job_in_state(job: dict, wanted: str) -> bool:
    """``--state``: PENDING is every unfinished job (OpenCue's word, running or not),
    RUNNING those with a running frame, FINISHED every finished one, else the outcome."""
    return wanted in (job["state"], job.get("outcome"), job.get("display_state"))


def _counts(job: dict) -> str:
    c = job["frame_counts"]
    done = c.get(m.SUCCEEDED, 0) + c.get(m.EATEN, 0)
    total = sum(c.values())
    parts = [f"{done}/{total} done"]
    for state in (m.RUNNING, m.WAITING, m.DEPEND, m.DEAD):
        if c.get(state):
            parts.append(f"{c[state]} {state.lower()}")
    return ", ".join(parts)


JOB_LIST_STATES = ("PENDING", "RUNNING", "FINISHED", "SUCCEEDED", "FAILED", "KILLED")


@job_app.command("list")
def job_list(
    ctx: typer.Context,
    as_json: bool = JSON_OPT,
    active: bool = typer.Option(False, "--active", help="Hide finished jobs."),
    user: Optional[str] = typer.Option(None, "--user", "-u", help="Only this user's jobs."),
    state: Optional[str] = typer.Option(
        None,
        "--state",
        help="PENDING (not finished), RUNNING (a frame "
        "runs), FINISHED, or how a finished job "
        "ended: SUCCEEDED, FAILED, KILLED.",
    ),
    name: Optional[str] = typer.Option(None, "--name", help="Only jobs named so (a glob: 'shot010-*')."),
    limit: Optional[int] = typer.Option(None, "--limit", "-n", help="Only the newest N jobs."),
    show: Optional[str] = typer.Option(None, "--show", help="Only jobs of this show."),
    shot: Optional[str] = typer.Option(None, "--shot", help="Only jobs of this shot."),
) -> None:
    """List jobs (newest last), with filters like squeue's: --user, --state, --name, --show, --shot."""
    import fnmatch

    from cuectl.sched.pending import add_pending_reasons

    wanted = state.upper() if state else None
    if wanted is not None and wanted not in JOB_LIST_STATES:
        raise InvalidInput(f"--state: {state!r} is not one of {', '.join(JOB_LIST_STATES)}")
    if limit is not None and limit < 1:
        raise InvalidInput(f"--limit: must be 1 or more, got {limit}")
    # The store filters by user (and state); pending reasons only for the jobs listed.
    store = _store(ctx)
    jobs = [
        j
        for j in store.list_jobs(include_finished=not active, user=user, show=show, shot=shot)
        if (name is None or fnmatch.fnmatchcase(j["name"], name)) and (wanted is None or _job_in_state(j, wanted))
    ]
    if limit is not None:
        jobs = jobs[-limit:]
    add_pending_reasons(store, jobs)
    if as_json:
        term.emit_json({"jobs": jobs})
        return
    C = term.Col  # on a narrow terminal: the reason is cut first, then PRI goes
    term.table(
        [
            C("ID"),
            C("NAME", fit="name"),
            C("USER", fit="name"),
            C("PRI", drop=1),
            C("STATE", "state"),
            C("FRAMES", fit="free"),
            C("PENDING REASON", fit="free"),
        ],
        [[j["id"], j["name"], j["user"], j["priority"], _state(j), _counts(j), j["pending_reason"]] for j in jobs],
    )


@job_app.command("show")
def job_show(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="Job id or unique name."),
    as_json: bool = JSON_OPT,
    show_secrets: bool = typer.Option(
        False, "--show-secrets", help="Show env values whose names look secret (masked as ***)."
    ),
) -> None:
    """Show a job, its layers (with their environment, secrets masked), and why waiting
    frames are not running."""
    from cuectl.sched.pending import describe_job
    from cuectl.units import format_bytes, format_duration

    data = describe_job(_store(ctx), job, show_secrets=show_secrets)
    if as_json:
        term.emit_json(data)
        return
    caps = [f"{key} {data[key]:g}" for key in ("max_running", "max_gpus", "max_cores") if data.get(key) is not None]
    term.fields(
        [
            ("job", f"{data['id']} {data['name']}"),
            ("user", data["user"]),
            ("priority", data["priority"]),
            ("state", _state(data) + (f": {data['outcome_reason']}" if data.get("outcome_reason") else "")),
            *([("project", data["project"])] if data.get("project") else []),
            *([(key, data[key]) for key in ("show", "shot") if data.get(key)]),
            *([("caps", ", ".join(caps))] if caps else []),
            ("created", data["created_at"]),
            ("frames", _counts(data)),
            ("pending reason", data["pending_reason"]),
        ]
    )
    rows = []
    for layer in data["layers"]:
        gpu = "-"
        if layer["gpus"]:
            gpu = f"{layer['gpus']}x {layer['gpu_vendor'] or 'any'}"
            if layer["gpu_models"]:
                gpu += " " + "|".join(layer["gpu_models"])
            if layer["gpu_memory_min_bytes"]:
                gpu += f" >={format_bytes(layer['gpu_memory_min_bytes'])}"
            for key, what in (("gpu_capability_min", "cc"), ("gpu_driver_min", "driver"), ("gpu_cuda_min", "CUDA")):
                if layer.get(key):
                    gpu += f" {what}>={layer[key]}"
        deps = ", ".join(_layer_dep_text(d) for d in layer["depends"]) or "-"
        rows.append(
            [
                layer["name"],
                layer["range"],
                layer["chunk"],
                gpu,
                layer["cores"],
                format_bytes(layer["memory_bytes"]) if layer["memory_bytes"] else "-",
                # A frame that runs out of GPU memory retries on a bigger device (docs/scheduling.md).
                f"{layer['retries']}, bigger GPU on OOM"
                if layer.get("retry_on_gpu_oom") == "bigger"
                else layer["retries"],
                format_duration(layer["timeout_s"]),
                deps,
            ]
        )
    term.line()
    term.table(["LAYER", "RANGE", "CHUNK", "GPUS", "CORES", "MEMORY", "RETRIES", "TIMEOUT", "DEPENDS"], rows)
    cap_rows = [
        [
            layer["name"],
            layer.get("max_running") or "-",
            ", ".join(layer.get("limits") or []) or "-",
            "default" if layer.get("retry_delay_s") is None else format_duration(layer["retry_delay_s"]),
        ]
        for layer in data["layers"]
        if layer.get("max_running") or layer.get("limits") or layer.get("retry_delay_s") is not None
    ]
    if cap_rows:
        term.line()
        term.table(["LAYER", "MAX RUNNING", "LIMITS", "RETRY DELAY"], cap_rows)
    _print_depends(data)
    env_rows = [
        [layer["name"], key, value if str(value).isprintable() else repr(value)]  # a newline stays one row
        for layer in data["layers"]
        for key, value in sorted((layer.get("env") or {}).items())
    ]
    if env_rows:  # values of secret-looking names are *** unless --show-secrets (views.mask_env)
        term.line()
        term.table(["LAYER", "ENV", "VALUE"], env_rows)


def _layer_dep_text(d: dict) -> str:
    """A layer's spec dependency as the DEPENDS column shows it: ``render(layer)``,
    ``sim:12``, ``job other``, ``other/render(any)``."""
    where = "/".join(str(x) for x in (d.get("job"), d.get("layer")) if x is not None)
    if d.get("frame") is not None:
        return f"{where}:{d['frame']}"
    if d.get("layer") is None:
        return f"job {where}"
    return f"{where}({d.get('type', 'layer')})"


def _depend_side(job: dict, layer: Optional[str], frame: Optional[int], this_job: int) -> str:
    text = "" if job["id"] == this_job and layer is not None else f"job {job['id']} {job['name']}"
    if layer is not None:
        text += ("" if not text else " ") + f"layer {layer}"
    if frame is not None:
        text += f" frame {frame}"
    return text


def _print_depends(data: dict) -> None:
    """What the job waits on and what waits on it (``job depend``; docs/opencue.md)."""
    rows = [
        [
            d["id"],
            d["type"],
            _depend_side(d["job"], d["layer"], d["frame"], data["id"]),
            _depend_side(d["on_job"], d["on_layer"], d["on_frame"], data["id"])
            + (" (any frame)" if d["any_frame"] else ""),
            d["state"],
        ]
        for d in data.get("depends", [])
    ]
    if rows:
        term.line()
        term.table(["DEPEND", "TYPE", "WAITING", "ON", "STATE"], rows)
    later = [
        [
            d["id"],
            d["type"],
            _depend_side(d["job"], d["layer"], d["frame"], data["id"]),
            _depend_side(d["on_job"], d["on_layer"], d["on_frame"], -1),
            d["state"],
        ]
        for d in data.get("dependents", [])
        if d["state"] == "waiting"
    ]
    if later:
        term.line()
        term.table(["WAITED ON BY", "TYPE", "WAITING", "ON", "STATE"], later)


@job_app.command("why")
def job_why(
    ctx: typer.Context, job: str = typer.Argument(..., help="Job id or unique name."), as_json: bool = JSON_OPT
) -> None:
    """Why the job's frames wait, per layer and per host (like HTCondor's better-analyze)."""
    from cuectl.sched.why import explain_job

    result = explain_job(_store(ctx), job)
    if as_json:
        term.emit_json(result.to_json())
        return
    j = result.job
    term.line(f"job {j['id']} {j['name']} (user {j['user']}, priority {j['priority']}): {_state(j)}, {_counts(j)}")
    term.line(f"  pending reason: {result.reason or '-'}")
    for layer in result.layers:
        counts = ", ".join(f"{n} {s.lower()}" for s, n in layer.counts.items() if n) or "no frames"
        term.line()
        reason = layer.reason
        if reason is None and any(h.can_run for h in layer.hosts):
            reason = "could run now on " + ", ".join(h.host for h in layer.hosts if h.can_run)
        elif reason is None and layer.hosts:
            reason = "no blocker known (hosts without dispatch details may run it)"
        term.line(f"layer {layer.name} ({counts}): {reason or 'nothing waits'}")
        if layer.cap:
            term.line(f"    cap: {layer.cap}")
        for h in layer.hosts:
            term.line(f"    {h.host}: {h.reason}")
    if result.gpu_events:
        term.line()
        term.line("GPU events (latest; docs/gpu-health.md):")
        for e in result.gpu_events:
            term.line(
                f"    {e['at']} frame {e['frame_id']} attempt {e['attempt']} on {e['host']}: {e['kind']}: {e['detail']}"
            )


def _job_change(ctx: typer.Context, as_json: bool, data: dict, message: str) -> None:
    if as_json:
        term.emit_json(data)
    else:
        term.line(message)


# -- several jobs at once (job kill|pause|resume|retry|priority JOB... or selectors) -------------
JOBS_ARG = typer.Argument(
    None,
    metavar="[JOB]...",
    help="Job ids or unique names (or select with --user, --state, --name).",
    show_default=False,
)
USER_SEL = typer.Option(None, "--user", "-u", help="Select the jobs of this user.")
STATE_SEL = typer.Option(
    None,
    "--state",
    help="Select jobs in this state: PENDING, RUNNING, FINISHED, SUCCEEDED, "
    "FAILED, KILLED (default: PENDING; retry: jobs with DEAD or EATEN "
    "frames).",
)
NAME_SEL = typer.Option(None, "--name", help="Select jobs whose name matches this glob ('shot010-*').")
YES_OPT = typer.Option(
    False,
    "--yes",
    "-y",
    help="Do not ask before changing several jobs or frames (asked only when stdin and stdout are a terminal).",
)
# Actions that lose work or start it again: asked for when they touch more than one job or frame.
_DESTRUCTIVE = ("kill", "retry", "eat")
_PAST = {
    "kill": "killed",
    "pause": "paused",
    "resume": "resumed",
    "retry": "retrying dead frames of",
    "priority": "set the priority of",
}


def _confirm(action: str, noun: str, shown: List[str], yes: bool) -> None:
    """Ask "kill 12 jobs (a, b, …)? [y/N]" when stdin and stdout are a terminal and not
    --yes (as `admin prune` does); without a terminal (scripts, cron) go ahead."""
    import sys

    if yes or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return
    listed = ", ".join(shown[:5]) + (f", … and {len(shown) - 5} more" if len(shown) > 5 else "")
    plural = noun if len(shown) == 1 else noun + "s"
    if not typer.confirm(f"{action} {len(shown)} {plural} ({listed})?", default=False, err=True):
        term.error("nothing changed", "rerun with --yes to skip the question")
        raise typer.Exit(1)


def _selected_jobs(
    ctx: typer.Context,
    action: str,
    jobs: Optional[List[str]],
    user: Optional[str],
    state: Optional[str],
    name: Optional[str],
) -> tuple[List[str], List[str], bool]:
    """(refs, what to show in the question, whether selectors chose them). JOB arguments or
    selectors, not both; selectors combine with AND, as `job list`'s filters do."""
    import fnmatch

    jobs = list(jobs or [])
    selectors = [flag for flag, value in (("--user", user), ("--state", state), ("--name", name)) if value is not None]
    usage = f"cuectl job {action} JOB... | cuectl job {action} [--user U] [--state S] [--name GLOB]"
    if jobs and selectors:
        raise InvalidInput(f"give JOB arguments or selectors ({', '.join(selectors)}), not both", hint=usage)
    if not jobs and not selectors:
        raise InvalidInput("which jobs? give JOB ids or names, or select with --user, --state or --name", hint=usage)
    wanted = state.upper() if state is not None else None
    if wanted is not None and wanted not in JOB_LIST_STATES:
        raise InvalidInput(f"--state: {state!r} is not one of {', '.join(JOB_LIST_STATES)}")
    if name is not None and not name:
        raise InvalidInput("--name: empty; give a name or a glob ('shot010-*')")
    if jobs:
        return jobs, jobs, False
    finished = wanted not in ("PENDING", "RUNNING", None) or action == "retry"  # by default: PENDING jobs only
    found = [
        j
        for j in _store(ctx).list_jobs(user=user, include_finished=finished)
        if (name is None or fnmatch.fnmatchcase(j["name"], name))
        and (
            _job_in_state(j, wanted)
            if wanted is not None
            else (j["frame_counts"].get(m.DEAD) or j["frame_counts"].get(m.EATEN))
            if action == "retry"
            else j["state"] == "PENDING"
        )
    ]
    return [str(j["id"]) for j in found], [f"{j['id']} {j['name']}" for j in found], True


def _job_action(
    ctx: typer.Context,
    action: str,
    jobs: Optional[List[str]],
    user: Optional[str],
    state: Optional[str],
    name: Optional[str],
    yes: bool,
    as_json: bool,
    force: bool,
    priority: Optional[int] = None,
) -> None:
    refs, shown, selected = _selected_jobs(ctx, action, jobs, user, state, name)
    if not selected and len(refs) == 1:  # one job, as before: its `job show` shape back
        store = _store(ctx)
        now = time.time()
        ref = refs[0]
        data = (
            store.kill_job(ref, now=now, force=force)
            if action == "kill"
            else store.retry_job(ref, now=now, force=force)
            if action == "retry"
            else store.set_job_priority(ref, priority, force=force)
            if priority is not None
            else store.set_job_paused(ref, action == "pause", force=force)
        )
        _job_change(ctx, as_json, data, _job_message(action, data, priority))
        return
    if not refs:
        term.info("no jobs match; nothing changed")
        if as_json:
            term.emit_json({"jobs": []})
        return
    if selected or action in _DESTRUCTIVE:
        _confirm(action if priority is None else f"set priority {priority} of", "job", shown, yes)
    store = _store(ctx)
    now = time.time()
    changed = (
        store.kill_jobs(refs, now=now, force=force)
        if action == "kill"
        else store.retry_jobs(refs, now=now, force=force)
        if action == "retry"
        else store.set_jobs_priority(refs, priority, force=force)
        if priority is not None
        else store.set_jobs_paused(refs, action == "pause", force=force)
    )
    if as_json:
        term.emit_json({"jobs": changed})
        return
    for data in changed:
        term.line(_job_message(action, data, priority))


def _job_message(action: str, data: dict, priority: Optional[int]) -> str:
    if priority is not None:
        return f"job {data['id']} {data['name']} priority {priority}"
    return f"{_PAST[action]} job {data['id']} {data['name']}"


@job_app.command("pause")
def job_pause(
    ctx: typer.Context,
    jobs: Optional[List[str]] = JOBS_ARG,
    user: Optional[str] = USER_SEL,
    state: Optional[str] = STATE_SEL,
    name: Optional[str] = NAME_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Stop dispatching jobs' frames (running frames finish). Several jobs, or those
    --user/--state/--name select (asked on a terminal unless --yes)."""
    _job_action(ctx, "pause", jobs, user, state, name, yes, as_json, force)


@job_app.command("resume")
def job_resume(
    ctx: typer.Context,
    jobs: Optional[List[str]] = JOBS_ARG,
    user: Optional[str] = USER_SEL,
    state: Optional[str] = STATE_SEL,
    name: Optional[str] = NAME_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Dispatch jobs' frames again. Several jobs, or those --user/--state/--name select."""
    _job_action(ctx, "resume", jobs, user, state, name, yes, as_json, force)


@job_app.command("kill")
def job_kill(
    ctx: typer.Context,
    jobs: Optional[List[str]] = JOBS_ARG,
    user: Optional[str] = USER_SEL,
    state: Optional[str] = STATE_SEL,
    name: Optional[str] = NAME_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Kill running frames and eat every unfinished frame, of one job or many (all in one
    transaction; more than one asks on a terminal unless --yes)."""
    _job_action(ctx, "kill", jobs, user, state, name, yes, as_json, force)


@job_app.command("retry")
def job_retry(
    ctx: typer.Context,
    jobs: Optional[List[str]] = JOBS_ARG,
    user: Optional[str] = USER_SEL,
    state: Optional[str] = STATE_SEL,
    name: Optional[str] = NAME_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Requeue jobs' DEAD and EATEN frames (more than one job asks on a terminal unless --yes)."""
    _job_action(ctx, "retry", jobs, user, state, name, yes, as_json, force)


@job_app.command("wait")
def job_wait(
    ctx: typer.Context,
    jobs: List[str] = typer.Argument(..., help="Job ids or unique names."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Give up after this long (e.g. 2h); exit 1."),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between looks at the store."),
    as_json: bool = JSON_OPT,
) -> None:
    """Wait until the jobs finish: exit 0 if every frame succeeded (or was eaten), 1 if a job
    has DEAD frames, was killed, or --timeout passed, 2 for bad input (an unknown or ambiguous job, a bad
    --timeout or --poll)."""
    from cuectl.sched.wait import check_succeeded, wait_jobs
    from cuectl.units import parse_duration

    limit = parse_duration(timeout, field="--timeout") if timeout is not None else None
    done = wait_jobs(_store(ctx), jobs, timeout_s=limit, poll_s=poll)
    if as_json:
        term.emit_json({"jobs": done, "succeeded": all(j.get("outcome") == "SUCCEEDED" for j in done)})
    else:
        for j in done:
            why = f": {j['outcome_reason']}" if j.get("outcome_reason") else ""  # "1 frame killed by alice"
            term.line(f"job {j['id']} {j['name']}: {j.get('outcome')}{why} ({_counts(j)})")
    check_succeeded(done)


@job_app.command("priority")
def job_priority(
    ctx: typer.Context,
    jobs: List[str] = typer.Argument(
        ...,
        metavar="[JOB]... PRIORITY",
        help="Job ids or unique names, then the new priority (or select the jobs with --user, --state, --name).",
    ),
    user: Optional[str] = USER_SEL,
    state: Optional[str] = STATE_SEL,
    name: Optional[str] = NAME_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Change jobs' priority (higher runs first): job priority JOB... P, or
    job priority --user U [--state S] [--name GLOB] P (asked on a terminal unless --yes)."""
    from cuectl.sched.fields import priority as check_priority

    *refs, last = jobs  # named `jobs` for <TAB> completion of job ids and names
    try:
        value = int(last.strip())
    except ValueError:
        raise InvalidInput(
            f"PRIORITY: expected a whole number last, got {last!r}", hint="cuectl job priority JOB... PRIORITY"
        ) from None
    priority = check_priority(value, "PRIORITY")
    _job_action(ctx, "priority", refs, user, state, name, yes, as_json, force, priority=priority)


# -- dependencies (OpenCue's types; docs/opencue.md) -------------------------------------------
def _frame_ref(value: Optional[str], layer: Optional[str], label: str) -> tuple:
    """A frame number, or OpenCue's frame name ``0001-render`` (which names its layer too)."""
    import re

    if value is None:
        return None, layer
    text = value.strip()
    named = re.fullmatch(r"(-?\d+)-([A-Za-z0-9_.-]+)", text)
    if named and not re.fullmatch(r"-?\d+", text):
        if layer is not None and layer != named.group(2):
            raise InvalidInput(f"{label}: frame {text!r} is of layer {named.group(2)!r}, not {layer!r}")
        return int(named.group(1)), named.group(2)
    try:
        return int(text), layer
    except ValueError:
        raise InvalidInput(f"{label}: expected a frame number or a frame name like 0001-render, got {text!r}") from None


@job_app.command("depend")
def job_depend(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="The job that waits (id or unique name)."),
    layer: Optional[str] = typer.Option(None, "--layer", "-l", help="Only this layer of it waits."),
    frame: Optional[str] = typer.Option(
        None, "--frame", "-f", help="Only this frame of --layer waits (a number, or 0001-render)."
    ),
    on_job: Optional[str] = typer.Option(None, "--on-job", help="The job waited on (default: JOB itself)."),
    on_layer: Optional[str] = typer.Option(None, "--on-layer", help="Wait on this layer of it only."),
    on_frame: Optional[str] = typer.Option(
        None, "--on-frame", help="Wait on this frame of --on-layer only (a number, or 0001-render)."
    ),
    kind: Optional[str] = typer.Option(
        None,
        "--type",
        help="OpenCue's type, when the options leave a "
        "choice: frame-by-frame, previous-frame, layer-on-sim-frame "
        "(others are checked against the options).",
    ),
    any_frame: bool = typer.Option(
        False, "--any-frame", help="Layer on layer: go once any one frame of --on-layer is done (OpenCue's anyframe)."
    ),
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Make a job, layer or frame wait on another job, layer or frame (OpenCue's twelve
    dependency types; `job show` lists them, `job undepend` drops them)."""
    frame_no, layer = _frame_ref(frame, layer, "--frame")
    on_frame_no, on_layer = _frame_ref(on_frame, on_layer, "--on-frame")
    if kind is not None:
        kind = kind.strip().lower().replace("_", "-")
    data = _store(ctx).add_depend(
        job,
        layer=layer,
        frame=frame_no,
        on_job=on_job,
        on_layer=on_layer,
        on_frame=on_frame_no,
        how="any" if any_frame else "layer",
        kind=kind,
        now=time.time(),
        force=force,
    )
    on = _depend_side(data["on_job"], data["on_layer"], data["on_frame"], -1)
    state = {"waiting": "waiting", "satisfied": "already satisfied (what it waits on is done)"}.get(
        data["state"], data["state"]
    )
    _job_change(
        ctx,
        as_json,
        data,
        f"dependency {data['id']}: {data['type']}, "
        f"{_depend_side(data['job'], data['layer'], data['frame'], -1)} on {on}: {state}",
    )


@job_app.command("undepend")
def job_undepend(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="The waiting job (id or unique name)."),
    depends: Optional[List[int]] = typer.Argument(None, metavar="[DEPEND]...", help="Dependency ids (see `job show`)."),
    drop_all: bool = typer.Option(False, "--all", help="Drop everything the job waits on."),
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Drop dependencies of a job, as satisfied (OpenCue's "drop depends"): by id, or --all."""
    if bool(depends) == drop_all:
        raise InvalidInput("give dependency ids or --all (not both)", hint=f"see `cuectl job show {job}`")
    data = _store(ctx).drop_depends(job, None if drop_all else list(depends or []), now=time.time(), force=force)
    if as_json:
        term.emit_json(data)
        return
    term.line(
        (
            f"dropped {len(depends)} dependenc{'y' if len(depends) == 1 else 'ies'}"
            if depends
            else "dropped every dependency"
        )
        + f" of job {job}"
    )


# -- frame -------------------------------------------------------------------------------
def _gpu_cell(frame: dict) -> str:
    # A RUNNING frame shows its latest sample (now); a finished one its mean and peak.
    if frame.get("gpu_sampled_at") is not None:
        util, peak = frame.get("gpu_util_pct"), frame.get("gpu_memory_used_bytes")
    else:
        util, peak = frame.get("gpu_util_mean_pct"), frame.get("gpu_memory_peak_bytes")
    if util is None and peak is None:
        return "-"
    from cuectl.units import format_bytes

    return f"{util:.0f}% {format_bytes(peak)}" if util is not None else format_bytes(peak)


@frame_app.command("list")
def frame_list(
    ctx: typer.Context,
    job: Optional[str] = typer.Option(None, "--job", help="Job id or unique name."),
    layer: Optional[str] = typer.Option(None, "--layer", help="Layer name."),
    state: Optional[str] = typer.Option(None, "--state", help="WAITING, DEPEND, RUNNING, SUCCEEDED, DEAD, EATEN."),
    limit: int = typer.Option(1000, "--limit", help="Show at most this many frames."),
    as_json: bool = JSON_OPT,
) -> None:
    """List frames in dispatch order."""
    if state is not None:
        state = state.upper()
        if state not in m.FRAME_STATES:
            raise InvalidInput(f"unknown frame state {state!r} (expected one of {', '.join(m.FRAME_STATES)})")
    if limit < 1:
        raise InvalidInput("--limit must be 1 or more")
    from cuectl.sched.why import frame_reasons

    store = _store(ctx)
    frames, total = store.list_frames(job=job, layer=layer, state=state, limit=limit)
    frame_reasons(store, frames)  # pending_reason of WAITING/DEPEND frames (their layer's, cuectl job why)
    truncated = total > len(frames)
    if as_json:
        term.emit_json({"frames": frames, "total": total, "truncated": truncated})
        return
    C = term.Col  # on a narrow terminal: GPUS goes first, then TRIES, EXIT, GPU UTIL/MEM, HOST
    term.table(
        [
            C("ID"),
            C("JOB", fit="name"),
            C("FRAME", fit="name"),
            C("STATE", "state"),
            C("TRIES", drop=4),
            C("HOST", fit="name", drop=1),
            C("GPUS", drop=5),
            C("GPU UTIL/MEM", "util", drop=2),
            C("EXIT", drop=3),
            C("STARTED", "time"),
            C("PENDING REASON", fit="free"),
        ],
        [
            [
                f["id"],
                f["job"],
                f["name"],
                f["state"],
                f["attempts"],
                f["host"],
                len(f["gpu_uuids"]) or "-",
                _gpu_cell(f),
                f["exit_code"] if f["exit_signal"] is None else f"sig {f['exit_signal']}",
                f["started_at"],
                f.get("pending_reason"),
            ]
            for f in frames
        ],
        footer=f"showing {len(frames)} of {total} frames (use --limit)" if truncated else None,
    )


FRAME_ARG = typer.Argument(
    ...,
    metavar="FRAME",
    help="Frame id, or JOB/FRAME: the job's id or unique name and the "
    "frame's name as `job show` prints it (sweep2/0003-main).",
)


@frame_app.command("show")
def frame_show(ctx: typer.Context, frame: str = FRAME_ARG, as_json: bool = JSON_OPT) -> None:
    """Show one frame with its attempts and GPU usage."""
    store = _store(ctx)
    data = store.get_frame(store.frame_id(frame))
    if as_json:
        term.emit_json(data)
        return
    term.fields(
        [
            (k, data[k])
            for k in (
                "id",
                "job",
                "layer",
                "name",
                "state",
                "attempts",
                "host",
                "gpu_uuids",
                "exit_code",
                "exit_signal",
                "started_at",
                "ended_at",
                "max_rss_bytes",
                "gpu_util_mean_pct",
                "gpu_util_max_pct",
                "gpu_memory_peak_bytes",
                "gpu_seconds",
                "gpu_util_pct",
                "gpu_memory_used_bytes",
                "gpu_sampled_at",
                "failure",
                "retry_at",
                "log_path",
            )
        ]
    )
    if data.get("samples"):
        _print_samples(data)
    if data["attempt_history"]:
        term.line()
        C = term.Col
        term.table(
            [
                "ATTEMPT",
                C("HOST", fit="name"),
                "OUTCOME",
                "EXIT",
                C("SIGNAL", drop=1),
                C("STARTED", "time"),
                C("ENDED", "time"),
                C("GPU UTIL", "util"),
                C("WHY", fit="free"),
            ],
            [
                [
                    a["attempt"],
                    a["host"],
                    a["outcome"],
                    a["exit_code"],
                    a["exit_signal"],
                    a["started_at"],
                    a["ended_at"],
                    _pct(a["gpu_util_mean_pct"]),
                    a.get("failure"),
                ]
                for a in data["attempt_history"]
            ],
        )
    if data.get("gpu_events"):
        term.line()
        C = term.Col
        term.table(
            ["ATTEMPT", C("AT", "time"), "EVENT", C("DEVICE", fit="name"), "PID", C("DETAIL", fit="free")],
            [[e["attempt"], e["at"], e["kind"], e["device_index"], e["pid"], e["detail"]] for e in data["gpu_events"]],
        )


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:.0f}%"


def _print_samples(data: dict) -> None:
    """A sparkline per device of the attempt the samples belong to, with its max and peak
    memory, and the attempt's mean utilisation: the stored, time-weighted one (the figure
    of gpu_util_mean_pct and of reports) — never an average of the points, which would
    count the final sample as much as a whole interval."""
    from cuectl.units import format_bytes

    attempt = data.get("samples_attempt")
    record = next((a for a in data["attempt_history"] if a["attempt"] == attempt), None)
    mean = record["gpu_util_mean_pct"] if record else None
    running = record is None and data["state"] == m.RUNNING and attempt == data["attempts"]
    term.line()
    term.line(f"GPU samples of attempt {attempt}{' so far' if running else ''} (utilisation over time):")
    for uuid, points in data["samples"].items():
        utils = [p[1] for p in points]
        known = [u for u in utils if u is not None]
        mems = [p[2] for p in points if p[2] is not None]
        util = f"max {max(known):.0f}%" if known else "no utilisation data"
        # One device: its mean is the attempt's; with several, the attempt's mean is over all.
        if mean is not None and len(data["samples"]) == 1:
            util = f"mean {mean:.0f}% {util}"
        term.line(f"  {uuid}  {term.sparkline(utils)}  {util}, peak {format_bytes(max(mems) if mems else None)}")
    if mean is not None and len(data["samples"]) > 1:
        term.line(f"  mean {mean:.0f}% over its {len(data['samples'])} devices (time-weighted)")


@frame_app.command("log")
def frame_log(
    ctx: typer.Context,
    frame: str = FRAME_ARG,
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Keep printing until the frame is done: wait for a waiting frame to start, go on into each retry.",
    ),
    attempt: Optional[int] = typer.Option(
        None, "--attempt", min=1, help="That attempt's log (1 = the first; default: the latest)."
    ),
    tail: Optional[int] = typer.Option(
        None, "--tail", "-n", min=0, help="Only the last N lines (then follow from there with -f)."
    ),
) -> None:
    """Print a frame's log (its latest attempt, or --attempt N). With --follow, exit 0 when
    the frame is SUCCEEDED, DEAD or EATEN (its final state is said on stderr)."""
    import sys

    from cuectl.run import logs

    store = _store(ctx)
    frame_id = store.frame_id(frame)
    out = sys.stdout.buffer
    if not follow:
        logs.show_log(store, frame_id, out=out, attempt=attempt, tail=tail)
        return
    try:
        logs.follow_log(store, frame_id, out=out, note=term.info, attempt=attempt, tail=tail)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None  # Ctrl-C: quietly, as tail -f


FRAMES_ARG = typer.Argument(
    None,
    metavar="[FRAME]...",
    help="Frame ids or JOB/FRAME names (sweep2/0003-main), or select with --job and --layer, --state, --range.",
    show_default=False,
)
JOB_SEL = typer.Option(None, "--job", help="Select frames of this job (id or unique name).")
LAYER_SEL = typer.Option(None, "--layer", help="With --job: only frames of this layer.")
FSTATE_SEL = typer.Option(
    None, "--state", help="With --job: only frames in this state (WAITING, DEPEND, RUNNING, SUCCEEDED, DEAD, EATEN)."
)
RANGE_SEL = typer.Option(
    None,
    "--range",
    help="With --job: only frames whose number is in this FrameSet "
    "(1-100, 1-100x2, 5,7,9; a chunk by its first frame).",
)


def _frame_action(
    ctx: typer.Context,
    refs: Optional[List[str]],
    action: str,
    as_json: bool,
    force: bool,
    job: Optional[str] = None,
    layer: Optional[str] = None,
    state: Optional[str] = None,
    range_: Optional[str] = None,
    yes: bool = False,
) -> None:
    """FRAME ids, or the frames --job (and --layer, --state, --range) select — not both.
    More than one frame asks on a terminal unless --yes; one transaction for them all."""
    given = list(refs or [])
    usage = f"cuectl frame {action} FRAME... | cuectl frame {action} --job J [--layer L] [--state S] [--range R]"
    selectors = [
        flag
        for flag, value in (("--job", job), ("--layer", layer), ("--state", state), ("--range", range_))
        if value is not None
    ]
    if given and selectors:
        raise InvalidInput(f"give FRAME ids or selectors ({', '.join(selectors)}), not both", hint=usage)
    if not given and not selectors:
        raise InvalidInput(
            "which frames? give FRAME ids or JOB/FRAME names, or select with --job (and --layer, --state, --range)",
            hint=usage,
        )
    if selectors and job is None:
        raise InvalidInput(f"{selectors[0]}: select frames of one job: add --job J", hint=usage)
    wanted = state.upper() if state is not None else None
    if wanted is not None and wanted not in m.FRAME_STATES:
        raise InvalidInput(f"--state: unknown frame state {state!r} (expected one of {', '.join(m.FRAME_STATES)})")
    numbers = None
    if range_ is not None:
        from cuectl.sched.frameset import parse_frameset

        try:
            numbers = parse_frameset(range_)
        except InvalidInput as exc:
            raise InvalidInput(f"--range: {exc.message}", hint=exc.hint) from None
    store = _store(ctx)
    frames = [store.frame_id(ref) for ref in given]  # every one checked before anything changes
    if job is not None:
        frames = store.select_frames(job, layer=layer, state=wanted, numbers=numbers)
        if not frames:
            term.info("no frames match; nothing changed")
            if as_json:
                term.emit_json({"frames": []})
            return
    if len(set(frames)) > 1 or selectors:
        _confirm(action, "frame", [str(f) for f in dict.fromkeys(frames)], yes)
    result = store.frames_action(frames, action, now=time.time(), force=force)
    if as_json:
        term.emit_json({"frames": result})
        return
    for f in result:
        note = f" (running: the worker will {action} it)" if f["state"] == m.RUNNING else ""
        term.line(f"{action}: frame {f['id']} {f['name']} is {f['state']}{note}")


@frame_app.command("retry")
def frame_retry(
    ctx: typer.Context,
    frames: Optional[List[str]] = FRAMES_ARG,
    job: Optional[str] = JOB_SEL,
    layer: Optional[str] = LAYER_SEL,
    state: Optional[str] = FSTATE_SEL,
    range_: Optional[str] = RANGE_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Requeue frames (a running frame is killed first): ids, or --job J [--layer L]
    [--state S] [--range R]; more than one asks on a terminal unless --yes."""
    _frame_action(ctx, frames, "retry", as_json, force, job, layer, state, range_, yes)


@frame_app.command("kill")
def frame_kill(
    ctx: typer.Context,
    frames: Optional[List[str]] = FRAMES_ARG,
    job: Optional[str] = JOB_SEL,
    layer: Optional[str] = LAYER_SEL,
    state: Optional[str] = FSTATE_SEL,
    range_: Optional[str] = RANGE_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Stop frames and mark them DEAD (retry them later): ids, or --job J [--layer L]
    [--state S] [--range R]; more than one asks on a terminal unless --yes."""
    _frame_action(ctx, frames, "kill", as_json, force, job, layer, state, range_, yes)


@frame_app.command("eat")
def frame_eat(
    ctx: typer.Context,
    frames: Optional[List[str]] = FRAMES_ARG,
    job: Optional[str] = JOB_SEL,
    layer: Optional[str] = LAYER_SEL,
    state: Optional[str] = FSTATE_SEL,
    range_: Optional[str] = RANGE_SEL,
    yes: bool = YES_OPT,
    as_json: bool = JSON_OPT,
    force: bool = FORCE_OPT,
) -> None:
    """Mark frames done without running them (their dependents stay waiting, as in Cuebot,
    unless depend.satisfy_on_eaten is set): ids, or --job J [--layer L] [--state S]
    [--range R]; more than one asks on a terminal unless --yes."""
    _frame_action(ctx, frames, "eat", as_json, force, job, layer, state, range_, yes)


def register(app: typer.Typer) -> None:
    app.command("submit", cls=SubmitCommand)(submit)
    app.add_typer(job_app, name="job")
    app.add_typer(frame_app, name="frame")
