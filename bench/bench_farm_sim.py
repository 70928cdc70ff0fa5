#!/usr/bin/env python3
"""A simulated GPU farm against the store: how many claims/s it sustains, and from there
how big a farm (GPUs, frame length) one database serves (issue 19; docs/scaling.md).

Each simulated worker makes the store calls a real `cuectl worker` makes, and nothing else:
register_host with --gpus-per-host fake NVIDIA devices, a heartbeat every --heartbeat
seconds with its frame ids, and a dispatch pass whenever a device frees (or every --poll
seconds while something is free): page `runnable_layers` (500 at a time, to the end, as
Dispatcher.claim_all does), skip layers the host could never run (remembered per layer),
match with `select_devices` against its free devices (the first multi-GPU layer that does
not fit reserves the free devices it could use), `claim_frame` with the chosen uuids, and
`complete_frame` (exit 0) once the frame's sampled duration is up. No frame process, no
device locks, no LISTEN connection. --procs OS processes (spawn) each drive --hosts/--procs
simulated workers round-robin over one store connection, so the database sees --procs
concurrent clients.

Jobs, submitted before the run: --jobs one-layer jobs, most frames 1-GPU, some 2/4/8-GPU,
a few CPU-only (1 core each, 4 slots per host), plus --unrunnable higher-priority layers no
host can run (AMD GPUs; the fleet is NVIDIA), which every dispatch pass pages past.
Enough frames to keep every device busy for the whole run.

Two phases per backend, each on a fresh database:
  farm       frames last a lognormal duration around --frame-seconds (sigma 0.5);
  saturated  frames end at once (0 s): every device is re-dispatched as fast as the
             store and the simulated workers allow — the most claims/s this setup gives.
Reported per phase, over the steady window (after the first --warmup seconds):
  claims/s; GPU busy (device-seconds used / available); dispatch latency p50/p99 (a GPU
  frame's claim returning minus the moment the last of its devices freed: the simulated
  end of the frame before on it); database CPU per claim (utime+stime of the throwaway
  PostgreSQL server's processes from /proc, before and after; not measured with --pg-url
  or for SQLite, whose database work runs inside the clients); client CPU per claim (the
  simulated workers, all of their Python and the driver); store call times p50/p99.
Then the capacity lines: GPUs / sustained claims/s is the frame length below which the
store, not the GPUs, limits the farm.

PostgreSQL: a throwaway server (tests/pgserver.py, as an unprivileged user when run as
root; durability off), or --pg-url. SQLite (one file, WAL) runs the same load for
comparison (--backends).

Usage: python bench/bench_farm_sim.py [--hosts N] [--gpus-per-host 8] [--seconds S]
           [--frame-seconds D] [--procs P] [--backends postgres,sqlite] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parent.parent
PAGE = 500
CPU_SLOTS = 4
#: (GPUs per frame, share of the frames)
MIX = ((1, 0.70), (2, 0.08), (4, 0.05), (8, 0.03), (0, 0.14))


# -- the simulated worker --------------------------------------------------------------------------------
@dataclass
class Running:
    frame_id: int
    attempt: int
    uuids: tuple[str, ...]
    gpus: int
    started: float
    ends: float


@dataclass
class SimHost:
    name: str
    devices: list[Any]
    freed_at: dict[str, float]
    running: dict[int, Running] = field(default_factory=dict)
    static_fit: dict[int, bool] = field(default_factory=dict)
    dirty: bool = True  # a device or slot freed since the last pass
    next_poll: float = 0.0
    next_heartbeat: float = 0.0

    def busy(self) -> set[str]:
        return {u for r in self.running.values() for u in r.uuids}

    def cpu_used(self) -> int:
        return sum(1 for r in self.running.values() if r.gpus == 0)


def fake_devices(host: str, n: int) -> list[Any]:
    from cuectl.gpu.device import Device

    return [
        Device(
            index=i,
            uuid=f"GPU-{host}-{i}",
            vendor="NVIDIA",
            model="NVIDIA H100 80GB HBM3",
            backend="fake",
            memory_total_bytes=80 * 1024**3,
        )
        for i in range(n)
    ]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def sim_process(
    url: str, names: list[str], cfg: dict[str, Any], barrier: Any, start: Any, results: Any, release: Any
) -> None:
    """Drive ``names`` simulated workers over one store connection until the run ends."""
    from cuectl.errors import StoreBusy
    from cuectl.sched.match import GpuRequest, device_fits_statically, select_devices
    from cuectl.sched.store import FrameResult, HostInfo, open_store

    rng = random.Random(names[0])
    store = open_store(url)
    gpus_per_host, lease_s = cfg["gpus_per_host"], cfg["lease_s"]
    hosts = []
    for name in names:
        devices = fake_devices(name, gpus_per_host)
        store.register_host(
            HostInfo(
                name=name,
                cores=CPU_SLOTS,
                memory_bytes=64 * 1024**3,
                gpus=[d.to_json() for d in devices],
                worker_pid=os.getpid(),
                version="sim",
            ),
            now=time.time(),
        )
        hosts.append(SimHost(name, devices, {}))
    mean = cfg["frame_seconds"]
    sigma = 0.5
    mu = math.log(mean) - sigma**2 / 2 if mean > 0 else 0.0

    def duration() -> float:
        return rng.lognormvariate(mu, sigma) if mean > 0 else 0.0

    calls: dict[str, list[float]] = {"claim": [], "page": [], "complete": [], "heartbeat": []}
    claims: list[float] = []  # when each claim returned
    latencies: list[tuple[float, int, float]] = []  # GPU frames: (when, GPUs, claimed - last device freed)
    busy_s = 0.0  # device-seconds inside the window
    passes = pages = busy_errors = 0

    barrier.wait()
    barrier.wait()  # the main process has set the start time
    t0 = start.value
    w0, t_end = t0 + cfg["warmup"], t0 + cfg["seconds"]
    for h in hosts:
        h.freed_at = {d.uuid: t0 for d in h.devices}
        h.next_heartbeat = t0 + rng.uniform(0, cfg["heartbeat"])
    while time.time() < t0:
        time.sleep(0.001)
    cpu0 = time.process_time()

    def timed(kind: str, fn: Any) -> Any:
        nonlocal busy_errors
        while True:
            c0 = time.perf_counter()
            try:
                out = fn()
            except StoreBusy:
                busy_errors += 1
                continue
            calls[kind].append(time.perf_counter() - c0)
            return out

    def window_busy(r: Running, until: float) -> float:
        return max(0.0, min(until, t_end) - max(r.started, w0)) * r.gpus

    def dispatch(h: SimHost) -> None:
        nonlocal passes, pages
        passes += 1
        busy = h.busy()
        reserved: set[str] = set()
        reserving = False
        after = None
        while True:
            page = timed("page", lambda: store.runnable_layers(limit=PAGE, after=after))
            pages += 1
            for layer in page:
                fit = h.static_fit.get(layer.layer_id)
                if fit is None:
                    fit = (
                        select_devices(GpuRequest.from_record(layer), h.devices).could_ever_fit
                        if layer.gpus > 0
                        else layer.cores <= CPU_SLOTS
                    )
                    h.static_fit[layer.layer_id] = fit
                if not fit:
                    continue
                while True:
                    if layer.gpus <= 0:
                        if h.cpu_used() + max(1, math.ceil(layer.cores)) > CPU_SLOTS:
                            break
                        chosen: tuple[Any, ...] = ()
                    else:
                        request = GpuRequest.from_record(layer)
                        result = select_devices(request, h.devices, busy=busy | reserved)
                        if not result.devices:
                            if not reserving and result.could_ever_fit and layer.gpus > 1:
                                reserving = True  # hold what it could use; others backfill elsewhere
                                reserved |= {
                                    d.uuid
                                    for d in h.devices
                                    if d.uuid not in busy and device_fits_statically(request, d) is None
                                }
                            break
                        chosen = result.devices
                    uuids = [d.uuid for d in chosen]
                    claim = timed(
                        "claim",
                        lambda: store.claim_frame(
                            layer.layer_id,
                            host=h.name,
                            worker=h.name,
                            gpu_uuids=uuids,
                            now=time.time(),
                            lease_s=lease_s,
                        ),
                    )
                    if claim is None:
                        break
                    t = time.time()
                    claims.append(t)
                    if chosen:
                        latencies.append((t, len(uuids), t - max(h.freed_at[u] for u in uuids)))
                    h.running[claim.frame_id] = Running(
                        claim.frame_id, claim.attempt, tuple(uuids), len(uuids), t, t + duration()
                    )
                    busy |= set(uuids)
            if len(page) < PAGE:
                return
            after = page[-1].order_key

    while True:
        now = time.time()
        if now >= t_end:
            break
        next_event = now + 0.05
        for h in hosts:
            now = time.time()
            for r in [r for r in h.running.values() if r.ends <= now]:
                res = FrameResult(exit_code=0, started_at=r.started, ended_at=r.ends)
                timed("complete", lambda: store.complete_frame(r.frame_id, r.attempt, res, now=time.time()))
                del h.running[r.frame_id]
                for u in r.uuids:
                    h.freed_at[u] = r.ends
                busy_s += window_busy(r, r.ends)
                h.dirty = True
            if now >= h.next_heartbeat:
                ids = list(h.running)
                attempts = {fid: r.attempt for fid, r in h.running.items()}
                timed(
                    "heartbeat",
                    lambda: store.heartbeat(h.name, ids, now=time.time(), lease_s=lease_s, attempts=attempts),
                )
                h.next_heartbeat = now + cfg["heartbeat"]
            free = len(h.devices) - len(h.busy()) + CPU_SLOTS - h.cpu_used()
            if h.dirty or (free and now >= h.next_poll):
                h.dirty = False
                h.next_poll = now + cfg["poll"]
                dispatch(h)
            soonest = min((r.ends for r in h.running.values()), default=next_event)
            next_event = min(next_event, soonest, h.next_heartbeat, h.next_poll if free else next_event)
        pause = next_event - time.time()
        if pause > 0:
            time.sleep(pause)
    for h in hosts:
        for r in h.running.values():
            busy_s += window_busy(r, t_end)
    cpu = time.process_time() - cpu0
    in_window = [t for t in claims if w0 <= t <= t_end]
    results.put(
        {
            "claims": len(in_window),
            "claims_all": len(claims),
            "latencies": [(g, v) for t, g, v in latencies if w0 <= t <= t_end],
            "busy_s": busy_s,
            "cpu_s": cpu,
            "passes": passes,
            "pages": pages,
            "busy_errors": busy_errors,
            "calls": {k: (_pct(v, 0.5), _pct(v, 0.99), len(v)) for k, v in calls.items()},
        }
    )
    release.wait(120)
    store.close()


# -- the database server's CPU ---------------------------------------------------------------------------
def server_pids(data_dir: Path) -> list[int]:
    """The postmaster of ``data_dir`` and its children (backends and helpers)."""
    try:
        master = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    pids = [master]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == master:
                pids.append(int(entry.name))
    return pids


def cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


# -- stores and jobs -------------------------------------------------------------------------------------
class Backends:
    def __init__(self, tmp: Path, pg_url: str | None, want_pg: bool) -> None:
        self.tmp, self.pg_url, self.server, self.pg_missing = tmp, pg_url, None, None
        if pg_url is None and want_pg:
            sys.path.insert(0, str(REPO / "tests"))
            import pgserver  # type: ignore[import-not-found]

            try:
                self.server = pgserver.shared_server()
            except pgserver.PgUnavailable as exc:
                self.pg_missing = str(exc)

    @property
    def has_pg(self) -> bool:
        return self.server is not None or self.pg_url is not None

    def sqlite(self) -> str:
        return str(self.tmp / f"{uuid.uuid4().hex[:8]}.db")

    def postgres(self) -> str:
        if self.server is not None:
            return str(self.server.url(self.server.create_database()))
        import psycopg

        assert self.pg_url is not None
        schema = f"farm_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        sep = "&" if "?" in self.pg_url else "?"
        return f"{self.pg_url}{sep}options={quote(f'-csearch_path={schema}')}"


def submit_jobs(
    url: str,
    *,
    gpus: int,
    hosts: int,
    seconds: float,
    frame_seconds: float,
    jobs: int,
    unrunnable: int,
    saturated_frames: int | None,
) -> int:
    """The job mix; returns the frames queued (runnable ones)."""
    from cuectl import config
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    user = config.current_user()
    store = open_store(url)
    now = time.time()
    for i in range(unrunnable):
        store.submit(
            spec_from_mapping(
                {
                    "name": f"amd-{i}",
                    "priority": 10,
                    "layers": [{"name": "r", "command": ["true"], "gpus": 1, "gpu_vendor": "AMD"}],
                },
                user=user,
            ),
            now=now,
        )
    gpu_share = sum(w * g for g, w in MIX)  # device-frames per frame
    if saturated_frames is None:
        # Twice the device-seconds the run can use, so the queue never runs dry.
        frames = max(3 * gpus, math.ceil(2 * gpus * seconds / max(frame_seconds, 0.1) / gpu_share))
    else:
        frames = saturated_frames
    cpu_frames_cap = (
        math.ceil(2 * hosts * CPU_SLOTS * seconds / max(frame_seconds, 0.1)) if saturated_frames is None else None
    )
    kinds = [g for g, _ in MIX]
    queued = 0
    for j in range(jobs):
        g = kinds[j % len(kinds)]
        share = dict(MIX)[g] / sum(1 for k in range(jobs) if kinds[k % len(kinds)] == g)
        n = max(1, math.ceil(frames * share))
        if g == 0 and cpu_frames_cap is not None:
            n = min(n, max(1, cpu_frames_cap // max(1, jobs // len(kinds))))
        layer: dict[str, Any] = {"name": "render", "command": ["true"], "range": f"1-{n}"}
        if g:
            layer.update({"gpus": g, "gpu_vendor": "NVIDIA", "gpu_memory_min": "40G"})
        store.submit(
            spec_from_mapping({"name": f"sim-{j}", "priority": j % 3, "layers": [layer]}, user=user, frame_limit=n),
            now=now,
        )
        queued += n
    store.close()
    return queued


# -- one phase -------------------------------------------------------------------------------------------
def run_phase(
    url: str, args: argparse.Namespace, *, frame_seconds: float, seconds: float, server_data: Path | None
) -> dict[str, Any]:
    gpus = args.hosts * args.gpus_per_host
    saturated = None if frame_seconds > 0 else args.saturated_frames
    t_sub = time.perf_counter()
    queued = submit_jobs(
        url,
        gpus=gpus,
        hosts=args.hosts,
        seconds=seconds,
        frame_seconds=frame_seconds,
        jobs=args.jobs,
        unrunnable=args.unrunnable,
        saturated_frames=saturated,
    )
    submit_s = time.perf_counter() - t_sub
    procs_n = max(1, min(args.procs, args.hosts))
    names = [f"sim{i:04d}" for i in range(args.hosts)]
    warmup = min(args.warmup, seconds / 3)
    cfg = {
        "gpus_per_host": args.gpus_per_host,
        "lease_s": args.lease_timeout,
        "frame_seconds": frame_seconds,
        "seconds": seconds,
        "warmup": warmup,
        "heartbeat": args.lease_timeout / 4,
        "poll": args.poll,
    }
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs_n + 1)
    start = ctx.Value("d", 0.0)
    results = ctx.Queue()
    release = ctx.Event()
    procs = [
        ctx.Process(target=sim_process, args=(url, names[i::procs_n], cfg, barrier, start, results, release))
        for i in range(procs_n)
    ]
    for p in procs:
        p.start()
    barrier.wait(600)  # every host registered
    start.value = time.time() + 0.2
    barrier.wait(60)
    t0 = start.value
    pids = server_pids(server_data) if server_data else []
    time.sleep(max(0.0, t0 + warmup - time.time()))
    db0 = cpu_seconds(pids) if pids else None
    out = [results.get(timeout=seconds + 600) for _ in procs]
    db1 = cpu_seconds(pids) if pids else None
    release.set()
    for p in procs:
        p.join(60)
    window = seconds - warmup
    claims = sum(r["claims"] for r in out)
    lat1 = [v for r in out for g, v in r["latencies"] if g == 1]
    latn = [v for r in out for g, v in r["latencies"] if g > 1]
    calls = {
        k: (max(r["calls"][k][0] for r in out), max(r["calls"][k][1] for r in out), sum(r["calls"][k][2] for r in out))
        for k in out[0]["calls"]
    }
    return {
        "queued": queued,
        "submit_s": submit_s,
        "procs": procs_n,
        "window": window,
        "rate": claims / window,
        "claims": claims,
        "busy": sum(r["busy_s"] for r in out) / (gpus * window),
        "p50": _pct(lat1, 0.5),
        "p99": _pct(lat1, 0.99),
        "multi50": _pct(latn, 0.5),
        "multi99": _pct(latn, 0.99),
        # A short run can fall inside one clock tick of the server's CPU time (10 ms): that is no figure.
        "db_cpu_ms": None if db0 is None or db1 is None or not claims or db1 <= db0 else 1000 * (db1 - db0) / claims,
        "client_cpu_ms": 1000 * sum(r["cpu_s"] for r in out) / max(1, sum(r["claims_all"] for r in out)),
        "passes": sum(r["passes"] for r in out),
        "pages": sum(r["pages"] for r in out),
        "busy_errors": sum(r["busy_errors"] for r in out),
        "calls": calls,
        "dry": sum(r["claims_all"] for r in out) >= 0.95 * queued,
    }


def ms(v: float | None) -> str:
    return "-" if v is None or v != v else f"{1000 * v:.1f}"


# -- main ------------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=50, help="simulated worker hosts (default 50)")
    parser.add_argument("--gpus-per-host", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20, help="length of the farm phase (default 20)")
    parser.add_argument("--frame-seconds", type=float, default=4, help="mean frame duration in the farm phase")
    parser.add_argument(
        "--saturated-seconds",
        type=float,
        default=None,
        help="length of the saturated phase (default: half of --seconds; 0 skips it)",
    )
    parser.add_argument("--saturated-frames", type=int, default=20_000, help="frames queued for the saturated phase")
    parser.add_argument("--warmup", type=float, default=5, help="seconds left out of the figures at the start")
    parser.add_argument("--procs", type=int, default=4, help="OS processes driving the hosts (store connections)")
    parser.add_argument("--jobs", type=int, default=40, help="one-layer jobs in the mix")
    parser.add_argument("--unrunnable", type=int, default=50, help="higher-priority layers no host can run")
    parser.add_argument("--poll", type=float, default=1.0, help="a host with free devices re-reads this often")
    parser.add_argument("--lease-timeout", type=float, default=60.0, help="heartbeats every lease-timeout/4")
    parser.add_argument("--backends", default="postgres,sqlite", help="comma-separated: postgres, sqlite")
    parser.add_argument("--pg-url", help="an existing PostgreSQL database (a schema per phase; CPU not measured)")
    args = parser.parse_args()
    sat_seconds = args.seconds / 2 if args.saturated_seconds is None else args.saturated_seconds
    wanted = [b.strip() for b in args.backends.split(",") if b.strip()]
    gpus = args.hosts * args.gpus_per_host

    with tempfile.TemporaryDirectory(prefix="cuectl-farm-") as tmp_name:
        backends = Backends(Path(tmp_name), args.pg_url, "postgres" in wanted)
        print(
            f"farm: {args.hosts} hosts x {args.gpus_per_host} GPUs = {gpus:,} GPUs, {CPU_SLOTS} CPU slots per host; "
            f"{min(args.procs, args.hosts)} client processes; {os.cpu_count()} CPUs; load average "
            f"{os.getloadavg()[0]:.1f}"
        )
        print(
            f"mix: frames {', '.join(f'{int(w * 100)} % {g}-GPU' if g else f'{int(w * 100)} % CPU' for g, w in MIX)}; "
            f"{args.jobs} jobs, {args.unrunnable} unrunnable layers ahead; farm phase {args.seconds:g} s, frames "
            f"~{args.frame_seconds:g} s (lognormal); saturated phase {sat_seconds:g} s, frames 0 s; "
            f"figures after a {min(args.warmup, args.seconds / 3):g} s warm-up"
        )
        runs: list[tuple[str, str, dict[str, Any]]] = []
        for backend in wanted:
            if backend == "postgres" and not backends.has_pg:
                print(f"PostgreSQL: not measured ({backends.pg_missing})")
                continue
            label = "PostgreSQL" if backend == "postgres" else "SQLite"
            phases = [("farm", args.frame_seconds, args.seconds)] + (
                [("saturated", 0.0, sat_seconds)] if sat_seconds > 0 else []
            )
            for phase, fs, secs in phases:
                url = backends.postgres() if backend == "postgres" else backends.sqlite()
                data = backends.server.data if backend == "postgres" and backends.server is not None else None
                runs.append((label, phase, run_phase(url, args, frame_seconds=fs, seconds=secs, server_data=data)))

        print(
            "\nlatency: a GPU frame's claim returning minus the moment the last of its devices freed; 1-GPU "
            "frames, then multi-GPU frames (these include waiting for a reservation to fill)"
        )
        print(
            f"{'backend':<11} {'phase':<10} {'claims/s':>9} {'GPU busy':>9} {'latency p50/p99 ms':>19} "
            f"{'multi-GPU p50/p99':>19} {'DB CPU/claim':>13} {'client CPU/claim':>17}  store calls p50/p99 ms "
            "(count)"
        )
        for label, phase, r in runs:
            db = "not measured" if r["db_cpu_ms"] is None else f"{r['db_cpu_ms']:.2f} ms"
            calls = ", ".join(f"{k} {ms(v[0])}/{ms(v[1])} ({v[2]:,})" for k, v in r["calls"].items())
            print(
                f"{label:<11} {phase:<10} {r['rate']:>9,.0f} {100 * r['busy']:>8.0f}% "
                f"{ms(r['p50']) + ' / ' + ms(r['p99']):>19} {ms(r['multi50']) + ' / ' + ms(r['multi99']):>19} "
                f"{db:>13} {r['client_cpu_ms']:>14.2f} ms  {calls}"
            )
        for label, phase, r in runs:
            print(
                f"  {label} {phase}: {r['queued']:,} frames queued in {r['submit_s']:.1f} s; {r['claims']:,} claims "
                f"in the {r['window']:.1f} s window; {r['passes']:,} dispatch passes reading {r['pages']:,} pages"
                + (f"; {r['busy_errors']} busy errors retried" if r["busy_errors"] else "")
                + ("; THE QUEUE RAN DRY: claims/s is a lower bound (raise --saturated-frames)" if r["dry"] else "")
            )

        print("\ncapacity (needed claims/s = GPUs / frame seconds):")
        for label in dict.fromkeys(lbl for lbl, _, _ in runs):
            best = max(r["rate"] for lbl, _, r in runs if lbl == label)
            farm = next((r for lbl, ph, r in runs if lbl == label and ph == "farm"), None)
            if farm is not None:
                per_gpu_frame = sum(w * g for g, w in MIX if g) / sum(w for g, w in MIX if g)
                need = gpus / per_gpu_frame / args.frame_seconds
                print(
                    f"  {label}: farm phase needed ~{need:,.0f} GPU claims/s to keep every device busy "
                    f"(this mix: {per_gpu_frame:.2f} GPUs per GPU frame; CPU frames come on top), got "
                    f"{farm['rate']:,.0f} claims/s with the GPUs {100 * farm['busy']:.0f}% busy"
                )
            print(
                f"  {label}: sustained {best:,.0f} claims/s -> on this {gpus:,}-GPU farm the store is the "
                f"bottleneck below frames of {gpus / best:.2f} s; 4,000 GPUs below {4000 / best:.1f} s, "
                f"10,000 GPUs below {10000 / best:.1f} s"
            )
            for lbl, ph, r in runs:
                if lbl == label and r["db_cpu_ms"] is not None:
                    print(
                        f"  {label} {ph}: database CPU {r['db_cpu_ms']:.2f} ms per claim (with its completion, "
                        f"heartbeats and dispatch reads) -> one database core ~{1000 / r['db_cpu_ms']:,.0f} claims/s"
                    )


if __name__ == "__main__":
    main()
