"""``cuectl submit``, ``cuectl job …`` and ``cuectl frame …``: parse, call the library, render."""

from __future__ import annotations

import time
from typing import List, Optional

import typer

from cuectl.cli import term
from cuectl.errors import InvalidInput
from cuectl.sched import model as m

job_app = typer.Typer(help="Inspect and control jobs.", no_args_is_help=True)
frame_app = typer.Typer(help="Inspect and control frames.", no_args_is_help=True)

JSON_OPT = typer.Option(False, "--json", help="Print JSON (stable keys, see docs/json.md).")
FORCE_OPT = typer.Option(False, "--force", help="Change another user's job (SQLite stores only; see docs/security.md).")


def _store(ctx: typer.Context):
    return ctx.obj.store()


# -- submit ------------------------------------------------------------------------------
_SPEC_SUFFIXES = (".yaml", ".yml", ".json")
# Interpreters: `python3 train.py` is named after train.py, not python3.
_INTERPRETERS = r"(python|pypy|bash|sh|zsh|dash|ksh|node|perl|ruby|php|lua|julia|rscript)[0-9.]*"


def _name_from_command(argv: List[str]) -> str:
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


def _read_stdin_spec() -> str:
    """The job spec piped to ``cuectl submit -``: at most MAX_SPEC_BYTES, UTF-8."""
    import sys

    from cuectl.sched.spec import MAX_SPEC_BYTES

    stream = getattr(sys.stdin, "buffer", None)
    raw = stream.read(MAX_SPEC_BYTES + 1) if stream is not None else sys.stdin.read(MAX_SPEC_BYTES + 1)
    if isinstance(raw, str):
        raw = raw.encode("utf-8")
    if len(raw) > MAX_SPEC_BYTES:
        raise InvalidInput(f"<stdin>: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MB; refused")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"<stdin>: not UTF-8 text (bad byte at offset {exc.start})") from None
    if not text.strip():
        raise InvalidInput("<stdin>: empty; pipe a job spec in: cuectl submit - < job.yaml")
    return text


