"""OpenCue's wire protocol (gRPC), served from a cuectl store: docs/opencue-grpc.md.

``server`` (``cuectl serve --opencue``), ``peer`` (who calls: the uid owning the client's
loopback connection), ``call`` (one call: its caller, its store, the one way it changes
things), ``jobs`` (job, layer, frame, group and show methods), ``farm`` (hosts, procs,
allocations, services, limits), ``convert`` (cuectl's shapes to OpenCue's messages),
``cache`` (reads shared between clients for a moment), ``gpu_service`` (cuectl's own
``GpuInterface``).
"""
