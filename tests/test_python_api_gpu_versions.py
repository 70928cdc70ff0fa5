"""cuectl.Job's layer keywords for the GPU version minimums (issue 39 §4): kept as given,
and refused, naming the spec key, when malformed."""

from __future__ import annotations

from pathlib import Path

import pytest

import cuectl
from cuectl.errors import InvalidInput
from cuectl.sched.store import open_store


def test_job_builder_keeps_version_minimums(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_USER", "ann")
    job_id = (
        cuectl.Job("versions")
        .layer("a", ["true"], gpus=1, gpu_capability_min="8.10", gpu_driver_min="535.104.05", gpu_cuda_min=12.2)
        .submit(db=str(db_path))
    )
    store = open_store(str(db_path), create=False)
    try:
        (layer,) = store.get_job(job_id)["layers"]
    finally:
        store.close()
    assert (layer["gpu_capability_min"], layer["gpu_driver_min"], layer["gpu_cuda_min"]) == (
        "8.10",
        "535.104.05",
        "12.2",
    )
    with pytest.raises(InvalidInput, match=r"^layers\[0\]\.gpu_capability_min: invalid version '8\.x'"):
        cuectl.Job("bad").layer("a", ["true"], gpus=1, gpu_capability_min="8.x").submit(db=str(db_path))
