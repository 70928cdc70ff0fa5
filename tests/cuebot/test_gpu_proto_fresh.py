"""cuectl's own proto (src/cuectl/cuebot/proto/cuectl_gpu.proto) and the Python modules
generated from it and committed: they must say the same thing, and the .proto must ship.

Regenerating is scripts/gen-proto.sh; these tests run the same protoc (grpcio-tools) into a
temporary directory and compare."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO / "src" / "cuectl" / "cuebot" / "proto"
PROTO = PROTO_DIR / "cuectl_gpu.proto"
GENERATED = ("cuectl_gpu_pb2.py", "cuectl_gpu_pb2.pyi", "cuectl_gpu_pb2_grpc.py")
FIX = "regenerate with scripts/gen-proto.sh and commit the result"


def _protoc(out: Path, *flags: str) -> None:
    """Run protoc as scripts/gen-proto.sh does (-Isrc, so the modules are named by package)."""
    out.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'src'}", *flags, str(PROTO)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, f"protoc failed: {res.stderr}"


def test_committed_modules_are_what_protoc_generates_now(tmp_path: Path) -> None:
    _protoc(tmp_path, f"--python_out={tmp_path}", f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}")
    import grpc_tools

    from cuectl.cuebot.proto import cuectl_gpu_pb2_grpc

    made = tmp_path / "cuectl" / "cuebot" / "proto"
    stale = [name for name in GENERATED if (made / name).read_bytes() != (PROTO_DIR / name).read_bytes()]
    version = getattr(grpc_tools, "__version__", None) or _dist_version("grpcio-tools")
    assert not stale, (
        f"{', '.join(stale)} differ from what protoc makes of cuectl_gpu.proto: {FIX} "
        f"(committed from grpcio-tools {cuectl_gpu_pb2_grpc.GRPC_GENERATED_VERSION}, "
        f"installed: {version})"
    )


def test_committed_descriptor_is_the_proto_files(tmp_path: Path) -> None:
    """The same check by meaning, whatever grpcio-tools version is installed: the message
    and service definitions compiled into cuectl_gpu_pb2 are those of the .proto now."""
    from google.protobuf import descriptor_pb2

    from cuectl.cuebot.proto import cuectl_gpu_pb2

    out = tmp_path / "set.pb"
    _protoc(tmp_path, f"--descriptor_set_out={out}")
    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    _drop_json_names(fresh)  # a descriptor set spells them out; the generated module leaves them implied
    committed = descriptor_pb2.FileDescriptorProto.FromString(cuectl_gpu_pb2.DESCRIPTOR.serialized_pb)
    assert committed == fresh, f"cuectl_gpu_pb2.py does not match cuectl_gpu.proto: {FIX}"
    assert fresh.package == "cuectl.gpu.v1"
    assert [s.name for s in fresh.service] == ["GpuInterface"]
    assert [r.name for r in fresh.service[0].method] == ["GetHostGpus", "GetFrameGpuUsage", "GetLayerGpuRequest"]


def _drop_json_names(file: Any) -> None:
    def walk(message: Any) -> None:
        for field in message.field:
            field.ClearField("json_name")
        for nested in message.nested_type:
            walk(nested)

    for message in file.message_type:
        walk(message)


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "none"


def test_the_proto_and_generated_modules_are_in_the_built_package(tmp_path: Path) -> None:
    # setuptools' build_py (what fills a wheel with modules and package data), on a copy,
    # as tests/test_packaging.py does: the checkout gets no build/ or egg-info.
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(
        REPO / "src" / "cuectl", project / "src" / "cuectl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    out = tmp_path / "lib"
    subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore",
            "-c",
            "from setuptools import setup; setup()",
            "-q",
            "build_py",
            "--build-lib",
            str(out),
        ],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=120,
    )
    built = out / "cuectl" / "cuebot" / "proto"
    for name in ("cuectl_gpu.proto", "__init__.py", *GENERATED):
        assert (built / name).is_file(), f"{name} is missing from the built package"
    assert (built / "cuectl_gpu.proto").read_bytes() == PROTO.read_bytes()
