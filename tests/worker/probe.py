"""A frame command for worker tests: records what it saw, optionally sleeps and fails.

Usage: probe.py LEDGER [--sleep S] [--exit N] [--fail-times N]
Appends one JSON line at start and one at end (or "killed" on SIGTERM) to LEDGER
(O_APPEND: atomic per line).
--fail-times N: exit 1 on the first N attempts (CUE_ATTEMPT), then succeed.
"""

import json
import os
import signal
import sys
import time

KEYS = (
    "CUE_JOB",
    "CUE_JOB_ID",
    "CUE_LAYER",
    "CUE_LAYER_ID",
    "CUE_FRAME_ID",
    "CUE_IFRAME",
    "CUE_FRAME",
    "CUE_RANGE",
    "CUE_CHUNK",
    "CUE_ATTEMPT",
    "CUE_THREADS",
    "CUE_MEMORY",
    "CUE_GPUS",
    "CUE_GPU_CORES",
    "CUE_GPU_UUIDS",
    "CUE_GPU_MEMORY",
    "CUE_LOG_PATH",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "EXTRA",
)


def record(path, event, **extra):
    line = (
        json.dumps(
            {"event": event, "t": time.time(), "pid": os.getpid(), "env": {k: os.environ.get(k) for k in KEYS}, **extra}
        )
        + "\n"
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)


def main(argv):
    ledger = argv[0]
    args = dict(zip(argv[1::2], argv[2::2]))

    def on_term(signum, frame):
        # Killed by cuectl (timeout, user kill, orphan clean-up): say so, so a test can
        # close this run's interval on its device.
        record(ledger, "killed", signal=signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    record(ledger, "start")
    time.sleep(float(args.get("--sleep", 0)))
    code = int(args.get("--exit", 0))
    if int(os.environ.get("CUE_ATTEMPT", "1")) <= int(args.get("--fail-times", 0)):
        code = 1
    record(ledger, "end", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
