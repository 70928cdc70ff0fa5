"""The GPU policy keys of a layer (issue 39, docs/gpu-health.md): gpu_escape, gpu_idle_limit,
gpu_idle_action, gpu_idle_util, gpu_share and gpu_share_enforce — parsed from a spec, from
the flags and from the Python API, refused as one input error when malformed, kept by the
store and handed to the worker with each claim."""

from __future__ import annotations

import pytest

from cuectl.api import Job
from cuectl.errors import InvalidInput
from cuectl.sched.spec import spec_from_flags, spec_from_mapping
from cuectl.sched.store import open_store

GIB = 1024**3


def layer(**keys):
    spec = spec_from_mapping({"name": "j", "layers": [{"name": "a", "command": ["true"], **keys}]}, user="alice")
    return spec.layers[0]


def test_the_keys_become_layer_fields():
    got = layer(
        gpus=1,
        gpu_escape="KILL",
        gpu_idle_limit="30m",
        gpu_idle_action="warn",
        gpu_idle_util="7.5%",
        gpu_share="10G",
        gpu_share_enforce="warn",
    )
    assert (got.gpu_escape, got.gpu_idle_limit_s, got.gpu_idle_action, got.gpu_idle_util) == (
        "kill",
        1800.0,
        "warn",
        7.5,
    )
    assert (got.gpu_share_bytes, got.gpu_share_enforce) == (10 * GIB, "warn")


def test_left_out_they_are_the_workers_and_whole_devices():
    got = layer(gpus=2)
    assert (got.gpu_escape, got.gpu_idle_limit_s, got.gpu_idle_action, got.gpu_idle_util) == (None, None, None, None)
    assert (got.gpu_share_bytes, got.gpu_share_enforce) == (None, None)


def test_a_share_asks_for_one_gpu():
    assert layer(gpu_share=4096).gpus == 1  # a bare number is MiB, as memory
    assert layer(gpu_share=4096).gpu_share_bytes == 4 * GIB


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"gpus": 2, "gpu_share": "8G"}, r"layers\[0\]\.gpu_share: a share is part of one GPU; layers\[0\]\.gpus is 2"),
        ({"gpus": 1, "gpu_share": "0"}, r"gpu_share: must be more than 0"),
        ({"gpus": 1, "gpu_share": "lots"}, r"gpu_share"),
        ({"gpus": 1, "gpu_escape": "maybe"}, r"gpu_escape: 'maybe' is not one of warn, kill"),
        ({"gpus": 1, "gpu_idle_action": 3}, r"gpu_idle_action: expected"),
        ({"gpus": 1, "gpu_idle_limit": "-5m"}, r"gpu_idle_limit"),
        ({"gpus": 1, "gpu_idle_util": 101}, r"gpu_idle_util: expected a percentage from 0 to 100"),
        ({"gpus": 1, "gpu_idle_util": True}, r"gpu_idle_util: expected a percentage"),
        ({"gpus": 1, "gpu_share_enforce": "kill"}, r"gpu_share_enforce: only applies with layers\[0\]\.gpu_share"),
        ({"gpu_escape": "kill"}, r"gpu_escape: only applies to GPU requests"),
        ({"gpus": 0, "gpu_idle_limit": "1m"}, r"gpu_idle_limit: only applies to GPU requests"),
    ],
)
def test_malformed_keys_are_one_input_error(keys, message):
    with pytest.raises(InvalidInput, match=message):
        layer(**keys)


def test_the_flags_name_themselves_in_errors():
    spec = spec_from_flags(name="j", command=["true"], gpu_share="8G", gpu_idle_limit="3s", gpu_escape="kill")
    got = spec.layers[0]
    assert (got.gpus, got.gpu_share_bytes, got.gpu_idle_limit_s, got.gpu_escape) == (1, 8 * GIB, 3.0, "kill")
    with pytest.raises(InvalidInput, match=r"^--gpu-share: a share is part of one GPU; --gpus is 2"):
        spec_from_flags(name="j", command=["true"], gpus=2, gpu_share="8G")
    with pytest.raises(InvalidInput, match=r"^--gpu-idle-action: 'stop' is not one of warn, kill"):
        spec_from_flags(name="j", command=["true"], gpus=1, gpu_idle_action="stop")


def test_the_python_api_takes_them():
    job = Job("j").layer("a", ["true"], gpu_share="8G", gpu_share_enforce="warn", gpu_idle_limit=60)
    got = spec_from_mapping(job.to_spec(), user="alice").layers[0]
    assert (got.gpus, got.gpu_share_bytes, got.gpu_share_enforce, got.gpu_idle_limit_s) == (1, 8 * GIB, "warn", 60.0)


def test_the_store_keeps_them_and_hands_them_to_the_worker(tmp_path):
    store = open_store(str(tmp_path / "s.db"))
    spec = spec_from_mapping(
        {
            "name": "j",
            "layers": [
                {
                    "name": "a",
                    "command": ["true"],
                    "gpu_share": "10G",
                    "gpu_share_enforce": "warn",
                    "gpu_escape": "kill",
                    "gpu_idle_limit": "3s",
                    "gpu_idle_action": "kill",
                    "gpu_idle_util": 2,
                }
            ],
        },
        user="alice",
    )
    job_id = store.submit(spec, now=1.0)
    shown = store.get_job(job_id)["layers"][0]
    assert {k: shown[k] for k in shown if k.startswith("gpu_") and k not in ("gpu_vendor", "gpu_models")} == {
        "gpu_memory_min_bytes": 0,
        "gpu_capability_min": None,
        "gpu_driver_min": None,
        "gpu_cuda_min": None,
        "gpu_escape": "kill",
        "gpu_idle_limit_s": 3.0,
        "gpu_idle_action": "kill",
        "gpu_idle_util": 2.0,
        "gpu_share_bytes": 10 * GIB,
        "gpu_share_enforce": "warn",
    }
    (runnable,) = store.runnable_layers()
    assert runnable.gpu_share_bytes == 10 * GIB
    claim = store.claim_frame(runnable.layer_id, host="h", worker="w", gpu_uuids=["GPU-a"], now=2.0, lease_s=60)
    assert claim is not None
    assert (claim.gpu_escape, claim.gpu_idle_limit_s, claim.gpu_idle_action, claim.gpu_idle_util) == (
        "kill",
        3.0,
        "kill",
        2.0,
    )
    assert (claim.gpu_share_bytes, claim.gpu_share_enforce) == (10 * GIB, "warn")
    store.close()
