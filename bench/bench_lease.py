"""Lease latency, uncontended: figures to read, never assertions.

    .venv/bin/python bench/bench_lease.py [--iterations 2000] [--runs 20]

1. ``cuectl.lease()`` acquire + release in-process: the first call (which discovers the
   GPUs) and then every later one (goal: median under 100 µs), side by side with the
   floor — a raw ``os.open`` + ``flock`` + ``os.write`` + ``close`` of one lock file in
   the same directory, in the same run.
2. Whole processes: ``cuectl run -- true`` next to plain ``true``, ``python -c 'import
   cuectl'``, the import-plus-spawn floor (that, then ``posix_spawn`` of ``true`` and a wait
   for it: the least any ``cuectl run -- true`` does; goal: ``run -- true`` under 1.5× it,
   the ratio of the medians is printed), and a Python process that takes and drops one
   lease. ``cuectl run`` takes its quick path (``cuectl.run.quick``) once a full run has
   left its per-user cache, which the warm-up does (in a private ``CUECTL_RUN_CACHE``).
   Runs are interleaved, after one warm-up each, with bytecode caching on (see
   ``process_env``).

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

    return (
        f"median {statistics.median(ms):.3f} ms  p95 {pick(0.95):.3f} ms  p99 {pick(0.99):.3f} ms  max {ms[-1]:.3f} ms"
    )


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
    print(
        f"cuectl.lease(gpus=2, gpu_memory_min='16G') (samples free memory), next {iterations}: {percentiles(samples)}"
    )


def time_process(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120, env=env
    )
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode()[-500:]}")
    return took


# The console script's code (`cuectl = cuectl.cli.entry:run`), for when it is not installed.
ENTRY = "import sys; from cuectl.cli.entry import run; sys.exit(run())"


def cuectl_argv() -> tuple[list[str], list[str], str]:
    """argv of `cuectl` (its `run` fast path), argv of the typer path, and what to call it."""
    exe = Path(sys.executable).with_name("cuectl")
    probe = subprocess.run([sys.executable, "-c", "import cuectl.cli.main"], capture_output=True)
    if probe.returncode != 0:
        return (
            [sys.executable, "-c", ENTRY],
            [sys.executable, "-c", MINI_CLI],
            "cuectl (typer path: minimal app, cuectl.cli.main not importable)",
        )
    if exe.exists():
        return [str(exe)], [str(exe)], "cuectl"
    return [sys.executable, "-c", ENTRY], [sys.executable, "-c", ENTRY], "cuectl"


def process_env(cache_dir: str) -> dict[str, str]:
    """The environment of the timed processes: bytecode cached, as for an installed package.

    With ``PYTHONDONTWRITEBYTECODE`` set (some CI and dev shells) every process would
    compile cuectl's sources again, tens of ms that no installed copy pays; the cache goes
    to a directory of the bench's own (``PYTHONPYCACHEPREFIX``), never into the tree.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache_dir
    env["CUECTL_RUN_CACHE"] = str(Path(cache_dir) / "run.cache")  # never the user's own
    return env


def bench_processes(runs: int, cache_dir: str) -> None:
    true = shutil.which("true") or "/bin/true"
    base, full_base, name = cuectl_argv()
    env = process_env(cache_dir)
    run_true = "cuectl run -- true"
    importing = "python -c 'import cuectl'"
    floor = "python -c 'import cuectl', then spawn true"
    spawn = f"import cuectl, os; os.waitpid(os.posix_spawn({true!r}, [{true!r}], os.environ), 0)"
    full_env = {**env, "CUECTL_FULL_CLI": "1"}
    no_fake_env = {k: v for k, v in env.items() if k != "CUECTL_FAKE_GPUS"}
    rows: list[tuple[str, list[str], dict[str, str]]] = [
        ("true", [true], env),
        (run_true, [*base, "run", "--", true], env),
        (f"{name} run -- true, typer path (CUECTL_FULL_CLI=1)", [*full_base, "run", "--", true], full_env),
        (
            "cuectl run --gpus 0 -- true, real discovery (no fake file)",
            [*base, "run", "--gpus", "0", "--", true],
            no_fake_env,
        ),
        ("python -c 'pass'", [sys.executable, "-c", "pass"], env),
        (importing, [sys.executable, "-c", "import cuectl"], env),
        (floor, [sys.executable, "-c", spawn], env),
        (
            "python -c 'cuectl.lease(gpus=1).release()'",
            [sys.executable, "-c", "import cuectl; cuectl.lease(gpus=1).release()"],
            env,
        ),
    ]
    for _, argv, row_env in rows:  # warm-up: writes the bytecode cache, loads the files into the page cache
        time_process(argv, row_env)
    samples: dict[str, list[float]] = {label: [] for label, _, _ in rows}
    for _ in range(runs):  # interleaved, so that a busy moment hits every row alike
        for label, argv, row_env in rows:
            samples[label].append(time_process(argv, row_env))
    width = max(len(label) for label, _, _ in rows)
    print(f"\nwhole processes, {runs} runs each, interleaved (wall time):")
    for label, _, _ in rows:
        print(f"  {label.ljust(width)}  {percentiles(samples[label])}")
    for peer, goal in ((floor, " (goal: ≤ 1.5×)"), (importing, "")):
        ratio = statistics.median(samples[run_true]) / statistics.median(samples[peer])
        print(f"  `{run_true}` / `{peer}`, medians: {ratio:.2f}×{goal}")


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
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, lock dir {os.environ['CUECTL_LOCK_DIR']}, "
            f"GPUs from {os.environ['CUECTL_FAKE_GPUS']}"
        )
        bench_in_process(args.iterations, os.environ["CUECTL_LOCK_DIR"])
        bench_processes(args.runs, str(Path(tmp) / "pycache"))


if __name__ == "__main__":
    main()
