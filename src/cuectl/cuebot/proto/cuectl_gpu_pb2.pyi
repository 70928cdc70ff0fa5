from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GpuDevice(_message.Message):
    __slots__ = ("id", "vendor", "model", "memory_bytes", "pci_bus", "driver_version", "cuda_version", "metal_version", "api_version", "uuid", "index", "attributes", "utilization_pct", "memory_used_bytes", "sampled_at", "holder", "holder_frame_id", "holder_kind")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    VENDOR_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    METAL_VERSION_FIELD_NUMBER: _ClassVar[int]
    API_VERSION_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_KIND_FIELD_NUMBER: _ClassVar[int]
    id: str
    vendor: str
    model: str
    memory_bytes: int
    pci_bus: str
    driver_version: str
    cuda_version: str
    metal_version: str
    api_version: str
    uuid: str
    index: int
    attributes: _containers.ScalarMap[str, str]
    utilization_pct: float
    memory_used_bytes: int
    sampled_at: float
    holder: str
    holder_frame_id: str
    holder_kind: str
    def __init__(self, id: _Optional[str] = ..., vendor: _Optional[str] = ..., model: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., pci_bus: _Optional[str] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ..., metal_version: _Optional[str] = ..., api_version: _Optional[str] = ..., uuid: _Optional[str] = ..., index: _Optional[int] = ..., attributes: _Optional[_Mapping[str, str]] = ..., utilization_pct: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., sampled_at: _Optional[float] = ..., holder: _Optional[str] = ..., holder_frame_id: _Optional[str] = ..., holder_kind: _Optional[str] = ...) -> None: ...

class GpuUsage(_message.Message):
    __slots__ = ("device_id", "utilization_pct", "memory_used_bytes", "sampled_at", "utilization_mean_pct", "utilization_max_pct", "memory_peak_bytes", "gpu_seconds")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_AT_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_MEAN_PCT_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_MAX_PCT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PEAK_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    utilization_pct: float
    memory_used_bytes: int
    sampled_at: float
    utilization_mean_pct: float
    utilization_max_pct: float
    memory_peak_bytes: int
    gpu_seconds: float
    def __init__(self, device_id: _Optional[str] = ..., utilization_pct: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., sampled_at: _Optional[float] = ..., utilization_mean_pct: _Optional[float] = ..., utilization_max_pct: _Optional[float] = ..., memory_peak_bytes: _Optional[int] = ..., gpu_seconds: _Optional[float] = ...) -> None: ...

class LayerGpuRequest(_message.Message):
    __slots__ = ("gpus", "gpu_vendor", "gpu_models_allowed", "min_gpu_memory_bytes")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_VENDOR_FIELD_NUMBER: _ClassVar[int]
    GPU_MODELS_ALLOWED_FIELD_NUMBER: _ClassVar[int]
    MIN_GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    gpus: int
    gpu_vendor: str
    gpu_models_allowed: _containers.RepeatedScalarFieldContainer[str]
    min_gpu_memory_bytes: int
    def __init__(self, gpus: _Optional[int] = ..., gpu_vendor: _Optional[str] = ..., gpu_models_allowed: _Optional[_Iterable[str]] = ..., min_gpu_memory_bytes: _Optional[int] = ...) -> None: ...

class GetHostGpusRequest(_message.Message):
    __slots__ = ("host",)
    HOST_FIELD_NUMBER: _ClassVar[int]
    host: str
    def __init__(self, host: _Optional[str] = ...) -> None: ...

class GetHostGpusResponse(_message.Message):
    __slots__ = ("devices", "sample_interval_s")
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    devices: _containers.RepeatedCompositeFieldContainer[GpuDevice]
    sample_interval_s: float
    def __init__(self, devices: _Optional[_Iterable[_Union[GpuDevice, _Mapping]]] = ..., sample_interval_s: _Optional[float] = ...) -> None: ...

class GetFrameGpuUsageRequest(_message.Message):
    __slots__ = ("frame_id",)
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    frame_id: str
    def __init__(self, frame_id: _Optional[str] = ...) -> None: ...

class GetFrameGpuUsageResponse(_message.Message):
    __slots__ = ("current", "summary", "total", "attempt", "frame_id")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FRAME_ID_FIELD_NUMBER: _ClassVar[int]
    current: _containers.RepeatedCompositeFieldContainer[GpuUsage]
    summary: _containers.RepeatedCompositeFieldContainer[GpuUsage]
    total: GpuUsage
    attempt: int
    frame_id: str
    def __init__(self, current: _Optional[_Iterable[_Union[GpuUsage, _Mapping]]] = ..., summary: _Optional[_Iterable[_Union[GpuUsage, _Mapping]]] = ..., total: _Optional[_Union[GpuUsage, _Mapping]] = ..., attempt: _Optional[int] = ..., frame_id: _Optional[str] = ...) -> None: ...

class GetLayerGpuRequestRequest(_message.Message):
    __slots__ = ("job", "layer")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    job: str
    layer: str
    def __init__(self, job: _Optional[str] = ..., layer: _Optional[str] = ...) -> None: ...

class GetLayerGpuRequestResponse(_message.Message):
    __slots__ = ("request", "job_id", "layer_id")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LAYER_ID_FIELD_NUMBER: _ClassVar[int]
    request: LayerGpuRequest
    job_id: str
    layer_id: str
    def __init__(self, request: _Optional[_Union[LayerGpuRequest, _Mapping]] = ..., job_id: _Optional[str] = ..., layer_id: _Optional[str] = ...) -> None: ...
