"""The GPU version minimums (issue 39 §4) in the other spec formats: cuectl's OpenCue XML
extension elements and OpenJD's farm-defined amounts."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.opencue_xml import parse_opencue_xml
from cuectl.sched.spec import load_spec_file, spec_from_mapping


def _xml(elements: str, gpus: str = "<gpus>1</gpus>") -> str:
    return (
        "<spec><show>demo</show><job name='shot'><layers><layer name='beauty' type='Render'>"
        f"<cmd>render #IFRAME#</cmd><range>1-4</range>{gpus}{elements}</layer></layers></job></spec>"
    )


def test_opencue_xml_extension_elements():
    ((mapping, notes),) = parse_opencue_xml(
        _xml(
            "<gpu_capability_min>8.10</gpu_capability_min><gpu_driver_min>535.104.05</gpu_driver_min>"
            "<gpu_cuda_min> 12.2 </gpu_cuda_min>"
        )
    )
    assert notes == []  # known elements: no warning
    (layer,) = spec_from_mapping(mapping, user="u").layers
    assert (layer.gpu_capability_min, layer.gpu_driver_min, layer.gpu_cuda_min) == ("8.10", "535.104.05", "12.2")
    ((mapping, notes),) = parse_opencue_xml(_xml("<gpu_cuda_min/>", gpus=""))  # empty: none
    assert notes == [] and spec_from_mapping(mapping, user="u").layers[0].gpu_cuda_min is None


@pytest.mark.parametrize(
    "elements,gpus,message",
    [
        ("<gpu_driver_min>550.x</gpu_driver_min>", "<gpus>1</gpus>", "(beauty): <gpu_driver_min>: invalid version"),
        ("<gpu_cuda_min>12</gpu_cuda_min>", "", "(beauty): <gpu_cuda_min>: only applies to GPU requests"),
    ],
)
def test_opencue_xml_bad_version_elements(elements, gpus, message):
    with pytest.raises(InvalidInput) as err:
        parse_opencue_xml(_xml(elements, gpus))
    assert message in err.value.message


TEMPLATE = """\
specificationVersion: jobtemplate-2023-09
name: versions
steps:
  - name: Train
    hostRequirements:
      amounts:
{amounts}
    script:
      actions:
        onRun:
          command: python
          args: ["train.py"]
"""


def _openjd(tmp_path: Path, amounts: str):
    path = tmp_path / "job.yaml"
    path.write_text(TEMPLATE.format(amounts=amounts))
    notes: list[str] = []
    spec = load_spec_file(path, openjd_params=[], notes=notes, cwd=str(tmp_path))
    return spec.layers[0], [n.split(": ", 1)[1] for n in notes]


def test_openjd_version_amounts(tmp_path: Path):
    layer, notes = _openjd(
        tmp_path,
        "        - {name: amount.worker.gpu, min: 1}\n"
        '        - {name: amount.gpu.compute_capability, min: "8.10"}\n'
        "        - {name: cuectl:amount.gpu.cuda, min: 12.2, max: 13}\n"
        "        - {name: amount.gpu.driver, min: 550}\n",
    )
    assert (layer.gpus, layer.gpu_capability_min, layer.gpu_cuda_min, layer.gpu_driver_min) == (
        1,
        "8.10",
        "12.2",
        "550",
    )
    assert notes == ["step 'Train': cuectl:amount.gpu.cuda max not honoured (cuectl has no upper bound on versions)"]
    layer, notes = _openjd(tmp_path, "        - {name: amount.gpu.cuda, min: 12}\n")
    assert layer.gpus == 1 and layer.gpu_cuda_min == "12"
    assert notes == ["step 'Train': a GPU version minimum without amount.worker.gpu: asks for 1 GPU"]