def submit(
    ctx: typer.Context,
    args: Optional[List[str]] = typer.Argument(None, metavar="SPEC.yaml | - | -- COMMAND [ARGS...]",
                                               help="A job spec file (YAML or JSON), - to read it from standard "
                                                    "input, or the command after --."),
    name: Optional[str] = typer.Option(None, "--name", help="Job name (flag form: one layer; default: named "
                                                            "after the command, see docs/job-spec.md)."),
    range_: str = typer.Option("1", "--range", help="Frame range (OpenCue FrameSet: 1-100, 1-100x2, 1-10:5…)."),
    chunk: int = typer.Option(1, "--chunk", help="Frames per chunk."),
    layer: Optional[str] = typer.Option(None, "--layer", help="Layer name (default: main)."),
    gpus: int = typer.Option(0, "--gpus", help="Devices per frame."),
    gpu_vendor: Optional[str] = typer.Option(None, "--gpu-vendor", help="NVIDIA, AMD, Apple or Intel."),
    gpu_model: List[str] = typer.Option([], "--gpu-model", help="Allowed model (repeatable): A100, 'RTX 4090', '*V100*'."),
    gpu_memory_min: Optional[str] = typer.Option(None, "--gpu-memory-min", help="Memory per device, e.g. 24G."),
    cores: Optional[float] = typer.Option(None, "--cores", help="CPU cores reserved per frame (at least 0.1)."),
    memory: Optional[str] = typer.Option(None, "--memory", help="Host RAM reserved per frame, e.g. 8G."),
    priority: int = typer.Option(0, "--priority", help="Higher runs first."),
    retries: Optional[int] = typer.Option(None, "--retries", help="Retries after a failure (default 3)."),
    timeout: Optional[str] = typer.Option(None, "--timeout", help="Per-frame timeout, e.g. 30m."),
    env: List[str] = typer.Option([], "--env", help="K=V for the frame environment (repeatable)."),
    tag: List[str] = typer.Option([], "--tag", help="Only hosts with this tag (repeatable)."),
    paused: bool = typer.Option(False, "--paused", help="Submit paused."),
    log_limit: Optional[str] = typer.Option(None, "--log-limit", help="Bytes each attempt's log may keep, head "
                                                                      "and tail (e.g. 100M; default: the worker's)."),
    project: Optional[str] = typer.Option(None, "--project", metavar="NAME",
                                          help="The job's project, for quotas and reports (with a spec: replaces "
                                               "its project)."),
    max_running: Optional[int] = typer.Option(None, "--max-running", metavar="N",
                                              help="At most N frames of the job running at once, farm-wide (with a "
                                                   "spec: replaces its max_running)."),
    max_cores: Optional[float] = typer.Option(None, "--max-cores", metavar="N",
                                              help="At most N cores held by the job's running frames (with a spec: "
                                                   "replaces its max_cores)."),
    max_gpus: Optional[int] = typer.Option(None, "--max-gpus", metavar="N",
                                           help="At most N GPUs held by the job's running frames (with a spec: "
                                                "replaces its max_gpus)."),
    limit: List[str] = typer.Option([], "--limit", metavar="NAME",
                                    help="A named limit each running frame holds (repeatable; `cuectl admin limit "
                                         "list`). Flag form only."),
    retry_delay: Optional[str] = typer.Option(None, "--retry-delay", metavar="DUR",
                                              help="Wait before a failed frame runs again, doubled per further "
                                                   "failure (default 2s; 0: at once). Flag form only."),
    as_json: bool = JSON_OPT,
) -> None:
    """Submit a job: a YAML/JSON spec (a file, or - for standard input) with several layers,
    or one layer from flags and the command after -- (named after the command without --name)."""
    from pathlib import Path

    from cuectl import config
    from cuectl.sched import spec as specs

    args = list(args or [])
    if name is None and len(args) == 1:  # a spec: a file, or - for standard input
        if args[0] == "-":
            job_spec = specs.load_spec_text(_read_stdin_spec(), source="<stdin>", user=config.current_user(),
                                            frame_limit=config.frame_limit())
        else:
            try:
                job_spec = specs.load_spec_file(args[0], user=config.current_user(),
                                                frame_limit=config.frame_limit())
            except InvalidInput as exc:
                word = args[0]
                if exc.hint is None and not word.lower().endswith(_SPEC_SUFFIXES) and not Path(word).exists():
                    raise InvalidInput(exc.message, hint="one argument is a job spec file; to run a one-word "
                                                         f"command, name the job: cuectl submit --name N -- "
                                                         f"{word}") from None
                raise
        if log_limit is not None:  # for every layer that does not set its own
            job_spec = specs.with_log_limit(job_spec, log_limit, "--log-limit")
        if limit or retry_delay is not None:  # layer settings: which layer would they mean?
            flag = "--limit" if limit else "--retry-delay"
            raise InvalidInput(f"{flag}: only for the flag form (one layer); in a spec, set "
                               f"{'limits' if limit else 'retry_delay'}: on each layer that needs it")
        # Job-level caps given as flags replace the spec's own, checked as the flag form's.
        flag_caps = {key: value for key, value in (("project", project), ("max_running", max_running),
                                                   ("max_cores", max_cores), ("max_gpus", max_gpus))
                     if value is not None}
        if flag_caps:
            import dataclasses

            from cuectl.sched.fields import flag_label

            job_spec = dataclasses.replace(job_spec, **specs._job_caps(flag_caps.get, flag_label))
    else:
        if not args:
            raise InvalidInput("give one job spec file, - for standard input, or a command after --",
                               hint="cuectl submit job.yaml | cuectl submit - < job.yaml | "
                                    "cuectl submit [--name N] --range 1-10 -- CMD ARGS")
        if name is None and args[0].lower().endswith(_SPEC_SUFFIXES):
            raise InvalidInput("give one job spec file (one job per submit)",
                               hint="cuectl submit job.yaml; for a command: cuectl submit -- CMD ARGS")
        job_spec = specs.spec_from_flags(
            name=_name_from_command(args) if name is None else name, command=args, range=range_, chunk=chunk,
            layer=layer, gpus=gpus, gpu_vendor=gpu_vendor,
            gpu_models=gpu_model, gpu_memory_min=gpu_memory_min, cores=cores, memory=memory, priority=priority,
            retries=retries, timeout=timeout, env=env, tags=tag, paused=paused, user=config.current_user(),
            frame_limit=config.frame_limit(), log_limit=log_limit, project=project, max_running=max_running,
            max_cores=max_cores, max_gpus=max_gpus, limits=limit, retry_delay=retry_delay)
    store = ctx.obj.store(create=True)
    job_id = store.submit(job_spec, now=time.time())
    if as_json:
        from cuectl.sched.pending import describe_job

        term.emit_json(describe_job(store, job_id))
    else:
        term.line(str(job_id))


