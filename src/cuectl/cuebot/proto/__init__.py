"""cuectl's own gRPC proto (``cuectl.gpu.v1``: per-device GPU data) and its generated modules.

``cuectl_gpu.proto`` is the source; ``cuectl_gpu_pb2.py``, ``cuectl_gpu_pb2.pyi`` and
``cuectl_gpu_pb2_grpc.py`` are generated from it by scripts/gen-proto.sh and committed
(tests/cuebot/test_gpu_proto_fresh.py checks they are current). Never edit them by hand.
"""
