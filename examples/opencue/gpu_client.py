"""Read cuectl's per-device GPU data (the cuectl.gpu.v1 proto) from `cuectl serve --opencue`,
as a pycue script talks to Cuebot: a plain gRPC channel to the server CUEBOT_HOSTS names.

    python examples/opencue/gpu_client.py --host demo-workstation --frame render/0001-beauty \\
        --job render --layer beauty          # each flag optional; --server HOST:PORT too
"""

import argparse
import os

import grpc

from cuectl.cuebot.proto import cuectl_gpu_pb2 as gpu
from cuectl.cuebot.proto import cuectl_gpu_pb2_grpc as gpu_grpc

GIB = 1024 ** 3


def server_address() -> str:
    """pycue's rule: the first of CUEBOT_HOSTS (comma or space separated), on port 8443."""
    first = (os.environ.get("CUEBOT_HOSTS") or "127.0.0.1").replace(",", " ").split()[0]
    return first if ":" in first else f"{first}:8443"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=server_address())
    ap.add_argument("--host"), ap.add_argument("--frame"), ap.add_argument("--job"), ap.add_argument("--layer")
    args = ap.parse_args()
    with grpc.insecure_channel(args.server) as channel:
        stub = gpu_grpc.GpuInterfaceStub(channel)
        if args.host:
            for d in stub.GetHostGpus(gpu.GetHostGpusRequest(host=args.host), timeout=10).devices:
                # An unset live value is unknown now (not sampled for two intervals).
                util = f"{d.utilization_pct:.0f}%" if d.HasField("utilization_pct") else "?"
                used = f"{d.memory_used_bytes / GIB:.1f}" if d.HasField("memory_used_bytes") else "?"
                print(f"gpu {d.index} {d.model} ({d.vendor}) {used}/{d.memory_bytes / GIB:.1f} GiB {util} "
                      f"holder: {d.holder or 'free'}")
        if args.frame:
            usage = stub.GetFrameGpuUsage(gpu.GetFrameGpuUsageRequest(frame_id=args.frame), timeout=10)
            for u in usage.current:
                print(f"frame {usage.frame_id} now on {u.device_id}: {u.utilization_pct:.0f}% "
                      f"{u.memory_used_bytes / GIB:.1f} GiB")
            for u in usage.summary:
                print(f"frame {usage.frame_id} attempt {usage.attempt} on {u.device_id}: mean "
                      f"{u.utilization_mean_pct:.1f}% max {u.utilization_max_pct:.0f}% peak "
                      f"{u.memory_peak_bytes / GIB:.1f} GiB {u.gpu_seconds:.1f} gpu-s")
        if args.job and args.layer:
            r = stub.GetLayerGpuRequest(gpu.GetLayerGpuRequestRequest(job=args.job, layer=args.layer),
                                        timeout=10).request
            print(f"layer {args.layer}: {r.gpus} gpus, vendor {r.gpu_vendor or 'any'}, models "
                  f"{', '.join(r.gpu_models_allowed) or 'any'}, at least {r.min_gpu_memory_bytes / GIB:g} GiB each")


if __name__ == "__main__":
    main()
