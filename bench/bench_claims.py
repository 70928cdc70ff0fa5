#!/usr/bin/env python3
"""Claims on PostgreSQL next to SQLite, in the same run on the same machine.

Prints:
  1. claims/s with 1, 4 and 16 concurrent claimer processes on each backend (each claimer
     reads the runnable layers, then claims until the layer runs dry, as a worker does),
     with the fewest/most claims one process got and the slowest single claim; then the same
     with 1,000 layers no claimer can run queued ahead (higher priority, asking for GPUs
     these CPU-only claimers lack), which the claimers page past as a worker does, and the
     ratio to the run without them (issue 16: no more than 10 % below);
  2. the store's PostgreSQL claim rate next to a raw psycopg loop on a copy of the same
     frames (``SELECT … FOR UPDATE SKIP LOCKED`` + ``UPDATE`` + COMMIT per claim, by as many
     processes), and their ratio (issue 19: the store at least half the raw loop's rate);
     With --pgbouncer POOL, section 2 again through PgBouncer in transaction mode
     (``pgbouncer=true``, POOL server connections shared by the claimers);
  3. how long one 100,000-frame submit takes on each backend;
  4. dispatch latency of an idle `cuectl worker`: submit -> frame process started, on
     PostgreSQL with `--poll 30` (woken by NOTIFY) next to SQLite with `--poll 1` (polling).

PostgreSQL: a throwaway server started from the installed binaries (tests/pgserver.py,
as an unprivileged user when run as root), or --pg-url for an existing database (a
schema of its own per measurement is created in it).

Usage: python bench/bench_claims.py [--frames N] [--submit-frames N] [--wakeups N] [--pg-url URL]
                                   [--only-raw]   (section 2 alone)  [--pgbouncer POOL]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
CLAIMERS = (1, 4, 16)


# -- stores ------------------------------------------------------------------------------------------
class Backends:
    """Hands out fresh, empty store URLs for each backend."""

    def __init__(self, tmp: Path, pg_url: str | None) -> None:
        self.tmp = tmp
        self.pg_url = pg_url
        self.server = None
        if pg_url is None:
            sys.path.insert(0, str(REPO / "tests"))
            import pgserver

            self.server = pgserver.shared_server()

    def sqlite(self) -> str:
        return str(self.tmp / f"{uuid.uuid4().hex[:8]}.db")

    def postgres(self) -> str:
        if self.server is not None:
            return self.server.url(self.server.create_database())
        import psycopg

        schema = f"bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in self.pg_url else "?"
        return f"{self.pg_url}{sep}options={quote(f'-csearch_path={schema}')}"


def user() -> str:
    from cuectl import config

    return config.current_user()  # a root worker runs frames as their submitting user


def submit_noop(url: str, frames: int, command: list[str] | None = None, name: str = "bench") -> float:
    from cuectl.sched.spec import spec_from_flags
    from cuectl.sched.store import open_store

    store = open_store(url)
    spec = spec_from_flags(
        name=name, command=command or ["true"], range=f"1-{frames}", user=user(), frame_limit=max(frames, 1)
    )
    t0 = time.perf_counter()
    store.submit(spec, now=time.time())
    elapsed = time.perf_counter() - t0
    store.close()
    return elapsed


# -- 1. concurrent claimers ----------------------------------------------------------------------------
def _runnable(store, devices):
    """What a worker's dispatch pass reads: every runnable layer, a page at a time, less
    those this host could never run (the real matcher, as the worker's Dispatcher.could_ever_run)."""
    from cuectl.sched.match import GpuRequest, select_devices
    from cuectl.sched.store import HostShape

    shape = HostShape(
        gpus=len(devices),
        gpu_memory_max_bytes=max((d.memory_total_bytes or 0 for d in devices), default=0),
        cores=1e6,
        memory_bytes=1 << 60,
    )
    after = None
    while True:
        page = store.runnable_layers(limit=500, after=after, host=shape)
        for layer in page:
            if layer.gpus == 0 or select_devices(GpuRequest.from_record(layer), devices).could_ever_fit:
                yield layer
        if len(page) < 500:
            return
        after = page[-1].order_key


def _claimer(url: str, name: str, barrier, results) -> None:
    from cuectl.errors import StoreBusy
    from cuectl.sched.store import open_store

    store = open_store(url)
    got, slowest, busy = 0, 0.0, 0
    barrier.wait()
    while True:
        layers = list(_runnable(store, []))
        if not layers:
            break
        for layer in layers:
            while True:
                t0 = time.perf_counter()
                try:
                    claim = store.claim_frame(
                        layer.layer_id, host=name, worker=name, gpu_uuids=[], now=time.time(), lease_s=3600
                    )
                except StoreBusy:
                    busy += 1
                    continue
                slowest = max(slowest, time.perf_counter() - t0)
                if claim is None:
                    break
                got += 1
    results.put((got, slowest, busy, time.perf_counter()))
    store.close()


def submit_unrunnable(url: str, layers: int) -> None:
    """``layers`` one-frame jobs at priority 10 that need a GPU: ahead of everything, and
    nothing a CPU-only claimer can run."""
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    store = open_store(url)
    for i in range(layers):
        store.submit(
            spec_from_mapping(
                {
                    "name": f"gpu-{i}",
                    "priority": 10,
                    "layers": [{"name": "r", "command": ["true"], "gpus": 1, "gpu_vendor": "AMD"}],
                },
                user=user(),
            ),
            now=time.time(),
        )
    store.close()


def claim_rate(url: str, frames: int, claimers: int, unrunnable: int = 0) -> dict[str, float]:
    if unrunnable:
        submit_unrunnable(url, unrunnable)
    submit_noop(url, frames)
    return _race(frames, [(_claimer, (url, f"c{i}")) for i in range(claimers)])


def _race(frames: int, claimers: list[tuple[Callable[..., None], tuple[object, ...]]]) -> dict[str, float]:
    """Start every claimer process (``target(*args, barrier, results)``), release them at
    once, and sum what they report: (claims, slowest claim, busy errors, end time)."""
    ctx = mp.get_context("spawn")  # each claimer opens its own connection, as a worker would
    barrier = ctx.Barrier(len(claimers) + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, results)) for target, args in claimers]
    for p in procs:
        p.start()
    barrier.wait()
    t0 = time.perf_counter()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    wall = max(end for *_, end in out) - t0
    total = sum(r[0] for r in out)
    assert total == frames, f"claimed {total} of {frames} frames"
    return {
        "rate": total / wall,
        "min": min(r[0] for r in out),
        "max": max(r[0] for r in out),
        "slowest_ms": 1000 * max(r[1] for r in out),
        "busy": sum(r[2] for r in out),
    }


