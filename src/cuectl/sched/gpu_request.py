"""What a frame or an ad-hoc lease asks of each device: ``GpuRequest``, built once.

One type from the flag to the kernel lock: ``cuectl submit`` flags, YAML job specs,
``cuectl run`` flags and ``cuectl.lease()`` keywords all go through ``GpuRequest.parse``
(the one validator, so the four accept and refuse the same inputs with the same
messages); stored layers and worker claims come back through ``GpuRequest.from_record``.
Field names follow the flags: ``--gpu-memory-min`` is ``gpu_memory_min`` in a spec and
a keyword, and ``gpu_memory_min_bytes`` here and in the store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cuectl.errors import InvalidInput
from cuectl.gpu.device import VENDORS, normalize_vendor
from cuectl.sched.fields import (
    CONTROL_RE,
    Label,
    as_list,
    describe,
    expect_str,
    item_label,
    keyword_label,
    quote,
    size_bytes,
    version,
    whole_number,
)

MAX_GPUS = 1024
MAX_MODEL_CHARS = 200
# Device constraints; on a request for 0 GPUs each one is refused rather than ignored.
_CONSTRAINTS = (
    "gpu_vendor",
    "gpu_models",
    "gpu_memory_min",
    "gpu_memory_free_min",
    "gpu_capability_min",
    "gpu_driver_min",
    "gpu_cuda_min",
)
#: The dotted-version minimums (``--gpu-capability-min 8.9``), each against the device's
#: field of this name; versions compare numerically (units.version_at_least).
VERSION_MINIMUMS = {
    "gpu_capability_min": "compute_capability",
    "gpu_driver_min": "driver_version",
    "gpu_cuda_min": "cuda_version",
}


class GpuFields(Protocol):
    """Any record carrying a layer's GPU request: ``LayerSpec``, the store's ``RunnableLayer``."""

    @property
    def gpus(self) -> int: ...

    @property
    def gpu_vendor(self) -> str | None: ...

    @property
    def gpu_models(self) -> Sequence[str]: ...

    @property
    def gpu_memory_min_bytes(self) -> int: ...

    @property
    def gpu_capability_min(self) -> str | None: ...

    @property
    def gpu_driver_min(self) -> str | None: ...

    @property
    def gpu_cuda_min(self) -> str | None: ...


@dataclass(frozen=True)
class GpuRequest:
    """Per-device constraints of a frame or lease (already valid: see ``parse``)."""

    gpus: int = 0
    gpu_vendor: str | None = None  # normalised vendor, or None = any
    gpu_models: tuple[str, ...] = ()  # model patterns, any of; empty = any
    gpu_memory_min_bytes: int = 0  # total memory per device
    gpu_memory_free_min_bytes: int = 0  # free memory per device now (ad-hoc leases only); 0 = no check
    gpu_capability_min: str | None = None  # CUDA compute capability, "8.9"; None = any
    gpu_driver_min: str | None = None  # driver version, "535.104.05"; None = any
    gpu_cuda_min: str | None = None  # the driver's CUDA version, "12.2"; None = any

    def __post_init__(self) -> None:
        # A list passed by a caller would make the frozen dataclass unhashable.
        if not isinstance(self.gpu_models, tuple):
            object.__setattr__(self, "gpu_models", tuple(self.gpu_models))

    @classmethod
    def parse(
        cls,
        *,
        gpus: Any,
        gpu_vendor: Any = None,
        gpu_models: Any = None,
        gpu_memory_min: Any = None,
        gpu_memory_free_min: Any = None,
        gpu_capability_min: Any = None,
        gpu_driver_min: Any = None,
        gpu_cuda_min: Any = None,
        label: Label = keyword_label,
    ) -> GpuRequest:
        """Validate user input; ``InvalidInput`` naming the field via ``label`` otherwise.

        ``label`` maps a field name (the keyword names of this method) to what the user
        wrote: ``--gpu-model`` for flags, ``layers[0].gpu_models`` in a spec. Sizes are
        strings (``24G``; a bare number is MiB) or ints of bytes. Unset is None (or empty).
        """
        count = whole_number(gpus, label("gpus"), minimum=0, maximum=MAX_GPUS)
        given = {
            "gpu_vendor": gpu_vendor,
            "gpu_models": gpu_models,
            "gpu_memory_min": gpu_memory_min,
            "gpu_memory_free_min": gpu_memory_free_min,
            "gpu_capability_min": gpu_capability_min,
            "gpu_driver_min": gpu_driver_min,
            "gpu_cuda_min": gpu_cuda_min,
        }
        if count == 0:
            # A device constraint without devices is almost surely a forgotten --gpus;
            # silently ignoring it would run a frame on the CPU pool (DESIGN §5 rules that out).
            for field in _CONSTRAINTS:
                if given[field] not in (None, (), []):
                    raise InvalidInput(
                        f"{label(field)}: only applies to GPU requests; set {label('gpus')} to 1 or more"
                    )
        return cls(
            gpus=count,
            gpu_vendor=None if gpu_vendor is None else _vendor(gpu_vendor, label("gpu_vendor")),
            gpu_models=() if gpu_models is None else _models(gpu_models, label("gpu_models")),
            gpu_memory_min_bytes=0 if gpu_memory_min is None else size_bytes(gpu_memory_min, label("gpu_memory_min")),
            gpu_memory_free_min_bytes=(
                0 if gpu_memory_free_min is None else size_bytes(gpu_memory_free_min, label("gpu_memory_free_min"))
            ),
            gpu_capability_min=_version(gpu_capability_min, label("gpu_capability_min")),
            gpu_driver_min=_version(gpu_driver_min, label("gpu_driver_min")),
            gpu_cuda_min=_version(gpu_cuda_min, label("gpu_cuda_min")),
        )

    @classmethod
    def from_record(cls, record: GpuFields | Mapping[str, Any]) -> GpuRequest:
        """The request of a stored layer: a ``LayerSpec``, a ``RunnableLayer``, or a layer of
        the job JSON (a mapping with the same keys). Trusted: validated when submitted."""
        if isinstance(record, Mapping):
            return cls(
                gpus=record["gpus"],
                gpu_vendor=record["gpu_vendor"],
                gpu_models=tuple(record["gpu_models"]),
                gpu_memory_min_bytes=record["gpu_memory_min_bytes"],
                gpu_capability_min=record.get("gpu_capability_min"),
                gpu_driver_min=record.get("gpu_driver_min"),
                gpu_cuda_min=record.get("gpu_cuda_min"),
            )
        return cls(
            gpus=record.gpus,
            gpu_vendor=record.gpu_vendor,
            gpu_models=tuple(record.gpu_models),
            gpu_memory_min_bytes=record.gpu_memory_min_bytes,
            gpu_capability_min=record.gpu_capability_min,
            gpu_driver_min=record.gpu_driver_min,
            gpu_cuda_min=record.gpu_cuda_min,
        )


def _version(value: Any, label: str) -> str | None:
    return None if value is None else version(value, label)


def _vendor(value: Any, label: str) -> str:
    vendor = normalize_vendor(value) if isinstance(value, str) else None
    if vendor is None:
        shown = quote(value) if isinstance(value, str) else describe(value)
        raise InvalidInput(f"{label}: unknown vendor {shown} (expected one of {', '.join(VENDORS)})")
    return vendor


def _models(value: Any, label: str) -> tuple[str, ...]:
    """Model patterns, stripped, in order, each once (DESIGN §5 says how they match)."""
    models: list[str] = []
    for index, item in enumerate(as_list(value, label)):
        where = item_label(label, index)
        model = expect_str(item, where, what="a GPU model name").strip()
        if not model or len(model) > MAX_MODEL_CHARS or CONTROL_RE.search(model):
            raise InvalidInput(f"{where}: invalid GPU model {quote(model)} (1-{MAX_MODEL_CHARS} printable characters)")
        if model not in models:
            models.append(model)
    return tuple(models)
