#!/usr/bin/env bash
# Regenerate the Python modules of cuectl's own gRPC proto (src/cuectl/cuebot/proto/) after
# editing cuectl_gpu.proto. The generated files are committed, so installing cuectl needs no
# protoc; tests/cuebot/test_gpu_proto_fresh.py fails while they differ from this output.
# Needs grpcio-tools in the venv (.venv/bin/pip install grpcio-tools; opencue-proto pulls it in).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-.venv/bin/python}"
# -Isrc: the modules are named by their package path, so the _grpc module imports
# `from cuectl.cuebot.proto import cuectl_gpu_pb2` and works from an installed wheel.
"$python" -m grpc_tools.protoc -Isrc --python_out=src --grpc_python_out=src --pyi_out=src \
    src/cuectl/cuebot/proto/cuectl_gpu.proto
