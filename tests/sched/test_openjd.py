"""Open Job Description templates (issue 18 item 9): real samples (tests/fixtures/openjd,
README there) validated by openjd-model and mapped onto cuectl layers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from cuectl.errors import InvalidInput
from cuectl.sched import openjd
from cuectl.sched.model import Dependency
from cuectl.sched.spec import load_spec_file, load_spec_text
from cuectl.units import MIB

pytest.importorskip("openjd.model", reason="the 'openjd' extra (scripts/test.sh installs it)")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openjd"


def load(name: str, *params: str, cwd: str = "/work"):
    notes: list[str] = []
    spec = load_spec_file(FIXTURES / name, openjd_params=list(params), notes=notes, cwd=cwd)
    return spec, [n.split(": ", 1)[1] for n in notes]


def test_is_openjd():
    assert openjd.is_openjd({"specificationVersion": "jobtemplate-2023-09"})
    assert not openjd.is_openjd({"name": "x", "layers": []})
    assert not openjd.is_openjd(["specificationVersion"])


def test_blender_frame_range_becomes_the_layers_range():
    spec, notes = load("blender-render.yaml", "BlenderSceneFile=/scenes/a.blend", "Frames=1-5,10-20:5")
    assert spec.name == "Blender Render" and notes == []
    (layer,) = spec.layers
    assert layer.name == "RenderBlender"
    assert layer.range == "1-5,10-20x5"
    assert [c[0] for c in spec.chunks[0]] == [1, 2, 3, 4, 5, 10, 15, 20]
    # The embedded script is written where the frame runs; the task's frame is #IFRAME#.
    assert isinstance(layer.command, str)
    assert "--render-frame #IFRAME#" in layer.command
    assert "/scenes/a.blend" in layer.command and '> "$d/Run" && bash "$d/Run"' in layer.command


def test_blender_default_frames():
    spec, _ = load("blender-render.yaml", "BlenderSceneFile=/s.blend")
    assert spec.layers[0].range == "1-10"


def test_embedded_script_really_runs(tmp_path):
    """The shell string that materialises the embedded file runs under /bin/sh as the
    worker would run it (the token replaced by the frame number)."""
    template = {
        "specificationVersion": "jobtemplate-2023-09",
        "name": "emb",
        "parameterDefinitions": [{"name": "Out", "type": "PATH", "default": str(tmp_path)}],
        "steps": [
            {
                "name": "s",
                "parameterSpace": {"taskParameterDefinitions": [{"name": "F", "type": "INT", "range": "3"}]},
                "script": {
                    "actions": {"onRun": {"command": "sh", "args": ["{{Task.File.Run}}", "it's"]}},
                    "embeddedFiles": [
                        {
                            "name": "Run",
                            "type": "TEXT",
                            "runnable": True,
                            "data": "echo \"frame {{Task.Param.F}} $1 $0\" > '{{Param.Out}}/out'\n",
                        }
                    ],
                },
            }
        ],
    }
    mapping, notes = openjd.openjd_to_spec(template, [])
    command = mapping["layers"][0]["command"].replace("#IFRAME#", "3")
    subprocess.run(["/bin/sh", "-c", command], check=True, cwd=tmp_path)
    text = (tmp_path / "out").read_text()
    assert text.startswith("frame 3 it's /") and text.rstrip().endswith("/Run")
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_multi_step_dependencies_and_other_spaces():
    spec, notes = load("ffmpeg.yaml", "InputFile=/in/seq.%04d.exr", "OutputDir=/out", "EndFrame=48")
    assert [layer.name for layer in spec.layers] == ["h264", "webm", "prores"]
    h264, webm, prores = spec.layers
    assert h264.command[:5] == ("ffmpeg", "-r", "24", "-start_number", "1") and "48" in h264.command
    assert h264.range == "1" and h264.depends == ()
    assert webm.depends == (Dependency("h264", "layer"),)
    assert prores.depends == (Dependency("h264", "layer"),)
    # A STRING parameter space: one frame per task, the task's values chosen by frame number.
    assert prores.range == "1-2"
    assert "case #IFRAME# in 1) ffmpeg" in prores.command and "-profile:v 3" in prores.command
    assert notes == ["step 'prores': its parameter space (Quality) becomes frames 1-2, one per task in OpenJD's order"]


def test_case_table_runs_the_right_task(tmp_path):
    spec, _ = load("gpu-train.yaml")
    sweep = spec.layers[1]
    out = subprocess.run(
        ["/bin/sh", "-c", sweep.command.replace("python3", "echo").replace("#IFRAME#", "5")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == "sweep.py 0.01 2\n"
    bad = subprocess.run(["/bin/sh", "-c", sweep.command.replace("#IFRAME#", "9")], capture_output=True, text=True)
    assert bad.returncode == 1 and "no task for frame 9" in bad.stderr


def test_gpu_host_requirements():
    spec, notes = load("gpu-train.yaml", "Model=vit")
    assert spec.name == "train vit"
    train, sweep = spec.layers
    assert train.name == "Train_Shards"
    assert train.range == "0-6x2"
    assert train.command == ("python3", "train.py", "--model", "vit", "--epochs", "3", "--shard", "#IFRAME#")
    assert train.gpus == 2 and train.gpu_models == ("A100", "H100")
    assert train.gpu_memory_min_bytes == 16384 * MIB
    assert train.cores == 8 and train.memory_bytes == 32768 * MIB and train.timeout_s == 3600
    assert dict(train.env) == {"DATASET": "/data/vit", "OMP_NUM_THREADS": "4"}
    assert sweep.gpus == 1 and sweep.gpu_memory_min_bytes == 8000 * MIB
    assert sweep.depends == (Dependency("Train_Shards", "layer"),)
    assert sweep.range == "1-6"
    assert set(notes) == {
        "step 'Train Shards': layer named 'Train_Shards' (layer names are [A-Za-z0-9_.-])",
        "step 'Train Shards': environment 'Conda': its script (onEnter/onExit) is not run; only its variables are set",
        "step 'Train Shards': host requirement amount.worker.disk.scratch not honoured (cuectl does not track it)",
        "step 'Train Shards': amount.worker.gpu.memory is required of each of the 2 GPUs (cuectl never adds "
        "memory across devices)",
        "step 'Train Shards': host requirement attr.worker.cpu.arch not honoured (cuectl does not match hosts by it)",
        "step 'Sweep': its parameter space (LR, Seed) becomes frames 1-6, one per task in OpenJD's order",
        "step 'Sweep': amount.worker.gpu.memory without amount.worker.gpu: asks for 1 GPU",
    }


def test_cpu_host_requirements_and_notes():
    spec, notes = load("host-requirements.yaml")
    one, two = spec.layers
    assert one.cores == 1 and one.memory_bytes == 256 * MIB and one.gpus == 0
    assert two.cores == 4 and two.memory_bytes == 8192 * MIB
    assert (
        "step 'StepTwo': host requirement attr.custom.host_config not honoured (cuectl does not match hosts "
        "by it)" in notes
    )
    assert "step 'StepOne': amount.worker.memory max not honoured (cuectl reserves the minimum)" in notes


def test_blender_ffmpeg_sample_two_steps():
    spec, notes = load("blender-ffmpeg.yaml", "JobName=shot 10")
    assert spec.name == "shot 10"
    render, video = spec.layers
    assert render.range == "1" and '--render-frame "1..100"' in render.command
    assert video.depends == (Dependency("RenderScene", "layer"),) and 'chmod +x "$d/Encode"' in video.command


def test_invalid_template_is_one_line_from_the_validator():
    bad = yaml.safe_dump(
        {
            "specificationVersion": "jobtemplate-2023-09",
            "name": "x",
            "steps": [
                {
                    "name": "a",
                    "script": {"actions": {"onRun": {"command": "true"}}},
                    "parameterSpace": {"taskParameterDefinitions": [{"name": "F", "type": "INT", "range": "a-b"}]},
                }
            ],
        }
    )
    with pytest.raises(InvalidInput) as err:
        load_spec_text(bad, source="t.yaml")
    message = err.value.message
    assert "\n" not in message
    assert message.startswith("t.yaml: not a valid Open Job Description job template: steps[0] -> parameterSpace")
    assert "Unexpected 'a' in 'a-b'" in message


def test_unknown_version_and_parameters():
    with pytest.raises(InvalidInput, match="Unknown template version: jobtemplate-2099"):
        load_spec_text("specificationVersion: jobtemplate-2099\nname: x\n", source="t.yaml")
    with pytest.raises(InvalidInput, match="not defined in the template: Nope"):
        load("host-requirements.yaml", "Nope=1")
    with pytest.raises(InvalidInput, match="Values missing for required job parameters: BlenderSceneFile"):
        load("blender-render.yaml")
    with pytest.raises(InvalidInput, match="expected NAME=VALUE"):
        load("host-requirements.yaml", "novalue")
    with pytest.raises(InvalidInput, match="only for Open Job Description templates"):
        load_spec_text("name: x\nlayers: [{name: a, command: [true]}]\n", openjd_params=["A=1"])


def test_missing_package_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "openjd.model", None)  # import fails as when not installed
    with pytest.raises(InvalidInput) as err:
        load("host-requirements.yaml")
    assert "openjd-model package, which is not installed" in err.value.message
    assert "cuectl[openjd]" in (err.value.hint or "")
