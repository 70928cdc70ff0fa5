#!/usr/bin/env python3
"""Dispatch rate: 1,000 no-op frames through one `cuectl worker` with 2 CPU slots, next to
1,000 no-op jobs through task-spooler (`tsp -S 2`) in the same run.

Both sides are timed end to end: cuectl = one `submit` of a 1,000-frame job plus a worker
draining it (`--until-idle`); task-spooler = 1,000 `tsp -n true` enqueues (its only way to
queue work; `-n`: output thrown away) while its server runs them, then `tsp -w` for the
last one. Task-spooler is also timed keeping each job's output in a file (plain `tsp true`,
its default), as cuectl keeps a log per frame. The worker is also timed alone (drain only),
and like for like: task-spooler's server is started before its clock, so a worker is too
(up and idle, then the clock runs from the submit to its exit). Runs alternate (cuectl,
task-spooler, cuectl, ...) and the medians are compared. Goal (issue 19): task-spooler's
rate (ratio >= 1.0).

Each run also drains the same job in process, in a fresh process, and reads the worker's own
CPU time a frame (``getrusage``, start-up left out), next to task-spooler's wall time a job:
the worker loop is one thread, so while its CPU a frame is above task-spooler's wall a job,
no overlapping of its waits (the spawn's, the store's) can reach task-spooler's rate.

On a filesystem that creates files slowly the figures move with it, task-spooler's
keeping output as much as cuectl's. This machine's ext4 has no journal, and there, creating a
file within ~30 s of many deletions makes the kernel scan past the recently freed inodes (a
previous run's clean-up slows the next one): leave 40 s between runs, or use `--dir /dev/shm`.

Usage: python bench/bench_worker.py [--frames N] [--runs N] [--dir DIR] [--profile]
  --profile  also run the drain in-process under cProfile and print where the time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def _cuectl_env(tmp: Path) -> tuple[dict[str, str], str]:
    """The environment of a cuectl run in ``tmp`` (its own locks, state and no GPUs), and its store."""
    env = dict(
        os.environ,
        CUECTL_LOCK_DIR=str(tmp / "locks"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(tmp / "state"),
        CUECTL_FAKE_GPUS=str(_no_gpus(tmp)),
    )
    return env, str(tmp / "bench.db")


def bench_cuectl(tmp: Path, frames: int) -> tuple[float, float]:
    env, db = _cuectl_env(tmp)
    t0 = time.perf_counter()
    subprocess.run(
        [*cuectl(), "--db", db, "submit", "--name", "noop", "--range", f"1-{frames}", "--", "true"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    t1 = time.perf_counter()
    subprocess.run(
        [*cuectl(), "--db", db, "worker", "--until-idle", "--cores", "2", "--poll", "0.05", "-q"], check=True, env=env
    )
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1


def bench_cuectl_running(tmp: Path, frames: int) -> float:
    """Like task-spooler's figure, whose server is started before its clock: a worker that is
    already up and idle (started, registered, polling every 0.05 s; `--max-frames` makes it
    exit after the last frame), then the clock runs from the `submit` to the worker's exit."""
    env, db = _cuectl_env(tmp)
    worker = subprocess.Popen(
        [*cuectl(), "--db", db, "worker", "--max-frames", str(frames), "--cores", "2", "--poll", "0.05", "-q"], env=env
    )
    heartbeat = tmp / "state" / "cuectl" / "worker" / "bench" / "heartbeat"
    deadline = time.monotonic() + 60
    while True:  # ready: registered with the store (the heartbeat file says when it last reached it)
        try:
            if json.loads(heartbeat.read_text()).get("store_ok_at"):
                break
        except (OSError, ValueError):
            pass
        if worker.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the worker did not start (exit {worker.poll()})")
        time.sleep(0.01)
    time.sleep(0.2)  # into its idle loop
    t0 = time.perf_counter()
    subprocess.run(
        [*cuectl(), "--db", db, "submit", "--name", "noop", "--range", f"1-{frames}", "--", "true"],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    if worker.wait(300) != 0:
        raise SystemExit(f"the worker failed (exit {worker.returncode})")
    return time.perf_counter() - t0


def _no_gpus(tmp: Path) -> Path:
    path = tmp / "no-gpus.yaml"
    path.write_text("host: bench\ndevices: []\n")
    return path


def bench_tsp(tmp: Path, frames: int, *, keep_output: bool = False) -> float | None:
    """``tsp -n true`` per job (output thrown away), or with ``keep_output`` plain ``tsp
    true``: task-spooler's default, each job's output kept in a file of its own, as cuectl
    keeps each frame's log."""
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        return None
    out = tmp / ("tsp-out" if keep_output else "tsp")
    out.mkdir()
    env = dict(os.environ, TS_SOCKET=str(out / "ts.sock"), TS_MAXFINISHED="100000", TMPDIR=str(out))
    subprocess.run([tsp, "-S", "2"], check=True, env=env, stdout=subprocess.DEVNULL)
    enqueue = [tsp, "true"] if keep_output else [tsp, "-n", "true"]
    t0 = time.perf_counter()
    for _ in range(frames):
        subprocess.run(enqueue, check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run([tsp, "-w"], env=env, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    subprocess.run([tsp, "-K"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return elapsed


def _in_process_worker(tmp: Path, frames: int, name: str):
    """A 2-slot worker in this process, with a ``frames``-frame no-op job queued in its own store."""
    os.environ.update(
        CUECTL_LOCK_DIR=str(tmp / f"{name}-locks"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(tmp / f"{name}-state"),
        CUECTL_FAKE_GPUS=str(_no_gpus(tmp)),
    )
    from cuectl import config
    from cuectl.run.service import build_worker
    from cuectl.sched.spec import spec_from_flags
    from cuectl.sched.store import open_store

    store = open_store(str(tmp / f"{name}.db"))
    store.submit(
        spec_from_flags(
            name="noop",
            command=["true"],
            range=f"1-{frames}",
            # The worker's own user: a root worker runs frames as their
            # submitter, and an unknown one would fail every frame.
            user=config.current_user(),
        ),
        now=time.time(),
    )
    worker, _ = build_worker(
        store,
        name="bench",
        until_idle=True,
        max_frames=None,
        poll=0.05,
        sample_interval=10,
        lease_timeout=60,
        gpu_only=False,
        lock_dir=None,
        tags=[],
        cores=2,
    )
    return worker


def profile_drain(tmp: Path, frames: int) -> str:
    from cuectl.run.worker import Supervisor

    worker = _in_process_worker(tmp, frames, "profile")
    prof = cProfile.Profile()
    prof.enable()
    Supervisor(worker).run()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats(os.environ.get("PROF_SORT", "tottime")).print_stats(
        int(os.environ.get("PROF_N", "15"))
    )
    return out.getvalue()


def cpu_child(tmp: Path, frames: int) -> None:
    """(``--cpu-child``, in a process of its own) Drain ``frames`` no-op frames in process and
    print, as JSON, the wall time and the CPU time of the worker itself and of its frames
    (``getrusage``: this process, and the children it reaped), start-up left out."""
    import resource

    from cuectl.run.worker import Supervisor

    worker = _in_process_worker(tmp, frames, "cpu")
    sup = Supervisor(worker)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    sup.run()
    wall = time.perf_counter() - t0
    me2, kids2 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with contextlib.closing(sqlite3.connect(tmp / "cpu.db")) as db:
        done = db.execute("SELECT COUNT(*) FROM frames WHERE state = 'SUCCEEDED'").fetchone()[0]
    if done != frames:
        sys.exit(f"bench_worker: {frames - done} of {frames} frames did not succeed in the in-process drain")
    print(
        json.dumps(
            {
                "frames": worker.claimed_total,
                "wall": wall,
                "user": me2.ru_utime - me.ru_utime,
                "system": me2.ru_stime - me.ru_stime,
                "frames_cpu": kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime,
            }
        )
    )


def bench_cpu(tmp: Path, frames: int) -> dict[str, float]:
    """The worker's own CPU time a frame (``cpu_child`` in a fresh process: the bench's
    process must not become the frames' subreaper, nor share warm caches with a drain)."""
    out = subprocess.run(
        [sys.executable, __file__, "--cpu-child", str(tmp), "--frames", str(frames)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    doc = json.loads(out.strip().splitlines()[-1])
    n = max(1, int(doc["frames"]))
    return {k: float(doc[k]) * 1000 / n for k in ("wall", "user", "system", "frames_cpu")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3, help="alternating cuectl / task-spooler runs (medians)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument(
        "--dir",
        help="where the store, logs and task-spooler's files go (default: the system's temporary "
        "directory); e.g. /dev/shm to leave the disk's filesystem out",
    )
    ap.add_argument("--cpu-child", metavar="DIR", help=argparse.SUPPRESS)  # bench_cpu's own process
    args = ap.parse_args()
    if args.cpu_child:
        cpu_child(Path(args.cpu_child), args.frames)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        tmpdir = Path(tmp)
        # The worker process compiles cuectl once, into a cache of the bench's own, even where
        # PYTHONDONTWRITEBYTECODE is set (an installed copy has its bytecode).
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.environ["PYTHONPYCACHEPREFIX"] = str(tmpdir / "pycache")
        warm = tmpdir / "warm-up"
        warm.mkdir()
        bench_cuectl(warm, 1)  # compiles what submit and the worker import, untimed
        totals, drains, tsps, tsps_out, running, cpus = [], [], [], [], [], []
        for i in range(max(1, args.runs)):  # alternating: both see the same machine load
            run_dir = tmpdir / f"run{i}"
            run_dir.mkdir()
            total, drain = bench_cuectl(run_dir, args.frames)
            totals.append(total)
            drains.append(drain)
            up = run_dir / "running"
            up.mkdir()
            running.append(bench_cuectl_running(up, args.frames))
            cpu = run_dir / "cpu"
            cpu.mkdir()
            cpus.append(bench_cpu(cpu, args.frames))
            tsp = bench_tsp(run_dir, args.frames)
            if tsp is not None:
                tsps.append(tsp)
                tsps_out.append(bench_tsp(run_dir, args.frames, keep_output=True) or 0.0)
        total, drain = statistics.median(totals), statistics.median(drains)
        print(f"{args.frames} no-op frames, 2 slots, median of {len(totals)} alternating runs")
        print(f"  cuectl submit + worker     {total:7.2f} s   {args.frames / total:7.1f} frames/s")
        print(f"  cuectl worker drain only   {drain:7.2f} s   {args.frames / drain:7.1f} frames/s")
        up = statistics.median(running)
        print(
            f"  cuectl, worker already up  {up:7.2f} s   {args.frames / up:7.1f} frames/s   (submit + drain; "
            "started and idle before the clock, as task-spooler's server is)"
        )
        if not tsps:
            print("  task-spooler               not installed (apt-get install task-spooler)")
        else:
            tsp = statistics.median(tsps)
            print(f"  task-spooler (tsp -S 2)    {tsp:7.2f} s   {args.frames / tsp:7.1f} jobs/s")
            print(
                f"  ratio cuectl/tsp (rates)   {tsp / total:7.2f}     submit + drain; drain only {tsp / drain:.2f} "
                "(goal, issue 19: >= 1.0)"
            )
            print("  per run (submit + drain):  " + ", ".join(f"{t / c:.2f}" for c, t in zip(totals, tsps)))
            out = statistics.median(tsps_out)
            print(
                f"  task-spooler keeping output {out:6.2f} s   {args.frames / out:7.1f} jobs/s   (plain `tsp true`, its "
                "default: a file per job, as cuectl's log per frame)"
            )
            print(
                f"  ratio cuectl/tsp keeping output {out / total:5.2f}     submit + drain; drain only {out / drain:.2f}"
            )
            print(
                f"  like for like (both servers up before the clock): cuectl / tsp -n {tsp / up:.2f}, "
                f"cuectl / tsp keeping output {out / up:.2f}"
            )
        cpu_ms = {k: statistics.median(c[k] for c in cpus) for k in cpus[0]}
        print(
            f"  the worker's own CPU a frame {cpu_ms['user'] + cpu_ms['system']:5.2f} ms   (user {cpu_ms['user']:.2f}, "
            f"system {cpu_ms['system']:.2f}; a drain in process, start-up left out: wall {cpu_ms['wall']:.2f} ms a "
            f"frame; the frames' own CPU {cpu_ms['frames_cpu']:.2f} ms)"
        )
        if tsps:
            per_job = statistics.median(tsps) * 1000 / args.frames
            print(
                f"  task-spooler's wall a job    {per_job:5.2f} ms   the worker's own CPU a frame is "
                f"{(cpu_ms['user'] + cpu_ms['system']) / per_job:.2f}x it (above 1: out of the one-thread loop's "
                "reach)"
            )
        if args.profile:
            print(profile_drain(tmpdir, args.frames))


if __name__ == "__main__":
    main()
