#!/usr/bin/env python3
"""OpenCue's gRPC protocol under CueGUI's load (issue 34 §7): read latency of `cuectl serve
--opencue` next to the REST API's for the same reads, and what 50 polling CueGUIs cost a
worker draining frames, each measured in the same run.

Builds a SQLite store as bench_api.py does (N one-frame jobs, every tenth waiting and paused,
the rest finished; one job of F frames, half finished, here paused so the worker leaves it
alone), starts a real `cuectl serve --opencue 127.0.0.1:0` (its port read from the line it
logs) and two real `cuectl serve` REST servers on the same store (the default `--cache 1`,
and `--cache 0`: every request builds its page, as every gRPC call does), with a viewer
token. A plain grpc channel with opencue_proto's stubs plays the client (no pycue). Then:
  1. latency, one client, the reads round-robin (gRPC, REST cached, REST uncached), C calls
     each: `JobInterface.GetJobs` with include_finished (every job) and with the default
     criteria (the jobs in the cue), `JobInterface.GetFrames` of the F-frame job with page 1
     and limit 1,000 (what CueGUI asks) and with limit 10,000; the REST reads are
     `GET /api/v1/jobs?limit=10000` (`&active=true`) and `/api/v1/jobs/J/frames?limit=…`;
  2. S simulated CueGUI sessions (default 50), one asyncio loop, each its own channel (its
     own connection, as each CueGUI has), each polling every P seconds (+-10 % jitter; by
     default first P = 10 s, CueGUI's own period, then P = 1 s, the period compressed: 10x
     CueGUI's rate) what an open Cuetopia and CueCommander ask: `GetJobs` of its 20
     monitored jobs (ids, include_finished, as MonitorJobs asks), `GetLayers` and
     `GetFrames` (page 1, limit 1,000: first tick and every 5th) or `GetUpdatedFrames`
     (since the last answer's server_time) of the job being drained,
     `HostInterface.GetHosts` and `ProcInterface.GetProcs`. Peer: one session alone (no
     worker) on a job of the same size, the same calls;
  3. drain rate: a real `cuectl worker --until-idle --cores 2` on fake GPUs
     (examples/fake-gpus.yaml: two devices) draining D no-op frames (`true`, one GPU each),
     alternately without and with the S sessions polling (idle, polling, ...), for each
     period; the sessions start a period before the worker (each has read its job's frames
     once); the calls counted, and the server's CPU, are those made while the worker
     drains. Targets: p99 < 100 ms, drain rate down <= 10 %.
Figures are printed with whether each target was met; nothing is asserted.

Usage: python bench/bench_opencue.py [--jobs N] [--frames N] [--calls N] [--sessions N]
                                     [--periods S,S] [--drain-frames N] [--pairs N] [--profile]
  --profile  run the gRPC server under cProfile (every thread) and print where its time
             went (slower: its latencies are not figures then).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc
from bench_api import (
    _PROFILED,
    HOST,
    Conn,
    Server,
    build_store,
    check_drained,
    cuectl,
    free_port,
    pct,
    print_profile,
    start_server,
    submit_drain_job,
)
from opencue_proto import host_pb2, host_pb2_grpc, job_pb2, job_pb2_grpc

from cuectl.sched.store import open_store

P99_TARGET_MS = 100.0
DRAIN_DROP_TARGET = 0.10
FAKE_GPUS = Path(__file__).resolve().parent.parent / "examples" / "fake-gpus.yaml"
SERVING = re.compile(r"serving OpenCue's gRPC protocol on \S+ \(port (\d+)\)")
FULL_EVERY = 5  # a session reads the frame page in full on its first tick and every 5th


# -- the gRPC server -------------------------------------------------------------------------
@dataclass
class Cuebot(Server):
    lines: list[str] = field(default_factory=list)


def start_cuebot(cmd: list[str], env: dict[str, str]) -> Cuebot:
    """`cuectl serve --opencue 127.0.0.1:0`: the port is the one its "serving" line names."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    port = None
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        found = SERVING.search(line)
        port = int(found.group(1)) if found else None
    if port is None:
        proc.kill()
        raise SystemExit("cuectl serve --opencue did not start:\n" + "".join(lines)[-2000:])

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=drain, daemon=True).start()
    return Cuebot(proc, port, Path(os.devnull), lines)  # type: ignore[arg-type]


