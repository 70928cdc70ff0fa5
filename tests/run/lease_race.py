"""Many real processes racing for leases, started fast: one warmed-up parent forks them.

    python lease_race.py '{"n": 100, "wait": false}'
    python lease_race.py '{"n": 100, "wait": true, "work_s": 0.02, "occupancy_dir": "/tmp/occ"}'

The parent imports cuectl and discovers the (fake) GPUs once — what a real caller pays
once, "after the first discovery" — then forks ``n`` children. Every child blocks on a
barrier pipe until all exist, so they call ``cuectl.lease(gpus=1)`` together.

- ``wait=false``: a winner reports ``won <uuid>`` and keeps its lease until every child has
  reported (a second barrier), so the losers really raced against held devices; a loser
  reports ``busy`` (DevicesBusy, exit 1).
- ``wait=true``: each child, once leased, claims ``<occupancy_dir>/<uuid>`` with O_EXCL (an
  overlap — two holders of one device — makes that fail), works ``work_s``, gives the claim
  back and releases; it reports ``done <uuid>`` or ``overlap <uuid>``.

Prints one JSON summary: counts, exit statuses, and any unexpected error text.
"""

from __future__ import annotations

import json
import os
import sys
import time


def child(params: dict, barrier_r: int, release_r: int, report_w: int) -> int:
    import cuectl
    from cuectl.errors import DevicesBusy

    os.read(barrier_r, 1)  # EOF when the parent closes the write end: everyone starts at once
    label = f"racer-{os.getpid()}"
    try:
        held = cuectl.lease(gpus=1, wait=params["wait"], timeout=params.get("timeout"), label=label)
    except DevicesBusy:
        os.write(report_w, b"busy\n")
        return 1
    except Exception as exc:  # reported, so the test shows it instead of a bare exit status
        os.write(report_w, f"error {type(exc).__name__}: {exc}\n".replace("\n", " ").encode()[:400] + b"\n")
        return 3
    uuid = held.uuids[0]
    if not params["wait"]:
        os.write(report_w, f"won {uuid}\n".encode())
        os.read(release_r, 1)  # hold until every racer has reported
        held.release()
        return 0
    claim = os.path.join(params["occupancy_dir"], uuid)
    try:
        fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        os.write(report_w, f"overlap {uuid}\n".encode())
        return 4
    time.sleep(params.get("work_s", 0.0))  # the "training": holding the device for a while
    os.close(fd)
    os.unlink(claim)
    held.release()
    os.write(report_w, f"done {uuid}\n".encode())
    return 0


def main() -> int:
    params = json.loads(sys.argv[1])
    import cuectl

    cuectl.lease(gpus=0)  # import everything and discover once, before forking
    barrier_r, barrier_w = os.pipe()
    release_r, release_w = os.pipe()
    report_r, report_w = os.pipe()
    pids = []
    for _ in range(params["n"]):
        pid = os.fork()
        if pid == 0:
            os.close(barrier_w)
            os.close(release_w)
            os.close(report_r)
            code = 5
            try:
                code = child(params, barrier_r, release_r, report_w)
            finally:
                os._exit(code)
        pids.append(pid)
    for fd in (barrier_r, release_r, report_w):
        os.close(fd)
    started = time.monotonic()
    os.close(barrier_w)  # go
    lines: list[str] = []
    with os.fdopen(report_r, "r") as reports:
        while len(lines) < len(pids):
            line = reports.readline()
            if not line:
                break
            lines.append(line.strip())
            if not params["wait"] and len(lines) == len(pids):
                break
    os.close(release_w)  # winners may let go now
    codes: dict[str, int] = {}
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        key = str(os.waitstatus_to_exitcode(status))
        codes[key] = codes.get(key, 0) + 1
    words = [line.split(" ", 1) for line in lines]
    summary = {
        "n": len(pids),
        "seconds": round(time.monotonic() - started, 3),
        "won": sorted(w[1] for w in words if w[0] == "won"),
        "busy": sum(1 for w in words if w[0] == "busy"),
        "done": sorted(w[1] for w in words if w[0] == "done"),
        "overlaps": [w[1] for w in words if w[0] == "overlap"],
        "errors": [" ".join(w) for w in words if w[0] == "error"],
        "exit_codes": codes,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
