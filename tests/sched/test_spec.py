"""Job specs: YAML and flag forms, every validation rule, YAML bombs, and the examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuectl.errors import InvalidInput
from cuectl.sched import spec as spec_module
from cuectl.sched.model import Dependency, JobSpec, LayerSpec
from cuectl.sched.spec import (
    LAYER_KEYS,
    MAX_SPEC_BYTES,
    load_spec_file,
    load_spec_text,
    spec_from_flags,
    spec_from_mapping,
)
from cuectl.units import GIB, MIB

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def load(text: str, **kw: Any) -> JobSpec:
    kw.setdefault("user", "alice")
    return load_spec_text(textwrap.dedent(text), source="job.yaml", **kw)


def error(text: str, **kw: Any) -> str:
    with pytest.raises(InvalidInput) as info:
        load(text, **kw)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


def one_layer(**fields: Any) -> dict[str, Any]:
    layer = {"name": "a", "command": ["echo", "hi"], **fields}
    return {"name": "j", "layers": [layer]}


def mapping_error(data: Any, **kw: Any) -> str:
    kw.setdefault("user", "alice")
    with pytest.raises(InvalidInput) as info:
        spec_from_mapping(data, **kw)
    assert "\n" not in str(info.value)
    return str(info.value)


# --------------------------------------------------------------------------------------
# The YAML form


def test_full_spec_is_normalised() -> None:
    spec = load(
        """
        name: shot010-lighting
        priority: 50
        paused: true
        env: {SHOT: "010", DEBUG: 1, FAST: yes, SHARED: job}
        layers:
          - name: render
            command: [python3, render.py, "#IFRAME#", 5]
            range: 1-10
            chunk: 3
            gpus: 2
            gpu_vendor: nvidia
            gpu_models: [A100, "RTX 4090", A100]
            gpu_memory_min: 16G
            cores: 2.5
            memory: 4096
            retries: 0
            timeout: 1h30m
            env: {SHARED: layer, RATIO: 0.5}
            tags: [render, render, big.gpu]
          - name: comp
            command: "python3 comp.py #IFRAME# | tee log"
            range: 4
            gpus: 1
            gpu_models: A40
            gpu_memory_min: 512
            depends:
              - render
        """
    )
    assert spec.name == "shot010-lighting" and spec.user == "alice"
    assert spec.priority == 50 and spec.paused is True
    render, comp = spec.layers
    assert render == LayerSpec(
        name="render",
        command=("python3", "render.py", "#IFRAME#", "5"),
        range="1-10",
        chunk=3,
        gpus=2,
        gpu_vendor="NVIDIA",
        gpu_models=("A100", "RTX 4090"),
        gpu_memory_min_bytes=16 * GIB,
        cores=2.5,
        memory_bytes=4096 * MIB,  # a bare number is MiB (DESIGN §5), not bytes
        retries=0,
        timeout_s=5400.0,
        env=(("SHOT", "010"), ("DEBUG", "1"), ("FAST", "true"), ("SHARED", "layer"), ("RATIO", "0.5")),
        tags=("render", "big.gpu"),
        depends=(),
    )
    assert comp.command == "python3 comp.py #IFRAME# | tee log"  # a string stays a shell string
    assert comp.range == "4" and comp.gpu_models == ("A40",) and comp.gpu_memory_min_bytes == 512 * MIB
    assert comp.depends == (Dependency("render", "layer"),)
    assert comp.env == (("SHOT", "010"), ("DEBUG", "1"), ("FAST", "true"), ("SHARED", "job"))
    assert spec.chunks == (((1, 2, 3), (4, 5, 6), (7, 8, 9), (10,)), ((4,),))


def test_defaults() -> None:
    spec = load(
        """
        name: j
        layers:
          - {name: a, command: ["true"]}
        """
    )
    assert spec.priority == 0 and spec.paused is False
    assert spec.layers[0] == LayerSpec(name="a", command=("true",))
    layer = spec.layers[0]
    assert (layer.range, layer.chunk, layer.gpus, layer.cores, layer.memory_bytes, layer.retries, layer.timeout_s) == (
        "1",
        1,
        0,
        1.0,
        0,
        3,
        None,
    )
    assert spec.chunks == (((1,),),)


def test_null_means_not_set() -> None:
    spec = load(
        """
        name: j
        priority: null
        layers:
          - {name: a, command: x, range: ~, timeout: null, retries: null, gpus: null, gpu_vendor: null, env: null}
        """
    )
    assert spec.priority == 0
    assert spec.layers[0].retries == 3 and spec.layers[0].timeout_s is None and spec.layers[0].range == "1"


def test_user_comes_from_the_argument_or_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_USER", "carol")
    assert load_spec_text("name: j\nlayers: [{name: a, command: x}]\n").user == "carol"
    assert load_spec_text("name: j\nlayers: [{name: a, command: x}]\n", user="dave").user == "dave"


def test_single_values_stand_for_lists() -> None:
    spec = load(
        """
        name: j
        layers:
          - {name: a, command: x}
          - {name: b, command: x, tags: t1, depends: a, gpus: 1, gpu_models: "RTX 4090"}
        """
    )
    assert spec.layers[1].tags == ("t1",) and spec.layers[1].depends == (Dependency("a"),)
    assert spec.layers[1].gpu_models == ("RTX 4090",)


def test_dependency_forms() -> None:
    spec = load(
        """
        name: j
        layers:
          - {name: render, command: x, range: 1-10}
          - {name: sim, command: x}
          - name: comp
            command: x
            range: 5-20
            depends: [{layer: render, type: frame}, {layer: sim}, ]
        """
    )
    assert spec.layers[2].depends == (Dependency("render", "frame"), Dependency("sim", "layer"))
    # Frame sets need not match for a frame-by-frame dependency (frames 11-20 have no counterpart).
    assert [c[0] for c in spec.chunks[2]] == list(range(5, 21))


def test_forward_dependencies_are_fine() -> None:
    spec = load("name: j\nlayers: [{name: a, command: x, depends: [b]}, {name: b, command: x}]\n")
    assert spec.layers[0].depends == (Dependency("b"),)


def test_anchors_and_merge_keys_share_settings() -> None:
    spec = load(
        """
        name: j
        x-gpu: &gpu {gpus: 1, gpu_vendor: amd, command: [run.sh, "#IFRAME#"]}
        layers:
          - {<<: *gpu, name: a}
          - {<<: *gpu, name: b, gpus: 2}
        """
    )
    assert [(layer.gpus, layer.gpu_vendor) for layer in spec.layers] == [(1, "AMD"), (2, "AMD")]


# --------------------------------------------------------------------------------------
# Validation errors carry the field path


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": -1}, "layers[0].gpus: must be 0 or more"),
        ({"gpus": 1.5}, "layers[0].gpus: expected a whole number, got a number (1.5)"),
        ({"gpus": True}, "layers[0].gpus: expected a whole number, got a boolean (true)"),
        ({"gpus": "2"}, "layers[0].gpus: expected a whole number"),
        ({"gpus": 10**6}, "layers[0].gpus: must be at most"),
        (
            {"gpus": 1, "gpu_vendor": "NVIDA"},
            "layers[0].gpu_vendor: unknown vendor 'NVIDA' (expected one of NVIDIA, AMD, Apple, Intel)",
        ),
        ({"gpus": 1, "gpu_vendor": 3}, "layers[0].gpu_vendor: unknown vendor"),
        (
            {"gpu_vendor": "NVIDIA"},
            "layers[0].gpu_vendor: only applies to GPU requests; set layers[0].gpus to 1 or more",
        ),
        ({"gpus": 0, "gpu_models": ["A100"]}, "layers[0].gpu_models: only applies to GPU requests"),
        ({"gpu_memory_min": "8G"}, "layers[0].gpu_memory_min: only applies to GPU requests"),
        ({"gpus": 1, "gpu_models": [""]}, "layers[0].gpu_models[0]: invalid GPU model"),
        ({"gpus": 1, "gpu_models": {"a": 1}}, "layers[0].gpu_models: expected a list"),
        ({"gpus": 1, "gpu_memory_min": "lots"}, "layers[0].gpu_memory_min: invalid size 'lots'"),
        ({"gpus": 1, "gpu_memory_min": -5}, "layers[0].gpu_memory_min: invalid size '-5'"),
        ({"memory": "99999999999T"}, "layers[0].memory: '99999999999T' is too large"),
        ({"memory": [1]}, "layers[0].memory: expected a size"),
        ({"cores": 0}, "layers[0].cores: must be more than 0"),
        ({"cores": -1}, "layers[0].cores: must be more than 0"),
        ({"cores": float("nan")}, "layers[0].cores: must be more than 0"),
        ({"cores": "two"}, "layers[0].cores: expected a number of cores"),
        ({"retries": -1}, "layers[0].retries: must be 0 or more"),
        ({"chunk": 0}, "layers[0].chunk: must be 1 or more"),
        ({"timeout": 0}, "layers[0].timeout: must be more than 0"),
        ({"timeout": "soon"}, "layers[0].timeout: invalid duration 'soon'"),
        ({"timeout": float("inf")}, "layers[0].timeout: must be more than 0"),
        ({"range": "1-x"}, "layers[0].range: invalid frame range section '1-x' in '1-x'"),
        ({"range": "1-10x0"}, "layers[0].range: invalid frame range section '1-10x0'"),
        ({"range": True}, "layers[0].range: expected a frame range"),
        ({"range": 1.5}, "layers[0].range: expected a frame range"),
        ({"range": " "}, "layers[0].range: empty frame range"),
        ({"command": []}, "layers[0].command: must not be empty"),
        ({"command": "  "}, "layers[0].command: must not be empty"),
        ({"command": ["", "x"]}, "layers[0].command[0]: the program name must not be empty"),
        ({"command": ["a", None]}, "layers[0].command[1]: expected a string, got nothing (null)"),
        ({"command": ["a", True]}, "layers[0].command[1]: expected a string, got a boolean"),
        ({"command": ["a", "b\x00"]}, "layers[0].command[1]: must not contain NUL"),
        ({"command": {"a": 1}}, "layers[0].command: expected a list of arguments or a shell string, got a mapping"),
        ({"command": None}, "layers[0].command: required"),
        ({"name": None}, "layers[0].name: required"),
        ({"name": "has space"}, "layers[0].name: invalid layer name 'has space'"),
        ({"name": "x" * 101}, "layers[0].name: invalid layer name"),
        ({"env": {"1A": "x"}}, "layers[0].env: invalid variable name '1A'"),
        ({"env": {"A=B": "x"}}, "layers[0].env: invalid variable name 'A=B'"),
        ({"env": {1: "x"}}, "layers[0].env: invalid variable name 1"),
        ({"env": {"A": None}}, "layers[0].env.A: expected a string, number or boolean, got nothing (null)"),
        ({"env": {"A": [1]}}, "layers[0].env.A: expected a string, number or boolean, got a list"),
        ({"env": ["A=1"]}, "layers[0].env: expected a mapping"),
        ({"tags": ["ok", "not ok"]}, "layers[0].tags[1]: invalid tag 'not ok'"),
        ({"tags": [1]}, "layers[0].tags[0]: expected a tag, got a number (1)"),
        ({"depends": ["x"]}, "layers[0].depends[0]: unknown layer 'x'"),
        ({"depends": ["a"]}, "layers[0].depends[0]: layer 'a' cannot depend on itself"),
        ({"depends": [{"layer": "a", "type": "frame"}]}, "layers[0].depends[0]: layer 'a' cannot depend on itself"),
        ({"depends": [{"type": "frame"}]}, "layers[0].depends[0]: missing 'layer'"),
        (
            {"depends": [{"layer": "b", "type": "frames"}]},
            "layers[0].depends[0].type: unknown dependency type 'frames' (expected layer, frame, previous or any)",
        ),
        ({"depends": [{"layr": "b"}]}, "layers[0].depends[0]: unknown key 'layr' (did you mean 'layer'?)"),
        ({"depends": [3]}, "layers[0].depends[0]: expected a string"),
        ({"gpu": 1}, "layers[0]: unknown key 'gpu' (did you mean 'gpus'?)"),
        ({"gpu_memory": "8G"}, "layers[0]: unknown key 'gpu_memory' (did you mean 'gpu_memory_min'?)"),
        ({"frames": "1-3"}, "layers[0]: unknown key 'frames'"),
        ({"priority": 3}, "layers[0]: unknown key 'priority' (a job setting: put it at the top level)"),
        ({"user": "bob"}, "layers[0]: unknown key 'user'"),
    ],
)
def test_layer_errors(fields: dict[str, Any], message: str) -> None:
    assert message in mapping_error(one_layer(**fields))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, "the job spec is empty"),
        ([1, 2], "the job spec must be a mapping with name: and layers:, got a list"),
        ("text", "the job spec must be a mapping"),
        ({"layers": [{"name": "a", "command": "x"}]}, "name: required"),
        ({"name": "", "layers": []}, "name: must not be empty"),
        ({"name": "a\tb", "layers": []}, "name: must not contain control characters"),
        ({"name": "x" * 201, "layers": []}, "name: at most 200 characters"),
        ({"name": 12, "layers": []}, "name: expected a string, got a number (12)"),
        ({"name": "j"}, "layers: required"),
        ({"name": "j", "layers": []}, "layers: needs at least one layer"),
        ({"name": "j", "layers": {"a": 1}}, "layers: expected a list of layers, got a mapping"),
        (
            {"name": "j", "layers": ["render"]},
            "layers[0]: expected a mapping with name: and command:, got a string ('render')",
        ),
        ({"name": "j", "layers": [{"name": "a", "command": "x"}] * 1001}, "layers: at most 1000 layers"),
        ({"name": "j", "user": "bob", "layers": []}, "unknown key 'user' (the job's user is whoever submits it)"),
        ({"name": "j", "priorty": 1, "layers": []}, "unknown key 'priorty' (did you mean 'priority'?)"),
        (
            {"name": "j", "command": "x", "layers": []},
            "unknown key 'command' (a layer setting: put it in an entry of layers:)",
        ),
        ({"name": "j", "priority": "high", "layers": []}, "priority: expected a whole number"),
        ({"name": "j", "paused": "no", "layers": []}, "paused: expected true or false, got a string ('no')"),
        ({"name": "j", "env": {"A B": 1}, "layers": []}, "env: invalid variable name 'A B'"),
        (
            {"name": "j", "layers": [{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]},
            "layers[1].name: duplicate layer name 'a' (also layers[0].name)",
        ),
        (
            {
                "name": "j",
                "layers": [
                    {"name": "a", "command": "x", "depends": ["b", {"layer": "b", "type": "frame"}]},
                    {"name": "b", "command": "x"},
                ],
            },
            "layers[0].depends[1]: depends on 'b' twice (also layers[0].depends[0])",
        ),
        (
            {
                "name": "j",
                "layers": [{"name": "render", "command": "x"}, {"name": "comp", "command": "x", "depends": ["rendr"]}],
            },
            "layers[1].depends[0]: unknown layer 'rendr'; did you mean 'render'?",
        ),
    ],
)
def test_job_errors(data: Any, message: str) -> None:
    assert message in mapping_error(data)


def test_dependency_cycles_are_refused_with_their_path() -> None:
    layers = [
        {"name": "a", "command": "x", "depends": ["b"]},
        {"name": "b", "command": "x", "depends": ["c"]},
        {"name": "c", "command": "x", "depends": [{"layer": "a", "type": "frame"}]},
        {"name": "d", "command": "x", "depends": ["a"]},
    ]
    assert mapping_error({"name": "j", "layers": layers}) == "layers: dependency cycle a -> b -> c -> a"
    two = [{"name": "a", "command": "x", "depends": ["b"]}, {"name": "b", "command": "x", "depends": ["a"]}]
    assert mapping_error({"name": "j", "layers": two}) == "layers: dependency cycle a -> b -> a"


def test_a_diamond_is_not_a_cycle() -> None:
    layers = [
        {"name": "top", "command": "x"},
        {"name": "left", "command": "x", "depends": ["top"]},
        {"name": "right", "command": "x", "depends": ["top"]},
        {"name": "bottom", "command": "x", "depends": ["left", "right"]},
    ]
    assert len(spec_from_mapping({"name": "j", "layers": layers}, user="u").layers) == 4


def test_frame_limit_counts_all_layers() -> None:
    two = {
        "name": "j",
        "layers": [{"name": "a", "command": "x", "range": "1-60"}, {"name": "b", "command": "x", "range": "1-60"}],
    }
    assert mapping_error(two, frame_limit=100) == (
        "the job has at least 120 frames across its layers; the limit is 100 (CUECTL_FRAME_LIMIT)"
    )
    assert sum(len(c) for c in spec_from_mapping(two, user="u", frame_limit=120).chunks) == 120
    # One layer over the limit by itself names that layer.
    assert mapping_error(one_layer(range="1-1000000000")) == (
        "layers[0].range: frame range '1-1000000000' has 1000000000 frames; the limit is 100000 (CUECTL_FRAME_LIMIT)"
    )


def test_repeat_guard_scales_with_the_whole_limit_not_the_remainder() -> None:
    # 150 listed, 5 distinct: fine against a limit of 100 even when only 10 are left.
    data = {
        "name": "j",
        "layers": [
            {"name": "a", "command": "x", "range": "1-90"},
            {"name": "b", "command": "x", "range": ",".join(["1-5"] * 30)},
        ],
    }
    spec = spec_from_mapping(data, user="u", frame_limit=100)
    assert [len(c) for c in spec.chunks] == [90, 5]


def test_frame_limit_defaults_to_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUECTL_FRAME_LIMIT", "5")
    assert "the limit is 5 " in mapping_error(one_layer(range="1-6"))


def test_many_huge_layers_fail_fast_and_small() -> None:
    layers = [{"name": f"l{i}", "command": "x", "range": "1-90000"} for i in range(1000)]
    started = time.perf_counter()
    assert "across its layers" in mapping_error({"name": "j", "layers": layers})
    # Refused before expanding 90 million frames (minutes and gigabytes): a bound that tells
    # the two apart on a loaded machine, not a speed measure (bench/ measures speed).
    assert time.perf_counter() - started < 20


# --------------------------------------------------------------------------------------
# YAML text: syntax, duplicates, bombs


def test_malformed_yaml_names_line_and_column() -> None:
    message = error("name: j\nlayers:\n  - name: a\n    command: [echo\n")
    assert message.startswith("job.yaml: invalid YAML at line 5, column 1:")
    message = error("name: j\nlayers:\n\t- name: a\n")
    assert message.startswith("job.yaml: invalid YAML at line 3, column 1:") and "'\\t'" in message


def test_control_characters_are_located() -> None:
    assert error("name: j\nlayers: [\x01]\n") == (
        "job.yaml: invalid YAML at line 2, column 10: unacceptable character #x0001 (control characters are not allowed)"
    )


def test_duplicate_keys_are_refused() -> None:
    message = error("name: j\nlayers:\n  - name: a\n    command: x\n    gpus: 1\n    gpus: 2\n")
    assert message == "job.yaml: line 6, column 5: duplicate key 'gpus'"
    assert "duplicate key 'name'" in error("name: j\nname: k\nlayers: []\n")


def test_several_documents_are_refused() -> None:
    assert "expected a single document" in error("name: j\n---\nname: k\n")


def test_validation_errors_are_prefixed_with_the_source() -> None:
    assert (
        error("name: j\nlayers: [{name: a, command: x, gpus: -1}]\n") == "job.yaml: layers[0].gpus: must be 0 or more"
    )


def test_yaml_values_that_are_not_strings_are_explained() -> None:
    assert "got a date ('2024-01-01'; quote it" in error("name: 2024-01-01\nlayers: [{name: a, command: x}]\n")
    assert "got a boolean (false)" in error("name: j\nlayers: [{name: no, command: x}]\n")  # YAML 1.1 'no'


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
name: *i
layers: *i
"""


