#!/usr/bin/env python3
"""What dependencies between jobs cost the claim and completion paths, on SQLite and
PostgreSQL, measured side by side in the same run (issue 18: no loss of claim throughput).

Prints:
  1. claims/s of runnable frames with 1, 4 and 16 claimer processes (as bench_claims.py),
     alone and with ``--waiting`` jobs of 10 DEPEND frames each queued ahead of them (higher
     priority), each waiting (job on job) on a gate job nobody runs, and the ratio;
  2. claim + complete per second of one claimer through frames that each release a frame of
     another job (frame by frame, across jobs), next to the same frames with no dependents.

Usage: python bench/bench_depends.py [--frames N] [--waiting N] [--repeat N] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_claims import CLAIMERS, Backends, claim_rate, user  # noqa: E402


def submit_waiting(url: str, jobs: int) -> None:
    """A gate job no CPU claimer can run (it needs an AMD GPU) and ``jobs`` jobs of 10
    frames at priority 10 that each wait on it: DEPEND frames ahead of everything."""
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    store = open_store(url)
    gate = store.submit(
        spec_from_mapping(
            {"name": "gate", "layers": [{"name": "r", "command": ["true"], "gpus": 1, "gpu_vendor": "AMD"}]},
            user=user(),
        ),
        now=time.time(),
    )
    for i in range(jobs):
        store.submit(
            spec_from_mapping(
                {
                    "name": f"waits-{i}",
                    "priority": 10,
                    "depends": [str(gate)],
                    "layers": [{"name": "r", "command": ["true"], "range": "1-10"}],
                },
                user=user(),
            ),
            now=time.time(),
        )
    store.close()


def complete_rate(url: str, frames: int, dependents: bool) -> float:
    """Claims and completions per second of one claimer through ``frames`` frames of job
    ``up``; with ``dependents``, job ``down`` waits on it frame by frame (each completion
    releases one frame of another job)."""
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import FrameResult, open_store

    store = open_store(url)
    up = store.submit(
        spec_from_mapping(
            {"name": "up", "layers": [{"name": "r", "command": ["true"], "range": f"1-{frames}"}]},
            user=user(),
            frame_limit=frames,
        ),
        now=time.time(),
    )
    down = None
    if dependents:
        down = store.submit(
            spec_from_mapping(
                {
                    "name": "down",
                    "layers": [
                        {
                            "name": "c",
                            "command": ["true"],
                            "range": f"1-{frames}",
                            "depends": [{"job": str(up), "layer": "r", "type": "frame"}],
                        }
                    ],
                },
                user=user(),
                frame_limit=frames,
            ),
            now=time.time(),
        )
    layer = next(lay.layer_id for lay in store.runnable_layers() if lay.job_id == up)
    t0 = time.perf_counter()
    done = 0
    while (
        c := store.claim_frame(layer, host="h", worker="h:1", gpu_uuids=[], now=time.time(), lease_s=3600)
    ) is not None:
        store.complete_frame(
            c.frame_id,
            c.attempt,
            FrameResult(exit_code=0, started_at=time.time(), ended_at=time.time()),
            now=time.time(),
        )
        done += 1
    elapsed = time.perf_counter() - t0
    assert done == frames, f"completed {done} of {frames}"
    if down is not None:
        waiting = store.list_frames(job=down, state="WAITING", limit=1)[1]
        assert waiting == frames, f"{waiting} of {frames} dependents released"
    store.close()
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8000, help="runnable frames claimed per measurement")
    parser.add_argument("--waiting", type=int, default=1000, help="jobs of 10 DEPEND frames queued ahead")
    parser.add_argument("--complete-frames", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3, help="alternating runs per figure (median)")
    parser.add_argument("--pg-url", help="an existing PostgreSQL database instead of a throwaway server")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cuectl-bench-") as tmp_name:
        backends = Backends(Path(tmp_name), args.pg_url)
        print(
            f"claims/s of {args.frames:,} runnable frames, alone and with {args.waiting * 10:,} DEPEND frames "
            f"({args.waiting:,} jobs waiting on another job) queued ahead; median of {args.repeat}"
        )
        print(
            f"{'claimers':>8}  {'SQLite alone':>13}  {'with deps':>10}  {'ratio':>6}   "
            f"{'PostgreSQL alone':>16}  {'with deps':>10}  {'ratio':>6}"
        )
        for n in CLAIMERS:
            cells = []
            for fresh in (backends.sqlite, backends.postgres):
                plain, waiting = [], []
                for _ in range(args.repeat):  # interleaved: both see the same machine load
                    plain.append(claim_rate(fresh(), args.frames, n)["rate"])
                    url = fresh()
                    submit_waiting(url, args.waiting)
                    waiting.append(claim_rate(url, args.frames, n)["rate"])
                a, b = statistics.median(plain), statistics.median(waiting)
                cells.append(f"{a:>13,.0f}  {b:>10,.0f}  {b / a:>6.2f}")
            print(f"{n:>8}  {cells[0]}   {cells[1]:>36}")

        print(
            f"\none claimer, claim + complete of {args.complete_frames:,} frames; each releasing a frame of "
            "another job (frame by frame) vs none; median of",
            args.repeat,
        )
        for label, fresh in (("SQLite", backends.sqlite), ("PostgreSQL", backends.postgres)):
            plain, released = [], []
            for _ in range(args.repeat):
                plain.append(complete_rate(fresh(), args.complete_frames, False))
                released.append(complete_rate(fresh(), args.complete_frames, True))
            a, b = statistics.median(plain), statistics.median(released)
            print(f"  {label:<11} {a:8,.0f}/s without dependents, {b:8,.0f}/s releasing one each: ratio {b / a:.2f}")


if __name__ == "__main__":
    main()
