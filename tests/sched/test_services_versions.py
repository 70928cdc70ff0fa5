"""A service's GPU version minimums (issue 39 §4): set, checked and cleared as the other
service fields, and at submit given to the layers that end up with GPUs and do not set
their own."""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.spec import spec_from_mapping

NOW = 1_700_000_000.0


def _layers(store, *layers: dict) -> list[dict]:
    spec = spec_from_mapping({"name": "j", "layers": list(layers)}, user="alice")
    return store.get_job(store.submit(spec, now=NOW))["layers"]


def test_service_version_minimums(store):
    row = store.set_service("cuda", {"gpus": 1, "gpu_capability_min": "8.10", "gpu_cuda_min": 12.2})
    assert (row["gpu_capability_min"], row["gpu_driver_min"], row["gpu_cuda_min"]) == ("8.10", None, "12.2")
    with pytest.raises(InvalidInput, match=r"^--gpu-driver-min: invalid version '5\.x'"):
        store.set_service("cuda", {"gpu_driver_min": "5.x"})
    store.set_service("cpu", {"gpus": 0, "gpu_cuda_min": "12"})
    gpu, own, cpu = _layers(
        store,
        {"name": "gpu", "command": ["true"], "service": "cuda"},
        {"name": "own", "command": ["true"], "service": "cuda", "gpus": 1, "gpu_capability_min": "9.0"},
        {"name": "cpu", "command": ["true"], "service": "cpu"},
    )
    assert (gpu["gpus"], gpu["gpu_capability_min"], gpu["gpu_cuda_min"]) == (1, "8.10", "12.2")
    assert (own["gpu_capability_min"], own["gpu_cuda_min"]) == ("9.0", "12.2")  # its own value wins
    assert (cpu["gpus"], cpu["gpu_cuda_min"]) == (0, None)  # per device: nothing for a CPU layer
    row = store.set_service("cuda", {"gpu_capability_min": None})
    assert row["gpu_capability_min"] is None and row["gpu_cuda_min"] == "12.2"
