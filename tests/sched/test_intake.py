"""cuectl.sched.intake, the one front door for jobs: sources read once (size cap, UTF-8,
standard input), their format told by the file's name or, on standard input, by the text,
the flag form as one frozen dataclass named by spec keys, and flags applied to a spec."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched import intake, spec

FIXTURES = Path(__file__).parent.parent / "fixtures"
CONTEXT = intake.SubmitContext(user="ann", frame_limit=1000)


def test_the_flags_are_one_frozen_dataclass_named_by_spec_keys():
    flags = intake.SubmitFlags(gpus=1, tags=["a", "b"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.gpus = 2  # type: ignore[misc]
    assert flags.tags == ("a", "b") and hash(flags)  # lists kept as tuples
    for f in dataclasses.fields(intake.SubmitFlags):
        key = f.metadata["key"] or f.name
        assert key in spec.JOB_KEYS or key in spec.LAYER_KEYS, f.name
        assert f.metadata["flags"] and all(name.startswith("-") for name in f.metadata["flags"])
    assert intake.FLAG_OPTIONS["-D"] == intake.FLAG_OPTIONS["--chdir"] == ("cwd", "str")
    assert intake.SubmitFlags.from_options({"--gpu-model": ["A100"], "--paused": True}) == intake.SubmitFlags(
        gpu_models=("A100",), paused=True
    )
    # the fast path's tables cover every option
    assert set(intake.VALUE_OPTIONS) | set(intake.SWITCHES) == set(intake.FLAG_OPTIONS)


def test_the_flag_form_names_the_flag_at_fault():
    job = intake.SubmitFlags(range="1-4", gpus=1, tags=("gpu",)).job_spec(["echo", "#IFRAME#"], CONTEXT, name="j")
    assert job.user == "ann" and job.layers[0].gpus == 1 and job.layers[0].tags == ("gpu",)
    with pytest.raises(InvalidInput, match="^--gpus: "):
        intake.SubmitFlags(gpus=-1).job_spec(["true"], CONTEXT, name="j")
    with pytest.raises(InvalidInput, match="^--chdir: "):
        intake.SubmitFlags(cwd="relative").job_spec(["true"], intake.SubmitContext(user="ann"), name="j")


def test_flags_override_a_spec_and_a_layer_flag_needs_one_layer(tmp_path: Path):
    one = tmp_path / "one.yaml"
    one.write_text("name: one\npriority: 3\nlayers:\n  - name: a\n    command: 'true'\n    gpus: 0\n")
    loaded = intake.load(
        intake.read_source(one), CONTEXT, flags=intake.SubmitFlags(priority=9, gpus=2, env=("A=1",), log_limit="1M")
    )
    job = loaded.one()
    assert (job.priority, job.layers[0].gpus, dict(job.layers[0].env)["A"]) == (9, 2, "1")
    assert job.layers[0].log_limit_bytes == 1024 * 1024
    two = tmp_path / "two.yaml"
    two.write_text("name: two\nlayers:\n  - {name: a, command: 'true'}\n  - {name: b, command: 'true'}\n")
    with pytest.raises(InvalidInput, match=r"^--tag: a layer setting, and the spec has 2 layers: set tags:"):
        intake.load(intake.read_source(two), CONTEXT, flags=intake.SubmitFlags(tags=("x",), priority=1))
    with pytest.raises(InvalidInput, match="^--cores: "):  # checked as flags before the spec is read
        intake.SubmitFlags(cores=0.0).adjuster()


def test_the_format_is_told_by_the_name_or_on_standard_input_by_the_text():
    xml = FIXTURES / "opencue" / "jobspec_simple.xml"
    assert intake.read_source(xml).format == intake.OPENCUE_XML
    assert intake.read_source(str(FIXTURES / "openjd" / "gpu-train.yaml")).format == intake.SPEC
    piped = intake.read_source("-", stdin=io.BytesIO(xml.read_bytes()))
    assert (piped.format, piped.name, piped.given) == (intake.OPENCUE_XML, "<stdin>", "-")
    assert intake.read_source("-", stdin=io.BytesIO(b"name: x\n")).format == intake.SPEC
    loaded = intake.load(piped, CONTEXT)
    assert loaded.format == intake.OPENCUE_XML and loaded.notes[0].startswith("<stdin>: ")


def test_reading_is_checked_once_for_every_door(tmp_path: Path):
    with pytest.raises(InvalidInput, match=r"^<stdin>: empty"):
        intake.read_source("-", stdin=io.BytesIO(b"  \n"))
    with pytest.raises(InvalidInput, match=r"not UTF-8 text \(bad byte at offset 6\)"):
        intake.read_source("-", stdin=io.BytesIO(b"name: \xff"))
    big = tmp_path / "big.xml"
    big.write_bytes(b"<" * (spec.MAX_SPEC_BYTES + 1))
    with pytest.raises(InvalidInput, match="larger than 10 MB; refused"):
        intake.read_source(big)
    with pytest.raises(InvalidInput, match="^cannot read job spec"):
        intake.read_source(tmp_path / "missing.yaml")
    assert intake.source_from_text("<?xml version='1.0'?><spec/>", name="body").format == intake.OPENCUE_XML
    assert intake.source_from_text("\ufeffname: x", name="body").format == intake.SPEC