# -- job ---------------------------------------------------------------------------------
def _state(job: dict) -> str:
    """A finished job by how it ended (KILLED, FAILED, SUCCEEDED): FINISHED alone said
    the same of a killed job as of a successful one."""
    return (job.get("outcome") or job["state"]) + (" (paused)" if job["paused"] else "")


def _counts(job: dict) -> str:
    c = job["frame_counts"]
    done = c.get(m.SUCCEEDED, 0) + c.get(m.EATEN, 0)
    total = sum(c.values())
    parts = [f"{done}/{total} done"]
    for state in (m.RUNNING, m.WAITING, m.DEPEND, m.DEAD):
        if c.get(state):
            parts.append(f"{c[state]} {state.lower()}")
    return ", ".join(parts)


JOB_LIST_STATES = ("PENDING", "FINISHED", "SUCCEEDED", "FAILED", "KILLED")


@job_app.command("list")
def job_list(ctx: typer.Context, as_json: bool = JSON_OPT,
             active: bool = typer.Option(False, "--active", help="Hide finished jobs."),
             user: Optional[str] = typer.Option(None, "--user", "-u", help="Only this user's jobs."),
             state: Optional[str] = typer.Option(None, "--state", help="PENDING or FINISHED, or how a finished "
                                                                     "job ended: SUCCEEDED, FAILED, KILLED."),
             name: Optional[str] = typer.Option(None, "--name", help="Only jobs named so (a glob: 'shot010-*')."),
             limit: Optional[int] = typer.Option(None, "--limit", "-n", help="Only the newest N jobs."),
             ) -> None:
    """List jobs (newest last), with filters like squeue's: --user, --state, --name."""
    import fnmatch

    from cuectl.sched.pending import add_pending_reasons

    wanted = state.upper() if state else None
    if wanted is not None and wanted not in JOB_LIST_STATES:
        raise InvalidInput(f"--state: {state!r} is not one of {', '.join(JOB_LIST_STATES)}")
    if limit is not None and limit < 1:
        raise InvalidInput(f"--limit: must be 1 or more, got {limit}")
    # The store filters by user (and state); pending reasons only for the jobs listed.
    store = _store(ctx)
    jobs = [j for j in store.list_jobs(include_finished=not active, user=user)
            if (name is None or fnmatch.fnmatchcase(j["name"], name))
            and (wanted is None or wanted in (j["state"], j.get("outcome")))]
    if limit is not None:
        jobs = jobs[-limit:]
    add_pending_reasons(store, jobs)
    if as_json:
        term.emit_json({"jobs": jobs})
        return
    term.table(["ID", "NAME", "USER", "PRI", "STATE", "FRAMES", "PENDING REASON"],
               [[j["id"], j["name"], j["user"], j["priority"],
                 _state(j), _counts(j), j["pending_reason"]] for j in jobs])