# -- figures ------------------------------------------------------------------------------------
@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    recording: bool = True  # calls that start while False are made but not counted

    def add(self, name: str, seconds: float) -> None:
        self.latencies.setdefault(name, []).append(seconds)

    def fail(self, name: str, exc: BaseException) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1
        self.last_error = f"{name}: {exc}"[:300]

    def merge(self, other: Tally) -> None:
        for name, values in other.latencies.items():
            self.latencies.setdefault(name, []).extend(values)
        for name, n in other.errors.items():
            self.errors[name] = self.errors.get(name, 0) + n
        self.last_error = other.last_error or self.last_error


def row(label: str, values: list[float], target: bool = False, width: int = 44) -> str:
    if not values:
        return f"    {label:<{width}} no answers"
    p99 = pct(values, 0.99)
    line = (
        f"    {label:<{width}} p50 {pct(values, 0.5):7.1f} ms   p99 {p99:7.1f} ms   "
        f"max {max(values) * 1000:7.1f} ms   {len(values):5d} calls"
    )
    if target:
        line += f"   [target p99 < {P99_TARGET_MS:g} ms: {'met' if p99 < P99_TARGET_MS else 'MISSED'}]"
    return line


# -- part 1: one client, the big reads ---------------------------------------------------------------
@dataclass
class Read:
    label: str
    grpc_call: Callable[[], Awaitable[Any]]
    rest_path: str


async def rest_get(conn: Conn, path: str) -> int:
    status, size, _ = await conn.get(path, {})
    if status != 200:
        raise SystemExit(f"GET {path}: {status}")
    return size


async def big_reads(
    port: int, rest: dict[str, int], headers: dict[str, str], big: int, calls: int, servers: dict[str, Server]
) -> None:
    async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
        jobs = job_pb2_grpc.JobInterfaceStub(channel)
        big_pb = job_pb2.Job(id=str(big))
        reads = [
            Read(
                "GetJobs include_finished",
                lambda: jobs.GetJobs(
                    job_pb2.JobGetJobsRequest(r=job_pb2.JobSearchCriteria(include_finished=True)), timeout=60
                ),
                "/api/v1/jobs?limit=10000",
            ),
            Read(
                "GetJobs (in the cue)",
                lambda: jobs.GetJobs(job_pb2.JobGetJobsRequest(r=job_pb2.JobSearchCriteria()), timeout=60),
                "/api/v1/jobs?active=true&limit=10000",
            ),
            Read(
                "GetFrames page 1 limit 1000",
                lambda: jobs.GetFrames(
                    job_pb2.JobGetFramesRequest(job=big_pb, req=job_pb2.FrameSearchCriteria(page=1, limit=1000)),
                    timeout=60,
                ),
                f"/api/v1/jobs/{big}/frames?limit=1000",
            ),
            Read(
                "GetFrames limit 10000",
                lambda: jobs.GetFrames(
                    job_pb2.JobGetFramesRequest(job=big_pb, req=job_pb2.FrameSearchCriteria(page=1, limit=10000)),
                    timeout=60,
                ),
                f"/api/v1/jobs/{big}/frames?limit=10000",
            ),
        ]
        conns = {name: Conn(p, headers) for name, p in rest.items()}
        # Sizes, and one untimed call of each (the REST cache's first build, the server's imports).
        for read in reads:
            answer = await read.grpc_call()
            count = len(answer.jobs.jobs) if hasattr(answer, "jobs") else len(answer.frames.frames)
            size = {name: await rest_get(conn, read.rest_path) for name, conn in conns.items()}
            print(
                f"  {read.label}: {count:,} rows; gRPC {answer.ByteSize():,} bytes, REST "
                f"`{read.rest_path}` {size['REST --cache 1']:,} bytes (JSON)"
            )
        for read in reads:
            tally = Tally()
            cpu0 = {name: s.cpu_seconds() for name, s in servers.items()}
            wall0 = time.perf_counter()
            for _ in range(calls):  # round-robin: the three see the same moments of the machine
                t0 = time.perf_counter()
                await read.grpc_call()
                tally.add("gRPC", time.perf_counter() - t0)
                for name, conn in conns.items():
                    t0 = time.perf_counter()
                    await rest_get(conn, read.rest_path)
                    tally.add(name, time.perf_counter() - t0)
            wall = time.perf_counter() - wall0
            print(f"{read.label}, {calls} calls each, round-robin")
            for name in ("gRPC", *conns):
                label = f"{'cuectl serve --opencue' if name == 'gRPC' else 'peer ' + name}"
                print(row(label, tally.latencies[name], width=30))
            print(
                "    CPU over the round: "
                + ", ".join(f"{name} {(s.cpu_seconds() - cpu0[name]) / wall:.2f} cores" for name, s in servers.items())
            )
        for conn in conns.values():
            conn.close()


