#!/usr/bin/env python3
"""The REST API under a monitor's load: read latency of `cuectl serve` and what polling
costs a worker draining frames, next to a static file server measured in the same run.

Builds a SQLite store with N one-frame jobs (default 10,000: every tenth waits, paused, so
the page's pending reasons are computed; the rest finished, one attempt each)
and one job of F frames (default 10,000, the first half finished with an attempt each),
starts a real `cuectl serve` on 127.0.0.1 (a free port) and creates a viewer token. Then:
  1. latency of `GET /api/v1/jobs` and `GET /api/v1/jobs/{id}/frames` (the big job), both
     the default page (1,000 rows): one client, requests back to back (the hot-read cache
     answers nearly all; an expired page is answered at once and rebuilt in the background),
     and one client asking for pages no cache holds (each one built while it waits);
  2. the same two reads under load: C clients (default 100) each polling both once a
     second, first sending If-None-Match with the last ETag (as a browser does), then
     without ETags (every answer a full body). Target: p99 < 50 ms for both;
  3. peer: the standard library's `http.server` (as `python -m http.server --protocol
     HTTP/1.1` runs it, Nagle off) serving two files of the two responses' sizes, the same
     requests and load (If-Modified-Since where cuectl gets If-None-Match): what a trivial
     server does on this machine;
  4. drain rate: a `cuectl worker --until-idle` with 2 CPU slots (bench_worker.py's setup)
     draining D no-op frames, alternately without and with the C clients polling (idle,
     polling, idle, polling ...), on the same store the server reads. Target: the rate
     drops by at most 10 % while polling.
Figures are printed with whether each target was met; nothing is asserted.

Usage: python bench/bench_api.py [--jobs N] [--frames N] [--clients N] [--seconds S]
                                 [--drain-frames N] [--pairs N] [--cache S] [--profile]
  --seconds  length of each load phase (and of the back-to-back one)
  --profile  run the server under cProfile (every thread: the routes run in a thread pool)
             and print where its time went over the run (slower: its latencies are not
             figures then).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

import psutil

from cuectl import config
from cuectl.sched.spec import spec_from_flags
from cuectl.sched.store import open_store

HOST = "127.0.0.1"  # the server and the peer listen here only
P99_TARGET_MS = 50.0
DRAIN_DROP_TARGET = 0.10


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


# -- the store ---------------------------------------------------------------------------------
def build_store(db: Path, jobs: int, frames: int) -> int:
    """Submit the jobs through the store (one `store.submit` each, as the CLI does), then
    mark the finished ones in one transaction; return the big job's id.

    Every tenth job waits, paused: `GET /jobs` computes a pending reason for each waiting
    job of its page all the same (the job's layers, its receipt), and the drain worker does
    not see them. (Waiting jobs it could see but not run — GPU layers on this GPU-less
    host — would measure the worker instead: it reads the first 200 runnable layers and
    tries each on every pass, and 200 it cannot run hide the rest from it.)"""
    store = open_store(str(db))
    user = config.current_user()
    t0 = time.time() - 86400
    waiting_jobs: set[int] = set()
    for i in range(jobs):
        waits = i % 10 == 0
        job_id = store.submit(
            spec_from_flags(name=f"shot{i:05d}", command=["true"], range="1", gpus=int(waits), paused=waits, user=user),
            now=t0 + i,
        )
        if waits:
            waiting_jobs.add(job_id)
    big = store.submit(
        spec_from_flags(name="big", command=["true"], range=f"1-{frames}", gpus=1, user=user, frame_limit=frames),
        now=t0 + jobs,
    )
    conn = store.conn  # type: ignore[attr-defined]  # SQLite's connection, as bench_report.py uses it
    done = [
        (fid, jid)
        for fid, jid, number in conn.execute("SELECT id, job_id, number FROM frames")
        if (jid != big and jid not in waiting_jobs) or (jid == big and number <= frames // 2)
    ]
    attempts, updates = [], []
    for k, (fid, jid) in enumerate(done):
        start = t0 + 3600 + k * 0.5
        gpu = jid == big
        attempts.append(
            (
                fid,
                1,
                jid,
                f"gpu{k % 16:02d}" if gpu else "cpu01",
                json.dumps([f"GPU-{k % 16:02d}-0"]) if gpu else "[]",
                "succeeded",
                t0,
                start,
                start + 60.0,
                0,
                None,
                0,
                1 << 30,
                55.0,
                1.0,
                71.5 if gpu else None,
                99.0 if gpu else None,
                (8 << 30) if gpu else None,
                60.0 if gpu else None,
            )
        )
        updates.append((f"gpu{k % 16:02d}" if gpu else "cpu01", start, start + 60.0, fid))
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO attempts(frame_id, attempt, job_id, host, gpu_uuids, outcome, waiting_since, "
        "started_at, ended_at, exit_code, exit_signal, timed_out, max_rss_bytes, cpu_seconds, cores, "
        "gpu_util_mean_pct, gpu_util_max_pct, gpu_memory_peak_bytes, gpu_seconds) "
        f"VALUES ({', '.join(['?'] * 19)})",
        attempts,
    )
    conn.executemany(
        "UPDATE frames SET state = 'SUCCEEDED', attempts = 1, exit_code = 0, host = ?, started_at = ?, "
        "ended_at = ? WHERE id = ?",
        updates,
    )
    conn.execute(
        "UPDATE jobs SET state = 'FINISHED', finished_at = created_at + 7200 "
        "WHERE NOT EXISTS (SELECT 1 FROM frames f WHERE f.job_id = jobs.id AND f.state != 'SUCCEEDED')"
    )
    conn.execute("COMMIT")
    store.close()
    return big


def submit_drain_job(db: Path, frames: int, gpus: int = 0) -> int:
    store = open_store(str(db))
    # The worker's own user: a root worker runs frames as their submitter (bench_worker.py).
    job_id = store.submit(
        spec_from_flags(
            name="noop",
            command=["true"],
            range=f"1-{frames}",
            gpus=gpus,
            user=config.current_user(),
            frame_limit=frames,
        ),
        now=time.time(),
    )
    store.close()
    return job_id


def check_drained(db: Path, job_id: int, frames: int) -> None:
    """Every frame ran: a worker that exits early (idle) would give a fine rate of nothing."""
    store = open_store(str(db))
    done = store.get_job(job_id)["frame_counts"].get("SUCCEEDED", 0)
    store.close()
    if done != frames:
        raise SystemExit(f"the worker exited with {done} of the {frames} frames of job {job_id} done")


# -- servers -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# Run `cuectl serve` with a cProfile profiler in every thread (FastAPI runs the routes in
# its thread pool; `python -m cProfile` would see only the event loop's thread), and write
# the merged statistics when the server stops.
_PROFILED = """
import cProfile, pstats, signal, sys, threading
# uvicorn stops on SIGTERM, then raises it again under the handler it found: make that one
# an exit that runs the `finally` below.
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
profiles = []
def start(frame, event, arg):
    sys.setprofile(None)
    p = cProfile.Profile()
    profiles.append(p)
    p.enable()
threading.setprofile(start)
main = cProfile.Profile()
profiles.append(main)
sys.argv = ["cuectl", *sys.argv[1:]]
from cuectl.cli.entry import run
try:
    main.enable()
    run()
except SystemExit:
    pass
finally:
    main.disable()
    stats = None
    for p in profiles:
        try:
            stats = pstats.Stats(p) if stats is None else stats.add(p)
        except TypeError:  # a thread that ran nothing
            pass
    if stats is not None:
        stats.dump_stats(OUT)
"""


# The peer: the standard library's file server (what `python -m http.server --protocol
# HTTP/1.1` runs: ThreadingHTTPServer, SimpleHTTPRequestHandler), with Nagle's algorithm off
# as asyncio (so uvicorn) has it. Left on, its headers and body go out in two writes and each
# kept-alive answer waits ~40 ms for the client's delayed ACK, a figure of TCP, not of a server.
_PEER = """
import functools, sys
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
class Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def log_message(self, *args):
        pass
handler = functools.partial(Handler, directory=sys.argv[1])
ThreadingHTTPServer((HOST, int(sys.argv[2])), handler).serve_forever()
""".replace("HOST", repr(HOST))


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def cpu_seconds(self) -> float:
        try:
            t = psutil.Process(self.proc.pid).cpu_times()
            return float(t.user + t.system)
        except psutil.Error:
            return float("nan")


def start_server(cmd: list[str], port: int, log: Path, env: dict[str, str]) -> Server:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{cmd[0]} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return Server(proc, port, log)
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"no server on {HOST}:{port} after 30 s:\n{log.read_text()[-2000:]}")


# -- the client ----------------------------------------------------------------------------------
# One asyncio event loop with raw keep-alive sockets plays every client. With 100 threads
# (http.client) on this 2-core machine the client would take a core's share of the GIL and
# of thread switches away from the server and add its own scheduling delay to every
# latency; one loop waiting on 100 sockets costs little (its CPU time is printed beside the
# figures) and it sends exactly the bytes a browser's keep-alive connection would.
class Conn:
    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port, self.headers = port, headers
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self, path: str, extra: dict[str, str]) -> tuple[int, int, dict[str, str]]:
        """One GET on the kept-alive connection: (status, body bytes, headers)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
        assert self.reader is not None
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {HOST}:{self.port}",
            *(f"{k}: {v}" for k, v in {**self.headers, **extra}.items()),
        ]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split()[1])
        headers = {}
        for line in head[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        size = int(headers.get("content-length", "0"))
        if size:
            await self.reader.readexactly(size)
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, size, headers

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0

    def add(self, name: str, seconds: float, status: int) -> None:
        self.latencies.setdefault(name, []).append(seconds)
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def timed_get(
    conn: Conn, name: str, path: str, tally: Tally, validators: dict[str, dict[str, str]] | None
) -> None:
    extra = validators.get(path, {}) if validators is not None else {}
    t0 = time.perf_counter()
    try:
        status, _, headers = await conn.get(path, extra)
    except (OSError, asyncio.IncompleteReadError, ValueError):
        tally.errors += 1
        conn.close()
        return
    tally.add(name, time.perf_counter() - t0, status)
    if validators is not None and status == 200:
        if "etag" in headers:
            validators[path] = {"If-None-Match": headers["etag"]}
        elif "last-modified" in headers:  # the static peer's validator
            validators[path] = {"If-Modified-Since": headers["last-modified"]}


async def back_to_back(port: int, headers: dict[str, str], paths: dict[str, str], seconds: float) -> Tally:
    tally, conn = Tally(), Conn(port, headers)
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        for name, path in paths.items():
            await timed_get(conn, name, path, tally, None)
    conn.close()
    return tally


async def cold_builds(port: int, headers: dict[str, str], paths: dict[str, str], count: int, wait: float) -> Tally:
    """Requests no cached page can answer: a page size one row smaller each time makes each
    URL new (an unknown parameter is refused with 400 since the API checks them), so the
    server builds the page while the client waits (what the first monitor to ask for a
    page, or the first read after a change, pays)."""
    tally, conn = Tally(), Conn(port, headers)
    for i in range(count):
        for name, path in paths.items():
            await asyncio.sleep(wait)
            sep = "&" if "?" in path else "?"
            await timed_get(conn, name, f"{path}{sep}limit={1000 - i - 1}", tally, None)
    conn.close()
    return tally


async def poller(
    port: int,
    headers: dict[str, str],
    paths: dict[str, str],
    tally: Tally,
    conditional: bool,
    phase: float,
    stop: asyncio.Event,
) -> None:
    """A monitor: both reads once a second (at once again if they took longer)."""
    conn = Conn(port, headers)
    validators: dict[str, dict[str, str]] | None = {} if conditional else None
    loop = asyncio.get_running_loop()
    due = loop.time() + phase
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))
            break
        except asyncio.TimeoutError:
            pass
        for name, path in paths.items():
            await timed_get(conn, name, path, tally, validators)
        due = max(due + 1.0, loop.time())
    conn.close()