@job_app.command("show")
def job_show(ctx: typer.Context, job: str = typer.Argument(..., help="Job id or unique name."),
             as_json: bool = JSON_OPT,
             show_secrets: bool = typer.Option(False, "--show-secrets",
                                               help="Show env values whose names look secret (masked as ***).")
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
    term.fields([("job", f"{data['id']} {data['name']}"), ("user", data["user"]), ("priority", data["priority"]),
                 ("state", _state(data)),
                 *([("project", data["project"])] if data.get("project") else []),
                 *([("caps", ", ".join(caps))] if caps else []),
                 ("created", data["created_at"]), ("frames", _counts(data)),
                 ("pending reason", data["pending_reason"])])
    rows = []
    for layer in data["layers"]:
        gpu = "-"
        if layer["gpus"]:
            gpu = f"{layer['gpus']}x {layer['gpu_vendor'] or 'any'}"
            if layer["gpu_models"]:
                gpu += " " + "|".join(layer["gpu_models"])
            if layer["gpu_memory_min_bytes"]:
                gpu += f" >={format_bytes(layer['gpu_memory_min_bytes'])}"
        deps = ", ".join(f"{d['layer']}({d['type']})" for d in layer["depends"]) or "-"
        rows.append([layer["name"], layer["range"], layer["chunk"], gpu, layer["cores"],
                     format_bytes(layer["memory_bytes"]) if layer["memory_bytes"] else "-",
                     layer["retries"], format_duration(layer["timeout_s"]), deps])
    term.line()
    term.table(["LAYER", "RANGE", "CHUNK", "GPUS", "CORES", "MEMORY", "RETRIES", "TIMEOUT", "DEPENDS"], rows)
    cap_rows = [[layer["name"], layer.get("max_running") or "-", ", ".join(layer.get("limits") or []) or "-",
                 "default" if layer.get("retry_delay_s") is None else format_duration(layer["retry_delay_s"])]
                for layer in data["layers"] if layer.get("max_running") or layer.get("limits")
                or layer.get("retry_delay_s") is not None]
    if cap_rows:
        term.line()
        term.table(["LAYER", "MAX RUNNING", "LIMITS", "RETRY DELAY"], cap_rows)
    env_rows = [[layer["name"], key, value if str(value).isprintable() else repr(value)]  # a newline stays one row
                for layer in data["layers"] for key, value in sorted((layer.get("env") or {}).items())]
    if env_rows:  # values of secret-looking names are *** unless --show-secrets (views.mask_env)
        term.line()
        term.table(["LAYER", "ENV", "VALUE"], env_rows)


@job_app.command("why")
def job_why(ctx: typer.Context, job: str = typer.Argument(..., help="Job id or unique name."),
            as_json: bool = JSON_OPT) -> None:
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


def _job_change(ctx: typer.Context, as_json: bool, data: dict, message: str) -> None:
    if as_json:
        term.emit_json(data)
    else:
        term.line(message)


@job_app.command("pause")
def job_pause(ctx: typer.Context, job: str, as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Stop dispatching the job's frames (running frames finish)."""
    data = _store(ctx).set_job_paused(job, True, force=force)
    _job_change(ctx, as_json, data, f"paused job {data['id']} {data['name']}")


@job_app.command("resume")
def job_resume(ctx: typer.Context, job: str, as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Dispatch the job's frames again."""
    data = _store(ctx).set_job_paused(job, False, force=force)
    _job_change(ctx, as_json, data, f"resumed job {data['id']} {data['name']}")


@job_app.command("kill")
def job_kill(ctx: typer.Context, job: str, as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Kill running frames and eat every unfinished frame."""
    data = _store(ctx).kill_job(job, now=time.time(), force=force)
    _job_change(ctx, as_json, data, f"killed job {data['id']} {data['name']}")


@job_app.command("retry")
def job_retry(ctx: typer.Context, job: str, as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Requeue the job's DEAD and EATEN frames."""
    data = _store(ctx).retry_job(job, now=time.time(), force=force)
    _job_change(ctx, as_json, data, f"retrying dead frames of job {data['id']} {data['name']}")


@job_app.command("wait")
def job_wait(ctx: typer.Context,
             jobs: List[str] = typer.Argument(..., help="Job ids or unique names."),
             timeout: Optional[str] = typer.Option(None, "--timeout", help="Give up after this long (e.g. 2h); "
                                                                           "exit 1."),
             poll: float = typer.Option(1.0, "--poll", help="Seconds between looks at the store."),
             as_json: bool = JSON_OPT) -> None:
    """Wait until the jobs finish: exit 0 if every frame succeeded (or was eaten), 1 if a job
    has DEAD frames, was killed, or --timeout passed."""
    from cuectl.sched.wait import check_succeeded, wait_jobs
    from cuectl.units import parse_duration

    limit = parse_duration(timeout, field="--timeout") if timeout is not None else None
    done = wait_jobs(_store(ctx), jobs, timeout_s=limit, poll_s=poll)
    if as_json:
        term.emit_json({"jobs": done, "succeeded": all(j.get("outcome") == "SUCCEEDED" for j in done)})
    else:
        for j in done:
            term.line(f"job {j['id']} {j['name']}: {j.get('outcome')} ({_counts(j)})")
    check_succeeded(done)


@job_app.command("priority")
def job_priority(ctx: typer.Context, job: str, priority: int = typer.Argument(..., help="New priority."),
                 as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Change a job's priority (higher runs first)."""
    from cuectl.sched.fields import priority as check_priority

    priority = check_priority(priority, "PRIORITY")
    data = _store(ctx).set_job_priority(job, priority, force=force)
    _job_change(ctx, as_json, data, f"job {data['id']} {data['name']} priority {priority}")


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
def frame_list(ctx: typer.Context,
               job: Optional[str] = typer.Option(None, "--job", help="Job id or unique name."),
               layer: Optional[str] = typer.Option(None, "--layer", help="Layer name."),
               state: Optional[str] = typer.Option(None, "--state", help="WAITING, DEPEND, RUNNING, SUCCEEDED, DEAD, EATEN."),
               limit: int = typer.Option(1000, "--limit", help="Show at most this many frames."),
               as_json: bool = JSON_OPT) -> None:
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
    term.table(["ID", "JOB", "FRAME", "STATE", "TRIES", "HOST", "GPUS", "GPU UTIL/MEM", "EXIT", "STARTED",
                "PENDING REASON"],
               [[f["id"], f["job"], f["name"], f["state"], f["attempts"], f["host"], len(f["gpu_uuids"]) or "-",
                 _gpu_cell(f), f["exit_code"] if f["exit_signal"] is None else f"sig {f['exit_signal']}",
                 f["started_at"], f.get("pending_reason")] for f in frames],
               footer=f"showing {len(frames)} of {total} frames (use --limit)" if truncated else None)


@frame_app.command("show")
def frame_show(ctx: typer.Context, frame: int = typer.Argument(..., help="Frame id."), as_json: bool = JSON_OPT) -> None:
    """Show one frame with its attempts and GPU usage."""
    data = _store(ctx).get_frame(frame)
    if as_json:
        term.emit_json(data)
        return
    term.fields([(k, data[k]) for k in ("id", "job", "layer", "name", "state", "attempts", "host", "gpu_uuids",
                                        "exit_code", "exit_signal", "started_at", "ended_at", "max_rss_bytes",
                                        "gpu_util_mean_pct", "gpu_util_max_pct", "gpu_memory_peak_bytes",
                                        "gpu_seconds", "gpu_util_pct", "gpu_memory_used_bytes", "gpu_sampled_at",
                                        "failure", "retry_at", "log_path")])
    if data.get("samples"):
        _print_samples(data)
    if data["attempt_history"]:
        term.line()
        term.table(["ATTEMPT", "HOST", "OUTCOME", "EXIT", "SIGNAL", "STARTED", "ENDED", "GPU UTIL", "WHY"],
                   [[a["attempt"], a["host"], a["outcome"], a["exit_code"], a["exit_signal"], a["started_at"],
                     a["ended_at"], _pct(a["gpu_util_mean_pct"]), a.get("failure")]
                    for a in data["attempt_history"]])


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
def frame_log(ctx: typer.Context, frame: int = typer.Argument(..., help="Frame id."),
              follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing while the frame runs.")) -> None:
    """Print a frame's log (its latest attempt)."""
    from cuectl.run.logs import stream_log

    store = _store(ctx)
    stream_log(store, frame, follow=follow)


def _frame_action(ctx: typer.Context, frames: List[int], action: str, as_json: bool, force: bool) -> None:
    result = _store(ctx).frame_action(frames, action, now=time.time(), force=force)
    if as_json:
        term.emit_json({"frames": result})
        return
    for f in result:
        note = f" (running: the worker will {action} it)" if f["state"] == m.RUNNING else ""
        term.line(f"{action}: frame {f['id']} {f['name']} is {f['state']}{note}")


@frame_app.command("retry")
def frame_retry(ctx: typer.Context, frames: List[int] = typer.Argument(..., help="Frame ids."),
                as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Requeue frames (a running frame is killed first)."""
    _frame_action(ctx, frames, "retry", as_json, force)


@frame_app.command("kill")
def frame_kill(ctx: typer.Context, frames: List[int] = typer.Argument(..., help="Frame ids."),
               as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Stop frames and mark them DEAD (retry them later)."""
    _frame_action(ctx, frames, "kill", as_json, force)


@frame_app.command("eat")
def frame_eat(ctx: typer.Context, frames: List[int] = typer.Argument(..., help="Frame ids."),
              as_json: bool = JSON_OPT, force: bool = FORCE_OPT) -> None:
    """Mark frames done without running them (dependents are released)."""
    _frame_action(ctx, frames, "eat", as_json, force)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.add_typer(job_app, name="job")
    app.add_typer(frame_app, name="frame")