# -- part 2: CueGUI sessions ------------------------------------------------------------------------
NAMES = (
    "GetJobs (monitored ids)",
    "GetLayers",
    "GetFrames page 1 limit 1000",
    "GetUpdatedFrames",
    "HostInterface.GetHosts",
    "ProcInterface.GetProcs",
)


async def timed(tally: Tally, name: str, call: Awaitable[Any]) -> Any:
    t0, counted = time.perf_counter(), tally.recording
    try:
        answer = await call
    except grpc.aio.AioRpcError as exc:
        tally.fail(name, exc)
        return None
    if counted:
        tally.add(name, time.perf_counter() - t0)
    return answer


async def session(
    port: int,
    job_id: int,
    monitored: list[str],
    period: float,
    phase: float,
    rng: random.Random,
    tally: Tally,
    stop: asyncio.Event,
) -> None:
    """One CueGUI: Cuetopia's MonitorJobs, MonitorLayers and MonitorFrames on one job, and
    CueCommander's MonitorHosts and MonitorProcs, all on one channel (one connection)."""
    async with grpc.aio.insecure_channel(f"{HOST}:{port}") as channel:
        jobs = job_pb2_grpc.JobInterfaceStub(channel)
        hosts = host_pb2_grpc.HostInterfaceStub(channel)
        procs = host_pb2_grpc.ProcInterfaceStub(channel)
        job = job_pb2.Job(id=str(job_id))
        loop = asyncio.get_running_loop()
        due = loop.time() + phase
        tick, last_check = 0, 0
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))
                break
            except asyncio.TimeoutError:
                pass
            await timed(
                tally,
                NAMES[0],
                jobs.GetJobs(
                    job_pb2.JobGetJobsRequest(r=job_pb2.JobSearchCriteria(ids=monitored, include_finished=True)),
                    timeout=30,
                ),
            )
            await timed(tally, NAMES[1], jobs.GetLayers(job_pb2.JobGetLayersRequest(job=job), timeout=30))
            if tick % FULL_EVERY == 0:
                answer = await timed(
                    tally,
                    NAMES[2],
                    jobs.GetFrames(
                        job_pb2.JobGetFramesRequest(job=job, req=job_pb2.FrameSearchCriteria(page=1, limit=1000)),
                        timeout=30,
                    ),
                )
                last_check = int(time.time()) if answer is not None else last_check
            else:
                answer = await timed(
                    tally,
                    NAMES[3],
                    jobs.GetUpdatedFrames(
                        job_pb2.JobGetUpdatedFramesRequest(job=job, last_check=last_check), timeout=30
                    ),
                )
                last_check = answer.server_time if answer is not None else last_check
            await timed(
                tally,
                NAMES[4],
                hosts.GetHosts(host_pb2.HostGetHostsRequest(r=host_pb2.HostSearchCriteria()), timeout=30),
            )
            await timed(
                tally,
                NAMES[5],
                procs.GetProcs(
                    host_pb2.ProcGetProcsRequest(r=host_pb2.ProcSearchCriteria(max_results=[1000])), timeout=30
                ),
            )
            tick += 1
            due = max(due + period * rng.uniform(0.9, 1.1), loop.time())


async def sessions(
    port: int,
    count: int,
    job_id: int,
    monitored: list[list[str]],
    period: float,
    stop: asyncio.Event,
    tally: Tally | None = None,
) -> Tally:
    rng = random.Random(34)  # CueGUIs are not in step: each starts at its own point of the period
    tally = tally or Tally()
    tasks = [
        asyncio.create_task(
            session(
                port,
                job_id,
                monitored[i % len(monitored)],
                period,
                rng.random() * period,
                random.Random(i),
                tally,
                stop,
            )
        )
        for i in range(count)
    ]
    await asyncio.gather(*tasks)
    return tally


