"""Services: OpenCue's named resource defaults (``cuectl admin service``, docs/scheduling.md).

A service (``render``, ``nuke``, ``cuda``) gives defaults for a layer's cores, memory, GPU
count, GPU memory per device, version minimums per device, tags and timeout. A layer names one with ``service:`` (or
``--service``); each of those fields the layer does not set itself takes the service's
value when the job is submitted. A layer without ``service:`` takes the ``default``
service's values, if an admin created one (Cuebot applies its default service the same
way). A field the service leaves empty (NULL) gives nothing: the layer keeps cuectl's default.

The store applies services inside the submit transaction (``apply``, with the rows of
``services`` read there), so the CLI, the Python API and the REST API get the same jobs.
Values are checked with the job spec's own validators (sched/checks.py), so a service can hold only what a
layer could ask for itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterable, Mapping

from cuectl.errors import InvalidInput
from cuectl.sched.model import JobSpec, LayerSpec

# The LayerSpec fields a service fills, in the order of the services table's columns.
FIELDS = (
    "cores",
    "memory_bytes",
    "gpus",
    "gpu_memory_min_bytes",
    "tags",
    "timeout_s",
    "gpu_capability_min",
    "gpu_driver_min",
    "gpu_cuda_min",
)
# The per-device constraints: given only to a layer that ends up with GPUs.
_PER_DEVICE = ("gpu_memory_min_bytes", "gpu_capability_min", "gpu_driver_min", "gpu_cuda_min")
_VERSIONS = ("gpu_capability_min", "gpu_driver_min", "gpu_cuda_min")
# `cuectl admin service set` options, per field.
OPTIONS = {
    "cores": "--cores",
    "memory_bytes": "--memory",
    "gpus": "--gpus",
    "gpu_memory_min_bytes": "--gpu-memory",
    "tags": "--tags",
    "timeout_s": "--timeout",
    "gpu_capability_min": "--gpu-capability-min",
    "gpu_driver_min": "--gpu-driver-min",
    "gpu_cuda_min": "--gpu-cuda-min",
}
DEFAULT = "default"  # the service of layers that name none
CLEAR = "none"  # `admin service set NAME --cores none`: the service gives no cores any more
_LAYER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LayerSpec)}


def check_name(name: Any) -> str:
    """A service name: as limit and project names (1-100 of A-Z a-z 0-9 _ . -)."""
    from cuectl.sched.checks import label_name

    return label_name(name, "NAME", "service")


def parse_options(raw: Mapping[str, str | None]) -> dict[str, Any]:
    """``admin service set``'s option texts (field -> text; None: not given) as column
    values; ``none`` clears a field (None). InvalidInput naming the option otherwise."""
    from cuectl.sched.fields import size_bytes

    out: dict[str, Any] = {}
    for field_name, text in raw.items():
        if text is None:
            continue
        option = OPTIONS[field_name]
        if text.strip().lower() == CLEAR:
            out[field_name] = None
        elif field_name == "cores":
            out[field_name] = _number(text, option, float)
        elif field_name == "gpus":
            out[field_name] = _number(text, option, int)
        elif field_name in ("memory_bytes", "gpu_memory_min_bytes"):
            out[field_name] = size_bytes(text.strip(), option)
        elif field_name in _VERSIONS:
            out[field_name] = text.strip()
        elif field_name == "tags":
            out[field_name] = [t for t in (part.strip() for part in text.split(",")) if t]
            if not out[field_name]:
                raise InvalidInput(f"{option}: expected tags separated by commas (or none to clear them)")
        else:
            out[field_name] = text.strip()
    return check_values(out)


def _number(text: str, option: str, kind: type) -> Any:
    try:
        return kind(text.strip())
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise InvalidInput(f"{option}: expected {what} (or none to clear it), got {text!r}") from None


def check_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Column values (field -> value; None clears it) checked as a layer's own would be:
    cores as ``cores:``, sizes as ``memory:``, tags as ``tags:``, the timeout as ``timeout:``."""
    from cuectl.sched.checks import cores_field, tags_field, timeout_field
    from cuectl.sched.fields import size_bytes, version, whole_number
    from cuectl.sched.gpu_request import MAX_GPUS

    out: dict[str, Any] = {}
    for field_name, value in values.items():
        if field_name not in OPTIONS:
            raise InvalidInput(f"unknown service field {field_name!r} (known: {', '.join(FIELDS)})")
        option = OPTIONS[field_name]
        if value is None:
            out[field_name] = None
        elif field_name == "cores":
            out[field_name] = cores_field(value, option)
        elif field_name == "gpus":
            out[field_name] = whole_number(value, option, minimum=0, maximum=MAX_GPUS)
        elif field_name in ("memory_bytes", "gpu_memory_min_bytes"):
            out[field_name] = size_bytes(value, option)
        elif field_name in _VERSIONS:
            out[field_name] = version(value, option)
        elif field_name == "tags":
            out[field_name] = list(tags_field(value, option))
        else:
            seconds = timeout_field(value, option)
            if not math.isfinite(seconds):
                raise InvalidInput(f"{option}: must be a finite duration")
            out[field_name] = seconds
    return out