def test_billion_laughs_is_refused_quickly() -> None:
    started = time.perf_counter()
    message = error(BILLION_LAUGHS)
    assert time.perf_counter() - started < 20  # refused unexpanded: 9**9 nodes would take far longer
    assert "refused as a YAML bomb" in message


def test_many_aliases_are_refused() -> None:
    text = "x-a: &a 1\nx-b: [" + ",".join(["*a"] * 10_001) + "]\nname: j\nlayers: [{name: a, command: x}]\n"
    assert "more than 10000 alias references" in error(text)
    ok = "x-a: &a 1\nx-b: [" + ",".join(["*a"] * 100) + "]\nname: j\nlayers: [{name: a, command: x}]\n"
    assert load(ok).name == "j"


def test_recursive_alias_is_refused() -> None:
    assert "recursive alias" in error("name: &n [*n]\nlayers: []\n")


def test_deep_nesting_is_refused_quickly() -> None:
    text = "name: " + "[" * 100_000 + "]" * 100_000 + "\n"
    message = error(text)
    # Refused at the 65th level (unguarded, PyYAML recurses to a RecursionError, its scanner
    # doing work for every open level on every token: seconds)...
    assert message == "job.yaml: invalid YAML at line 1, column 70: nested more than 64 levels deep"
    # ... having read only the start of the text: the work is bounded by the limit, not by
    # the input (counted, not timed: a timing bound fails on a loaded machine).
    loader = spec_module._guarded_loader()(text)
    try:
        with pytest.raises(spec_module._TooDeep):
            loader.get_single_node()
        assert loader.pointer < 10_000
    finally:
        loader.dispose()
    block = "name:\n" + "".join(" " * i + "-\n" for i in range(100))
    assert "nested more than 64 levels deep" in error(block)