def session_lines(tally: Tally, target: bool) -> list[str]:
    out = [row(name, tally.latencies.get(name, []), target) for name in NAMES]
    every = [v for values in tally.latencies.values() for v in values]
    out.append(row("every call", every, target))
    errors = ", ".join(f"{name} {n}" for name, n in tally.errors.items())
    out.append(f"    errors: {errors or 'none'}" + (f" (last: {tally.last_error})" if tally.errors else ""))
    return out


# -- part 3: the drain ---------------------------------------------------------------------------------
async def drain_run(
    db: Path,
    env: dict[str, str],
    frames: int,
    port: int | None,
    count: int,
    monitored: list[list[str]],
    period: float,
    server_cpu: Callable[[], float] = lambda: 0.0,
) -> tuple[float, float, Tally | None]:
    """The drain's seconds, the server's CPU seconds while the worker ran, the sessions' calls."""
    job_id = submit_drain_job(db, frames, gpus=1)
    stop = asyncio.Event()
    tally = Tally(recording=False)  # counted from the worker's start
    load = (
        asyncio.create_task(sessions(port, count, job_id, [[str(job_id), *m] for m in monitored], period, stop, tally))
        if port is not None
        else None
    )
    if load is not None:
        await asyncio.sleep(period)  # every session has polled once (each begins within its first period)
    tally.recording = True
    t0, cpu0 = time.perf_counter(), server_cpu()
    proc = await asyncio.create_subprocess_exec(
        *cuectl(), "--db", str(db), "worker", "--until-idle", "--cores", "2", "--poll", "0.05", "-q", env=env
    )
    rc = await proc.wait()
    elapsed, cpu = time.perf_counter() - t0, server_cpu() - cpu0
    tally.recording = False
    stop.set()
    if load is not None:
        await load
    if rc != 0:
        raise SystemExit(f"the worker exited with {rc}")
    check_drained(db, job_id, frames)
    return elapsed, cpu, tally if load is not None else None


def monitored_sets(db: Path, big: int, count: int) -> list[list[str]]:
    """Each session's monitored jobs besides the drained one: the big job and 18 others, in
    the cue or finished (a Cuetopia keeps finished jobs listed until one clears them)."""
    store = open_store(str(db))
    ids = [int(j["id"]) for j in store.list_jobs(include_finished=True) if int(j["id"]) != big]
    store.close()
    rng = random.Random(7)
    return [[str(big), *(str(i) for i in rng.sample(ids, min(18, len(ids))))] for _ in range(max(count, 1))]


