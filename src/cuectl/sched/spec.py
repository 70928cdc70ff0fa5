"""Job specs: YAML files and the single-layer flag form, validated into ``JobSpec`` values.

Everything a user can get wrong is refused here, before the store sees anything, with one
``InvalidInput`` line that names the field (``layers[1].gpus: must be 0 or more``). Both
forms go through the same per-field validators, so the flag form and the YAML form cannot
drift apart; only the field labels differ (``--gpus`` instead of ``layers[0].gpus``).

YAML is read with PyYAML's safe loader plus guards against "billion laughs" alias bombs,
recursive aliases, deep nesting, oversized files and duplicate keys (which PyYAML would
otherwise silently resolve to the last value). PyYAML is imported lazily: ``cuectl --help``
must not pay for it. The schema is documented in docs/job-spec.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from cuectl.errors import InvalidInput
from cuectl.sched.checks import NAME_RE, cores_field, label_name, limit_names, tags_field, timeout_field
from cuectl.sched.fields import (
    CONTROL_RE,
    Label,
    as_list,
    describe,
    expect_str,
    flag_label,
    item_label,
    log_limit_bytes,
    printable_name,
    quote,
    size_bytes,
    whole_number,
)
from cuectl.sched.fields import priority as check_priority
from cuectl.sched.frameset import MAX_FRAME, chunk_frames, parse_frameset
from cuectl.sched.gpu_request import GpuRequest
from cuectl.sched.model import (
    DEPEND_TYPES,
    GPU_POLICY_ACTIONS,
    RETRY_ON_GPU_OOM,
    Dependency,
    JobSpec,
    LayerSpec,
    Notify,
)
from cuectl.units import parse_duration

MAX_SPEC_BYTES = 10 * 1024 * 1024
# Alias references followed while sizing the document, and the size of the document with
# every alias expanded. A real spec sharing a block of defaults across 1000 layers stays far
# below both; a "billion laughs" document exceeds them after a few microseconds of counting.
MAX_ALIASES = 10_000
MAX_EXPANDED_NODES = 1_000_000
MAX_DEPTH = 64  # YAML nesting; a job spec needs about 5
MAX_LAYERS = 1000
MAX_JOB_NAME = 200
MAX_RETRIES = 1000
DEFAULT_FLAG_LAYER = "main"

JOB_KEYS = (
    "name",
    "priority",
    "paused",
    "env",
    "layers",
    "project",
    "max_running",
    "max_cores",
    "max_gpus",
    "cwd",
    "export",
    "notify",
    "depends",
    "show",
    "shot",
)
LAYER_KEYS = (
    "name",
    "command",
    "range",
    "chunk",
    "gpus",
    "gpu_vendor",
    "gpu_models",
    "gpu_memory_min",
    "gpu_capability_min",
    "gpu_driver_min",
    "gpu_cuda_min",
    "cores",
    "memory",
    "retries",
    "timeout",
    "env",
    "tags",
    "depends",
    "log_limit",
    "max_running",
    "limits",
    "retry_delay",
    "retry_on_gpu_oom",
    "gpu_escape",
    "gpu_idle_limit",
    "gpu_idle_action",
    "gpu_idle_util",
    "gpu_share",
    "gpu_share_enforce",
    "cwd",
    "type",
    "service",
)
# OpenCue's layer types: a Post layer runs once every other layer of its job is done.
LAYER_TYPES = ("Render", "Util", "Post")
MAX_RUNNING = 1_000_000
MAX_GPUS_CAP = 1_000_000
DEPEND_KEYS = ("layer", "type", "job", "frame")
JOB_DEPEND_KEYS = ("job", "layer", "frame")
# Keys that belong at the other level, with a hint saying where (a common slip).
_LAYER_ONLY_KEYS = {
    "user": "the job's user is whoever submits it",
    **{k: "a layer setting: put it in an entry of layers:" for k in LAYER_KEYS if k not in JOB_KEYS},
}
_JOB_ONLY_KEYS = {
    "user": "the job's user is whoever submits it",
    **{k: "a job setting: put it at the top level" for k in JOB_KEYS if k not in LAYER_KEYS},
}

_LAYER_NAME_RE = NAME_RE
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


# --------------------------------------------------------------------------------------
# Small helpers


def _check_keys(
    data: Mapping[Any, Any], known: Sequence[str], label: str, *, elsewhere: Mapping[str, str] | None = None
) -> None:
    """Refuse keys not in ``known``, suggesting the closest known one (typos are common).
    ``elsewhere`` maps keys that belong at another level to a hint saying where."""
    elsewhere = elsewhere or {}
    for key in data:
        if key in known:
            continue
        where = f"{label}: " if label else ""
        if not isinstance(key, str):
            raise InvalidInput(f"{where}unknown key {key!r} (known keys: {', '.join(known)})")
        if key in elsewhere:
            raise InvalidInput(f"{where}unknown key {key!r} ({elsewhere[key]})")
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(known)}"
        raise InvalidInput(f"{where}unknown key {quote(key)} ({hint})")


# --------------------------------------------------------------------------------------
# Field validators (shared by the YAML and the flag form)


def _job_name(value: Any, label: str) -> str:
    name = expect_str(value, label).strip()
    if not name:
        raise InvalidInput(f"{label}: must not be empty")
    if len(name) > MAX_JOB_NAME:
        raise InvalidInput(f"{label}: at most {MAX_JOB_NAME} characters (got {len(name)})")
    if CONTROL_RE.search(name):
        raise InvalidInput(f"{label}: must not contain control characters")
    if name.isdigit():
        # JOB arguments take an id or a name, and digits mean the id: a job named "42"
        # could not be reached by its name. Any script's digits ("٤٢"), not only ASCII.
        raise InvalidInput(
            f"{label}: a job name must not be only digits ({quote(name)}): a JOB argument of digits is a job id",
            hint="add a letter, e.g. 'job-42'",
        )
    return printable_name(name, label)


def _layer_name(value: Any, label: str) -> str:
    name = expect_str(value, label)
    if not _LAYER_NAME_RE.fullmatch(name):
        raise InvalidInput(f"{label}: invalid layer name {quote(name)} (1-100 of A-Z a-z 0-9 _ . -)")
    return name


def _boolean(value: Any, label: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{label}: expected true or false, got {describe(value)}")
    return value


def _mib_if_number(value: Any) -> Any:
    """YAML reads ``memory: 512`` as a number, which in a spec means MiB (DESIGN §5), not
    bytes as an int does for library callers: pass it on as the text the user wrote."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value


