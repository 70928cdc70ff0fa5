"""``GpuRequest``: the one validator of a GPU request, and the one way back from a record.

The entry points (``cuectl submit``, ``cuectl run``, ``cuectl.lease()``) are compared with
each other in tests/run/test_gpu_request_entry_points.py; here the validator itself.
"""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.fields import flag_label
from cuectl.sched.gpu_request import GpuRequest
from cuectl.sched.model import LayerSpec
from cuectl.sched.store import RunnableLayer
from cuectl.units import GIB, MIB

WANT = GpuRequest(gpus=2, gpu_vendor="NVIDIA", gpu_models=("A100", "H100"), gpu_memory_min_bytes=24 * GIB)


def test_defaults_and_models_coerced_to_tuple() -> None:
    assert GpuRequest() == GpuRequest(
        gpus=0, gpu_vendor=None, gpu_models=(), gpu_memory_min_bytes=0, gpu_memory_free_min_bytes=0
    )
    req = GpuRequest(gpus=1, gpu_models=["A100"])  # type: ignore[arg-type]
    assert req.gpu_models == ("A100",)
    hash(req)  # stays hashable


def test_from_record_of_a_layer_spec() -> None:
    layer = LayerSpec(
        name="render",
        command="true",
        gpus=2,
        gpu_vendor="NVIDIA",
        gpu_models=("A100", "H100"),
        gpu_memory_min_bytes=24 * GIB,
        cores=4,
        memory_bytes=8 * GIB,
    )
    assert GpuRequest.from_record(layer) == WANT


def test_from_record_of_a_runnable_layer() -> None:
    layer = RunnableLayer(
        layer_id=1,
        job_id=1,
        job="j",
        layer="render",
        priority=0,
        gpus=2,
        gpu_vendor="NVIDIA",
        gpu_models=("A100", "H100"),
        gpu_memory_min_bytes=24 * GIB,
        cores=1.0,
        memory_bytes=0,
        tags=(),
        waiting=3,
    )
    assert GpuRequest.from_record(layer) == WANT


def test_from_record_of_a_job_json_layer() -> None:
    layer = {
        "name": "render",
        "gpus": 2,
        "gpu_vendor": "NVIDIA",
        "gpu_models": ["A100", "H100"],
        "gpu_memory_min_bytes": 24 * GIB,
        "cores": 1.0,
    }
    assert GpuRequest.from_record(layer) == WANT


def test_parse_normalises() -> None:
    req = GpuRequest.parse(gpus=2, gpu_vendor="nvidia", gpu_models=[" A100 ", "H100", "A100"], gpu_memory_min="24G")
    assert req == WANT
    assert GpuRequest.parse(gpus=1, gpu_models="RTX 4090").gpu_models == ("RTX 4090",)  # one string: one model
    assert GpuRequest.parse(gpus=1, gpu_memory_min=8 * GIB).gpu_memory_min_bytes == 8 * GIB  # an int is bytes
    assert GpuRequest.parse(gpus=1, gpu_memory_free_min="512").gpu_memory_free_min_bytes == 512 * MIB
    assert GpuRequest.parse(gpus=0) == GpuRequest()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpus": -1}, "gpus: must be 0 or more"),
        ({"gpus": 1025}, "gpus: must be at most 1024"),
        ({"gpus": True}, "gpus: expected a whole number, got a boolean (true)"),
        ({"gpus": "2"}, "gpus: expected a whole number, got a string ('2')"),
        ({"gpus": 0, "gpu_vendor": "NVIDIA"}, "gpu_vendor: only applies to GPU requests; set gpus to 1 or more"),
        ({"gpus": 0, "gpu_memory_free_min": "1G"}, "gpu_memory_free_min: only applies to GPU requests"),
        (
            {"gpus": 1, "gpu_vendor": "Matrox"},
            "gpu_vendor: unknown vendor 'Matrox' (expected one of NVIDIA, AMD, Apple, Intel)",
        ),
        ({"gpus": 1, "gpu_models": [""]}, "gpu_models[0]: invalid GPU model '' (1-200 printable characters)"),
        ({"gpus": 1, "gpu_models": "A\x01"}, "gpu_models[0]: invalid GPU model 'A\\x01'"),
        ({"gpus": 1, "gpu_models": ["x" * 201]}, "gpu_models[0]: invalid GPU model 'xxxxx"),
        ({"gpus": 1, "gpu_models": [3]}, "gpu_models[0]: expected a GPU model name, got a number (3)"),
        ({"gpus": 1, "gpu_memory_min": "lots"}, "gpu_memory_min: invalid size 'lots'"),
        ({"gpus": 1, "gpu_memory_min": "2000000T"}, "gpu_memory_min: '2000000T' is too large"),
        ({"gpus": 1, "gpu_memory_min": -1}, "gpu_memory_min: must be 0 or more"),
        ({"gpus": 1, "gpu_memory_min": 1.5}, "gpu_memory_min: expected a size like 8G, got a number (1.5)"),
    ],
)
def test_parse_refuses_naming_the_field(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        GpuRequest.parse(**kwargs)
    assert caught.value.message.startswith(message)


def test_parse_names_fields_as_the_caller_spells_them() -> None:
    with pytest.raises(InvalidInput) as caught:
        GpuRequest.parse(gpus=0, gpu_models=["A100"], label=flag_label)
    assert caught.value.message == "--gpu-model: only applies to GPU requests; set --gpus to 1 or more"