# -- 2. the store next to a raw SKIP LOCKED loop ------------------------------------------------------
_RAW_NEXT = "SELECT id FROM frames WHERE layer_id = %s AND state = 'WAITING' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
_RAW_TAKE = (
    "UPDATE frames SET state = 'RUNNING', host = %s, worker = %s, attempts = attempts + 1, "
    "lease_expires = %s, started_at = %s WHERE id = %s"
)


def _raw_claimer(url: str, layer_id: int, name: str, barrier, results) -> None:
    """The minimal claim loop, straight on psycopg: autocommit off, one transaction per
    claim (select the layer's next WAITING frame FOR UPDATE SKIP LOCKED, mark it RUNNING
    with host, attempts and lease, commit)."""
    import psycopg

    conn = psycopg.connect(url)
    got, slowest = 0, 0.0
    barrier.wait()
    while True:
        t0 = time.perf_counter()
        row = conn.execute(_RAW_NEXT, (layer_id,)).fetchone()
        if row is None:
            conn.commit()
            break
        now = time.time()
        conn.execute(_RAW_TAKE, (name, name, now + 3600, now, row[0]))
        conn.commit()
        slowest = max(slowest, time.perf_counter() - t0)
        got += 1
    results.put((got, slowest, 0, time.perf_counter()))
    conn.close()


def raw_claim_rate(url: str, frames: int, claimers: int) -> dict[str, float]:
    """``claim_rate``'s job submitted by the store to a fresh database, then claimed by
    ``claimers`` processes running ``_raw_claimer`` on its frames table."""
    import psycopg

    submit_noop(url, frames)
    with psycopg.connect(url) as conn:
        layer_id = conn.execute("SELECT id FROM layers").fetchone()[0]
    return _race(frames, [(_raw_claimer, (url, layer_id, f"r{i}")) for i in range(claimers)])


