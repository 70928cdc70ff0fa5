"""OpenCue's layer types: Render and Util run as any layer; a Post layer waits for every
other layer of its job (cuebot: post frames run once the job's other frames are done)."""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched import model as m
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store


def spec(*layers):
    return spec_from_mapping({"name": "j", "layers": list(layers)}, user="u")


def test_a_post_layer_waits_for_every_other_layer(tmp_path):
    job = spec(
        {"name": "render", "command": ["true"], "range": "1-3"},
        {"name": "notify", "command": ["true"], "type": "post"},
        {"name": "util", "command": ["true"], "type": "Util"},
    )
    types = {layer.name: layer.type for layer in job.layers}
    assert types == {"render": "Render", "notify": "Post", "util": "Util"}
    post = next(layer for layer in job.layers if layer.name == "notify")
    assert {(d.on, d.type) for d in post.depends} == {("render", "layer"), ("util", "layer")}
    store = open_store(str(tmp_path / "s.db"))
    try:
        job_id = store.submit(job, now=1.0)
        states = {f["layer"]: f["state"] for f in store.list_frames(job=job_id)[0]}
        assert states == {"render": m.WAITING, "util": m.WAITING, "notify": m.DEPEND}
    finally:
        store.close()


def test_a_bad_layer_type_is_refused():
    with pytest.raises(InvalidInput, match=r"^layers\[0\].type: 'Final' is not one of Render, Util, Post"):
        spec({"name": "a", "command": ["true"], "type": "Final"})