def test_empty_document() -> None:
    assert error("# only a comment\n") == "job.yaml: the job spec is empty (expected a mapping with name: and layers:)"


# --------------------------------------------------------------------------------------
# Files


def test_load_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("\ufeffname: j\nlayers: [{name: a, command: x, range: 1-3}]\n", encoding="utf-8")  # BOM is fine
    spec = load_spec_file(path, user="u", frame_limit=10)
    assert spec.name == "j" and spec.chunks == (((1,), (2,), (3,)),)
    assert load_spec_file(str(path), user="u").name == "j"


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"cannot read job spec '.*missing.yaml': No such file"):
        load_spec_file(tmp_path / "missing.yaml")
    with pytest.raises(InvalidInput, match="cannot read job spec"):
        load_spec_file(tmp_path)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(InvalidInput, match=r"latin.yaml: not UTF-8 text \(bad byte at offset 9\)"):
        load_spec_file(latin)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_SPEC_BYTES + 1))
    with pytest.raises(InvalidInput, match="larger than 10 MB"):
        load_spec_file(big)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: j\nlayers: [{name: a, command: x, gpu: 1}]\n")
    with pytest.raises(InvalidInput) as info:
        load_spec_file(bad)
    assert str(info.value) == f"{bad}: layers[0]: unknown key 'gpu' (did you mean 'gpus'?)"