def store_vs_raw(backends: "Backends", frames: int, repeat: int, pool: int = 0) -> None:
    """Section 2; with ``pool`` also the store through PgBouncer in transaction mode
    (``pgbouncer=true``, ``pool`` server connections shared by the claimers,
    tests/pgpooler.py), interleaved with the same runs: what sharing a few server
    connections among many workers costs a claim."""
    pooler = None
    if pool:
        if backends.server is None:
            raise SystemExit("--pgbouncer needs the throwaway server (not --pg-url)")
        import pgpooler

        pooler = pgpooler.start_pooler(backends.server, pool_size=pool)
    print(
        f"\nPostgreSQL: the store's claims next to a raw SKIP LOCKED loop on a copy of the same frames "
        f"(median of {repeat})"
    )
    print(f"{'claimers':>8}  {'store claims/s':>15}  {'raw claims/s':>13}  {'ratio':>6}")
    pooled_rows = []
    try:
        for n in CLAIMERS:
            store, raw, pooled = [], [], []
            for _ in range(repeat):  # interleaved: all see the same machine load
                store.append(claim_rate(backends.postgres(), frames, n)["rate"])
                raw.append(raw_claim_rate(backends.postgres(), frames, n)["rate"])
                if pooler is not None and backends.server is not None:
                    url = pooler.url(backends.server.create_database())
                    pooled.append(claim_rate(url, frames, n)["rate"])
            s, r = statistics.median(store), statistics.median(raw)
            print(f"{n:>8}  {s:>15,.0f}  {r:>13,.0f}  {s / r:>6.2f}", flush=True)
            if pooled:
                pooled_rows.append((n, s, statistics.median(pooled), r))
    finally:
        if pooler is not None:
            pooler.stop()
    if pooled_rows:
        print(
            f"\nthe same runs through PgBouncer (transaction mode, {pool} server connections), next to the "
            "store connected directly and the raw loop"
        )
        print(
            f"{'claimers':>8}  {'direct claims/s':>16}  {'pooled claims/s':>16}  {'raw claims/s':>13}  "
            f"{'pooled/raw':>10}"
        )
        for n, d, p, r in pooled_rows:
            print(f"{n:>8}  {d:>16,.0f}  {p:>16,.0f}  {r:>13,.0f}  {p / r:>10.2f}")