def to_columns(values: Mapping[str, Any]) -> dict[str, Any]:
    """Checked values as the services table holds them (tags: a JSON list)."""
    return {k: (json.dumps(v) if k == "tags" and v is not None else v) for k, v in values.items()}


def row_json(row: Mapping[str, Any]) -> dict[str, Any]:
    """A services row as ``admin service list --json`` shows it (null: no default)."""
    tags = row["tags"]
    return {
        "name": row["name"],
        "cores": None if row["cores"] is None else float(row["cores"]),
        "memory_bytes": None if row["memory_bytes"] is None else int(row["memory_bytes"]),
        "gpus": None if row["gpus"] is None else int(row["gpus"]),
        "gpu_memory_min_bytes": None if row["gpu_memory_min_bytes"] is None else int(row["gpu_memory_min_bytes"]),
        "tags": None if tags is None else list(json.loads(tags)),
        "timeout_s": None if row["timeout_s"] is None else float(row["timeout_s"]),
        **{key: row[key] for key in _VERSIONS},
    }


def explicit_fields(layer: LayerSpec) -> frozenset[str]:
    """The fields a layer set itself: as its spec said, or (a LayerSpec built in code)
    those that differ from LayerSpec's defaults."""
    if layer.explicit is not None:
        return layer.explicit
    return frozenset(f for f in FIELDS if getattr(layer, f) != _LAYER_DEFAULTS[f])


def _chosen(layer: LayerSpec, table: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    if isinstance(layer.service, str):
        found = table.get(layer.service)
        if found is None:
            raise InvalidInput(
                f"layer {layer.name}: service: no service {layer.service!r}",
                hint="see `cuectl admin service list`; an admin creates one with "
                "`cuectl admin service set NAME --cores N ...`",
            )
        return found
    for name in layer.service or ():  # OpenCue's rule: the first one that exists
        if name in table:
            return table[name]
    return table.get(DEFAULT)


def apply(spec: JobSpec, rows: Iterable[Mapping[str, Any]]) -> JobSpec:
    """``spec`` with each layer's unset resource fields taken from its service (``rows``:
    the services table). InvalidInput for a layer naming a service that does not exist."""
    from cuectl.sched.gpu_request import GpuRequest

    table = {row["name"]: row_json(row) for row in rows}
    layers = []
    for layer in spec.layers:
        service = _chosen(layer, table)
        if service is None:
            layers.append(layer)
            continue
        own = explicit_fields(layer)
        changes: dict[str, Any] = {
            f: service[f] for f in FIELDS if f not in own and service[f] is not None and f not in _PER_DEVICE
        }
        if "tags" in changes:
            changes["tags"] = tuple(changes["tags"])
        gpus = changes.get("gpus", layer.gpus)
        # GPU memory is a per-device constraint: it means something only for a layer that
        # gets devices (a service may serve CPU and GPU layers alike).
        for f in _PER_DEVICE:
            if f not in own and service[f] is not None and gpus > 0:
                changes[f] = service[f]
        if not changes:
            layers.append(layer)
            continue
        layer = dataclasses.replace(layer, **changes)
        try:  # the result must still be a valid request (a device constraint needs devices)
            GpuRequest.parse(
                gpus=layer.gpus,
                gpu_vendor=layer.gpu_vendor,
                gpu_models=layer.gpu_models or None,
                gpu_memory_min=layer.gpu_memory_min_bytes or None,
                gpu_capability_min=layer.gpu_capability_min,
                gpu_driver_min=layer.gpu_driver_min,
                gpu_cuda_min=layer.gpu_cuda_min,
            )
        except InvalidInput as exc:
            raise InvalidInput(f"layer {layer.name}: with service {service['name']!r}: {exc.message}") from None
        layers.append(layer)
    return dataclasses.replace(spec, layers=tuple(layers))
