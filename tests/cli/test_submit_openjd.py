"""`cuectl submit TEMPLATE.yaml --param NAME=VALUE`: Open Job Description templates
(issue 18 item 9; docs/openjd.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("openjd.model", reason="the 'openjd' extra (scripts/test.sh installs it)")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "openjd"


def test_submit_blender_template_with_params(cli, tmp_path):
    template = tmp_path / "template.yaml"
    shutil.copy(FIXTURES / "blender-render.yaml", template)
    res = cli("submit", "--json", str(template), "--param", "Frames=1-5", "--param", "BlenderSceneFile=/s/a.blend")
    assert res.exit_code == 0, res
    job = res.json()
    assert job["name"] == "Blender Render"
    assert job["frame_counts"] == {"WAITING": 5}
    (layer,) = job["layers"]
    assert layer["name"] == "RenderBlender" and layer["range"] == "1-5"
    assert "--render-frame #IFRAME#" in layer["command"]
    assert "warning:" not in res.stderr


def test_submit_prints_notes_as_warnings_and_flags_still_override(cli):
    res = cli("submit", "--json", "--priority", "7", str(FIXTURES / "gpu-train.yaml"), "--param", "Model=vit")
    assert res.exit_code == 0, res
    job = res.json()
    assert job["name"] == "train vit" and job["priority"] == 7
    train, sweep = job["layers"]
    assert train["gpus"] == 2 and train["gpu_models"] == ["A100", "H100"] and train["range"] == "0-6x2"
    assert sweep["depends"] == [{"layer": "Train_Shards", "type": "layer"}]
    warnings = [ln for ln in res.stderr.splitlines() if ln.startswith("warning: ")]
    assert len(warnings) == 7
    assert any("attr.worker.cpu.arch not honoured" in w for w in warnings)


def test_submit_invalid_template_and_bad_params(cli, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("specificationVersion: jobtemplate-2023-09\nname: x\nsteps: []\n")
    res = cli("submit", str(bad))
    assert res.exit_code == 2
    assert res.stderr.startswith(f"error: {bad}: not a valid Open Job Description job template: ")
    assert len([ln for ln in res.stderr.splitlines() if ln.startswith("error:")]) == 1
    res = cli("submit", str(FIXTURES / "blender-render.yaml"), "--param", "Frames=1-5")
    assert res.exit_code == 2 and "Values missing for required job parameters: BlenderSceneFile" in res.stderr
    res = cli("submit", "--param", "A=1", "--name", "x", "--", "true")
    assert res.exit_code == 2 and "--param: only for Open Job Description templates" in res.stderr


def test_strict_refuses_what_cannot_be_honoured(cli):
    res = cli("submit", "--strict", str(FIXTURES / "host-requirements.yaml"))
    assert res.exit_code == 2 and "attr.worker.os.family not honoured" in res.stderr
    assert (
        cli("submit", "--strict", str(FIXTURES / "blender-render.yaml"), "--param", "BlenderSceneFile=/a").exit_code
        == 0
    )