def test_importing_spec_does_not_import_yaml() -> None:
    code = "import sys, cuectl.sched.spec; print('yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------
# The flag form


def test_flags_minimal() -> None:
    spec = spec_from_flags(name="quick", command=["echo", "#IFRAME#"], user="u")
    assert spec == JobSpec(name="quick", user="u", layers=(LayerSpec(name="main", command=("echo", "#IFRAME#")),))
    assert spec.chunks == (((1,),),)


def test_flags_full() -> None:
    spec = spec_from_flags(
        name="train",
        command=["python3", "train.py", "--lr", "0.1"],
        range="1-10",
        chunk=5,
        layer="fit",
        gpus=1,
        gpu_vendor="nvidia",
        gpu_models=["A100", "H100"],
        gpu_memory_min="40G",
        cores=4,
        memory="16G",
        priority=10,
        retries=0,
        timeout="2h",
        env=["A=1", "B=x=y", "A=2", "EMPTY="],
        tags=["ml"],
        paused=True,
        user="u",
    )
    layer = spec.layers[0]
    assert (spec.name, spec.priority, spec.paused) == ("train", 10, True)
    assert layer.name == "fit" and layer.command == ("python3", "train.py", "--lr", "0.1")
    assert (layer.gpus, layer.gpu_vendor, layer.gpu_models, layer.gpu_memory_min_bytes) == (
        1,
        "NVIDIA",
        ("A100", "H100"),
        40 * GIB,
    )
    assert (layer.cores, layer.memory_bytes, layer.retries, layer.timeout_s) == (4.0, 16 * GIB, 0, 7200.0)
    assert layer.env == (("A", "2"), ("B", "x=y"), ("EMPTY", ""))  # split at the first '='; last wins
    assert spec.chunks == (((1, 2, 3, 4, 5), (6, 7, 8, 9, 10)),)