async def main_async(args: argparse.Namespace, tmp: Path) -> None:
    db = tmp / "opencue.db"
    env = dict(
        os.environ,
        CUECTL_LOCK_DIR=str(tmp / "locks"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(tmp / "state"),
        CUECTL_FAKE_GPUS=str(FAKE_GPUS),
        GRPC_VERBOSITY="ERROR",
    )
    t0 = time.perf_counter()
    big = build_store(db, args.jobs, args.frames)
    store = open_store(str(db))
    store.set_job_paused(big, True)  # the worker's fake GPUs would run it otherwise
    store.close()
    print(
        f"store: {args.jobs:,} one-frame jobs ({len(range(0, args.jobs, 10)):,} waiting, paused; the rest finished)"
        f" and a {args.frames:,}-frame job ({args.frames // 2:,} finished, paused), built in "
        f"{time.perf_counter() - t0:.1f} s"
    )
    token = json.loads(
        subprocess.run(
            [*cuectl(), "--db", str(db), "admin", "token", "create", "bench-viewer", "--role", "viewer", "--json"],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    )["secret"]
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    stats = tmp / "cuebot.prof"
    serve = ["--db", str(db), "serve", "--opencue", f"{HOST}:0"]
    cuebot = start_cuebot(
        [sys.executable, "-c", _PROFILED.replace("OUT", repr(str(stats))), *serve]
        if args.profile
        else [*cuectl(), *serve],
        env,
    )
    rest: dict[str, Server] = {}
    try:
        for cache in ("1", "0"):
            port = free_port()
            rest[f"REST --cache {cache}"] = start_server(
                [
                    *cuectl(),
                    "--db",
                    str(db),
                    "serve",
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    "--cache",
                    cache,
                    "--no-access-log",
                ],
                port,
                tmp / f"serve-{cache}.log",
                env,
            )
        # Warm-up: a worker registers the fake-GPU host (GetHosts then has one to answer).
        await drain_run(db, env, 4, None, 0, [], 0.0)
        print(
            f"servers: cuectl serve --opencue on port {cuebot.port}; peers: cuectl serve (REST) --cache 1 "
            f"(the default) and --cache 0, the same store"
        )
        await big_reads(
            cuebot.port, {name: s.port for name, s in rest.items()}, headers, big, args.calls, {"gRPC": cuebot, **rest}
        )
        for server in rest.values():
            server.stop()
        rest.clear()

        monitored = monitored_sets(db, big, args.sessions)
        print(
            f"CueGUI sessions: {args.sessions}, each its own channel, polling GetJobs of 20 monitored ids, "
            f"GetLayers and GetFrames (page 1, limit 1000; first tick and every {FULL_EVERY}th) or "
            f"GetUpdatedFrames of the job being drained, GetHosts, GetProcs; every P s +-10 % (CueGUI: 10 s)"
        )
        # Peer: one session alone, no worker, on a job of the drain's size (none of its frames done).
        alone_job = submit_drain_job(db, args.drain_frames, gpus=1)
        store = open_store(str(db))
        store.set_job_paused(alone_job, True)
        store.close()
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3.0, stop.set)
        alone = await sessions(cuebot.port, 1, alone_job, [[str(alone_job), *monitored[0]]], 0.5, stop)
        print(f"  one session alone, every 0.5 s for 3 s, no worker, a paused {args.drain_frames:,}-frame job (peer)")
        for line in session_lines(alone, False):
            print(line)
        summary = []
        for period in args.periods:
            rate = "CueGUI's own rate" if period == 10 else f"{10 / period:g}x CueGUI's rate"
            print(
                f"drain, sessions every {period:g} s ({rate}): {args.drain_frames:,} no-op frames of 1 GPU each, "
                f"one worker (--cores 2, 2 fake GPUs), alternately idle and with {args.sessions} sessions polling"
            )
            rates: dict[bool, list[float]] = {False: [], True: []}
            loaded = Tally()
            for i in range(args.pairs):
                for polling in (False, True):
                    client0 = time.process_time()
                    elapsed, cpu, tally = await drain_run(
                        db,
                        env,
                        args.drain_frames,
                        cuebot.port if polling else None,
                        args.sessions,
                        monitored,
                        period,
                        cuebot.cpu_seconds,
                    )
                    rates[polling].append(args.drain_frames / elapsed)
                    extra = ""
                    if tally is not None:
                        loaded.merge(tally)
                        calls = sum(len(v) for v in tally.latencies.values())
                        client = (time.process_time() - client0) / (elapsed + period)
                        extra = (
                            f"   {calls / elapsed:6.1f} calls/s; gRPC server {cpu / elapsed:.2f} cores; "
                            f"the client {client:.2f}"
                        )
                    print(
                        f"    run {i + 1} {'polling' if polling else 'idle':<8} {elapsed:7.2f} s   "
                        f"{rates[polling][-1]:7.1f} frames/s{extra}"
                    )
            print(f"  {args.sessions} sessions polling every {period:g} s, while the worker drains (every polling run)")
            for line in session_lines(loaded, True):
                print(line)
            idle, busy = (sum(rates[k]) / len(rates[k]) for k in (False, True))
            ratio = busy / idle
            met = "met" if 1 - ratio <= DRAIN_DROP_TARGET else "MISSED"
            print(
                f"    drain rate polling/idle   {ratio:7.2f}   (idle {idle:.1f}, polling {busy:.1f} frames/s; drop "
                f"{100 * (1 - ratio):.0f} %)   [target drop <= {100 * DRAIN_DROP_TARGET:.0f} %: {met}]"
            )
            every = [v for values in loaded.latencies.values() for v in values] or [0.0]
            summary.append(
                f"    sessions every {period:>4g} s: every call p50 {pct(every, 0.5):7.1f} ms, "
                f"p99 {pct(every, 0.99):7.1f} ms; drain polling/idle {ratio:.2f}"
            )
        print("summary")
        for line in summary:
            print(line)
    finally:
        for server in rest.values():
            server.stop()
        cuebot.stop()
    if args.profile:
        print_profile(stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=15, help="calls of each big read, per server")
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument(
        "--periods",
        type=lambda text: [float(p) for p in text.split(",")],
        default=[10.0, 1.0],
        help="seconds between a session's polls, one drain series each (CueGUI: 10)",
    )
    ap.add_argument("--drain-frames", type=int, default=1500)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