def _retry_delay(value: Any, label: str) -> float:
    """A duration (``10s``, ``2m``; a bare number is seconds); 0 retries at once."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise InvalidInput(f"{label}: expected a duration like 10s, got {describe(value)}")
    seconds = parse_duration(value, field=label)
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"{label}: must be 0 or more")
    if seconds > 86400:
        raise InvalidInput(f"{label}: at most a day (got {seconds:g} s)")
    return float(seconds)


MAX_PATH = 4096
# What travels with a job by default (`--export`, spec `export:`): what finds the same
# programs and libraries (PATH, the active virtualenv or conda env, PYTHONPATH,
# LD_LIBRARY_PATH) and reads text the same way (locale, time zone) — and nothing else. Not
# sbatch's ALL: the store is readable by every user of the farm, and a shell's environment
# holds tokens and passwords; the frame gets the rest from the host it runs on.
BASE_EXPORT = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CONDA_DEFAULT_ENV",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
)
# Never exported by ALL: the shell's own state, and cuectl's (a submit from inside a frame).
_SHELL_STATE = frozenset(
    {
        "_",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "PS1",
        "PS2",
        "PROMPT_COMMAND",
        "TERM",
        "COLUMNS",
        "LINES",
        "SHELL",
        "DISPLAY",
        "SSH_AUTH_SOCK",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "XDG_SESSION_ID",
        "XDG_RUNTIME_DIR",
        "DBUS_SESSION_BUS_ADDRESS",
        "PGPASSFILE",
    }
)


def directory(value: Any, label: str, *, base: str | None, home: str | None = None) -> str:
    """An absolute, normalised directory for ``cwd``/``--chdir``: a relative one is taken from
    ``base`` (where `cuectl submit` runs), ``~`` is the submitter's home. Its existence is
    checked where the frame runs (another host may mount it elsewhere)."""
    import os.path

    text = expect_str(value, label)
    if not text.strip():
        raise InvalidInput(f"{label}: must not be empty")
    if CONTROL_RE.search(text) or len(text) > MAX_PATH:
        raise InvalidInput(f"{label}: not a usable directory name {quote(text)}")
    if text == "~" or text.startswith("~/"):
        if not home:
            raise InvalidInput(f"{label}: {quote(text)} needs a home directory to start from; give the full path")
        text = home + text[1:]
    if not os.path.isabs(text):
        if base is None:
            raise InvalidInput(f"{label}: {quote(text)} is relative; give the full path")
        text = os.path.join(base, text)
    return os.path.normpath(text)


def exported_env(value: Any, label: str, environ: Mapping[str, str]) -> dict[str, str]:
    """Which of the submitter's variables travel with the job (sbatch's ``--export``):
    ``BASE`` (the default, ``BASE_EXPORT``), ``NONE``, ``ALL`` (all but secret-looking names,
    the shell's state and ``CUE_*``), names (``HF_HOME``: its current value), and ``NAME=VALUE``;
    a comma list or a YAML list. Names not set are left out, as sbatch does."""
    from cuectl.sched.views import looks_secret

    if value is None:
        value = "BASE"
    items = [part.strip() for part in value.split(",")] if isinstance(value, str) else as_list(value, label)
    out: dict[str, str] = {}
    words = [w for w in items if isinstance(w, str) and w.strip()]
    if len(words) != len(items):
        raise InvalidInput(f"{label}: expected NONE, BASE, ALL, names or NAME=VALUE, comma separated")
    if "NONE" in words and len(words) > 1:
        raise InvalidInput(f"{label}: NONE cannot be combined with anything")
    for word in words:
        if word == "NONE":
            continue
        if word == "BASE":
            out.update({k: environ[k] for k in BASE_EXPORT if k in environ})
        elif word == "ALL":
            out.update(
                {
                    k: v
                    for k, v in environ.items()
                    if _ENV_KEY_RE.fullmatch(k)
                    and not k.startswith("CUE_")
                    and k not in _SHELL_STATE
                    and k != "PGPASSWORD"
                    and not looks_secret(k)
                }
            )
        elif "=" in word:
            key, _, val = word.partition("=")
            out[_env_key(key, label)] = _env_value(val, f"{label} {key}")
        else:
            key = _env_key(word, label)
            if key in environ:
                out[key] = environ[key]
    return out


def _job_caps(get: Callable[[str], Any], label: Label) -> dict[str, Any]:
    """``project``, ``show``, ``shot``, ``max_running``, ``max_cores`` and ``max_gpus`` of a job
    (spec or flags)."""
    caps: dict[str, Any] = {}
    if get("project") is not None:
        caps["project"] = label_name(get("project"), label("project"), "project")
    for key in ("show", "shot"):  # OpenCue's job metadata: labels, like project
        if get(key) is not None:
            caps[key] = label_name(get(key), label(key), key)
    if get("max_running") is not None:
        caps["max_running"] = whole_number(get("max_running"), label("max_running"), minimum=1, maximum=MAX_RUNNING)
    if get("max_cores") is not None:
        caps["max_cores"] = cores_field(get("max_cores"), label("max_cores"))
    if get("max_gpus") is not None:
        caps["max_gpus"] = whole_number(get("max_gpus"), label("max_gpus"), minimum=0, maximum=MAX_GPUS_CAP)
    if get("notify") is not None:  # spec: notify[0].webhook; flags: already checked entries
        from cuectl.sched import notify

        caps["notify"] = notify.entries(get("notify"), "notify")
    return caps


# Layer keys a service (``cuectl admin service``) fills when the layer leaves them out, and
# the LayerSpec field each sets (sched/services.py).
SERVICE_KEYS = {
    "cores": "cores",
    "memory": "memory_bytes",
    "gpus": "gpus",
    "gpu_memory_min": "gpu_memory_min_bytes",
    "gpu_capability_min": "gpu_capability_min",
    "gpu_driver_min": "gpu_driver_min",
    "gpu_cuda_min": "gpu_cuda_min",
    "tags": "tags",
    "timeout": "timeout_s",
}


def service_names(value: Any, label: str) -> str | tuple[str, ...]:
    """A layer's ``service``: one name (it must exist when the job is submitted), or a list
    of names (OpenCue's rule: the first one the store has, else the ``default`` service)."""
    if isinstance(value, str):
        return label_name(value, label, "service")
    items = as_list(value, label)
    if not items:
        raise InvalidInput(f"{label}: expected a service name or a list of them, got an empty list")
    return tuple(dict.fromkeys(label_name(item, item_label(label, i), "service") for i, item in enumerate(items)))


def _command(value: Any, label: str) -> tuple[str, ...] | str:
    """An argv list (run as is, never through a shell) or one shell string (``sh -c``)."""
    if isinstance(value, str):
        if not value.strip():
            raise InvalidInput(f"{label}: must not be empty")
        if "\x00" in value:
            raise InvalidInput(f"{label}: must not contain NUL characters")
        _check_shell_quotes(value, label)
        return value
    if not isinstance(value, (list, tuple)):
        raise InvalidInput(f"{label}: expected a list of arguments or a shell string, got {describe(value)}")
    if not value:
        raise InvalidInput(f"{label}: must not be empty")
    argv: list[str] = []
    for index, arg in enumerate(value):
        where = f"{label}[{index}]"
        # YAML turns `[sleep, 5]` into a number; that is clearly meant as the text "5".
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            arg = str(arg)
        if not isinstance(arg, str):
            raise InvalidInput(f"{where}: expected a string, got {describe(arg)}")
        if "\x00" in arg:
            raise InvalidInput(f"{where}: must not contain NUL characters")
        argv.append(arg)
    if not argv[0].strip():
        raise InvalidInput(f"{label}[0]: the program name must not be empty")
    return tuple(argv)


# What a #TOKEN# looks like (the worker's tokens, run/launch.py, and any misspelling of one).
_TOKEN_SHAPE_RE = re.compile(r"#[A-Z][A-Z0-9_]*#")
# A `#` that does not start a word (it follows a character that is not a blank or an operator).
_MID_WORD_HASH_RE = re.compile(r"(?<=[^\s;&|()<>])#")


def _check_shell_quotes(text: str, label: str) -> None:
    """Refuse a shell string whose quotes do not close: ``/bin/sh -c`` would fail every
    frame with "Unterminated quoted string". The usual cause is YAML cutting the value at
    an unquoted `` #`` (``sh -c 'echo #IFRAME#'`` reads as ``sh -c 'echo``).

    shlex reads quotes as the shell does. Tokens become a plain word first (a ``#`` at the
    start of a word is a comment to shlex, as to the shell; the worker replaces tokens
    before the shell sees them). Here-documents (whose bodies are not shell syntax) and
    ``$'…'`` (bash's, which shlex does not know) are left to the shell: a refusal must
    never be wrong, so what shlex cannot judge passes.
    """
    import shlex

    if "<<" in text or "$'" in text:
        return
    # shlex takes a `#` inside a word for a comment too; the shell only one that starts a
    # word (`${F#0}`, `$((16#ff))`, `a#b` are words): those become a plain letter first.
    plain = _MID_WORD_HASH_RE.sub("_", _TOKEN_SHAPE_RE.sub("x", text))
    lexer = shlex.shlex(plain, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        for _ in lexer:
            pass
    except ValueError as exc:  # "No closing quotation" / "No escaped character"
        raise InvalidInput(
            f"{label}: the shell string's quotes do not close ({str(exc).lower()}): {text!r}",
            hint="a string command runs as /bin/sh -c: close the quote; in YAML, quote the whole "
            "value when it holds ' #' (a YAML comment starts there)",
        ) from None


def _range(value: Any, label: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    text = expect_str(value, label, what="a frame range like 1-100").strip()
    if not text:
        raise InvalidInput(f"{label}: empty frame range (use e.g. 1, 1-100 or 1-100x5)")
    return text


def _env_key(key: Any, label: str) -> str:
    if not isinstance(key, str) or not _ENV_KEY_RE.fullmatch(key):
        shown = quote(key) if isinstance(key, str) else repr(key)
        raise InvalidInput(f"{label}: invalid variable name {shown} (letters, digits and _, not starting with a digit)")
    return key


def _env_value(value: Any, label: str) -> str:
    if isinstance(value, bool):  # YAML spelling, not Python's True/False
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise InvalidInput(f"{label}: expected a string, number or boolean, got {describe(value)}")
    if "\x00" in value:
        raise InvalidInput(f"{label}: must not contain NUL characters")
    return value


def _env_mapping(value: Any, label: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{label}: expected a mapping of NAME: value, got {describe(value)}")
    env: dict[str, str] = {}
    for key, item in value.items():
        name = _env_key(key, label)
        env[name] = _env_value(item, f"{label}.{name}")
    return env


def _env_items(items: Sequence[str], label: str) -> dict[str, str]:
    """``--env K=V`` items; a later item for the same name wins, as in a shell."""
    env: dict[str, str] = {}
    for item in [items] if isinstance(items, str) else items:
        text = expect_str(item, label, what="K=V")
        if "=" not in text:
            raise InvalidInput(f"{label}: expected NAME=VALUE, got {quote(text)}")
        key, value = text.split("=", 1)
        env[_env_key(key, label)] = _env_value(value, label)
    return env


def _job_ref(value: Any, label: str) -> str:
    """Another job, by id (a whole number, or digits) or by name."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(whole_number(value, label, minimum=1, maximum=2**63 - 1))
    text = expect_str(value, label).strip()
    return text if text.isascii() and text.isdigit() else _job_name(text, label)


def _depend_frame(value: Any, label: str) -> int:
    return whole_number(value, label, minimum=-MAX_FRAME, maximum=MAX_FRAME)


def _depends(value: Any, label: str) -> list[tuple[Dependency, str]]:
    """A layer's dependencies with the label of each (for errors found later, once all
    layers are known). An entry is a layer name, or a mapping of ``layer`` (a layer of this
    job, or of ``job``), ``job`` (another job: alone, the whole job), ``frame`` (one frame of
    that layer) and ``type`` (layer, frame, previous or any: how to wait on a layer)."""
    deps: list[tuple[Dependency, str]] = []
    targets: dict[tuple[str | None, str | None, int | None], str] = {}
    for index, item in enumerate(as_list(value, label)):
        where = item_label(label, index)
        if isinstance(item, Mapping):
            _check_keys(item, DEPEND_KEYS, where)
            job = None if item.get("job") is None else _job_ref(item["job"], f"{where}.job")
            if item.get("layer") is None and job is None:
                raise InvalidInput(f"{where}: missing 'layer' (the layer to wait for) or 'job' (another job)")
            on = None if item.get("layer") is None else _layer_name(item["layer"], f"{where}.layer")
            frame = None if item.get("frame") is None else _depend_frame(item["frame"], f"{where}.frame")
            if frame is not None and on is None:
                raise InvalidInput(f"{where}.frame: a frame needs the 'layer' it belongs to")
            kind = item.get("type", "layer")
            if kind is None:
                kind = "layer"
            if not isinstance(kind, str) or kind.lower() not in DEPEND_TYPES:
                shown = quote(kind) if isinstance(kind, str) else describe(kind)
                raise InvalidInput(
                    f"{where}.type: unknown dependency type {shown} (expected "
                    f"{', '.join(DEPEND_TYPES[:-1])} or {DEPEND_TYPES[-1]})"
                )
            if kind.lower() != "layer" and (on is None or frame is not None):
                raise InvalidInput(
                    f"{where}.type: {kind.lower()!r} is how a layer waits on a layer; "
                    f"this entry waits on {'a frame' if frame is not None else 'a whole job'}"
                )
            dep = Dependency(on=on, type=kind.lower(), job=job, frame=frame)  # type: ignore[arg-type]
        else:
            dep = Dependency(on=_layer_name(item, where), type="layer")
        key = (dep.job, dep.on, dep.frame)
        if key in targets:
            raise InvalidInput(f"{where}: depends on {_depend_text(dep)} twice (also {targets[key]})")
        targets[key] = where
        deps.append((dep, where))
    return deps


def _depend_text(dep: Dependency) -> str:
    parts = [f"job {dep.job!r}"] if dep.job is not None else []
    if dep.on is not None:
        parts.append(f"{dep.on!r}" if dep.frame is None else f"frame {dep.frame} of {dep.on!r}")
    return " ".join(parts)


def _job_depends(value: Any, label: str) -> tuple[Dependency, ...]:
    """The job's own ``depends:`` (every layer waits): entries name another job, or a
    mapping of ``job`` with an optional ``layer`` and ``frame`` of it."""
    deps: list[Dependency] = []
    seen: dict[tuple[str | None, str | None, int | None], str] = {}
    for index, item in enumerate(as_list(value, label)):
        where = item_label(label, index)
        if isinstance(item, Mapping):
            _check_keys(item, JOB_DEPEND_KEYS, where)
            if item.get("job") is None:
                raise InvalidInput(f"{where}: missing 'job' (the job to wait for)")
            job = _job_ref(item["job"], f"{where}.job")
            on = None if item.get("layer") is None else _layer_name(item["layer"], f"{where}.layer")
            frame = None if item.get("frame") is None else _depend_frame(item["frame"], f"{where}.frame")
            if frame is not None and on is None:
                raise InvalidInput(f"{where}.frame: a frame needs the 'layer' it belongs to")
            dep = Dependency(on=on, job=job, frame=frame)
        else:
            dep = Dependency(on=None, job=_job_ref(item, where))
        key = (dep.job, dep.on, dep.frame)
        if key in seen:
            raise InvalidInput(f"{where}: depends on {_depend_text(dep)} twice (also {seen[key]})")
        seen[key] = where
        deps.append(dep)
    return tuple(deps)


# --------------------------------------------------------------------------------------
# Layers and jobs


def _build_layer(
    data: Mapping[str, Any],
    label: Label,
    job_env: Mapping[str, str],
    *,
    parse_env: Callable[[Any, str], dict[str, str]] = _env_mapping,
    job_cwd: str | None = None,
    home: str | None = None,
) -> tuple[LayerSpec, list[tuple[Dependency, str]]]:
    """Validate one layer's fields (already checked for unknown keys). ``None`` = not set.

    ``parse_env`` reads the ``env`` field: a YAML mapping, or ``K=V`` items for the flags."""

    def get(key: str) -> Any:
        return data.get(key)

    for required in ("name", "command"):
        if get(required) is None:
            raise InvalidInput(f"{label(required)}: required")
    name = _layer_name(get("name"), label("name"))
    fields: dict[str, Any] = {"name": name, "command": _command(get("command"), label("command"))}
    if get("range") is not None:
        fields["range"] = _range(get("range"), label("range"))
    if get("chunk") is not None:
        fields["chunk"] = whole_number(get("chunk"), label("chunk"), minimum=1, maximum=MAX_FRAME)
    gpu = GpuRequest.parse(
        # A share is part of one GPU: asking for one asks for a GPU.
        gpus=(1 if get("gpu_share") is not None else 0) if get("gpus") is None else get("gpus"),
        gpu_vendor=get("gpu_vendor"),
        gpu_models=get("gpu_models"),
        gpu_memory_min=_mib_if_number(get("gpu_memory_min")),
        gpu_capability_min=get("gpu_capability_min"),
        gpu_driver_min=get("gpu_driver_min"),
        gpu_cuda_min=get("gpu_cuda_min"),
        label=label,
    )
    fields.update(
        gpus=gpu.gpus,
        gpu_vendor=gpu.gpu_vendor,
        gpu_models=gpu.gpu_models,
        gpu_memory_min_bytes=gpu.gpu_memory_min_bytes,
        gpu_capability_min=gpu.gpu_capability_min,
        gpu_driver_min=gpu.gpu_driver_min,
        gpu_cuda_min=gpu.gpu_cuda_min,
    )
    if get("cores") is not None:
        fields["cores"] = cores_field(get("cores"), label("cores"))
    if get("memory") is not None:
        fields["memory_bytes"] = size_bytes(_mib_if_number(get("memory")), label("memory"))
    if get("retries") is not None:
        fields["retries"] = whole_number(get("retries"), label("retries"), minimum=0, maximum=MAX_RETRIES)
    if get("timeout") is not None:
        fields["timeout_s"] = timeout_field(get("timeout"), label("timeout"))
    env = dict(job_env)  # the layer's own variables win over the job's
    if get("env") is not None:
        env.update(parse_env(get("env"), label("env")))
    fields["env"] = tuple(env.items())
    if get("tags") is not None:
        fields["tags"] = tags_field(get("tags"), label("tags"))
    if get("log_limit") is not None:
        fields["log_limit_bytes"] = log_limit_bytes(_mib_if_number(get("log_limit")), label("log_limit"))
    if get("max_running") is not None:
        fields["max_running"] = whole_number(get("max_running"), label("max_running"), minimum=1, maximum=MAX_RUNNING)
    if get("limits") is not None:
        fields["limits"] = limit_names(get("limits"), label("limits"))
    if get("retry_delay") is not None:
        fields["retry_delay_s"] = _retry_delay(get("retry_delay"), label("retry_delay"))
    if get("retry_on_gpu_oom") is not None:
        fields["retry_on_gpu_oom"] = _retry_on_gpu_oom(get("retry_on_gpu_oom"), label, gpu.gpus)
    fields.update(_gpu_policies(get, label, gpu.gpus))
    if get("type") is not None:
        kind = expect_str(get("type"), label("type"))
        fields["type"] = next((t for t in LAYER_TYPES if t.casefold() == kind.strip().casefold()), None)
        if fields["type"] is None:
            raise InvalidInput(f"{label('type')}: {quote(kind)} is not one of {', '.join(LAYER_TYPES)}")
    cwd = job_cwd if get("cwd") is None else directory(get("cwd"), label("cwd"), base=job_cwd, home=home)
    if cwd is not None:
        fields["cwd"] = cwd
    deps = _depends(get("depends"), label("depends")) if get("depends") is not None else []
    fields["depends"] = tuple(dep for dep, _ in deps)
    if get("service") is not None:
        fields["service"] = service_names(get("service"), label("service"))
    # What the layer set itself, which no service overrides (sched/services.py).
    fields["explicit"] = frozenset(f for key, f in SERVICE_KEYS.items() if get(key) is not None)
    return LayerSpec(**fields), deps


def _retry_on_gpu_oom(value: Any, label: Label, gpus: int) -> str:
    """``same`` or ``bigger`` (any case); ``bigger`` only for a layer that asks for GPUs."""
    where = label("retry_on_gpu_oom")
    text = expect_str(value, where).strip().lower()
    if text not in RETRY_ON_GPU_OOM:
        raise InvalidInput(f"{where}: {quote(text)} is not one of {', '.join(RETRY_ON_GPU_OOM)}")
    if text == "bigger" and gpus == 0:
        raise InvalidInput(f"{where}: only applies to GPU requests; set {label('gpus')} to 1 or more")
    return text


def _gpu_policies(get: Callable[[str], Any], label: Label, gpus: int) -> dict[str, Any]:
    """A layer's GPU policy keys (docs/gpu-health.md) as LayerSpec fields: each only for a
    layer that asks for GPUs; ``gpu_share`` for exactly one."""
    out: dict[str, Any] = {}
    given = [key for key in _GPU_POLICY_KEYS if get(key) is not None]
    if not given:
        return out
    if gpus == 0:
        raise InvalidInput(f"{label(given[0])}: only applies to GPU requests; set {label('gpus')} to 1 or more")
    for key in ("gpu_escape", "gpu_idle_action", "gpu_share_enforce"):
        if get(key) is not None:
            text = expect_str(get(key), label(key)).strip().lower()
            if text not in GPU_POLICY_ACTIONS:
                raise InvalidInput(f"{label(key)}: {quote(text)} is not one of {', '.join(GPU_POLICY_ACTIONS)}")
            out[key] = text
    if get("gpu_idle_limit") is not None:
        out["gpu_idle_limit_s"] = timeout_field(get("gpu_idle_limit"), label("gpu_idle_limit"))
    if get("gpu_idle_util") is not None:
        out["gpu_idle_util"] = _percent(get("gpu_idle_util"), label("gpu_idle_util"))
    if get("gpu_share") is not None:
        where = label("gpu_share")
        if gpus != 1:
            raise InvalidInput(f"{where}: a share is part of one GPU; {label('gpus')} is {gpus}, set it to 1")
        share = size_bytes(_mib_if_number(get("gpu_share")), where)
        if share <= 0:
            raise InvalidInput(f"{where}: must be more than 0 (leave it out for whole devices)")
        out["gpu_share_bytes"] = share
    elif get("gpu_share_enforce") is not None:
        raise InvalidInput(f"{label('gpu_share_enforce')}: only applies with {label('gpu_share')}")
    return out


_GPU_POLICY_KEYS = (
    "gpu_escape",
    "gpu_idle_limit",
    "gpu_idle_action",
    "gpu_idle_util",
    "gpu_share",
    "gpu_share_enforce",
)


def _percent(value: Any, where: str) -> float:
    """A percentage from 0 to 100: ``5``, ``5.5`` or ``"5%"``."""
    text = value.strip().removesuffix("%").strip() if isinstance(value, str) else value
    try:
        pct = float(text) if not isinstance(text, bool) else math.nan
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}: expected a percentage from 0 to 100, got {describe(value)}") from None
    if not math.isfinite(pct) or not 0 <= pct <= 100:
        raise InvalidInput(f"{where}: expected a percentage from 0 to 100, got {describe(value)}")
    return pct


def _post_layers_last(
    layers: Sequence[LayerSpec], deps: Sequence[list[tuple[Dependency, str]]]
) -> tuple[list[LayerSpec], list[list[tuple[Dependency, str]]]]:
    """A Post layer (OpenCue) waits for every layer that is not Post: it gets a layer
    dependency on each, besides its own."""
    others = [layer.name for layer in layers if layer.type != "Post"]
    out_layers, out_deps = [], []
    for layer, layer_deps in zip(layers, deps):
        if layer.type == "Post":
            have = {d.on for d in layer.depends if d.job is None and d.frame is None}
            extra = [Dependency(on=name) for name in others if name not in have]
            layer = dataclasses.replace(layer, depends=layer.depends + tuple(extra))
            layer_deps = layer_deps + [(d, f"layers: {layer.name} (type Post)") for d in extra]
        out_layers.append(layer)
        out_deps.append(layer_deps)
    return out_layers, out_deps


def _check_dependencies(layers: Sequence[LayerSpec], deps: Sequence[list[tuple[Dependency, str]]]) -> None:
    names = {layer.name for layer in layers}
    for layer, layer_deps in zip(layers, deps):
        for dep, where in layer_deps:
            if dep.job is not None or dep.on is None:
                continue  # another job's layer: the store finds it at submit
            if dep.on == layer.name and (dep.type != "previous" or dep.frame is not None):
                raise InvalidInput(f"{where}: layer {layer.name!r} cannot depend on itself")
            if dep.on not in names:
                close = difflib.get_close_matches(dep.on, sorted(names), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise InvalidInput(f"{where}: unknown layer {dep.on!r}{hint}")
    # Depth-first search for a cycle; report it as a path so the user can see which edge to cut.
    # (A layer's previous-frame dependency on itself, a simulation's chain, is no cycle.)
    graph = {
        layer.name: [
            dep.on
            for dep in layer.depends
            if dep.job is None and dep.on is not None and not (dep.on == layer.name and dep.type == "previous")
        ]
        for layer in layers
    }
    done: set[str] = set()
    for root in graph:
        if root in done:
            continue
        path = [root]  # the chain being explored; iterators[i] walks path[i]'s dependencies
        iterators = [iter(graph[root])]
        while iterators:
            nxt = next(iterators[-1], None)
            if nxt is None:
                done.add(path.pop())
                iterators.pop()
            elif nxt in path:
                cycle = path[path.index(nxt) :] + [nxt]
                raise InvalidInput(f"layers: dependency cycle {' -> '.join(cycle)}")
            elif nxt not in done:
                path.append(nxt)
                iterators.append(iter(graph[nxt]))


def _finish(
    *,
    name: str,
    user: str | None,
    priority: int,
    paused: bool,
    layers: Sequence[LayerSpec],
    deps: Sequence[list[tuple[Dependency, str]]],
    layer_labels: Sequence[Label],
    frame_limit: int | None,
    caps: Mapping[str, Any] | None = None,
) -> JobSpec:
    """Cross-layer checks (names, dependencies, frame limit) and the chunk expansion."""
    seen: dict[str, str] = {}
    for layer, label in zip(layers, layer_labels):
        if layer.name in seen:
            raise InvalidInput(f"{label('name')}: duplicate layer name {layer.name!r} (also {seen[layer.name]})")
        seen[layer.name] = label("name")
    layers, deps = _post_layers_last(layers, deps)
    _check_dependencies(layers, deps)
    if frame_limit is None:
        from cuectl.config import frame_limit as configured_limit

        frame_limit = configured_limit()
    if user is None:
        from cuectl.config import current_user

        user = current_user()
    if not isinstance(user, str) or not user.strip() or CONTROL_RE.search(user):
        raise InvalidInput(f"user: invalid user name {user!r}")
    chunks: list[tuple[tuple[int, ...], ...]] = []
    total = 0
    for layer, label in zip(layers, layer_labels):
        try:
            # Only what is left of the budget may be expanded, so memory stays bounded by
            # the limit for the whole job, not per layer.
            frames = parse_frameset(layer.range, limit=max(frame_limit - total, 0))
        except InvalidInput:
            # Refused against what is left: find out whether the range is bad or over the
            # limit by itself (its own message says which), or only the job's total is over.
            try:
                frames = parse_frameset(layer.range, limit=frame_limit)
            except InvalidInput as own:
                raise InvalidInput(f"{label('range')}: {own.message}") from None
            if total + len(frames) > frame_limit:
                raise InvalidInput(
                    f"the job has at least {total + len(frames)} frames across its layers; "
                    f"the limit is {frame_limit} (CUECTL_FRAME_LIMIT)"
                ) from None
            # else: only the repeat guard, scaled to the remaining budget, objected; fine.
        total += len(frames)
        chunks.append(tuple(chunk_frames(frames, layer.chunk)))
    _check_frame_targets(layers, deps, chunks)
    for layer, label in zip(layers, layer_labels):
        _check_argv_size(layer, label)
    return JobSpec(
        name=name,
        user=user,
        layers=tuple(layers),
        priority=priority,
        paused=paused,
        chunks=tuple(chunks),
        **dict(caps or {}),
    )


def _check_frame_targets(
    layers: Sequence[LayerSpec],
    deps: Sequence[list[tuple[Dependency, str]]],
    chunks: Sequence[tuple[tuple[int, ...], ...]],
) -> None:
    """A dependency on one frame of a layer of this job names a frame that layer has."""
    frames = {layer.name: {n for chunk in layer_chunks for n in chunk} for layer, layer_chunks in zip(layers, chunks)}
    for layer_deps in deps:
        for dep, where in layer_deps:
            if dep.job is None and dep.frame is not None and dep.on is not None and dep.frame not in frames[dep.on]:
                raise InvalidInput(f"{where}.frame: layer {dep.on!r} has no frame {dep.frame}")


# The kernel refuses an exec whose arguments and environment exceed ARG_MAX (E2BIG): such a
# frame could never start, so it is refused here rather than burning retries on every host.
# Room is left for the environment the worker adds (CUE_* variables, the isolation ones).
_ENV_ALLOWANCE = 64 * 1024
_MAX_ARG_STRLEN = 32 * 4096  # Linux: the longest single argument or environment string


def _arg_max() -> int:
    import os

    try:
        value = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        value = -1
    return value if value > 0 else 2 * 1024 * 1024


def _check_argv_size(layer: LayerSpec, label: Label) -> None:
    """Refuse a command (with the layer's env) too long for any exec to take.

    Tokens are counted as written: a ``#FRAMESPEC#`` may grow a little at run time, which the
    allowance absorbs. Each string costs its bytes, a NUL and a pointer, as the kernel counts."""
    argv = [layer.command] if isinstance(layer.command, str) else list(layer.command)
    if isinstance(layer.command, str):
        argv = ["/bin/sh", "-c", layer.command]
    env = [f"{k}={v}" for k, v in layer.env]
    for text in (*argv, *env):
        if len(text.encode()) >= _MAX_ARG_STRLEN:
            what = "an environment entry" if text in env else "an argument"
            raise InvalidInput(
                f"{label('command')}: {what} of {len(text.encode())} bytes is longer than Linux takes "
                f"in one string ({_MAX_ARG_STRLEN} bytes): it could never start",
                hint="pass long data in a file instead",
            )
    size = sum(len(a.encode()) + 1 + 8 for a in argv) + sum(len(e.encode()) + 1 + 8 for e in env)
    limit = _arg_max() - _ENV_ALLOWANCE
    if size > limit:
        raise InvalidInput(
            f"{label('command')}: the command and its env take {size} bytes; the system's limit "
            f"for starting a process is about {limit} (ARG_MAX): it could never start",
            hint="pass long data in a file instead",
        )


def _field_of(layer: str) -> Label:
    """Labels of one YAML layer's fields: ``layers[1].gpus``."""
    return lambda key: f"{layer}.{key}"


def spec_from_mapping(
    data: Any,
    *,
    user: str | None = None,
    frame_limit: int | None = None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobSpec:
    """Validate a parsed YAML/JSON document into a JobSpec (see docs/job-spec.md).

    ``user`` defaults to the submitting user (config), never to anything in the document;
    ``frame_limit`` to ``CUECTL_FRAME_LIMIT``. Keys set to null count as not set. ``cwd``:
    where the submit happens (the frames' directory unless the spec says ``cwd:``; None: no
    directory unless the spec gives an absolute one). ``environ``: the submitter's
    environment, of which ``export:`` (default BASE) travels with the job; None: nothing
    is captured (library callers that build specs for tests and tools).
    """
    if data is None:
        raise InvalidInput("the job spec is empty (expected a mapping with name: and layers:)")
    if not isinstance(data, Mapping):
        raise InvalidInput(f"the job spec must be a mapping with name: and layers:, got {describe(data)}")
    # Keys starting with "x-" are ignored (as in docker-compose): a place for anchors such
    # as `x-defaults: &defaults {...}` that layers then merge with `<<: *defaults`.
    _check_keys(
        {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))},
        JOB_KEYS,
        "",
        elsewhere=_LAYER_ONLY_KEYS,
    )
    if data.get("name") is None:
        raise InvalidInput("name: required (the job's name)")
    name = _job_name(data["name"], "name")
    priority = 0
    if data.get("priority") is not None:
        priority = check_priority(data["priority"], "priority")
    paused = False if data.get("paused") is None else _boolean(data["paused"], "paused")
    job_env = {} if data.get("env") is None else _env_mapping(data["env"], "env")
    home = (environ or {}).get("HOME")
    job_cwd = cwd if data.get("cwd") is None else directory(data["cwd"], "cwd", base=cwd, home=home)
    if environ is not None:
        job_env = {**exported_env(data.get("export"), "export", environ), **job_env}
    elif data.get("export") is not None:
        exported_env(data["export"], "export", {})  # still checked: a typo is an error wherever it is made
    raw_layers = data.get("layers")
    if raw_layers is None:
        raise InvalidInput("layers: required (a list of at least one layer)")
    if not isinstance(raw_layers, (list, tuple)):
        raise InvalidInput(f"layers: expected a list of layers, got {describe(raw_layers)}")
    if not raw_layers:
        raise InvalidInput("layers: needs at least one layer")
    if len(raw_layers) > MAX_LAYERS:
        raise InvalidInput(f"layers: at most {MAX_LAYERS} layers (got {len(raw_layers)})")
    layers: list[LayerSpec] = []
    deps: list[list[tuple[Dependency, str]]] = []
    labels: list[Label] = []
    for index, raw in enumerate(raw_layers):
        here = f"layers[{index}]"
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{here}: expected a mapping with name: and command:, got {describe(raw)}")
        _check_keys(raw, LAYER_KEYS, here, elsewhere=_JOB_ONLY_KEYS)
        label = _field_of(here)
        layer, layer_deps = _build_layer(raw, label, job_env, job_cwd=job_cwd, home=home)
        layers.append(layer)
        deps.append(layer_deps)
        labels.append(label)
    return _finish(
        name=name,
        user=user,
        priority=priority,
        paused=paused,
        layers=layers,
        deps=deps,
        layer_labels=labels,
        frame_limit=frame_limit,
        caps={
            **_job_caps(data.get, lambda key: key),
            **({"depends": _job_depends(data["depends"], "depends")} if data.get("depends") is not None else {}),
        },
    )


def spec_from_flags(
    *,
    name: str,
    command: Sequence[str],
    range: str = "1",  # noqa: A002 - the flag is --range
    chunk: int = 1,
    layer: str | None = None,
    gpus: int | None = None,
    gpu_vendor: str | None = None,
    gpu_models: Sequence[str] = (),
    gpu_memory_min: str | None = None,
    gpu_capability_min: str | None = None,
    gpu_driver_min: str | None = None,
    gpu_cuda_min: str | None = None,
    cores: float | None = None,
    memory: str | None = None,
    priority: int = 0,
    retries: int | None = None,
    timeout: str | None = None,
    env: Sequence[str] = (),
    tags: Sequence[str] = (),
    paused: bool = False,
    user: str | None = None,
    frame_limit: int | None = None,
    log_limit: str | int | None = None,
    project: str | None = None,
    show: str | None = None,
    shot: str | None = None,
    service: str | None = None,
    max_running: int | None = None,
    max_cores: float | None = None,
    max_gpus: int | None = None,
    limits: Sequence[str] = (),
    notify: Sequence[Notify] = (),
    retry_delay: str | None = None,
    retry_on_gpu_oom: str | None = None,
    gpu_escape: str | None = None,
    gpu_idle_limit: str | None = None,
    gpu_idle_action: str | None = None,
    gpu_idle_util: float | None = None,
    gpu_share: str | None = None,
    gpu_share_enforce: str | None = None,
    chdir: str | None = None,
    export: str | None = None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> JobSpec:
    """The single-layer job of ``cuectl submit --name N ... -- COMMAND ARGS`` (DESIGN §6).

    ``command`` is the argv after ``--`` and is kept as argv: an element with spaces or shell
    metacharacters is one argument, never shell-interpreted (use ``-- sh -c '...'`` for a
    pipeline). A plain ``str`` (library callers) is taken as a shell string. The layer is
    named ``layer`` or ``main``. Errors name the flag: ``--gpus: must be 0 or more``.
    ``gpus`` None: not given (0, unless the layer's service gives a count).
    """

    job_name = _job_name(name, "--name")
    job_priority = check_priority(priority, "--priority")
    job_paused = _boolean(paused, "--paused")
    if not isinstance(command, str):
        if not isinstance(command, (list, tuple)):
            command = list(command)
        if not command:
            raise InvalidInput("COMMAND: no command given (put it after --, e.g. -- python3 render.py #IFRAME#)")
    raw = {
        "name": DEFAULT_FLAG_LAYER if layer is None else layer,
        "command": command,
        "range": range,
        "chunk": chunk,
        "gpus": gpus,
        "gpu_vendor": gpu_vendor,
        "gpu_models": _as_flag_list(gpu_models),
        "gpu_memory_min": gpu_memory_min,
        "gpu_capability_min": gpu_capability_min,
        "gpu_driver_min": gpu_driver_min,
        "gpu_cuda_min": gpu_cuda_min,
        "cores": cores,
        "memory": memory,
        "retries": retries,
        "timeout": timeout,
        "env": env,
        "tags": _as_flag_list(tags) or None,
        "log_limit": log_limit,
        "limits": _as_flag_list(limits) or None,
        "retry_delay": retry_delay,
        "retry_on_gpu_oom": retry_on_gpu_oom,
        "gpu_escape": gpu_escape,
        "gpu_idle_limit": gpu_idle_limit,
        "gpu_idle_action": gpu_idle_action,
        "gpu_idle_util": gpu_idle_util,
        "gpu_share": gpu_share,
        "gpu_share_enforce": gpu_share_enforce,
        "service": service,
    }
    home = (environ or {}).get("HOME")
    job_cwd = cwd if chdir is None else directory(chdir, "--chdir", base=cwd, home=home)
    exported = exported_env(export, "--export", environ) if environ is not None else {}
    if environ is None and export is not None:
        exported_env(export, "--export", {})
    built, deps = _build_layer(raw, flag_label, exported, parse_env=_env_items, job_cwd=job_cwd, home=home)
    job_caps = {
        "project": project,
        "show": show,
        "shot": shot,
        "max_running": max_running,
        "max_cores": max_cores,
        "max_gpus": max_gpus,
        "notify": tuple(notify) or None,
    }
    return _finish(
        name=job_name,
        user=user,
        priority=job_priority,
        paused=job_paused,
        layers=[built],
        deps=[deps],
        layer_labels=[flag_label],
        frame_limit=frame_limit,
        caps=_job_caps(job_caps.get, flag_label),
    )


def flag_env(items: Sequence[str]) -> dict[str, str]:
    """``--env K=V`` items as a mapping (checked as the flag form checks them)."""
    return _env_items(list(items), "--env") if items else {}


def _as_flag_list(values: Sequence[str] | str) -> list[str]:
    """A repeated flag's values; a lone str is one value, not a list of characters."""
    return [values] if isinstance(values, str) else list(values)


# --------------------------------------------------------------------------------------
# YAML


def _at(source: str, node: Any) -> str:
    mark = node.start_mark
    return f"{source}: line {mark.line + 1}, column {mark.column + 1}"


def _guard_nodes(root: Any, source: str) -> None:
    """Refuse alias bombs, recursive aliases and duplicate keys, before constructing.

    PyYAML shares one node for every use of an anchor, so the composed graph stays small
    even for a "billion laughs" document; the blow-up happens when something walks the
    constructed value. Sizing the graph with memoisation costs one visit per distinct node,
    so the expanded size is known, and refused, without ever expanding.
    """
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()
    aliases = 0

    def size(node: Any) -> int:
        nonlocal aliases
        key = id(node)
        if key in sizes:
            aliases += 1
            if aliases > MAX_ALIASES:
                raise InvalidInput(
                    f"{source}: more than {MAX_ALIASES} alias references (*name); refused as a YAML bomb"
                )
            return sizes[key]
        if key in active:
            raise InvalidInput(f"{_at(source, node)}: recursive alias (a node that contains itself)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            explicit: dict[tuple[str, str], Any] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    ident = (key_node.tag, key_node.value)
                    if ident in explicit:
                        raise InvalidInput(f"{_at(source, key_node)}: duplicate key {quote(key_node.value)}")
                    explicit[ident] = key_node
                total += size(key_node) + size(value_node)
        elif isinstance(node, yaml.SequenceNode):
            for child in node.value:
                total += size(child)
        active.discard(key)
        sizes[key] = total
        if total > MAX_EXPANDED_NODES:
            raise InvalidInput(
                f"{source}: the document expands to more than {MAX_EXPANDED_NODES} values through aliases; "
                "refused as a YAML bomb"
            )
        return total

    size(root)


# A YAML comment that begins with a token: `` #IFRAME#`` right after an unquoted value.
_SWALLOWED_RE = re.compile(r"[ \t]+(#[A-Z][A-Z0-9_]*#)")


def _check_swallowed_tokens(root: Any, text: str, source: str) -> None:
    """Refuse an unquoted ``command:`` value that YAML cut at a comment starting with a
    ``#TOKEN#``: ``command: sh -c 'echo #IFRAME#'`` is ``sh -c 'echo`` to YAML (a space then
    ``#`` starts a comment), and every frame would run the stump. The hint gives the line
    with the value quoted. Walks the composed nodes, so the text positions are known."""
    import yaml

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == "command":
                    values = value.value if isinstance(value, yaml.SequenceNode) else [value]
                    for item in values:
                        _refuse_swallowed(item, text, source)
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _refuse_swallowed(node: Any, text: str, source: str) -> None:
    import yaml

    if not isinstance(node, yaml.ScalarNode) or node.style is not None:  # quoted and block values keep '#'
        return
    end = node.end_mark.index
    line_end = text.find("\n", end)
    rest = text[end:] if line_end < 0 else text[end:line_end]
    found = _SWALLOWED_RE.match(rest)
    if found is None:
        return
    whole = (node.value + rest).rstrip()
    quoted = f'"{whole}"' if '"' not in whole and "\\" not in whole else "'" + whole.replace("'", "''") + "'"
    raise InvalidInput(
        f"{_at(source, node)}: command: YAML read only {node.value!r}: an unquoted ' #' starts a comment, "
        f"which swallowed {found.group(1)} and the rest of the line",
        hint=f"quote the whole value: {quoted}",
    )


def _yaml_error(exc: Exception, text: str, source: str) -> InvalidInput:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        # PyYAML splits its message into a context ("while parsing a block mapping") and
        # the problem; together they read as one sentence.
        parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
        detail = " ".join(", ".join(str(p) for p in parts if p).split()) or "syntax error"
        return InvalidInput(f"{source}: invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {detail}")
    position = getattr(exc, "position", None)  # ReaderError: a character YAML does not allow
    if isinstance(position, int):
        line = text.count("\n", 0, position)
        column = position - (text.rfind("\n", 0, position) + 1)
        character = getattr(exc, "character", None)
        what = f"character #x{character:04x}" if isinstance(character, int) else "character"
        return InvalidInput(
            f"{source}: invalid YAML at line {line + 1}, column {column + 1}: "
            f"unacceptable {what} (control characters are not allowed)"
        )
    return InvalidInput(f"{source}: invalid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")


class _TooDeep(Exception):
    """Raised by the loader's depth guard with the YAML mark where nesting went too deep."""


@functools.lru_cache(maxsize=1)
def _guarded_loader() -> type:
    """PyYAML's pure-Python SafeLoader with a nesting limit.

    Not CSafeLoader: the C composer recurses on the C stack. The Python one recurses too,
    and PyYAML's scanner does work proportional to the open nesting for every token, so an
    unlimited "[[[[..." costs seconds before a RecursionError; a job spec needs a few levels.
    """
    import yaml

    class GuardedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    raise _TooDeep(self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return GuardedLoader


def _load_yaml(text: str, source: str) -> Any:
    import yaml

    if len(text) > MAX_SPEC_BYTES:
        raise InvalidInput(f"{source}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MB; refused")
    loader = None
    try:
        loader = _guarded_loader()(text)  # checks for unprintable characters right away
        root = loader.get_single_node()
        if root is None:
            return None
        _guard_nodes(root, source)
        _check_swallowed_tokens(root, text, source)
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, text, source) from None
    except _TooDeep as exc:
        mark = exc.args[0]
        raise InvalidInput(
            f"{source}: invalid YAML at line {mark.line + 1}, column {mark.column + 1}: "
            f"nested more than {MAX_DEPTH} levels deep"
        ) from None
    except RecursionError:  # the depth guard should make this unreachable; keep it a clean error
        raise InvalidInput(f"{source}: invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_spec_text(
    text: str,
    *,
    source: str = "<job spec>",
    user: str | None = None,
    frame_limit: int | None = None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    adjust: Callable[[Any], Any] | None = None,
    openjd_params: Sequence[str] | Mapping[str, str] = (),
    notes: list[str] | None = None,
    base_dir: str | None = None,
) -> JobSpec:
    """Parse YAML text (e.g. a spec piped on stdin). Errors start with ``source:``.
    ``adjust``: applied to the parsed document before validation (flags that override it).
    An Open Job Description template (``specificationVersion:``) is converted first
    (sched/openjd.py, docs/openjd.md) with ``openjd_params`` (``NAME=VALUE`` items);
    ``base_dir``: the template's directory; what it cannot honour is added to ``notes``."""
    data = _load_yaml(text, source)
    from cuectl.sched import openjd

    if openjd.is_openjd(data):
        try:
            data, found = openjd.openjd_to_spec(data, openjd_params, template_dir=base_dir, cwd=cwd)
        except InvalidInput as exc:
            raise InvalidInput(f"{source}: {exc.message}", hint=exc.hint) from None
        if notes is not None:
            notes.extend(f"{source}: {note}" for note in found)
    elif openjd_params:
        raise InvalidInput(
            "--param: only for Open Job Description templates (specificationVersion: jobtemplate-2023-09)",
            hint="a cuectl spec takes values from its own keys and flags",
        )
    if adjust is not None:
        data = adjust(data)
    try:
        return spec_from_mapping(data, user=user, frame_limit=frame_limit, cwd=cwd, environ=environ)
    except InvalidInput as exc:
        raise InvalidInput(f"{source}: {exc.message}", hint=exc.hint) from None


def load_spec_file(
    path: str | Path,
    *,
    user: str | None = None,
    frame_limit: int | None = None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    adjust: Callable[[Any], Any] | None = None,
    openjd_params: Sequence[str] | Mapping[str, str] = (),
    notes: list[str] | None = None,
) -> JobSpec:
    """Read and validate a YAML job spec (or an Open Job Description template: see
    load_spec_text). Every problem is an InvalidInput starting with the
    path: unreadable file, over 10 MB, not UTF-8, malformed YAML (with line and column),
    unknown keys, bad values."""
    from cuectl.sched.intake import read_source  # the one place a spec is read (size cap, UTF-8)

    source = read_source(Path(path))
    return load_spec_text(
        source.text,
        source=source.name,
        user=user,
        frame_limit=frame_limit,
        cwd=cwd,
        environ=environ,
        adjust=adjust,
        openjd_params=openjd_params,
        notes=notes,
        base_dir=source.base_dir,
    )


def with_log_limit(spec: JobSpec, value: str | int, label: str) -> JobSpec:
    """``spec`` with ``value`` as the log cap of every layer that does not set its own."""
    import dataclasses

    limit = log_limit_bytes(value, label)
    layers = tuple(
        layer if layer.log_limit_bytes is not None else dataclasses.replace(layer, log_limit_bytes=limit)
        for layer in spec.layers
    )
    return dataclasses.replace(spec, layers=layers)


def recheck(spec: JobSpec, *, user: str, frame_limit: int | None = None) -> JobSpec:
    """A JobSpec built by another process (a client of the store's socket: cuectl.serve.
    storecalls) checked again here, as if parsed here, and made ``user``'s: the names,
    commands, environment and directories each field validator checks, the layers'
    dependencies, the frame limit and the command size; the chunks are expanded anew from
    each layer's range (a client's own ``chunks`` are never believed: they become frame rows)."""
    _job_name(spec.name, "name")
    for key in ("project", "show", "shot"):
        if getattr(spec, key) is not None:
            label_name(getattr(spec, key), key, key)
    labels: list[Label] = []
    for index, layer in enumerate(spec.layers):
        label = _field_of(f"layers[{index}]")
        _layer_name(layer.name, label("name"))
        _command(layer.command, label("command"))
        for key, value in layer.env:
            _env_value(value, f"{label('env')}.{_env_key(key, label('env'))}")
        if layer.cwd is not None and not layer.cwd.startswith("/"):
            raise InvalidInput(f"{label('cwd')}: must be an absolute directory, got {quote(layer.cwd)}")
        if layer.chunk < 1:
            raise InvalidInput(f"{label('chunk')}: must be 1 or more, got {layer.chunk}")
        labels.append(label)
    deps = [[(d, f"layers[{i}].depends") for d in layer.depends] for i, layer in enumerate(spec.layers)]
    checked = _finish(
        name=spec.name,
        user=user,
        priority=spec.priority,
        paused=spec.paused,
        layers=spec.layers,
        deps=deps,
        layer_labels=labels,
        frame_limit=frame_limit,
    )
    return dataclasses.replace(spec, user=checked.user, layers=checked.layers, chunks=checked.chunks)