async def polling(
    port: int, headers: dict[str, str], paths: dict[str, str], clients: int, conditional: bool, stop: asyncio.Event
) -> Tally:
    tally = Tally()
    rng = random.Random(7)  # monitors are not in step: each starts at its own point of the second
    tasks = [
        asyncio.create_task(poller(port, headers, paths, tally, conditional, rng.random(), stop))
        for _ in range(clients)
    ]
    await asyncio.gather(*tasks)
    return tally


async def load_for(
    port: int, headers: dict[str, str], paths: dict[str, str], clients: int, conditional: bool, seconds: float
) -> Tally:
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    return await polling(port, headers, paths, clients, conditional, stop)


# -- figures ---------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile, in ms."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))] * 1000


def row(label: str, values: list[float], target: bool = False) -> str:
    if not values:
        return f"    {label:<34} no answers"
    p99 = pct(values, 0.99)
    line = (
        f"    {label:<34} p50 {pct(values, 0.5):7.1f} ms   p99 {p99:7.1f} ms   max {max(values) * 1000:7.1f} ms"
        f"   {len(values):6d} requests"
    )
    if target:
        line += f"   [target p99 < {P99_TARGET_MS:g} ms: {'met' if p99 < P99_TARGET_MS else 'MISSED'}]"
    return line


