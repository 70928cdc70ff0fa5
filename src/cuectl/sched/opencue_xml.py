"""OpenCue job specs (CJSL XML, as Cuebot reads them and pyoutline writes them) as cuectl specs.

``parse_opencue_xml(text)`` reads a ``<spec>`` document and returns, per ``<job>``, a mapping
in the YAML schema of docs/job-spec.md (``spec_from_mapping`` validates it) and the notes:
one per element whose effect cuectl does not reproduce. Units are OpenCue's (Cuebot's
``JobSpec``): ``<cores>`` in core points unless it has a decimal point (``100`` and ``1.0``
are one core), ``<memory>``/``<gpu_memory>`` a bare number in GB or with ``m``/``g``,
``<gpu_memory>`` the total across the frame's GPUs, ``<timeout>`` in minutes. The mapping
is documented in docs/opencue-xml.md. A ``<layer>`` may also hold cuectl's extension
elements (``EXTENSION_ELEMENTS``): the per-device GPU request CJSL cannot say.

The XML is read with the standard library's expat parser, guarded as defusedxml does: no
``<!ENTITY`` declarations (so no "billion laughs", no external entities), the DOCTYPE's DTD
is never fetched, at most ``MAX_SPEC_BYTES``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from cuectl.errors import InvalidInput

MAX_SPEC_BYTES = 10 * 1024 * 1024
# The CJSL versions Cuebot ships a DTD for (cuebot/src/main/resources/public/dtd/).
CJSL_VERSIONS = ("1.5", "1.6", "1.7", "1.8", "1.9", "1.10", "1.11", "1.12", "1.13", "1.14", "1.15")
# Cuebot's Dispatcher: below 10 core points a layer gets the default, 100 (one core).
CORE_POINTS_MIN = 10
CORE_POINTS_DEFAULT = 100
# Cuebot's FRAME_RETRIES_DEFAULT: retries when <maxretries> is absent.
DEFAULT_RETRIES = 1
KIB_PER_GB = 1024 * 1024  # Cuebot's CueUtil.GB: memory is kept in KiB

_SPEC_CHILDREN = ("facility", "dept", "show", "shot", "user", "email", "uid", "job", "depends")
_JOB_CHILDREN = (
    "paused",
    "priority",
    "maxretries",
    "maxcores",
    "maxgpus",
    "autoeat",
    "localbook",
    "os",
    "env",
    "layers",
)
_LAYER_CHILDREN = (
    "cmd",
    "range",
    "chunk",
    "cores",
    "threadable",
    "memory",
    "gpus",
    "gpu",
    "gpu_memory",
    "timeout",
    "timeout_llu",
    "tags",
    "limits",
    "env",
    "services",
    "outputs",
)
# cuectl's extension of the spec (docs/opencue-xml.md, "cuectl's extension elements"): a
# layer's per-device GPU request as a YAML spec has it, which no CJSL version can say.
EXTENSION_ELEMENTS = ("gpu_vendor", "gpu_models_allowed", "min_gpu_memory_bytes", "retry_on_gpu_oom")
_LAYER_TYPES = ("RENDER", "UTIL", "POST")
_PROJECT_RE = re.compile(r"[A-Za-z0-9_.-]{1,100}", re.ASCII)
_TRUE = ("true", "1", "yes", "y", "on", "t")
_FALSE = ("false", "0", "no", "n", "off", "f", "none", "")


@dataclass(frozen=True)
class Note:
    """An element of the spec that cuectl does not honour (``job`` None: the spec's own)."""

    job: str | None
    element: str
    why: str

    def __str__(self) -> str:
        where = f"{self.job}: " if self.job else ""
        return f"{where}{self.element}: not honoured: {self.why}"


def looks_like_xml(text: str) -> bool:
    """Whether spec text read from standard input is an OpenCue XML spec."""
    head = text.lstrip("\ufeff \t\r\n")[:200]
    return head.startswith("<?xml") or head.startswith("<spec") or head.startswith("<!DOCTYPE spec")


# --------------------------------------------------------------------------------------
# Safe parsing


class _Refused(Exception):
    pass


def _parse(text: str, source: str) -> Any:
    import xml.etree.ElementTree as ET

    if len(text) > MAX_SPEC_BYTES:
        raise InvalidInput(f"{source}: larger than {MAX_SPEC_BYTES // (1024 * 1024)} MB; refused")
    if "<!ENTITY" in text:
        raise InvalidInput(
            f"{source}: XML entity declarations (<!ENTITY) are refused (entity expansion is how "
            "'billion laughs' and external-entity attacks work; an OpenCue spec needs none)"
        )
    from xml.parsers import expat as pyexpat

    builder = ET.TreeBuilder()
    expat = pyexpat.ParserCreate()  # no namespace processing; the DTD is never read

    def refuse(*_args: Any) -> None:
        raise _Refused("XML entity declarations are refused")

    def no_external(*_args: Any) -> int:
        raise _Refused("external entities are refused")

    expat.EntityDeclHandler = refuse
    expat.UnparsedEntityDeclHandler = refuse
    expat.ExternalEntityRefHandler = no_external
    expat.StartElementHandler = builder.start
    expat.EndElementHandler = lambda tag: builder.end(tag)
    expat.CharacterDataHandler = builder.data
    expat.buffer_text = True
    try:
        expat.Parse(text, True)
        return builder.close()
    except _Refused as exc:
        raise InvalidInput(f"{source}: {exc}") from None
    except pyexpat.ExpatError as exc:
        detail = pyexpat.ErrorString(exc.code) if exc.code else str(exc)
        raise InvalidInput(f"{source}: invalid XML at line {exc.lineno}, column {exc.offset + 1}: {detail}") from None
    except RecursionError:
        raise InvalidInput(f"{source}: invalid XML: nested too deeply") from None


def _doctype_version(text: str) -> str | None:
    match = re.search(r"<!DOCTYPE\s+spec\b[^>]*?cjsl-([^\"'>]*?)\.dtd", text[:4096])
    return match.group(1) if match else None


# --------------------------------------------------------------------------------------
# Values in Cuebot's units


def _text(element: Any) -> str:
    return " ".join((element.text or "").split()) if element is not None else ""


def _bool(value: str, label: str) -> bool:
    low = value.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise InvalidInput(f"{label}: expected True or False, got {value!r}")


def _int(value: str, label: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InvalidInput(f"{label}: expected a whole number, got {value!r}") from None


def core_points(value: str, label: str) -> int:
    """Cuebot's reading of ``<cores>``: with a decimal point, cores (``1.5`` → 150 points);
    without, core points (``100`` → one core). 1-9 points become the default, 100."""
    text = value.strip()
    try:
        if "." in text:
            number = float(text)
            points = int(number * 100 - 0.5) if "-" in text else int(number * 100 + 0.5)
        else:
            points = int(text)
    except (ValueError, OverflowError):
        raise InvalidInput(f"{label}: expected cores like 100 (core points) or 1.0 (cores), got {value!r}") from None
    if 0 < points < CORE_POINTS_MIN:
        points = CORE_POINTS_DEFAULT
    return points


def memory_kib(value: str, label: str) -> int:
    """Cuebot's ``convertMemoryInput``: ``512m`` MB, ``2g``/``2gb`` GB, a bare number GB
    (binary units: Cuebot multiplies by 1024), in KiB."""
    text = value.strip().lower()
    try:
        if "m" in text:
            kib = float(text[: text.rindex("m")]) * 1024
        elif "g" in text:
            kib = float(text[: text.rindex("g")]) * KIB_PER_GB
        else:
            kib = float(text) * KIB_PER_GB
    except ValueError:
        raise InvalidInput(f"{label}: expected a size like 4 (GB), 4g or 512m, got {value!r}") from None
    if not math.isfinite(kib) or kib < 0:
        raise InvalidInput(f"{label}: must be 0 or more, got {value!r}")
    return int(kib)


def conform_name(name: str) -> str:
    """Cuebot's layer-name form, for matching ``<depend>`` names: lower case, ``-`` → ``_``."""
    return name.strip().lower().replace("-", "_")


def _job_key(name: str, prefix: str) -> str:
    """Cuebot's ``conformJobName`` suffix: a job is found by its name with or without the
    ``show-shot-user_`` prefix, in any case."""
    text = name.strip()
    if prefix and text.startswith(prefix):
        text = text[len(prefix) :]
    text = re.sub(r"_{2,}", "_", text.lower()).replace("-", "_")
    return text.lstrip("_")


# --------------------------------------------------------------------------------------
# The spec


def parse_opencue_xml(
    text: str, *, source: str = "<job spec>", submitter: str | None = None
) -> list[tuple[dict[str, Any], list[Note]]]:
    """Each ``<job>`` of an OpenCue spec as (cuectl spec mapping, notes). Spec-level notes
    (``<facility>``, cross-job ``<depend>``s, ...) come with the first job. ``submitter``:
    who submits (a different ``<user>`` is noted: the job runs as the submitter)."""
    root = _parse(text, source)
    if root.tag != "spec":
        raise InvalidInput(f"{source}: not an OpenCue job spec (the root element is <{root.tag}>, expected <spec>)")
    spec_notes: list[Note] = []
    version = _doctype_version(text)
    if version is not None and version not in CJSL_VERSIONS:
        spec_notes.append(
            Note(
                None,
                "DOCTYPE",
                f"cjsl-{version}.dtd is not a CJSL version Cuebot accepts "
                f"({CJSL_VERSIONS[0]} to {CJSL_VERSIONS[-1]}); read as "
                f"{CJSL_VERSIONS[-1]}",
            )
        )
    for child in root:
        if child.tag not in _SPEC_CHILDREN:
            spec_notes.append(Note(None, f"<{child.tag}>", "not an element of any CJSL version"))
    show, shot, user = _text(root.find("show")), _text(root.find("shot")), _text(root.find("user"))
    for tag, why in (
        ("facility", "cuectl has one farm, with no facilities"),
        ("dept", "cuectl has no departments"),
        ("email", "cuectl does not mail the job's owner; use notify: with email in a YAML spec or --notify-email"),
    ):
        if _text(root.find(tag)):
            spec_notes.append(Note(None, f"<{tag}>", why))
    if user and submitter is not None and user != submitter:
        spec_notes.append(
            Note(
                None,
                "<user>",
                f"the job runs as {submitter}, who submits it, not as {user} "
                "(cuectl takes a job's user from who submits)",
            )
        )
    # The show is the job's show (CUE_SHOW) and, as before shows existed, its project
    # (quotas, reports); the shot is its shot (CUE_SHOT).
    labels: dict[str, str] = {}
    for tag, value, targets in (("show", show, ("project", "show")), ("shot", shot, ("shot",))):
        if not value:
            continue
        if _PROJECT_RE.fullmatch(value) and value.strip("-."):
            labels.update({key: value for key in targets})
        else:
            spec_notes.append(
                Note(None, f"<{tag}>", f"{value!r} is not a usable {tag} name (1-100 of A-Z a-z 0-9 _ . -)")
            )
    project = labels.get("project")
    prefix = f"{show}-{shot}-{user}_" if show or shot or user else ""
    jobs = root.findall("job")
    if not jobs:
        raise InvalidInput(f"{source}: the spec has no <job>")
    built: list[tuple[dict[str, Any], list[Note]]] = []
    keys: dict[str, int] = {}
    for index, job in enumerate(jobs):
        mapping, notes = _job(job, f"{source}: job[{index}]", project)
        mapping.update({key: labels[key] for key in ("show", "shot") if key in labels})
        built.append((mapping, notes))
        keys.setdefault(_job_key(mapping["name"], prefix), index)
    spec_notes.extend(_depends(root, built, keys, prefix, source))
    built[0][1][:0] = spec_notes
    return built


def _job(job: Any, label: str, project: str | None) -> tuple[dict[str, Any], list[Note]]:
    name = (job.get("name") or "").strip()
    if not name:
        raise InvalidInput(f"{label}: <job> needs a name attribute")
    label = f"{label} ({name})"
    notes: list[Note] = []

    def note(element: str, why: str) -> None:
        notes.append(Note(name, element, why))

    mapping: dict[str, Any] = {"name": name}
    if project:
        mapping["project"] = project
    for child in job:
        if child.tag not in _JOB_CHILDREN:
            note(f"<{child.tag}>", "not an element of any CJSL version")
    if job.find("paused") is not None:
        mapping["paused"] = _bool(_text(job.find("paused")), f"{label}: <paused>")
    priority = _text(job.find("priority"))
    if priority and priority.lower() != "none":
        mapping["priority"] = _int(priority, f"{label}: <priority>")
    retries = DEFAULT_RETRIES
    maxretries = _text(job.find("maxretries"))
    if maxretries and maxretries.lower() != "none":
        retries = max(0, _int(maxretries, f"{label}: <maxretries>"))
    maxcores = _text(job.find("maxcores"))
    if maxcores:
        mapping["max_cores"] = _int(maxcores, f"{label}: <maxcores>")
    maxgpus = _text(job.find("maxgpus"))
    if maxgpus:
        mapping["max_gpus"] = _int(maxgpus, f"{label}: <maxgpus>")
    if job.find("autoeat") is not None and _bool(_text(job.find("autoeat")), f"{label}: <autoeat>"):
        note("<autoeat>", "cuectl retries a failed frame and then leaves it DEAD; it does not eat it")
    if job.find("localbook") is not None:
        note("<localbook>", "cuectl has no local booking; the job runs on the farm's workers")
    if _text(job.find("os")):
        note("<os>", "cuectl does not match hosts by operating system")
    env = _env(job.findall("env"), note)
    if env:
        mapping["env"] = env
    layer_elements = [el for layers in job.findall("layers") for el in layers.findall("layer")]
    if not layer_elements:
        raise InvalidInput(f"{label}: the job has no <layer>")
    layers: list[dict[str, Any]] = []
    post: list[str] = []
    for index, element in enumerate(layer_elements):
        layer, kind = _layer(element, f"{label}: layer[{index}]", note)
        layer["retries"] = retries
        layers.append(layer)
        if kind == "POST":
            post.append(layer["name"])
    # A Post layer runs once every other layer is done (Cuebot puts it in a post job that
    # waits for the job): here, a layer-on-layer dependency on each non-Post layer.
    for layer in layers:
        if layer["name"] in post:
            layer["depends"] = [
                {"layer": other["name"], "type": "layer"} for other in layers if other["name"] not in post
            ]
    mapping["layers"] = layers
    return mapping, notes


def _env(elements: Iterable[Any], note: Any) -> dict[str, str]:
    env: dict[str, str] = {}
    for element in elements:
        for key in element:
            if key.tag != "key":
                note(f"<env><{key.tag}>", "only <key name=...> entries are environment variables")
                continue
            name = key.get("name")
            if name is None:
                note("<env><key>", "an entry without a name is skipped (as Cuebot does)")
                continue
            env[name] = (key.text or "").strip()
    return env


def _layer(element: Any, label: str, job_note: Any) -> tuple[dict[str, Any], str]:
    name = (element.get("name") or "").strip()
    if not name:
        raise InvalidInput(f"{label}: <layer> needs a name attribute")
    label = f"{label} ({name})"

    def note(what: str, why: str) -> None:
        job_note(f"layer {name}: {what}", why)

    kind = (element.get("type") or "").strip().upper()
    if kind not in _LAYER_TYPES:
        raise InvalidInput(f"{label}: type must be Render, Util or Post, got {element.get('type')!r}")
    for child in element:
        if child.tag not in _LAYER_CHILDREN and child.tag not in EXTENSION_ELEMENTS + VERSION_ELEMENTS:
            note(f"<{child.tag}>", "not an element of any CJSL version")
    cmd = (element.find("cmd").text or "").strip() if element.find("cmd") is not None else ""
    if not cmd:
        raise InvalidInput(f"{label}: <cmd> is required")
    frame_range = _text(element.find("range")).replace(" ", "")
    if not frame_range:
        raise InvalidInput(f"{label}: <range> is required")
    layer: dict[str, Any] = {"name": name, "command": cmd, "range": frame_range}
    chunk = _text(element.find("chunk"))
    layer["chunk"] = _int(chunk, f"{label}: <chunk>") if chunk else 1
    cores = _text(element.find("cores"))
    if cores:
        points = core_points(cores, f"{label}: <cores>")
        if points <= 0:
            what = "the whole host" if points == 0 else f"all but {-points / 100:g} of the host's cores"
            note("<cores>", f"{cores} asks for {what}; cuectl reserves a fixed number of cores (1 here)")
        else:
            layer["cores"] = points / 100
    if _text(element.find("threadable")) and _bool(_text(element.find("threadable")), f"{label}: <threadable>"):
        note("<threadable>", "cuectl gives a frame exactly the cores it reserves, never more")
    memory = _text(element.find("memory"))
    if memory:
        layer["memory"] = f"{memory_kib(memory, f'{label}: <memory>')}K"
    gpus_text = _text(element.find("gpus"))
    gpus = _int(gpus_text, f"{label}: <gpus>") if gpus_text else 0
    if gpus:
        layer["gpus"] = gpus
    gpu_memory, tag = _text(element.find("gpu_memory")), "<gpu_memory>"
    if not gpu_memory and _text(element.find("gpu")):
        gpu_memory, tag = _text(element.find("gpu")), "<gpu>"  # deprecated spelling (CJSL 1.10)
    if gpu_memory:
        total = memory_kib(gpu_memory, f"{label}: {tag}")
        if gpus <= 0:
            if total:
                note(tag, "the layer asks for no <gpus>, so there is no device to need memory")
        elif total:
            # OpenCue's figure is the frame's total across its GPUs; cuectl's is per device.
            layer["gpu_memory_min"] = f"{-(-total // gpus)}K"
    _gpu_extension(element, layer, gpus, label)
    retry_on_gpu_oom = _text(element.find("retry_on_gpu_oom"))
    if retry_on_gpu_oom:  # validated with the layer, as the YAML key (same or bigger)
        layer["retry_on_gpu_oom"] = retry_on_gpu_oom
    timeout = _text(element.find("timeout"))
    if timeout:
        minutes = _int(timeout, f"{label}: <timeout>")
        if minutes > 0:
            layer["timeout"] = f"{minutes}m"
    llu = _text(element.find("timeout_llu"))
    if llu and _int(llu, f"{label}: <timeout_llu>") > 0:
        note("<timeout_llu>", "cuectl does not kill a frame whose log stops growing")
    tags = [t for t in _text(element.find("tags")).replace(" ", "").split("|") if t]
    if tags:  # any of them, as in OpenCue: cuectl's "a | b" entry (docs/job-spec.md)
        layer["tags"] = [" | ".join(tags)]
    limits = [_text(limit) for lim in element.findall("limits") for limit in lim.findall("limit")]
    limits = [limit for limit in limits if limit]
    if limits:
        layer["limits"] = list(dict.fromkeys(limits))
    env = _env(element.findall("env"), note)
    if env:
        layer["env"] = env
    # Cuebot's rule: the first service the farm has gives the layer's defaults, else the
    # default service; a list `service:` is that rule (docs/opencue-xml.md). Only `default`
    # (or none) is what a layer without `service:` gets anyway.
    services = [_text(s) for el in element.findall("services") for s in el.findall("service")]
    services = [s for s in dict.fromkeys(services) if s]
    if services and services != ["default"]:
        bad = [s for s in services if not (_PROJECT_RE.fullmatch(s) and s.strip("-."))]
        if bad:
            note(
                "<services>",
                f"{', '.join(map(repr, bad))}: not a usable service name (1-100 of A-Z a-z 0-9 _ . -); skipped",
            )
        kept = [s for s in services if s not in bad]
        if kept:
            layer["service"] = kept
    outputs = [o for el in element.findall("outputs") for o in el.findall("output")]
    if outputs:
        note("<outputs>", "cuectl does not register output paths")
    return layer, kind


# cuectl's extension elements for a layer's per-device version minimums: the YAML keys of
# the same names (<gpu_capability_min>8.9</gpu_capability_min>).
VERSION_ELEMENTS = ("gpu_capability_min", "gpu_driver_min", "gpu_cuda_min")


def _gpu_extension(element: Any, layer: dict[str, Any], gpus: int, label: str) -> None:
    """cuectl's extension elements of ``<layer>`` into the layer's ``gpu_vendor``,
    ``gpu_models``, ``gpu_memory_min`` and version minimums, validated as a YAML spec's keys are (the same
    rules and messages, each naming its element). An empty element, or a minimum of 0, is
    the same as none: a spec writer may emit every element whatever the layer asks."""
    from cuectl.sched.gpu_request import GpuRequest

    vendor = _text(element.find("gpu_vendor")) or None
    models_element = element.find("gpu_models_allowed")
    if models_element is not None and len(models_element):
        raise InvalidInput(
            f"{label}: <gpu_models_allowed>: expected model names separated by commas "
            f"(A100, RTX 4090), not child elements (<{models_element[0].tag}>)"
        )
    models = [m.strip() for m in _text(models_element).split(",") if m.strip()] or None
    memory_text = _text(element.find("min_gpu_memory_bytes"))
    memory = _int(memory_text, f"{label}: <min_gpu_memory_bytes>") if memory_text else 0
    if memory < 0:
        raise InvalidInput(f"{label}: <min_gpu_memory_bytes>: must be 0 or more, got {memory_text!r}")
    versions = {key: _text(element.find(key)) or None for key in VERSION_ELEMENTS}
    if vendor is None and models is None and not memory and not any(versions.values()):
        return
    elements = {
        "gpu_vendor": "<gpu_vendor>",
        "gpu_models": "<gpu_models_allowed>",
        "gpu_memory_min": "<min_gpu_memory_bytes>",
        **{key: f"<{key}>" for key in VERSION_ELEMENTS},
    }
    # The field at fault leads the message with the layer's label; <gpus> is named within it.
    request = GpuRequest.parse(
        gpus=gpus,
        gpu_vendor=vendor,
        gpu_models=models,
        gpu_memory_min=memory or None,
        **versions,
        label=lambda field: f"{label}: {elements[field]}" if field in elements else f"<{field}>",
    )
    if request.gpu_vendor is not None:
        layer["gpu_vendor"] = request.gpu_vendor
    if request.gpu_models:
        layer["gpu_models"] = list(request.gpu_models)
    for key in VERSION_ELEMENTS:
        if getattr(request, key) is not None:
            layer[key] = getattr(request, key)
    if request.gpu_memory_min_bytes:
        # With <gpu_memory> too, a device must meet both: the larger minimum per device.
        from cuectl.units import parse_size

        total_share = parse_size(layer["gpu_memory_min"]) if "gpu_memory_min" in layer else 0
        if request.gpu_memory_min_bytes > total_share:
            layer["gpu_memory_min"] = f"{request.gpu_memory_min_bytes}B"


# Cuebot's DependType names (spaces, underscores and case aside): who waits, on what, and how
# a layer waits on a layer (model.DependType).
_DEPEND_TYPES = {
    "JOBONJOB": ("job", "job", "layer"),
    "JOBONLAYER": ("job", "layer", "layer"),
    "JOBONFRAME": ("job", "frame", "layer"),
    "LAYERONJOB": ("layer", "job", "layer"),
    "LAYERONLAYER": ("layer", "layer", "layer"),
    "LAYERONFRAME": ("layer", "frame", "layer"),
    "LAYERONSIMFRAME": ("layer", "frame", "layer"),
    "FRAMEBYFRAME": ("layer", "layer", "frame"),
    "PREVIOUSFRAME": ("layer", "layer", "previous"),
    "FRAMEONJOB": ("frame", "job", "layer"),
    "FRAMEONLAYER": ("frame", "layer", "layer"),
    "FRAMEONFRAME": ("frame", "frame", "layer"),
}
_FRAME_NAME_RE = re.compile(r"(-?\d+)(?:-(.+))?")


def _frame_ref(text: str | None, layer: str | None, label: str) -> tuple[int | None, str | None]:
    """A ``<depframe>``/``<onframe>``: Cuebot's frame name ``0001-render`` (which names its
    layer) or a bare number of ``layer``."""
    if not text:
        return None, layer
    match = _FRAME_NAME_RE.fullmatch(text.strip())
    if match is None:
        raise InvalidInput(f"{label}: {text!r} is not a frame name like 0001-render")
    return int(match.group(1)), match.group(2) or layer


def _depends(
    root: Any, built: list[tuple[dict[str, Any], list[Note]]], keys: dict[str, int], prefix: str, source: str
) -> list[Note]:
    """``<depends>``: every type Cuebot has becomes a ``depends`` entry of the waiting job
    (job-on-*) or layer, naming the other job of the spec (``job``: its name; the submit
    swaps in its id, see ``order_jobs``) when it is not the same job. Frame-on-* types (a
    single frame waits) have no key in a spec: they go under ``FRAME_DEPENDS`` of the
    waiting job's mapping, which ``take_frame_depends`` hands to ``submit_jobs``."""
    notes: list[Note] = []
    for depends in root.findall("depends"):
        for index, dep in enumerate(depends.findall("depend")):
            label = f"{source}: depends[{index}]"
            kind = re.sub(r"[\s_-]", "", (dep.get("type") or "").upper())
            depjob, onjob = _text(dep.find("depjob")), _text(dep.find("onjob"))
            deplayer, onlayer = _text(dep.find("deplayer")), _text(dep.find("onlayer"))
            what = f"<depend type={dep.get('type')!r}> {depjob}/{deplayer or '*'} on {onjob}/{onlayer or '*'}"
            if not depjob or not onjob:
                raise InvalidInput(f"{label}: <depend> needs <depjob> and <onjob>")
            if kind not in _DEPEND_TYPES:
                notes.append(Note(None, what, f"{dep.get('type')!r} is not a Cuebot dependency type"))
                continue
            waiter, target, how = _DEPEND_TYPES[kind]
            er, on = keys.get(_job_key(depjob, prefix)), keys.get(_job_key(onjob, prefix))
            if er is None or on is None:
                missing = depjob if er is None else onjob
                notes.append(Note(None, what, f"no job {missing!r} in this spec"))
                continue
            mapping, target_job = built[er][0], built[on][0]
            if waiter == "frame":
                mapping.setdefault(FRAME_DEPENDS, []).append(
                    _frame_wait(dep, kind, deplayer, onlayer, mapping, target_job, same_job=er == on, label=label)
                )
                continue
            _, er_layer = _frame_ref(_text(dep.find("depframe")), deplayer, f"{label}: <depframe>")
            on_frame, on_layer = _frame_ref(_text(dep.find("onframe")), onlayer, f"{label}: <onframe>")
            entry: dict[str, Any] = {} if er == on else {"job": target_job["name"]}
            if target != "job":
                if not on_layer:
                    raise InvalidInput(f"{label}: {dep.get('type')} needs <onlayer> (or an <onframe> naming it)")
                by_name = {conform_name(layer["name"]): layer["name"] for layer in target_job["layers"]}
                if conform_name(on_layer) not in by_name:
                    raise InvalidInput(f"{label}: no layer {on_layer!r} in job {target_job['name']!r}")
                entry["layer"] = by_name[conform_name(on_layer)]
                if target == "frame":
                    if on_frame is None:
                        raise InvalidInput(f"{label}: {dep.get('type')} needs <onframe>")
                    entry["frame"] = on_frame
                elif how != "layer":
                    entry["type"] = how
                elif _bool(dep.get("anyframe") or "false", f"{label}: anyframe"):
                    entry["type"] = "any"
            if waiter == "job":
                if er == on:
                    notes.append(Note(mapping["name"], what, "a job cannot wait on itself"))
                    continue
                entries = mapping.setdefault("depends", [])
            else:
                by_name = {conform_name(layer["name"]): layer for layer in mapping["layers"]}
                layer = by_name.get(conform_name(er_layer or ""))
                if layer is None:
                    raise InvalidInput(f"{label}: no layer {er_layer!r} in job {mapping['name']!r}")
                entries = layer.setdefault("depends", [])
            key = (entry.get("job"), entry.get("layer"), entry.get("frame"))
            same = [d for d in entries if (d.get("job"), d.get("layer"), d.get("frame")) == key]
            if same:
                if same[0].get("type") in ("any", "frame", "previous") and how == "layer" and "type" not in entry:
                    same[0]["type"] = "layer"  # the stricter of the two
                continue
            entries.append(entry)
    return notes


#: The key of a job's mapping (from ``parse_opencue_xml``) under which its frames' own
#: waits (FRAME_ON_JOB, FRAME_ON_LAYER, FRAME_ON_FRAME) travel to ``submit_jobs``: no job
#: spec key holds a single frame's wait, so ``take_frame_depends`` removes it first.
FRAME_DEPENDS = "opencue_frame_depends"


def _frame_wait(
    dep: Any,
    kind: str,
    deplayer: str | None,
    onlayer: str | None,
    mapping: dict[str, Any],
    target_job: dict[str, Any],
    *,
    same_job: bool,
    label: str,
) -> dict[str, Any]:
    """One frame-on-* ``<depend>`` as ``Store.add_depend``'s arguments (jobs by name)."""
    er_frame, er_layer = _frame_ref(_text(dep.find("depframe")), deplayer, f"{label}: <depframe>")
    on_frame, on_layer = _frame_ref(_text(dep.find("onframe")), onlayer, f"{label}: <onframe>")
    if er_frame is None or not er_layer:
        raise InvalidInput(
            f"{label}: {dep.get('type')} needs <depframe> (a frame name like 0001-render, or a number with <deplayer>)"
        )

    def layer_of(job: dict[str, Any], name: str, frame: int | None = None) -> str:
        """The layer's name as the spec writes it; with ``frame``, a frame of its range.
        Checked here, before anything is submitted: the store would refuse it only after
        the spec's jobs were in (bad input changes nothing)."""
        from cuectl.sched.frameset import parse_frameset

        by_name = {conform_name(layer["name"]): layer for layer in job["layers"]}
        layer = by_name.get(conform_name(name))
        if layer is None:
            raise InvalidInput(f"{label}: no layer {name!r} in job {job['name']!r}")
        if frame is not None and frame not in set(parse_frameset(str(layer.get("range") or "1"))):
            raise InvalidInput(
                f"{label}: layer {layer['name']!r} of job {job['name']!r} has no frame {frame} "
                f"(its range is {layer.get('range') or '1'})"
            )
        return str(layer["name"])

    if kind == "FRAMEONJOB" and same_job:
        raise InvalidInput(f"{label}: a frame of job {mapping['name']!r} waiting on its own job would never run")

    wait: dict[str, Any] = {
        "type": {"FRAMEONJOB": "frame-on-job", "FRAMEONLAYER": "frame-on-layer", "FRAMEONFRAME": "frame-on-frame"}[
            kind
        ],
        "layer": layer_of(mapping, er_layer, er_frame),
        "frame": er_frame,
        "on_job": None if same_job else target_job["name"],
        "on_layer": None,
        "on_frame": None,
    }
    if kind != "FRAMEONJOB":
        if not on_layer:
            raise InvalidInput(f"{label}: {dep.get('type')} needs <onlayer> (or an <onframe> naming it)")
        wait["on_layer"] = layer_of(target_job, on_layer)
    if kind == "FRAMEONFRAME":
        if on_frame is None:
            raise InvalidInput(f"{label}: {dep.get('type')} needs <onframe>")
        layer_of(target_job, wait["on_layer"], on_frame)
        wait["on_frame"] = on_frame
    return wait


def take_frame_depends(mapping: dict[str, Any]) -> list[dict[str, Any]]:
    """Remove and return the frame-level waits ``parse_opencue_xml`` put in ``mapping``."""
    return list(mapping.pop(FRAME_DEPENDS, None) or [])


def submit_jobs(
    store: Any,
    job_specs: Sequence[Any],
    frame_waits: Sequence[Sequence[Mapping[str, Any]]],
    *,
    now: float,
    warn: Callable[[str], None],
    source: str,
) -> list[int]:
    """Submit an OpenCue spec's jobs (in ``order_jobs`` order), each waiting on the jobs of
    this spec it names by id (not any older job of that name), and then make their frames
    wait as their frame-on-* ``<depend>``s say, through ``Store.add_depend`` (what `cuectl
    job depend` calls). A job with such waits is submitted paused and resumed once they are
    in (unless the spec paused it), so none of its frames can start before its wait exists."""
    from dataclasses import replace

    from cuectl.sched import model as m

    ids: list[int] = []
    by_name: dict[str, str] = {}  # a job of this spec that others wait on -> its id
    held: list[int] = []  # jobs paused here until their frames' waits are in
    try:
        for job_spec, waits in zip(job_specs, frame_waits, strict=True):
            hold = bool(waits) and not job_spec.paused
            spec = replace(job_spec, paused=True) if hold else job_spec
            ids.append(store.submit(m.with_job_ids(spec, by_name), now=now))
            by_name.setdefault(job_spec.name, str(ids[-1]))
            if hold:
                held.append(ids[-1])
        for job_id, waits in zip(ids, frame_waits):
            for w in waits:
                on_job = by_name.get(w["on_job"], w["on_job"]) if w["on_job"] is not None else job_id
                store.add_depend(
                    job_id,
                    layer=w["layer"],
                    frame=w["frame"],
                    on_job=on_job,
                    on_layer=w["on_layer"],
                    on_frame=w["on_frame"],
                    kind=w["type"],
                    now=now,
                )
        for job_id in held:
            store.set_job_paused(job_id, False)
    except Exception:
        if ids:
            left = f"; still paused (resume with `cuectl job resume`): {', '.join(map(str, held))}" if held else ""
            warn(
                f"{source}: submitted {len(ids)} of {len(job_specs)} jobs before this error: "
                + ", ".join(str(i) for i in ids)
                + left
            )
        raise
    return ids


def order_jobs(jobs: Sequence[tuple[dict[str, Any], list[Note]]], source: str) -> list[int]:
    """The order to submit a spec's jobs in: each after the jobs it waits on (so that the
    submit can name them by id). A cycle between jobs is an error."""
    names = {mapping["name"]: i for i, (mapping, _) in enumerate(jobs)}
    needs: dict[int, set[int]] = {}
    for i, (mapping, _) in enumerate(jobs):
        refs = [d.get("job") for d in mapping.get("depends", [])] + [
            d.get("job") for layer in mapping["layers"] for d in layer.get("depends", [])
        ]
        needs[i] = {names[r] for r in refs if r in names and names[r] != i}
    order: list[int] = []
    while len(order) < len(jobs):
        ready = [i for i in range(len(jobs)) if i not in order and needs[i] <= set(order)]
        if not ready:
            stuck = [jobs[i][0]["name"] for i in range(len(jobs)) if i not in order]
            raise InvalidInput(f"{source}: the jobs {', '.join(map(repr, stuck))} wait on each other in a cycle")
        order.append(ready[0])
    return order


def strict_error(source: str, notes: Iterable[Note]) -> InvalidInput:
    """``--strict``: the notes as one error (nothing is submitted)."""
    lines = [str(n) for n in notes]
    return InvalidInput(
        f"{source}: {len(lines)} element(s) cannot be honoured: " + "; ".join(lines),
        hint="drop --strict to submit anyway (each is a warning then)",
    )


def spec_user(text: str, source: str = "<job spec>") -> str:
    """The ``<user>`` an OpenCue spec names ("" for none)."""
    return _text(_parse(text, source).find("user"))


def import_jobs(
    text: str,
    *,
    source: str,
    user: str,
    frame_limit: int | None,
    cwd: str | None = None,
    environ: Mapping[str, str] | None = None,
    adjust: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    strict: bool = False,
) -> tuple[list[Any], list[list[dict[str, Any]]], list[Note]]:
    """An OpenCue spec as cuectl job specs, validated, in submit order (``order_jobs``),
    with each job's frame-level waits (for ``submit_jobs``) and the notes of what cannot be
    honoured. ``adjust``: a change to each job's mapping before validation (CLI flags);
    ``strict``: any note is an error, raised before anything is validated."""
    from cuectl.sched import spec as specs

    imported = parse_opencue_xml(text, source=source, submitter=user)
    notes = [note for _, job_notes in imported for note in job_notes]
    imported = [imported[i] for i in order_jobs(imported, source)]  # each after those it waits on
    if strict and notes:
        raise strict_error(source, notes)
    job_specs, frame_waits = [], []
    for mapping, _ in imported:
        frame_waits.append(take_frame_depends(mapping))  # added after submit (submit_jobs)
        if adjust is not None:
            mapping = adjust(mapping)
        try:
            job_specs.append(
                specs.spec_from_mapping(mapping, user=user, frame_limit=frame_limit, cwd=cwd, environ=environ)
            )
        except InvalidInput as exc:
            raise InvalidInput(f"{source}: job {mapping.get('name')!r}: {exc.message}", hint=exc.hint) from None
    return job_specs, frame_waits, notes


def import_and_submit(
    store: Any,
    text: str,
    *,
    source: str,
    user: str,
    now: float,
    frame_limit: int | None = None,
    warn: Callable[[str], None],
) -> list[int]:
    """Validate every job of an OpenCue spec, then submit them (``submit_jobs``) as
    ``user``; each note goes to ``warn`` first. Returns the ids, in submit order."""
    job_specs, frame_waits, notes = import_jobs(text, source=source, user=user, frame_limit=frame_limit)
    for note in notes:
        warn(f"{source}: {note}")
    return submit_jobs(store, job_specs, frame_waits, now=now, warn=warn, source=source)