def test_flag_command_is_argv_never_a_shell() -> None:
    spec = spec_from_flags(name="n", command=["echo hi; rm -rf /tmp/x | cat"], user="u")
    assert spec.layers[0].command == ("echo hi; rm -rf /tmp/x | cat",)  # one argv element, as given
    # A plain str from library callers is a shell string (the LayerSpec representation of one).
    assert spec_from_flags(name="n", command="echo $HOME", user="u").layers[0].command == "echo $HOME"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"command": []}, "COMMAND: no command given (put it after --"),
        ({"command": [""]}, "COMMAND[0]: the program name must not be empty"),
        ({"name": " "}, "--name: must not be empty"),
        ({"gpus": -1}, "--gpus: must be 0 or more"),
        ({"gpu_vendor": "nvidia"}, "--gpu-vendor: only applies to GPU requests; set --gpus to 1 or more"),
        ({"gpu_models": ["A100"]}, "--gpu-model: only applies to GPU requests; set --gpus to 1 or more"),
        ({"gpu_memory_min": "8G"}, "--gpu-memory-min: only applies to GPU requests"),
        (
            {"gpus": 1, "gpu_vendor": "NVIDA"},
            "--gpu-vendor: unknown vendor 'NVIDA' (expected one of NVIDIA, AMD, Apple, Intel)",
        ),
        ({"gpus": 1, "gpu_models": ["ok", " "]}, "--gpu-model: invalid GPU model ''"),
        ({"range": "1-x"}, "--range: invalid frame range section '1-x' in '1-x'"),
        ({"range": "1-1000000000"}, "--range: frame range '1-1000000000' has 1000000000 frames"),
        ({"chunk": 0}, "--chunk: must be 1 or more"),
        ({"layer": "a b"}, "--layer: invalid layer name 'a b'"),
        ({"cores": 0}, "--cores: must be more than 0"),
        ({"memory": "8X"}, "--memory: invalid size '8X'"),
        ({"retries": -2}, "--retries: must be 0 or more"),
        ({"timeout": "forever"}, "--timeout: invalid duration 'forever'"),
        ({"env": ["NOEQUALS"]}, "--env: expected NAME=VALUE, got 'NOEQUALS'"),
        ({"env": ["1X=2"]}, "--env: invalid variable name '1X'"),
        ({"env": ["=2"]}, "--env: invalid variable name ''"),
        ({"tags": ["a/b"]}, "--tag: invalid tag 'a/b'"),
        ({"priority": 2**40}, "--priority: must be at most"),
    ],
)
def test_flag_errors_name_the_flag(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"name": "n", "command": ["true"], "user": "u", **kwargs}
    with pytest.raises(InvalidInput) as info:
        spec_from_flags(**args)
    assert message in str(info.value)


