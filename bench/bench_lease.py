"""Lease latency, uncontended: figures to read, never assertions.

    .venv/bin/python bench/bench_lease.py [--iterations 2000] [--runs 20]

1. ``cuectl.lease()`` acquire + release in-process: the first call (which discovers the
   GPUs) and then every later one (goal: median under 100 µs), side by side with the
   floor — a raw ``os.open`` + ``flock`` + ``os.write`` + ``close`` of one lock file in
   the same directory, in the same run.
2. Whole processes: ``cuectl run -- true`` next to plain ``true``, ``python -c 'import
   cuectl'`` (the import-plus-spawn floor; goal: ``run -- true`` under 1.5× it), and a
   Python process that takes and drops one lease.

Uses four fake GPUs and a private lock directory unless CUECTL_FAKE_GPUS / --lock-dir say
otherwise, so it never touches the machine's real leases. The private directory is made
on /dev/shm when there is one — a tmpfs, like the default lock directories
(/run/cuectl/locks, /dev/shm/cuectl-locks); on a disk filesystem every record write and
truncation costs a few µs more.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAKE = """devices:
""" + "".join('  - {model: "Tesla V100-SXM2-16GB", vendor: NVIDIA, memory: 16160MiB}\n' for _ in range(4))

# Used when the full CLI cannot be imported: the same commands on a minimal root app.
MINI_CLI = """
import sys, typer
from cuectl.cli.lease_cmds import RUN_CONTEXT_SETTINGS, run_cmd
app = typer.Typer(add_completion=False)
app.command("run", context_settings=RUN_CONTEXT_SETTINGS)(run_cmd)
app.command("noop")(lambda: None)
sys.exit(app(standalone_mode=False))
"""


def percentiles(samples_s: list[float]) -> str:
    ms = sorted(s * 1e3 for s in samples_s)

    def pick(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    return (f"median {statistics.median(ms):.3f} ms  p95 {pick(0.95):.3f} ms  p99 {pick(0.99):.3f} ms  "
            f"max {ms[-1]:.3f} ms")


def floor_once(path: str) -> None:
    """The least a lease can cost: open the lock file, lock it, write a record, close."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, b'{"pid":1}')
    finally:
        os.close(fd)


def bench_in_process(iterations: int, lock_dir: str) -> None:
    import cuectl

    t0 = time.perf_counter()
    cuectl.lease(gpus=1).release()
    first = time.perf_counter() - t0
    floor_path = os.path.join(lock_dir, "bench-floor.lock")
    samples, floor = [], []
    for _ in range(iterations):  # interleaved, so that both see the same machine
        t0 = time.perf_counter()
        with cuectl.lease(gpus=1):
            pass
        samples.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        floor_once(floor_path)
        floor.append(time.perf_counter() - t0)
    os.unlink(floor_path)
    print(f"cuectl.lease(gpus=1) acquire+release, first call (discovery): {first * 1e3:.1f} ms")
    print(f"cuectl.lease(gpus=1) acquire+release, next {iterations}: {percentiles(samples)}")
    print(f"floor: os.open+flock+write+close, same run: {percentiles(floor)}")
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        with cuectl.lease(gpus=2, gpu_memory_min="16G"):
            pass
        samples.append(time.perf_counter() - t0)
    print(f"cuectl.lease(gpus=2, gpu_memory_min='16G') (samples free memory), next {iterations}: {percentiles(samples)}")


def time_process(argv: list[str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=120)
        samples.append(time.perf_counter() - t0)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return samples


def cuectl_argv() -> tuple[list[str], str]:
    exe = Path(sys.executable).with_name("cuectl")
    probe = subprocess.run([sys.executable, "-c", "import cuectl.cli.main"], capture_output=True)
    if exe.exists() and probe.returncode == 0:
        return [str(exe)], "cuectl"
    return [sys.executable, "-c", MINI_CLI], "cuectl (minimal app: cuectl.cli.main not importable)"


def bench_processes(runs: int) -> None:
    true = shutil.which("true") or "/bin/true"
    base, name = cuectl_argv()
    rows = [
        ("true", [true]),
        (f"{name} run -- true", [*base, "run", "--", true]),
        ("python -c 'pass'", [sys.executable, "-c", "pass"]),
        ("python -c 'import cuectl'", [sys.executable, "-c", "import cuectl"]),
        ("python -c 'cuectl.lease(gpus=1).release()'",
         [sys.executable, "-c", "import cuectl; cuectl.lease(gpus=1).release()"]),
    ]
    width = max(len(label) for label, _ in rows)
    print(f"\nwhole processes, {runs} runs each (wall time):")
    for label, argv in rows:
        print(f"  {label.ljust(width)}  {percentiles(time_process(argv, runs))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--lock-dir", help="lock directory (default: a fresh temporary one)")
    args = parser.parse_args()
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="cuectl-bench-", dir=shm) as tmp:
        if not os.environ.get("CUECTL_FAKE_GPUS"):
            fake = Path(tmp) / "gpus.yaml"
            fake.write_text(FAKE)
            os.environ["CUECTL_FAKE_GPUS"] = str(fake)
        os.environ["CUECTL_LOCK_DIR"] = args.lock_dir or str(Path(tmp) / "locks")
        os.environ["CUECTL_CREATE_LOCK_DIR"] = "1"  # a throwaway lock dir of its own
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, lock dir {os.environ['CUECTL_LOCK_DIR']}, "
              f"GPUs from {os.environ['CUECTL_FAKE_GPUS']}")
        bench_in_process(args.iterations, os.environ["CUECTL_LOCK_DIR"])
        bench_processes(args.runs)


if __name__ == "__main__":
    main()