def tally_lines(tally: Tally, labels: dict[str, str], target: bool = False) -> list[str]:
    out = [row(labels[name], tally.latencies.get(name, []), target) for name in labels]
    statuses = ", ".join(f"{n} x {s}" for s, n in sorted(tally.statuses.items()))
    out.append(f"    answers: {statuses or 'none'}; errors {tally.errors}")
    return out


@dataclass
class Target:
    name: str
    port: int
    paths: dict[str, str]
    cpu: Callable[[], float]


async def latency_phase(
    title: str,
    targets: list[Target],
    labels: dict[str, dict[str, str]],
    run: Callable[[Target], Awaitable[Tally]],
    target: bool = False,
) -> None:
    print(title)
    for t in targets:
        cpu0, client0, wall0 = t.cpu(), time.process_time(), time.perf_counter()
        tally = await run(t)
        wall = time.perf_counter() - wall0
        for line in tally_lines(tally, labels[t.name], target and t.name == "cuectl"):
            print(line)
        client = (time.process_time() - client0) / wall
        print(f"    {t.name} CPU {(t.cpu() - cpu0) / wall:.2f} cores, the client's {client:.2f}")


async def drain_run(
    db: Path, env: dict[str, str], frames: int, load: Target | None, clients: int, headers: dict[str, str]
) -> float:
    job_id = submit_drain_job(db, frames)
    stop = asyncio.Event()
    poll = (
        asyncio.create_task(polling(load.port, headers, load.paths, clients, True, stop)) if load is not None else None
    )
    if poll is not None:
        await asyncio.sleep(1.0)  # every monitor started (each begins within its first second)
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *cuectl(),
        "--db",
        str(db),
        "worker",
        "--name",
        "bench",
        "--until-idle",
        "--cores",
        "2",
        "--poll",
        "0.05",
        "-q",
        env=env,
    )
    rc = await proc.wait()
    elapsed = time.perf_counter() - t0
    stop.set()
    if poll is not None:
        await poll
    if rc != 0:
        raise SystemExit(f"the worker exited with {rc}")
    check_drained(db, job_id, frames)
    return elapsed