# -- 4. idle worker dispatch latency ---------------------------------------------------------------------
def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def dispatch_latency(url: str, poll: str, wakeups: int, tmp: Path) -> list[float]:
    """Start an idle worker, then submit one frame at a time; seconds from the submit's
    commit to the frame's first instruction."""
    from cuectl.sched.store import open_store

    stamps = tmp / f"stamps-{uuid.uuid4().hex[:8]}"
    env = dict(
        os.environ, CUECTL_LOCK_DIR=str(tmp / "locks"), CUECTL_CREATE_LOCK_DIR="1", XDG_STATE_HOME=str(tmp / "state")
    )
    fake = tmp / "no-gpus.yaml"
    fake.write_text("devices: []\n")
    env["CUECTL_FAKE_GPUS"] = str(fake)
    # As root, run the frames as root: jobs submitted through the PostgreSQL superuser are
    # proven to be role "postgres"'s, a user a root worker would (rightly) refuse to run as.
    as_worker = ["--run-as-worker-user"] if os.geteuid() == 0 else []
    worker = subprocess.Popen(
        [
            *cuectl(),
            "--db",
            url,
            "worker",
            "--name",
            "bench-idle",
            "--poll",
            poll,
            "--cores",
            "1",
            "--quiet",
            *as_worker,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    store = open_store(url)
    try:
        wait(lambda: store.list_hosts(now=time.time(), down_after=60), "worker registered")
        latencies = []
        for i in range(wakeups):
            time.sleep(0.3 + (i % 4) * 0.17)  # idle, at varied points of its poll interval
            t0 = time.time()
            submit_noop(url, 1, ["sh", "-c", f"date +%s.%N >> {stamps}"], name=f"w{i}")
            wait(lambda: stamps.exists() and len(stamps.read_text().split()) > i, "frame start", 60)
            latencies.append(float(stamps.read_text().split()[i]) - t0)
            wait(lambda: not store.has_unfinished_work(), "frame done", 60)
        return latencies
    finally:
        store.close()
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(30)


def wait(predicate: Callable[[], object], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


# -- main ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8000, help="frames claimed per measurement")
    parser.add_argument("--submit-frames", type=int, default=100_000)
    parser.add_argument("--wakeups", type=int, default=10, help="frames submitted to the idle worker")
    parser.add_argument("--pg-url", help="an existing PostgreSQL database instead of a throwaway server")
    parser.add_argument("--unrunnable", type=int, default=1000, help="layers no claimer can run, queued ahead")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure of the unrunnable comparison (median)")
    parser.add_argument("--only-raw", action="store_true", help="only the store vs raw SKIP LOCKED comparison")
    parser.add_argument(
        "--pgbouncer",
        type=int,
        metavar="POOL",
        default=0,
        help="section 2 also through PgBouncer in transaction mode with POOL server connections, "
        "in the same runs (needs pgbouncer installed)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="cuectl-bench-") as tmp_name:
        tmp = Path(tmp_name)
        backends = Backends(tmp, args.pg_url)
        if args.only_raw:
            print(f"{os.cpu_count()} CPUs; {args.frames} frames per claim run")
            store_vs_raw(backends, args.frames, args.repeat, args.pgbouncer)
            return
        print(f"{os.cpu_count()} CPUs; {args.frames} frames per claim run")
        print(
            f"{'claimers':>8}  {'SQLite claims/s':>16}  {'PostgreSQL claims/s':>20}   per-process min-max, "
            "slowest claim (SQLite | PostgreSQL)"
        )
        for n in CLAIMERS:
            lite = claim_rate(backends.sqlite(), args.frames, n)
            post = claim_rate(backends.postgres(), args.frames, n)
            busy = f" ({lite['busy']:.0f} busy errors)" if lite["busy"] else ""
            print(
                f"{n:>8}  {lite['rate']:>16,.0f}  {post['rate']:>20,.0f}   "
                f"{lite['min']:.0f}-{lite['max']:.0f}, {lite['slowest_ms']:.1f} ms{busy} | "
                f"{post['min']:.0f}-{post['max']:.0f}, {post['slowest_ms']:.1f} ms"
            )

        print(
            f"\nthe same with {args.unrunnable:,} unrunnable layers queued ahead (ratio to the run without them, "
            "same backend, measured side by side)"
        )
        print(f"{'claimers':>8}  {'SQLite claims/s':>16}  {'PostgreSQL claims/s':>20}   ratio SQLite | PostgreSQL")
        for n in CLAIMERS:
            pair = {}
            for label, fresh in (("lite", backends.sqlite), ("post", backends.postgres)):
                plain, ahead = [], []
                for _ in range(args.repeat):  # interleaved: both see the same machine load
                    plain.append(claim_rate(fresh(), args.frames, n)["rate"])
                    ahead.append(claim_rate(fresh(), args.frames, n, unrunnable=args.unrunnable)["rate"])
                pair[label] = (statistics.median(ahead), statistics.median(ahead) / statistics.median(plain))
            print(
                f"{n:>8}  {pair['lite'][0]:>16,.0f}  {pair['post'][0]:>20,.0f}   "
                f"{pair['lite'][1]:.2f} | {pair['post'][1]:.2f}"
            )

        store_vs_raw(backends, args.frames, args.repeat, args.pgbouncer)

        lite_s = submit_noop(backends.sqlite(), args.submit_frames)
        post_s = submit_noop(backends.postgres(), args.submit_frames)
        print(f"\nsubmit of {args.submit_frames:,} frames: SQLite {lite_s:.2f} s, PostgreSQL {post_s:.2f} s")

        pg_lat = dispatch_latency(backends.postgres(), "30", args.wakeups, tmp)
        lite_lat = dispatch_latency(backends.sqlite(), "1", args.wakeups, tmp)
        print(f"\nidle worker, submit -> frame started ({args.wakeups} frames):")
        for label, lat in (("PostgreSQL, --poll 30, NOTIFY", pg_lat), ("SQLite, --poll 1, polling", lite_lat)):
            print(f"  {label:<30} median {1000 * statistics.median(lat):6.1f} ms, max {1000 * max(lat):6.1f} ms")


if __name__ == "__main__":
    main()