def test_flags_single_strings_are_one_value_not_characters() -> None:
    spec = spec_from_flags(name="n", command=["x"], gpus=1, gpu_models="RTX 4090", tags="ml", env="A=1", user="u")
    layer = spec.layers[0]
    assert (layer.gpu_models, layer.tags, layer.env) == (("RTX 4090",), ("ml",), (("A", "1"),))


def test_flag_and_yaml_forms_agree() -> None:
    from_flags = spec_from_flags(
        name="n",
        command=["run", "#IFRAME#"],
        range="1-8x2",
        chunk=2,
        gpus=1,
        gpu_memory_min="8G",
        memory="512",
        timeout="90",
        env=["K=V"],
        tags=["t"],
        user="u",
    )
    from_yaml = load(
        """
        name: n
        layers:
          - {name: main, command: [run, "#IFRAME#"], range: 1-8x2, chunk: 2, gpus: 1, gpu_memory_min: 8G,
             memory: 512, timeout: 90, env: {K: V}, tags: [t]}
        """,
        user="u",
    )
    assert from_flags == from_yaml and from_flags.chunks == from_yaml.chunks == (((1, 3), (5, 7)),)


# --------------------------------------------------------------------------------------
# Properties: nothing but InvalidInput escapes, whatever the document holds

_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["1-10", "1-10x0", "8G", "2h", "NVIDIA", "nvidia", "render", "#IFRAME#", "a", "frame", "-1", "0"]),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=6), st.sampled_from(["layer", "type"])), inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(LAYER_KEYS), _VALUES, max_size=6), _VALUES)
def test_arbitrary_layers_raise_only_invalid_input(fields: dict[str, Any], job_env: Any) -> None:
    data = {
        "name": "j",
        "env": job_env,
        "layers": [{"name": "a", "command": "x", **fields}, {"name": "b", "command": ["y"]}],
    }
    try:
        spec = spec_from_mapping(data, user="u", frame_limit=1000)
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert len(spec.chunks) == len(spec.layers) == 2
    assert all(isinstance(v, str) for layer in spec.layers for _, v in layer.env)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.sampled_from(
            list("ab:-[]{},&*!|>'\"#\n \t0123") + ["name", "layers", "command", "\x01", "é", "&a", "*a", "<<"]
        ),
        max_size=40,
    ).map("".join)
)
def test_arbitrary_yaml_text_raises_only_invalid_input(text: str) -> None:
    try:
        load_spec_text(text, user="u", frame_limit=1000)
    except InvalidInput as exc:
        assert str(exc) and "\n" not in str(exc)


