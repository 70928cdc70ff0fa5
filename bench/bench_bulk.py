#!/usr/bin/env python3
"""Bulk job actions (issue 17, item 8): kill N jobs at once next to killing them one by one.

Prints:
  1. wall time of `cuectl job kill --user USER --yes` over N one-frame jobs (the whole
     process: start-up, selection, one ownership check, one transaction; goal: under 2 s
     for 1,000 jobs);
  2. the peer: `cuectl job kill ID` one process per job, timed over a sample of jobs and
     extrapolated to N (how it was done before: 195 jobs took 74 s);
  3. the ratio, and the same bulk kill through the store alone (store.kill_jobs).

Jobs are submitted in-process (store.submit). Usage:
  python bench/bench_bulk.py [--jobs N] [--sample N] [--db URL]   (default: a new SQLite file)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cuectl.sched.spec import spec_from_flags
from cuectl.sched.store import open_store

USER = "bulkbench"


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def submit_jobs(url: str, n: int, user: str) -> list[int]:
    store = open_store(url)
    try:
        now = time.time()
        return [
            store.submit(spec_from_flags(name=f"bulk-{i:05d}", command=["true"], range="1", user=user), now=now)
            for i in range(n)
        ]
    finally:
        store.close()


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        sys.exit(f"{' '.join(argv[-4:])} failed: {res.stderr.strip()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs killed at once (default 1000)")
    parser.add_argument("--sample", type=int, default=20, help="jobs killed one by one (default 20)")
    parser.add_argument("--db", help="store URL (default: a new SQLite file in a temporary directory)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cuectl-bench-bulk-") as tmp:
        url = args.db or str(Path(tmp) / "bench.db")
        base = [*cuectl(), "--db", url]
        # Unique labels per run, so a reused --db store does not mix runs.
        tag = f"{USER}{int(time.time() * 1000) % 10**8}"
        t0 = time.perf_counter()
        submit_jobs(url, args.jobs, tag)
        took_submit = time.perf_counter() - t0

        bulk = timed([*base, "job", "kill", "--user", tag, "--yes"])
        check = json.loads(
            subprocess.run(
                [*base, "job", "list", "--user", tag, "--state", "KILLED", "--json"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )["jobs"]
        if len(check) != args.jobs:
            sys.exit(f"bulk kill killed {len(check)} of {args.jobs} jobs")

        one_tag = tag + "one"
        sample_ids = submit_jobs(url, args.sample, one_tag)
        one_by_one = sum(timed([*base, "job", "kill", str(job_id)]) for job_id in sample_ids)
        per_job = one_by_one / max(1, args.sample)

        store_tag = tag + "st"
        ids = submit_jobs(url, args.jobs, store_tag)
        store = open_store(url)
        try:
            t0 = time.perf_counter()
            store.kill_jobs(ids, now=time.time())
            in_store = time.perf_counter() - t0
        finally:
            store.close()

    n = args.jobs
    print(
        f"store: {n} one-frame jobs submitted in {took_submit:.2f} s ({url.split('://')[0] if '://' in url else 'sqlite'})"
    )
    print(f"cuectl job kill --user U --yes   {n:>6} jobs  {bulk:8.2f} s  (whole process)   [target < 2 s per 1,000]")
    print(
        f"cuectl job kill ID, one by one   {n:>6} jobs  {per_job * n:8.2f} s  "
        f"(extrapolated: {per_job * 1000:.0f} ms per job over a sample of {args.sample})"
    )
    print(f"store.kill_jobs                  {n:>6} jobs  {in_store:8.2f} s  (in-process, one transaction)")
    print(f"bulk is {per_job * n / bulk:.0f}x faster than one by one")


if __name__ == "__main__":
    main()
