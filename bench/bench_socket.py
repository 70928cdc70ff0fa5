#!/usr/bin/env python3
"""The store behind `cuectl serve --socket` (a machine several people use, issue 35) next to
the same store opened as a file, measured in the same run.

Builds a SQLite store with N one-frame jobs (default 1,000), starts a real `cuectl serve
--socket` on it, then:
  1. per call, in one process: `get_job`, `list_jobs` (every job) and `submit` (a one-frame
     job), R times each (default 200), through the socket (`unix:` URL, sched/store/remote.py)
     and on the file itself (SQLiteStore): median and p99 in ms;
  2. whole commands, as a user types them: `cuectl job list`, `cuectl job show ID` and
     `cuectl submit -- true`, K times each (default 15), through the socket and on the file:
     median wall in ms (the interpreter's start-up is in both).
Target: a command through the socket within 1.25x of the same command on the file, and
within 50 ms of it. Figures are printed with whether the target was met; nothing is asserted.

Usage: python bench/bench_socket.py [--jobs N] [--calls R] [--commands K]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from cuectl.sched.spec import spec_from_flags
from cuectl.sched.store import open_store

RATIO_TARGET = 1.25
EXTRA_MS_TARGET = 50.0


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def spec(name: str):
    return spec_from_flags(name=name, command=["true"], user=os.environ.get("USER") or "bench", frame_limit=10)


def timed(fn: Callable[[], object], times: int) -> list[float]:
    out = []
    for _ in range(times):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


def start_server(db: Path, sock: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*cuectl(), "--db", str(db), "serve", "--socket", str(sock), "--no-access-log"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not (sock.exists() and os.stat(sock).st_mode & 0o002):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"cuectl serve --socket did not start: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--commands", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cuectl-bench-sock-", dir="/tmp") as tmp:
        db, sock = Path(tmp) / "q.db", Path(tmp) / "q.sock"
        store = open_store(str(db))
        for i in range(args.jobs):
            store.submit(spec(f"job-{i}"), now=time.time())
        store.close()
        server = start_server(db, sock)
        try:
            print(f"store: {args.jobs} one-frame jobs; socket: {sock}")
            print("\n1. per call (ms, one process)            median      p99   | file median      p99  | ratio")
            ways = {"socket": open_store(f"unix:{sock}"), "file": open_store(str(db))}
            calls: dict[str, Callable[[object], Callable[[], object]]] = {
                "get_job": lambda s: lambda: s.get_job(1),  # type: ignore[attr-defined]
                "list_jobs (all)": lambda s: lambda: s.list_jobs(),  # type: ignore[attr-defined]
                "submit": lambda s: lambda: s.submit(spec("more"), now=time.time()),  # type: ignore[attr-defined]
            }
            for label, make in calls.items():
                via = {way: timed(make(s), args.calls) for way, s in ways.items()}
                sm, fm = statistics.median(via["socket"]), statistics.median(via["file"])
                print(
                    f"   {label:<36} {sm:8.2f} {p99(via['socket']):8.2f}   | {fm:8.2f} {p99(via['file']):8.2f}"
                    f"  | {sm / fm:5.2f}x"
                )
            for s in ways.values():
                s.close()
            print("\n2. whole commands (ms, median wall)          socket      file   ratio  extra  target")
            env = dict(os.environ)
            commands = {
                "job list": ["job", "list"],
                "job show 1": ["job", "show", "1"],
                "submit -- true": ["submit", "--name", "cmd", "--", "true"],
            }
            for label, words in commands.items():
                walls = {}
                for way, db_arg in (("socket", f"unix:{sock}"), ("file", str(db))):
                    walls[way] = statistics.median(
                        timed(
                            lambda: subprocess.run(
                                [*cuectl(), "--db", db_arg, *words], env=env, capture_output=True, check=True
                            ),
                            args.commands,
                        )
                    )
                ratio, extra = walls["socket"] / walls["file"], walls["socket"] - walls["file"]
                met = "met" if ratio <= RATIO_TARGET and extra <= EXTRA_MS_TARGET else "NOT met"
                print(f"   {label:<38} {walls['socket']:8.1f} {walls['file']:8.1f}  {ratio:5.2f}x {extra:6.1f}  {met}")
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
