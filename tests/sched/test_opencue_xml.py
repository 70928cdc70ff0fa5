"""OpenCue job specs (CJSL XML) read into cuectl specs (issue 18 item 8). The vectors in
tests/fixtures/opencue/ are Cuebot's own test specs, copied from OpenCue's
cuebot/src/test/resources/conf/jobspec/ (see the README there); each test names its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.opencue_xml import (
    core_points,
    memory_kib,
    order_jobs,
    parse_opencue_xml,
    strict_error,
    take_frame_depends,
)
from cuectl.sched.spec import spec_from_mapping

FIXTURES = Path(__file__).parents[1] / "fixtures" / "opencue"
GIB = 1024**3


def _read(name: str, submitter: str | None = "testuser"):
    return parse_opencue_xml((FIXTURES / name).read_text(), source=name, submitter=submitter)


def _specs(name: str):
    return [spec_from_mapping(m, user="u") for m, _ in _read(name)]


def _notes(name: str, submitter: str | None = "testuser") -> list[str]:
    return [str(n) for _, notes in _read(name, submitter) for n in notes]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.xml")))
def test_every_cuebot_vector_is_read_and_validates(name):
    assert _specs(name)


def test_jobspec_xml_units_env_and_layer_depend():
    # cuebot/src/test/resources/conf/jobspec/jobspec.xml (CJSL 1.5)
    (spec,) = _specs("jobspec.xml")
    pre, render = spec.layers
    assert spec.name == "pipe-dev.cue-testuser_shell_v1" and spec.paused and spec.project == "pipe"
    assert (pre.cores, render.cores) == (0.25, 1.0)  # <cores>25</cores>, <cores>100</cores>: core points
    assert render.range == "1-10" and render.tags == ("general",)
    assert dict(render.env)["VNP_VCR_SESSION"] == "9000"
    assert pre.retries == 0  # <maxretries>0</maxretries>
    assert [(d.on, d.type) for d in render.depends] == [("pass_1_preprocess", "layer")]


def test_gpu_vectors_gpu_memory_is_the_frames_total():
    # cuebot/src/test/resources/conf/jobspec/jobspec_dispatch_gpus_test.xml (CJSL 1.12)
    specs = {s.name: s for s in _specs("jobspec_dispatch_gpus_test.xml")}
    layers = {layer.name: layer for layer in specs["test_gpu"].layers}
    assert (layers["test_gpus_1_layer"].gpus, layers["test_gpus_1_layer"].gpu_memory_min_bytes) == (1, GIB)
    four = layers["test_gpus_4_layer"]  # <gpus>4</gpus><gpu_memory>7g</gpu_memory>: 7 GiB over 4 devices
    assert four.gpus == 4 and four.gpu_memory_min_bytes == -(-7 * GIB // 4)
    assert layers["test_gpus_0_layer"].gpus == 0 and layers["test_gpus_0_layer"].gpu_memory_min_bytes == 0
    assert any("test_gpus_0_layer: <gpu_memory>: not honoured" in n for n in _notes("jobspec_dispatch_gpus_test.xml"))


def test_memory_units_and_deprecated_gpu_element():
    # cuebot/src/test/resources/conf/jobspec/jobspec_dispatch_gpu_test.xml (CJSL 1.7: <memory>2gb, <gpu>512m)
    spec = _specs("jobspec_dispatch_gpu_test.xml")[0]
    assert spec.layers[0].memory_bytes == 2 * GIB
    # cuebot/src/test/resources/conf/jobspec/jobspec_multiple_frames.xml
    assert _specs("jobspec_multiple_frames.xml")[0].layers[0].memory_bytes == 2 * GIB


def test_maxcores_maxgpus_map_to_job_caps():
    # cuebot/src/test/resources/conf/jobspec/override_max_cores_gpus.xml (CJSL 1.13)
    (spec,) = _specs("override_max_cores_gpus.xml")
    assert (spec.max_cores, spec.max_gpus) == (420, 42)


def test_frame_by_frame_and_post_layers():
    # cuebot/src/test/resources/conf/jobspec/chunked_depend.xml, uneven_frame_by_frame.xml ("FrameByFrame")
    for name in ("chunked_depend.xml", "uneven_frame_by_frame.xml"):
        (spec,) = _specs(name)
        assert [d.type for d in spec.layers[1].depends] == ["frame"]
    # cuebot/src/test/resources/conf/jobspec/jobspec_postframes.xml: the POST layer waits for the others
    (spec,) = _specs("jobspec_postframes.xml")
    cleanup = spec.layers[2]
    assert cleanup.name == "cleanup"
    assert {(d.on, d.type) for d in cleanup.depends} == {("pass_1_preprocess", "layer"), ("pass_1", "layer")}


def test_several_jobs_in_one_spec():
    # cuebot/src/test/resources/conf/jobspec/jobspec_depend_test.xml
    assert [s.name for s in _specs("jobspec_depend_test.xml")] == [
        "pipe-dev.cue-testuser_depend_test_a",
        "pipe-dev.cue-testuser_depend_test_b",
    ]


def test_every_cuebot_depend_type_maps_within_and_across_jobs():
    """Cuebot's JobSpec.handleDependTag types, with its frame names (0001-pass_1), between
    the two jobs of jobspec_depend_test.xml; frame-on-* waits are noted (no place in a spec)."""
    a, b = "pipe-dev.cue-testuser_depend_test_a", "pipe-dev.cue-testuser_depend_test_b"

    def depend(kind, er_layer="", on_layer="", on_frame="", er_frame="", er=b, on=a, anyframe=""):
        parts = [f"<depjob>{er}</depjob>", f"<onjob>{on}</onjob>"]
        parts += [
            f"<{tag}>{value}</{tag}>"
            for tag, value in (
                ("deplayer", er_layer),
                ("onlayer", on_layer),
                ("onframe", on_frame),
                ("depframe", er_frame),
            )
            if value
        ]
        extra = f' anyframe="{anyframe}"' if anyframe else ""
        return f'<depend type="{kind}"{extra}>{"".join(parts)}</depend>'

    depends = "".join(
        [
            depend("JOB_ON_JOB"),
            depend("JOB_ON_LAYER", on_layer="pass_1"),
            depend("JOB_ON_FRAME", on_frame="0003-pass_2"),
            depend("LAYER_ON_JOB", er_layer="pass_1"),
            depend("LAYER_ON_LAYER", "pass_2", "pass_2", anyframe="true"),
            depend("LAYER_ON_FRAME", "pass_1", "pass_1", "0005-pass_1"),
            depend("FRAME_BY_FRAME", "pass_2", "pass_1"),
            depend("PREVIOUS_FRAME", "pass_1", "pass_1", er=a, on=a),
            depend("LAYER_ON_SIM_FRAME", "pass_2", on_frame="0001-pass_1", er=a, on=a),
            depend("FRAME_ON_FRAME", "pass_1", "pass_1", "0002-pass_1", er_frame="0002-pass_1"),
        ]
    )
    text = (FIXTURES / "jobspec_depend_test.xml").read_text().replace("</spec>", f"<depends>{depends}</depends></spec>")
    imported = parse_opencue_xml(text)
    (job_a, _), (job_b, _) = imported
    assert job_b["depends"] == [{"job": a}, {"job": a, "layer": "pass_1"}, {"job": a, "layer": "pass_2", "frame": 3}]
    by_layer = {layer["name"]: layer.get("depends") for layer in job_b["layers"]}
    assert by_layer == {
        "pass_1": [{"job": a}, {"job": a, "layer": "pass_1", "frame": 5}],
        "pass_2": [{"job": a, "layer": "pass_2", "type": "any"}, {"job": a, "layer": "pass_1", "type": "frame"}],
    }
    assert [layer.get("depends") for layer in job_a["layers"]] == [
        [{"layer": "pass_1", "type": "previous"}],
        [{"layer": "pass_1", "frame": 1}],
    ]
    notes = [str(n) for _, ns in imported for n in ns]
    assert notes == []  # FRAME_ON_FRAME too is honoured (issue 41), not noted
    assert take_frame_depends(job_b) == [
        {"type": "frame-on-frame", "layer": "pass_1", "frame": 2, "on_job": a, "on_layer": "pass_1", "on_frame": 2}
    ]
    assert take_frame_depends(job_b) == [] and take_frame_depends(job_a) == []
    assert order_jobs(imported, "x") == [0, 1]  # b waits on a: a first
    with pytest.raises(InvalidInput, match="wait on each other in a cycle"):
        order_jobs(parse_opencue_xml(text.replace("</depends>", depend("JOB_ON_JOB", er=a, on=b) + "</depends>")), "x")


def test_notes_for_unsupported_elements():
    # cuebot/src/test/resources/conf/jobspec/autoeat.xml, services.xml, jobspec_dispatch_test.xml, depend_any.xml
    assert any("<autoeat>: not honoured" in n for n in _notes("autoeat.xml"))
    assert any("<facility>: not honoured" in n for n in _notes("autoeat.xml"))
    assert not any("<services>" in n for n in _notes("services.xml"))  # honoured now: test_services.py
    assert any("<os>: not honoured" in n for n in _notes("jobspec_dispatch_test.xml"))
    assert _notes("depend_any.xml") == []  # anyframe is honoured: a layer waits on any frame
    assert [d.type for d in _specs("depend_any.xml")[0].layers[1].depends] == ["any"]
    assert any("<user>: not honoured: the job runs as ada" in n for n in _notes("jobspec.xml", submitter="ada"))
    assert any("cjsl-nonexistent.dtd" in n for n in _notes("jobspec_nonexistent_dtd.xml"))


def test_several_tags_are_any_of():
    text = (
        (FIXTURES / "jobspec_simple.xml")
        .read_text()
        .replace("<chunk>1</chunk>", "<chunk>1</chunk><tags>gpu | desktop</tags>")
    )
    ((mapping, notes),) = parse_opencue_xml(text)
    assert mapping["layers"][0]["tags"] == ["gpu | desktop"]  # one entry: either tag will do
    assert not any("<tags>" in str(n) for n in notes)


def test_strict_error_lists_every_note():
    notes = [n for _, ns in _read("autoeat.xml") for n in ns]
    err = strict_error("autoeat.xml", notes)
    assert f"{len(notes)} element(s) cannot be honoured" in err.message and "<autoeat>" in err.message


def test_pyoutline_output():
    # Written as pyoutline/outline/backend/cue.py's _serialize writes it (CJSL 1.15, one line).
    ((mapping, notes),) = _read("pyoutline_gpu.xml", submitter="artist")
    assert notes == []
    spec = spec_from_mapping(mapping, user="artist")
    render, comp, publish = spec.layers
    assert (render.cores, render.memory_bytes, render.gpus, render.gpu_memory_min_bytes) == (2.0, 512 * 1024**2, 1, GIB)
    assert render.timeout_s == 1800 and render.retries == 2 and render.tags == ("gpu",)
    assert [(d.on, d.type) for d in comp.depends] == [("render", "frame")]
    assert {d.on for d in publish.depends} == {"render", "comp"}
    assert spec.priority == 10 and spec.max_gpus == 4 and spec.project == "demo"


@pytest.mark.parametrize(
    "text,points", [("100", 100), ("25", 25), ("1.0", 100), ("1.5", 150), ("5", 100), ("0", 0), ("-100", -100)]
)
def test_core_points(text, points):
    assert core_points(text, "x") == points


@pytest.mark.parametrize(
    "text,kib",
    [("1", 1024**2), ("2gb", 2 * 1024**2), ("512m", 512 * 1024), ("7g", 7 * 1024**2), ("1.5G", int(1.5 * 1024**2))],
)
def test_memory_units(text, kib):
    assert memory_kib(text, "x") == kib


BOMB = """<?xml version="1.0"?>
<!DOCTYPE spec [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">
<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">]>
<spec><show>&d;</show></spec>"""
EXTERNAL = """<?xml version="1.0"?><!DOCTYPE spec [<!ENTITY x SYSTEM "file:///etc/passwd">]><spec>&x;</spec>"""


@pytest.mark.parametrize(
    "text,message",
    [
        (BOMB, "entity declarations (<!ENTITY) are refused"),
        (EXTERNAL, "entity declarations (<!ENTITY) are refused"),
        ("<spec><job name='x'>", "invalid XML at line 1"),
        ("<spec>&undefined;</spec>", "invalid XML at line 1, column 7: undefined entity"),
        ("<job name='x'/>", "not an OpenCue job spec (the root element is <job>"),
        ("<spec><show>a</show></spec>", "the spec has no <job>"),
        ("<spec>" + " " * (10 * 1024 * 1024) + "</spec>", "larger than 10 MB"),
    ],
)
def test_hostile_or_malformed_xml_is_one_clear_error(text, message):
    with pytest.raises(InvalidInput) as err:
        parse_opencue_xml(text, source="job.xml")
    assert err.value.message.startswith("job.xml: ") and message in err.value.message


def test_bad_values_name_the_element():
    text = (FIXTURES / "jobspec_simple.xml").read_text()
    for old, new, message in [
        ("<chunk>1</chunk>", "<chunk>x</chunk>", "<chunk>: expected a whole number"),
        ('type="Render"', 'type="Bake"', "type must be Render, Util or Post"),
        ("<paused>False</paused>", "<paused>maybe</paused>", "<paused>: expected True"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            parse_opencue_xml(text.replace(old, new))


# -- cuectl's extension elements (docs/opencue-xml.md): a layer's per-device GPU request ----------
def _gpu_layer(elements: str, gpus: str = "<gpus>2</gpus>") -> str:
    return (
        f"<spec><show>demo</show><job name='shot'><layers><layer name='beauty' type='Render'>"
        f"<cmd>render #IFRAME#</cmd><range>1-4</range>{gpus}{elements}</layer></layers></job></spec>"
    )


def test_extension_elements_are_the_layers_gpu_request():
    ((mapping, notes),) = parse_opencue_xml(
        _gpu_layer(
            "<gpu_vendor>nvidia</gpu_vendor><gpu_models_allowed>A100, RTX 4090 ,</gpu_models_allowed>"
            f"<min_gpu_memory_bytes>{24 * GIB}</min_gpu_memory_bytes>"
        ),
        source="job.xml",
    )
    assert notes == []  # known elements: no "not an element of any CJSL version" warning
    (layer,) = spec_from_mapping(mapping, user="u").layers
    assert (layer.gpus, layer.gpu_vendor, layer.gpu_models, layer.gpu_memory_min_bytes) == (
        2,
        "NVIDIA",
        ("A100", "RTX 4090"),
        24 * GIB,
    )


def test_min_gpu_memory_and_opencues_gpu_memory_both_hold():
    # <gpu_memory> is OpenCue's total over the frame's devices (8 GiB / 2 = 4 GiB each): a
    # device must meet it and the per-device minimum, so the larger of the two wins.
    for per_device, expected in ((6 * GIB, 6 * GIB), (GIB, 4 * GIB)):
        ((mapping, _),) = parse_opencue_xml(
            _gpu_layer(f"<gpu_memory>8g</gpu_memory><min_gpu_memory_bytes>{per_device}</min_gpu_memory_bytes>")
        )
        assert spec_from_mapping(mapping, user="u").layers[0].gpu_memory_min_bytes == expected


def test_empty_extension_elements_ask_nothing():
    ((mapping, notes),) = parse_opencue_xml(
        _gpu_layer(
            "<gpu_vendor/><gpu_models_allowed> </gpu_models_allowed><min_gpu_memory_bytes>0</min_gpu_memory_bytes>",
            gpus="",
        )
    )
    assert notes == []
    (layer,) = spec_from_mapping(mapping, user="u").layers
    assert (layer.gpus, layer.gpu_vendor, layer.gpu_models, layer.gpu_memory_min_bytes) == (0, None, (), 0)


@pytest.mark.parametrize(
    "elements,gpus,message",
    [
        ("<gpu_vendor>NVIDA</gpu_vendor>", "<gpus>1</gpus>", "(beauty): <gpu_vendor>: unknown vendor 'NVIDA'"),
        (
            "<gpu_models_allowed>A100," + "x" * 201 + "</gpu_models_allowed>",
            "<gpus>1</gpus>",
            "(beauty): <gpu_models_allowed>[1]: invalid GPU model",
        ),
        (
            "<gpu_models_allowed><gpu_model>A100</gpu_model></gpu_models_allowed>",
            "<gpus>1</gpus>",
            "(beauty): <gpu_models_allowed>: expected model names separated by commas",
        ),
        (
            "<min_gpu_memory_bytes>24G</min_gpu_memory_bytes>",
            "<gpus>1</gpus>",
            "(beauty): <min_gpu_memory_bytes>: expected a whole number, got '24G'",
        ),
        (
            "<min_gpu_memory_bytes>-1</min_gpu_memory_bytes>",
            "<gpus>1</gpus>",
            "(beauty): <min_gpu_memory_bytes>: must be 0 or more",
        ),
        (
            "<gpu_vendor>AMD</gpu_vendor>",
            "",
            "(beauty): <gpu_vendor>: only applies to GPU requests; set <gpus> to 1 or more",
        ),
    ],
)
def test_bad_extension_elements_name_the_element(elements, gpus, message):
    with pytest.raises(InvalidInput) as err:
        parse_opencue_xml(_gpu_layer(elements, gpus=gpus), source="job.xml")
    assert err.value.message.startswith("job.xml: job[0] (shot): layer[0] (beauty): "), err.value.message
    assert message in err.value.message, err.value.message


def test_unknown_layer_elements_still_warn_beside_the_extension():
    ((_, notes),) = parse_opencue_xml(_gpu_layer("<gpu_vendor>NVIDIA</gpu_vendor><gpu_colour>green</gpu_colour>"))
    assert [str(n) for n in notes] == [
        "shot: layer beauty: <gpu_colour>: not honoured: not an element of any CJSL version"
    ]