def print_profile(path: Path) -> None:
    if not path.exists():
        print("profile: the server wrote no statistics")
        return
    for key in ("tottime", "cumulative"):
        out = pstats.Stats(str(path)).sort_stats(key)
        print(
            f"server profile over the whole run, by {key} (every thread; cProfile slows the server: "
            f"its latencies above are not figures)"
        )
        out.print_stats(25)


async def main_async(args: argparse.Namespace, tmp: Path) -> None:
    db = tmp / "api.db"
    env = dict(
        os.environ,
        CUECTL_LOCK_DIR=str(tmp / "locks"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(tmp / "state"),
        CUECTL_FAKE_GPUS=str(_no_gpus(tmp)),
    )
    t0 = time.perf_counter()
    big = build_store(db, args.jobs, args.frames)
    waiting = len(range(0, args.jobs, 10))
    print(
        f"store: {args.jobs:,} one-frame jobs ({waiting:,} waiting, paused; the rest finished) and a "
        f"{args.frames:,}-frame job ({args.frames // 2:,} finished), built in {time.perf_counter() - t0:.1f} s"
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
    port = free_port()
    serve = [
        "--db",
        str(db),
        "serve",
        "--host",
        HOST,
        "--port",
        str(port),
        "--cache",
        str(args.cache),
        "--no-access-log",
    ]
    stats = tmp / "serve.prof"
    cmd = (
        [sys.executable, "-c", _PROFILED.replace("OUT", repr(str(stats))), *serve]
        if args.profile
        else [*cuectl(), *serve]
    )
    server = start_server(cmd, port, tmp / "serve.log", env)
    peer = None
    try:
        api = {"jobs": "/api/v1/jobs", "frames": f"/api/v1/jobs/{big}/frames"}
        # Warm-up: a worker registers this host (the pending reasons then stay the same for
        # every phase) and the responses' sizes are read for the peer's files.
        await drain_run(db, env, 4, None, 0, headers)
        sizes = {}
        conn = Conn(port, headers)
        for name, path in api.items():
            status, sizes[name], _ = await conn.get(path, {})
            if status != 200:
                raise SystemExit(f"GET {path}: {status}\n{server.log.read_text()[-2000:]}")
        conn.close()
        site = tmp / "static"
        site.mkdir()
        for name in api:
            (site / f"{name}.json").write_bytes(b"[" + b" " * (sizes[name] - 2) + b"]")
        peer_port = free_port()
        peer = start_server([sys.executable, "-c", _PEER, str(site), str(peer_port)], peer_port, tmp / "peer.log", env)
        print(
            f"GET /api/v1/jobs: {sizes['jobs']:,} bytes; GET /api/v1/jobs/{big}/frames: {sizes['frames']:,} bytes "
            f"(the default page: up to 1,000 rows)"
        )
        print(
            f"server: cuectl serve --cache {args.cache:g}; peer: the standard library's http.server "
            f"(HTTP/1.1, TCP_NODELAY) serving two files of those sizes"
        )
        targets = [
            Target("cuectl", port, api, server.cpu_seconds),
            Target("peer", peer_port, {"jobs": "/jobs.json", "frames": "/frames.json"}, peer.cpu_seconds),
        ]
        labels = {
            "cuectl": {"jobs": "cuectl GET /api/v1/jobs", "frames": "cuectl GET /api/v1/jobs/J/frames"},
            "peer": {"jobs": "peer   GET /jobs.json", "frames": "peer   GET /frames.json"},
        }

        await latency_phase(
            f"sequential, 1 client, back to back for {args.seconds:g} s",
            targets,
            labels,
            lambda t: back_to_back(t.port, headers, t.paths, args.seconds),
        )
        misses = max(1, int(args.seconds // 2))
        await latency_phase(
            f"sequential, 1 client, pages built for the request ({misses} each: cache misses)",
            targets[:1],
            labels,
            lambda t: cold_builds(t.port, headers, t.paths, misses, 0.2),
        )
        for conditional in (True, False):
            how = "with If-None-Match (peer: If-Modified-Since)" if conditional else "without ETags"
            await latency_phase(
                f"{args.clients} clients polling both once a second for {args.seconds:g} s, {how}",
                targets,
                labels,
                lambda t: load_for(t.port, headers, t.paths, args.clients, conditional, args.seconds),
                target=True,
            )

        print(
            f"drain: {args.drain_frames:,} no-op frames, one worker, 2 CPU slots, alternately idle and with "
            f"{args.clients} clients polling (If-None-Match)"
        )
        rates: dict[bool, list[float]] = {False: [], True: []}
        for i in range(args.pairs):
            for loaded in (False, True):
                elapsed = await drain_run(
                    db, env, args.drain_frames, targets[0] if loaded else None, args.clients, headers
                )
                rate = args.drain_frames / elapsed
                rates[loaded].append(rate)
                print(f"    run {i + 1} {'polling' if loaded else 'idle':<8} {elapsed:7.2f} s   {rate:7.1f} frames/s")
        idle, busy = (sum(rates[k]) / len(rates[k]) for k in (False, True))
        ratio = busy / idle
        met = "met" if 1 - ratio <= DRAIN_DROP_TARGET else "MISSED"
        print(
            f"    drain rate polling/idle   {ratio:7.2f}   (drop {100 * (1 - ratio):.0f} %)   "
            f"[target drop <= {100 * DRAIN_DROP_TARGET:.0f} %: {met}]"
        )
    finally:
        if peer is not None:
            peer.stop()
        server.stop()
    if args.profile:
        print_profile(stats)


def _no_gpus(tmp: Path) -> Path:
    path = tmp / "no-gpus.yaml"
    path.write_text("host: bench\ndevices: []\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--drain-frames", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--cache", type=float, default=1.0, help="the server's --cache")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main_async(args, Path(tmp)))


if __name__ == "__main__":
    main()