# --------------------------------------------------------------------------------------
# The examples: valid, and their scripts really run (no GPU, no renderer needed)


def test_yaml_in_the_docs_is_valid() -> None:
    import re

    text = (REPO / "docs" / "job-spec.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for block in blocks:
        assert load_spec_text(textwrap.dedent(block), user="u").layers


def test_examples_are_valid() -> None:
    render = load_spec_file(EXAMPLES / "render.yaml", user="u")
    assert [layer.name for layer in render.layers] == ["render", "comp"]
    assert render.layers[0].gpus == 1 and render.layers[1].gpus == 0
    assert render.layers[1].depends == (Dependency("render", "frame"),)
    assert len(render.chunks[0]) == 24
    sweep = load_spec_file(EXAMPLES / "train-sweep.yaml", user="u")
    train, report = sweep.layers
    assert train.gpus == 1 and train.gpu_memory_min_bytes == 4 * GIB
    assert report.depends == (Dependency("train", "layer"),) and isinstance(report.command, str)
    # A tagged layer only runs on a worker with those tags; the examples must run on a plain
    # `cuectl worker` (scripts/demo.sh, CI).
    assert not any(layer.tags for spec in (render, sweep) for layer in spec.layers)


def _run_frame(command: tuple[str, ...] | str, frame: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """What the worker does, minus isolation: substitute #IFRAME# and run from the repo root."""
    if isinstance(command, str):
        argv: list[str] | str = command.replace("#IFRAME#", str(frame))
    else:
        argv = [arg.replace("#IFRAME#", str(frame)) for arg in command]
    if isinstance(argv, list) and argv[0] == "python3":
        argv[0] = sys.executable
    elif isinstance(argv, str):
        argv = argv.replace("python3", sys.executable, 1)
    return subprocess.run(
        argv, shell=isinstance(argv, str), cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


def test_render_example_scripts_run(tmp_path: Path) -> None:
    spec = load_spec_file(EXAMPLES / "render.yaml", user="u")
    render, comp = spec.layers
    env = {
        **os.environ,
        **dict(render.env),
        "EXAMPLE_OUT": str(tmp_path),
        "RENDER_SLEEP": "0",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    missing = _run_frame(comp.command, 2, env)
    assert missing.returncode == 1 and "cannot read the rendered frame" in missing.stderr
    for frame in (1, 2):
        done = _run_frame(render.command, frame, env)
        assert done.returncode == 0, done.stderr
        assert "CUDA_VISIBLE_DEVICES=1" in done.stdout
    first = (tmp_path / "render" / "frame.0001.ppm").read_bytes()
    assert first.startswith(b"P6\n64 48\n255\n") and len(first) == len(b"P6\n64 48\n255\n") + 64 * 48 * 3
    assert first != (tmp_path / "render" / "frame.0002.ppm").read_bytes()  # each frame differs
    assert _run_frame(render.command, 1, env).returncode == 0
    assert (tmp_path / "render" / "frame.0001.ppm").read_bytes() == first  # and is deterministic
    done = _run_frame(comp.command, 2, env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "comp" / "frame.0002.pgm").read_bytes().startswith(b"P5\n64 48\n255\n")


def test_sweep_example_scripts_run(tmp_path: Path) -> None:
    spec = load_spec_file(EXAMPLES / "train-sweep.yaml", user="u")
    train, report = spec.layers
    env = {**os.environ, **dict(train.env), "EXAMPLE_OUT": str(tmp_path), "TRAIN_STEPS": "100"}
    for frame in spec.chunks[0]:
        done = _run_frame(train.command, frame[0], env)
        assert done.returncode == 0, done.stderr
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("run-*.json"))]
    assert [r["lr"] for r in runs] == [0.5, 0.2, 0.1, 0.05, 0.02, 0.01]
    assert runs[0]["diverged"] is True and runs[0]["loss"] is None  # lr 0.5 is too large
    assert all(r["loss"] < 0.1 for r in runs[1:4])
    done = _run_frame(report.command, 1, env)
    assert done.returncode == 0, done.stderr
    best = json.loads((tmp_path / "sweep" / "best.json").read_text())
    assert best["lr"] == min(runs[1:], key=lambda r: r["loss"])["lr"]


# -- job names that read as ids ----------------------------------------------------------
# JOB arguments take an id or a name, and a purely numeric argument means the id, so a job
# named "42" could never be addressed by its name: such names are refused at submit.
@pytest.mark.parametrize("name", ["42", "0", " 7 ", "0042", "٤٢", "²"])
def test_purely_numeric_job_names_are_refused(name: str) -> None:
    message = error(f"name: {json.dumps(name)}\nlayers: [{{name: a, command: x}}]\n")
    assert "job.yaml: name: a job name must not be only digits" in message and "job id" in message, message
    with pytest.raises(InvalidInput) as info:
        spec_from_flags(name=name, command=["true"], user="u")
    assert str(info.value).startswith("--name: a job name must not be only digits")


@pytest.mark.parametrize("name", ["42a", "v2", "4-2", "1.5", "-1", "shot 42", "#42"])
def test_job_names_with_digits_and_more_are_fine(name: str) -> None:
    assert load(f"name: {json.dumps(name)}\nlayers: [{{name: a, command: x}}]\n").name == name
    assert spec_from_flags(name=name, command=["true"], user="u").name == name
