"""The one front door for jobs: every way a job enters (``cuectl submit``, ``cuectl.api``,
``POST /api/v1/jobs``) reads, recognises and loads it here.

- ``read_source``: a spec file, or ``-`` for standard input, read once: at most
  ``MAX_SPEC_BYTES``, UTF-8 (a BOM is fine); ``source_from_text`` for text already in hand
  (a REST body).
- The format: a ``.xml`` file, or text that starts like one, is an OpenCue XML spec
  (sched/opencue_xml.py); anything else is a YAML or JSON job spec (JSON is YAML), which is
  an Open Job Description template when it has ``specificationVersion`` (sched/openjd.py).
  A REST body says its format by its ``Content-Type`` instead (``FORMATS``).
- ``SubmitContext``: who submits, where, with what environment and frame limit, built once
  at the edge (``SubmitContext.here()`` for the CLI and the Python API; the REST server
  builds it from the caller's token and its settings).
- ``SubmitFlags``: the flag form's values (``cuectl submit --gpus 1 ...``), one frozen
  dataclass whose fields are named as spec keys and carry their flag names as metadata;
  the CLI's fast path derives its option tables from it (``FLAG_OPTIONS``). With a spec,
  the flags given override it (job keys always, layer keys when it has one layer).
- ``load``: a source as validated ``JobSpec`` values (an OpenCue spec may hold several
  jobs), with the frame-level waits of an OpenCue spec and the notes about what cannot be
  honoured; ``submit`` puts them in a store.

Heavy modules (the spec validators, PyYAML, the XML parser) are imported inside the
functions: the console script's fast path imports this module to parse flags.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, Sequence

from cuectl.errors import InvalidInput

if TYPE_CHECKING:
    from cuectl.sched.model import JobSpec

STDIN = "-"
STDIN_NAME = "<stdin>"
#: What names a YAML or JSON job spec file (one argument with one of these is a spec, not a command).
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
XML_SUFFIX = ".xml"

#: The formats a source can have: a cuectl job spec (YAML or JSON; an Open Job Description
#: template is recognised once parsed) and an OpenCue XML spec.
SPEC = "spec"
OPENCUE_XML = "opencue-xml"
#: Media types a REST body may have, and the format each means.
FORMATS = {
    "application/json": SPEC,
    "application/yaml": SPEC,
    "application/x-yaml": SPEC,
    "text/yaml": SPEC,
    "text/x-yaml": SPEC,
    "application/xml": OPENCUE_XML,
    "text/xml": OPENCUE_XML,
}


# -- the submit context ------------------------------------------------------------------------
class SubmitContext(NamedTuple):
    """Who submits and from where: the job's user, the most frames a job may have, the
    directory relative paths (``cwd:``, ``--chdir``, a template's PATH values) start from
    and the environment ``export:`` picks from. None: not known (the REST server has no
    directory or environment of the caller's)."""

    user: str | None
    frame_limit: int | None = None
    cwd: str | None = None
    environ: Mapping[str, str] | None = None

    @classmethod
    def here(cls) -> SubmitContext:
        """This process's: ``CUECTL_USER`` (else the login name), ``CUECTL_FRAME_LIMIT``,
        the working directory and environment (as ``cuectl submit`` captures them)."""
        from cuectl import config

        return cls(
            user=config.current_user(),
            frame_limit=config.frame_limit(),
            cwd=config.submit_cwd(),
            environ=config.submit_environ(),
        )


# -- sources -----------------------------------------------------------------------------------
class Source(NamedTuple):
    """A job spec's text, read and checked once. ``name`` starts its errors (a path,
    ``<stdin>``; empty: none, as for a REST body whose errors name the field alone);
    ``given``: what the user typed (a path, ``-``); ``base_dir``: the file's directory (a
    template's relative PATH defaults are joined to it)."""

    text: str
    name: str
    format: str
    given: str = ""
    base_dir: str | None = None


def decode(raw: bytes, name: str) -> str:
    """A spec's bytes as text: at most ``MAX_SPEC_BYTES``, UTF-8 (a BOM is fine)."""
    from cuectl.sched.spec import MAX_SPEC_BYTES

    if len(raw) > MAX_SPEC_BYTES:
        raise InvalidInput(f"{name}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MB; refused")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{name}: not UTF-8 text (bad byte at offset {exc.start})") from None


def read_source(where: str | Any, *, stdin: Any = None) -> Source:
    """The spec at ``where``: a path (``str`` or ``Path``), or ``-`` for standard input
    (``stdin``, default ``sys.stdin``). Never reads more than the cap (``/dev/zero``)."""
    from pathlib import Path

    from cuectl.sched.spec import MAX_SPEC_BYTES

    given = str(where)
    if given == STDIN and not isinstance(where, Path):
        import sys

        stream = stdin if stdin is not None else sys.stdin
        stream = getattr(stream, "buffer", stream)
        raw = stream.read(MAX_SPEC_BYTES + 1)
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        text = decode(raw, STDIN_NAME)
        if not text.strip():
            raise InvalidInput(f"{STDIN_NAME}: empty; pipe a job spec in: cuectl submit - < job.yaml")
        return source_from_text(text, name=STDIN_NAME, given=given)
    try:
        with open(where, "rb") as handle:
            raw = handle.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read job spec {given!r}: {exc.strerror or exc}") from None
    return Source(
        decode(raw, given),
        given,
        OPENCUE_XML if given.lower().endswith(XML_SUFFIX) else SPEC,
        given=given,
        base_dir=str(Path(where).parent),
    )


def source_from_text(
    text: str,
    *,
    name: str,
    format: str | None = None,
    given: str = "",  # noqa: A002
    base_dir: str | None = None,
) -> Source:
    """Text in hand as a source; ``format`` None: told from the text (XML or not)."""
    if format is None:
        from cuectl.sched import opencue_xml

        format = OPENCUE_XML if opencue_xml.looks_like_xml(text) else SPEC  # noqa: A001
    elif format not in (SPEC, OPENCUE_XML):
        raise InvalidInput(f"unknown job spec format {format!r} (known: {SPEC}, {OPENCUE_XML})")
    return Source(text, name, format, given=given or name, base_dir=base_dir)


# -- the flag form -----------------------------------------------------------------------------
JOB, LAYER, EVERY_LAYER = "job", "layer", "every layer"


def _flag(*names: str, level: str, kind: str = "str", key: str | None = None) -> Any:
    """A ``SubmitFlags`` field: ``names`` its options (the first is the one errors name),
    ``level`` what it overrides in a spec (``JOB``, ``LAYER``: a one-layer spec's layer,
    ``EVERY_LAYER``), ``kind`` how its value is read (str, int, float, list, bool), ``key``
    the spec key it sets where it differs from the field's name."""
    return field(default=None, metadata={"flags": names, "level": level, "kind": kind, "key": key})


@dataclass(frozen=True)
class SubmitFlags:
    """The values of ``cuectl submit``'s job flags; None: not given. Fields are named as
    spec keys (docs/job-spec.md) and carry their flag names (``metadata["flags"]``). The
    flag form (``submit [FLAGS] -- COMMAND``) makes its one-layer job of them; with a spec
    they override it (``adjuster``). Layer flags are in the order their errors are told."""

    name: str | None = _flag("--name", level=JOB)
    range: str | None = _flag("--range", level=LAYER)
    chunk: int | None = _flag("--chunk", level=LAYER, kind="int")
    layer: str | None = _flag("--layer", level=LAYER, key="name")
    gpus: int | None = _flag("--gpus", level=LAYER, kind="int")
    gpu_vendor: str | None = _flag("--gpu-vendor", level=LAYER)
    gpu_models: tuple[str, ...] | None = _flag("--gpu-model", level=LAYER, kind="list")
    gpu_memory_min: str | None = _flag("--gpu-memory-min", level=LAYER)
    gpu_capability_min: str | None = _flag("--gpu-capability-min", level=LAYER)
    gpu_driver_min: str | None = _flag("--gpu-driver-min", level=LAYER)
    gpu_cuda_min: str | None = _flag("--gpu-cuda-min", level=LAYER)
    cores: float | None = _flag("--cores", level=LAYER, kind="float")
    memory: str | None = _flag("--memory", level=LAYER)
    priority: int | None = _flag("--priority", level=JOB, kind="int")
    retries: int | None = _flag("--retries", level=LAYER, kind="int")
    timeout: str | None = _flag("--timeout", level=LAYER)
    env: tuple[str, ...] | None = _flag("--env", level=EVERY_LAYER, kind="list")
    tags: tuple[str, ...] | None = _flag("--tag", level=LAYER, kind="list")
    paused: bool | None = _flag("--paused", level=JOB, kind="bool")
    log_limit: str | None = _flag("--log-limit", level=EVERY_LAYER)
    project: str | None = _flag("--project", level=JOB)
    show: str | None = _flag("--show", level=JOB)
    shot: str | None = _flag("--shot", level=JOB)
    service: str | None = _flag("--service", level=LAYER)
    max_running: int | None = _flag("--max-running", level=JOB, kind="int")
    max_cores: float | None = _flag("--max-cores", level=JOB, kind="float")
    max_gpus: int | None = _flag("--max-gpus", level=JOB, kind="int")
    limits: tuple[str, ...] | None = _flag("--limit", level=LAYER, kind="list")
    retry_delay: str | None = _flag("--retry-delay", level=LAYER)
    retry_on_gpu_oom: str | None = _flag("--retry-on-gpu-oom", level=LAYER)
    gpu_escape: str | None = _flag("--gpu-escape", level=LAYER)
    gpu_idle_limit: str | None = _flag("--gpu-idle-limit", level=LAYER)
    gpu_idle_action: str | None = _flag("--gpu-idle-action", level=LAYER)
    gpu_idle_util: float | None = _flag("--gpu-idle-util", level=LAYER, kind="float")
    gpu_share: str | None = _flag("--gpu-share", level=LAYER)
    gpu_share_enforce: str | None = _flag("--gpu-share-enforce", level=LAYER)
    cwd: str | None = _flag("--chdir", "-D", level=JOB)
    export: str | None = _flag("--export", level=JOB)

    def __post_init__(self) -> None:
        for f in FLAG_FIELDS:  # lists as tuples: the flags stay hashable and unchanged
            value = getattr(self, f.name)
            if f.metadata["kind"] == "list" and value is not None and not isinstance(value, tuple):
                object.__setattr__(self, f.name, (value,) if isinstance(value, str) else tuple(value))

    @classmethod
    def from_options(cls, given: Mapping[str, Any]) -> SubmitFlags:
        """The flags of ``{option: value}`` (``{"--gpus": 1, "-D": "/tmp"}``), as a
        command line gives them; an unknown option is a ``KeyError``."""
        return cls(**{FLAG_OPTIONS[option][0]: value for option, value in given.items()})

    def given(self) -> dict[str, Any]:
        """The fields given (not None), in field order."""
        return {f.name: getattr(self, f.name) for f in FLAG_FIELDS if getattr(self, f.name) is not None}

    def job_spec(self, command: Sequence[str] | str, context: SubmitContext, *, name: str | None = None) -> JobSpec:
        """The one-layer job of ``cuectl submit [FLAGS] -- COMMAND``, validated; errors name
        the flag (``--gpus: must be 0 or more``). ``name``: the job's name when ``--name``
        is not given."""
        from cuectl.sched import spec as specs

        keywords: dict[str, Any] = {"name": name, **_flag_keywords(self.given())}
        return specs.spec_from_flags(
            **keywords,
            command=command if isinstance(command, str) else list(command),
            user=context.user,
            frame_limit=context.frame_limit,
            cwd=context.cwd,
            environ=context.environ,
        )

    def adjuster(self) -> Callable[[Any], Any] | None:
        """What applies the flags given to a spec's parsed document (None: no flags that
        change it); ``--log-limit`` is applied to the loaded jobs instead (``load``). The
        flags are checked first as the flag form checks them, so an error names the flag,
        not the spec's key; a layer flag and a spec of several layers is an error naming
        the flag — never silently dropped."""
        flags = {k: v for k, v in self.given().items() if k != "log_limit"}
        if not flags:
            return None
        from cuectl.sched import spec as specs

        checked = {k: v for k, v in flags.items() if k not in ("cwd", "export")}
        if _GPU_FLAGS & set(checked):
            checked.setdefault("gpus", 1)  # the spec's layer may ask for GPUs: only the flags' own values are checked
        trial: dict[str, Any] = {"name": "x", **_flag_keywords(checked)}
        specs.spec_from_flags(command=["true"], **trial)  # errors name the flag
        env = specs.flag_env(flags.get("env") or [])
        job_keys = {_KEYS[k]: v for k, v in flags.items() if _LEVELS[k] == JOB}
        layer_flags = [k for k in flags if _LEVELS[k] == LAYER]

        def adjust(data: Any) -> Any:
            if not isinstance(data, dict):
                return data  # the spec's own error says what is wrong with it
            data = {**data, **job_keys}
            layers = data.get("layers")
            if isinstance(layers, list) and (layer_flags or env):
                if layer_flags and len(layers) != 1:
                    first = layer_flags[0]
                    raise InvalidInput(
                        f"{_OPTIONS[first]}: a layer setting, and the spec has {len(layers)} layers: "
                        f"set {_KEYS[first]}: in the layer it is for",
                        hint="layer flags apply to a spec with one layer",
                    )
                changed = []
                for raw in layers:
                    if isinstance(raw, dict):
                        raw = {**raw, **{_KEYS[k]: _plain(flags[k]) for k in layer_flags}}
                        if env:
                            own = raw.get("env")
                            raw["env"] = {**(own if isinstance(own, dict) else {}), **env}
                    changed.append(raw)
                data["layers"] = changed
            return data

        return adjust


FLAG_FIELDS = tuple(dataclasses.fields(SubmitFlags))
# Flags that only apply to a GPU request: checked alone as if with --gpus 1 (the spec's
# layer may ask for GPUs itself).
_GPU_FLAGS = frozenset(
    {
        "gpu_vendor",
        "gpu_models",
        "gpu_memory_min",
        "gpu_capability_min",
        "gpu_driver_min",
        "gpu_cuda_min",
        "gpu_escape",
        "gpu_idle_limit",
        "gpu_idle_action",
        "gpu_idle_util",
        "gpu_share",
        "gpu_share_enforce",
    }
)
_KEYS = {f.name: f.metadata["key"] or f.name for f in FLAG_FIELDS}
_LEVELS = {f.name: f.metadata["level"] for f in FLAG_FIELDS}
_OPTIONS = {f.name: f.metadata["flags"][0] for f in FLAG_FIELDS}
#: Every option of ``SubmitFlags`` -> (its field, its kind: str, int, float, list or bool).
FLAG_OPTIONS = {name: (f.name, f.metadata["kind"]) for f in FLAG_FIELDS for name in f.metadata["flags"]}
# The console script's fast path (cli/entry.py) parses the flag form with these, so that it
# cannot miss a flag: options taking a value -> field, options taking none -> field, each
# field's kind, and the repeatable fields.
VALUE_OPTIONS = {option: name for option, (name, kind) in FLAG_OPTIONS.items() if kind != "bool"}
SWITCHES = {option: name for option, (name, kind) in FLAG_OPTIONS.items() if kind == "bool"}
FLAG_KINDS = {f.name: str(f.metadata["kind"]) for f in FLAG_FIELDS}
LIST_FLAGS = frozenset(name for name, kind in FLAG_KINDS.items() if kind == "list")
# spec_from_flags' keyword for a field, where the two differ.
_FLAG_KEYWORDS = {"cwd": "chdir"}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _flag_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    return {_FLAG_KEYWORDS.get(k, k): _plain(v) for k, v in values.items()}


# -- loading -----------------------------------------------------------------------------------
class Loaded(NamedTuple):
    """A source's jobs, validated, in submit order (``source``: the source's name); per job the frame-level waits an
    OpenCue spec gives (``opencue_xml.submit_jobs``); the notes about what cannot be
    honoured, each starting with the source's name."""

    jobs: tuple[JobSpec, ...]
    format: str
    source: str
    frame_waits: tuple[tuple[dict[str, Any], ...], ...] = ()
    notes: tuple[str, ...] = ()

    def one(self, hint: str | None = None) -> JobSpec:
        """The job, where the caller takes one; InvalidInput if the source holds several."""
        if len(self.jobs) != 1:
            raise InvalidInput(f"the spec holds {len(self.jobs)} jobs, and one is expected here", hint=hint)
        return self.jobs[0]


def load(
    source: Source,
    context: SubmitContext,
    *,
    flags: SubmitFlags | None = None,
    params: Sequence[str] | Mapping[str, str] = (),
    strict: bool = False,
    warn: Callable[[str], None] | None = None,
) -> Loaded:
    """``source``'s jobs, validated for ``context`` with ``flags`` applied (``--log-limit``
    to every layer that sets none). ``params``: an Open Job Description template's
    parameters (``NAME=VALUE`` items or a mapping); ``strict``: anything that cannot be
    honoured is an error, else a note, given to ``warn`` too as soon as it is known."""
    from cuectl.sched import spec as specs

    flags = flags or SubmitFlags()
    adjust = flags.adjuster()
    if source.format == OPENCUE_XML:
        from cuectl.sched import opencue_xml

        if params:
            raise InvalidInput(
                "--param: only for Open Job Description templates (specificationVersion: jobtemplate-2023-09)",
                hint="an OpenCue spec takes values from its own elements",
            )
        job_specs, frame_waits, found = opencue_xml.import_jobs(
            source.text,
            source=source.name,
            user=context.user or "",
            frame_limit=context.frame_limit,
            cwd=context.cwd,
            environ=context.environ,
            adjust=adjust,
            strict=strict,
        )
        if flags.log_limit is not None:
            job_specs = [specs.with_log_limit(job_spec, flags.log_limit, "--log-limit") for job_spec in job_specs]
        notes = tuple(f"{source.name}: {note}" for note in found)
        if warn is not None:
            for note in notes:
                warn(note)
        return Loaded(tuple(job_specs), OPENCUE_XML, source.name, tuple(tuple(w) for w in frame_waits), notes)
    collected: list[str] = []
    job_spec = specs.load_spec_text(
        source.text,
        source=source.name,
        user=context.user,
        frame_limit=context.frame_limit,
        cwd=context.cwd,
        environ=context.environ,
        adjust=adjust,
        openjd_params=params,
        notes=collected,
        base_dir=source.base_dir,
    )
    if strict and collected:
        raise InvalidInput(
            f"{source.given}: {len(collected)} thing(s) cannot be honoured: " + "; ".join(collected),
            hint="drop --strict to submit anyway (each is a warning then)",
        )
    if warn is not None:
        for note in collected:
            warn(note)
    if flags.log_limit is not None:  # for every layer that does not set its own
        job_spec = specs.with_log_limit(job_spec, flags.log_limit, "--log-limit")
    return Loaded((job_spec,), SPEC, source.name, ((),), tuple(collected))


def load_mapping(
    data: Any, context: SubmitContext, *, params: Sequence[str] | Mapping[str, str] = (), notes: list[str] | None = None
) -> JobSpec:
    """A parsed job spec (a mapping in the YAML schema, or an Open Job Description
    template as a mapping) validated for ``context``; errors name the field alone."""
    from cuectl.sched import openjd
    from cuectl.sched import spec as specs

    if openjd.is_openjd(data):
        data, found = openjd.openjd_to_spec(data, params, cwd=context.cwd)
        if notes is not None:
            notes.extend(found)
    elif params:
        raise InvalidInput(
            "--param: only for Open Job Description templates (specificationVersion: jobtemplate-2023-09)",
            hint="a cuectl spec takes values from its own keys and flags",
        )
    return specs.spec_from_mapping(
        data, user=context.user, frame_limit=context.frame_limit, cwd=context.cwd, environ=context.environ
    )


def submit(store: Any, loaded: Loaded, *, now: float, warn: Callable[[str], None] | None = None) -> list[int]:
    """Put ``loaded``'s jobs in ``store``; their ids, in order. An OpenCue spec's jobs each
    wait on the jobs of the spec they name, and their frame-level waits are added
    (``opencue_xml.submit_jobs``)."""
    if loaded.format == OPENCUE_XML:
        from cuectl.sched import opencue_xml

        return opencue_xml.submit_jobs(
            store, loaded.jobs, loaded.frame_waits, now=now, warn=warn or (lambda _text: None), source=loaded.source
        )
    return [store.submit(job_spec, now=now) for job_spec in loaded.jobs]
