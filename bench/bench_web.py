#!/usr/bin/env python3
"""The web monitor in headless Chromium: how long a job of F frames (default 10,000) takes to
show and to filter, and what each live refresh of its page downloads.

Builds a SQLite store with one job of F frames, R of them (default 8) RUNNING on a host
played by this script (no real worker: the figures are the page's and the server's alone),
starts a real `cuectl serve` on 127.0.0.1 (a free port), creates a viewer token, and drives
Debian's Chromium (/usr/bin/chromium, or $CUECTL_CHROMIUM; never a browser Playwright
downloads) with Playwright:
  1. open: a new tab of a logged-in browser goes to #/jobs/<id>; the time until the first
     frame rows are in the table, and until the last frame's row is there after scrolling
     the table to its end (median and range over --runs tabs);
  2. filter: a click on the RUNNING state chip until only the R RUNNING rows show, and a
     second click until the WAITING rows are back;
  3. live: for --seconds the page stays open while the played worker publishes new GPU
     values for its RUNNING frames every 0.5 s and ends one frame (claiming the next) every
     2 s, as a busy host does. Every request the page makes is recorded with its response's
     status and body bytes on the wire (Playwright's request sizes): per tick (one fetch of
     the job each), and by kind, next to the size of the whole frame list.
The contract (docs/web.md) says under 1 s to rows and interactive on a 2-core machine, and
that a tick never downloads the whole list while only RUNNING frames change. Figures are
printed, with whether the 1 s target was met; nothing is asserted.

Usage: python bench/bench_web.py [--frames N] [--running N] [--runs N] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from cuectl.sched.spec import spec_from_flags
from cuectl.sched.store import open_store
from cuectl.sched.store.base import FrameResult, LiveUsage

HOST = "127.0.0.1"
GIB = 1024**3
TARGET_S = 1.0
CHROMIUM = os.environ.get("CUECTL_CHROMIUM") or "/usr/bin/chromium"
PLAYED_HOST = "bench-host"


def cuectl() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class PlayedWorker:
    """A host's worker played in this process: claims, live values, completions."""

    def __init__(self, db: Path, layer_id: int, running: int) -> None:
        self.db = db
        self.store = open_store(str(db), create=False)  # this thread's; the ticking thread opens its own
        self.layer_id = layer_id
        self.claims = [self._claim(self.store) for _ in range(running)]
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.completed = 0

    def _claim(self, store):
        return store.claim_frame(
            self.layer_id, host=PLAYED_HOST, worker="bench-w", gpu_uuids=[], now=time.time(), lease_s=3600.0
        )

    def publish(self, store, util: float) -> None:
        now = time.time()
        store.record_live_usage(
            PLAYED_HOST,
            [
                LiveUsage(
                    frame_id=c.frame_id,
                    attempt=c.attempt,
                    sampled_at=now,
                    util_pct=util,
                    memory_used_bytes=int((2 + util / 50) * GIB),
                    samples={},
                )
                for c in self.claims
                if c
            ],
            now=now,
        )

    def start(self) -> None:
        def run() -> None:
            store = open_store(str(self.db), create=False)
            tick = 0
            while not self.stop.wait(0.5):
                tick += 1
                if tick % 4 == 0 and self.claims and self.claims[0] is not None:
                    done = self.claims.pop(0)
                    now = time.time()
                    store.complete_frame(
                        done.frame_id, done.attempt, FrameResult(exit_code=0, started_at=now - 2, ended_at=now), now=now
                    )
                    self.completed += 1
                    self.claims.append(self._claim(store))
                self.publish(store, 30 + (tick * 7) % 60)
            store.close()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread:
            self.thread.join(5)
        self.store.close()


def median_range(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    if len(ms) == 1:
        return f"{ms[0]:.0f} ms"
    return f"{statistics.median(ms):.0f} ms median ({min(ms):.0f}-{max(ms):.0f})"


def kind_of(url: str, job_id: int) -> str | None:
    parts = urlsplit(url)
    if parts.path == f"/api/v1/jobs/{job_id}":
        return "job"
    if parts.path == f"/api/v1/jobs/{job_id}/frames":
        query = parse_qs(parts.query)
        if "ids" in query:
            return "frames?ids="
        if "state" in query:
            return "frames?state=" + ",".join(query["state"])
        return "frames (whole list)"
    if parts.path.startswith("/api/"):
        return parts.path
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("error: playwright is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 1
    if not os.access(CHROMIUM, os.X_OK):
        print(f"error: no Chromium at {CHROMIUM} (apt-get install chromium, or set CUECTL_CHROMIUM)", file=sys.stderr)
        return 1

    tmp = Path(tempfile.mkdtemp(prefix="cuectl-bench-web-"))
    env = dict(
        os.environ,
        CUECTL_LOCK_DIR=str(tmp / "locks"),
        CUECTL_CREATE_LOCK_DIR="1",
        XDG_STATE_HOME=str(tmp / "state"),
        CUECTL_LOCK_REGISTRY=str(tmp / "lock-registry"),
    )
    for key in ("CUECTL_DB", "CUECTL_FAKE_GPUS", "CUECTL_LOG_DIR"):
        env.pop(key, None)
    db = tmp / "web.db"
    server = None
    played = None
    try:
        store = open_store(str(db), create=True)
        job_id = store.submit(
            spec_from_flags(name="bench-web", command=["true"], range=f"1-{args.frames}", gpus=1, user="bench"),
            now=time.time(),
        )
        layer_id = store.get_job(job_id)["layers"][0]["id"]
        store.close()
        played = PlayedWorker(db, layer_id, min(args.running, args.frames))
        played.publish(played.store, 40)
        token = json.loads(
            subprocess.run(
                [*cuectl(), "--db", str(db), "admin", "token", "create", "bench-viewer", "--role", "viewer", "--json"],
                check=True,
                env=env,
                capture_output=True,
                text=True,
            ).stdout
        )["secret"]
        port = free_port()
        url = f"http://{HOST}:{port}"
        log = open(tmp / "serve.log", "wb")
        server = subprocess.Popen(
            [*cuectl(), "--db", str(db), "serve", "--host", HOST, "--port", str(port), "--no-access-log"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/healthz", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    print((tmp / "serve.log").read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.05)
        req = urllib.request.Request(
            f"{url}/api/v1/jobs/{job_id}/frames?attempts=false&limit=10000",
            headers={"Authorization": f"Bearer {token}"},
        )
        full_bytes = len(urllib.request.urlopen(req, timeout=30).read())
        print(
            f"store: one job of {args.frames:,} frames, {len(played.claims)} RUNNING; the whole frame list "
            f"(attempts=false) is {full_bytes:,} bytes"
        )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(60_000)
            page = context.new_page()
            page.goto(url + "/#/login")
            page.fill("#token", token)
            page.check("#remember")  # localStorage: every new tab of this context is logged in
            page.click("#login-submit")
            page.wait_for_selector("#whoami:not(:empty)")
            page.close()
            measure(context, url, job_id, args, played, full_bytes)
            browser.close()
    finally:
        if played:
            played.close()
        if server:
            server.terminate()
            server.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


ROWS = "#frames-table tr[data-frame-id]"
ONLY_RUNNING = """n => { const rows = document.querySelectorAll('#frames-table tr[data-frame-id]');
  return rows.length === n && [...rows].every(r => r.querySelector('.state').textContent.trim() === 'RUNNING'); }"""
SOME_WAITING = """() => [...document.querySelectorAll('#frames-table tr[data-frame-id] .state')]
  .some(c => c.textContent.trim() === 'WAITING')"""
SCROLLER = """const scroller = () => { const t = document.getElementById('frames-table'); let el = t.parentElement;
  while (el && el !== document.body && !/(auto|scroll)/.test(getComputedStyle(el).overflowY)) el = el.parentElement;
  return (el && el !== document.body) ? el : document.scrollingElement; };"""
# Scroll the table to its end (again on each call: a big job's list arrives in parts) and
# say whether the row of frame ``id`` is there.
AT_END = (
    "id => { "
    + SCROLLER
    + """ const s = scroller(); s.scrollTop = s.scrollHeight;
  return !!document.querySelector(`#frames-table tr[data-frame-id="${id}"]`); }"""
)
TO_TOP = "() => { " + SCROLLER + " scroller().scrollTop = 0; }"
TIMINGS = """id => {
  const e = performance.getEntriesByType('resource'), nav = performance.getEntriesByType('navigation')[0];
  const list = e.filter(r => r.name.includes('/jobs/' + id + '/frames') && !/[?&](state|ids)=/.test(r.name));
  const first = list[0], last = list[list.length - 1];
  return {scripts_end: Math.max(...e.filter(r => r.name.endsWith('.js')).map(r => r.responseEnd)),
          dom: nav ? nav.domContentLoadedEventEnd : null, parts: list.length,
          first_start: first ? first.startTime : null, first_wait: first ? first.responseStart - first.requestStart : null,
          first_end: first ? first.responseEnd : null, rest_wait: list.length > 1 ? last.responseStart - last.requestStart : null,
          rest_bytes: list.length > 1 ? last.encodedBodySize : null, last_end: last ? last.responseEnd : null};
}"""


def measure(context, url: str, job_id: int, args: argparse.Namespace, played: PlayedWorker, full_bytes: int) -> None:
    opened, whole, to_end, chip_on, chip_off, rendered, phases = [], [], [], [], [], [], []
    frames = played.store.list_frames(job=job_id, limit=args.frames)[0]
    last_id = frames[-1]["id"]
    running = sum(1 for c in played.claims if c)
    for _ in range(args.runs):
        page = context.new_page()
        t0 = time.perf_counter()
        page.goto(f"{url}/#/jobs/{job_id}")
        page.wait_for_selector(ROWS)
        opened.append(time.perf_counter() - t0)
        rendered.append(page.locator(ROWS).count())
        page.wait_for_function(AT_END, arg=last_id, polling="raf")
        whole.append(time.perf_counter() - t0)
        phases.append(page.evaluate(TIMINGS, job_id))  # where the time went, from the page's own timings
        page.evaluate(TO_TOP)
        page.wait_for_selector(f'#frames-table tr[data-frame-id="{frames[0]["id"]}"]')
        t0 = time.perf_counter()
        page.wait_for_function(AT_END, arg=last_id, polling="raf")
        to_end.append(time.perf_counter() - t0)
        chip = page.locator('#state-chips .chip[data-state="RUNNING"]')
        t0 = time.perf_counter()
        chip.click()
        page.wait_for_function(ONLY_RUNNING, arg=running, polling="raf")
        chip_on.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        chip.click()
        page.wait_for_function(SOME_WAITING, polling="raf")
        chip_off.append(time.perf_counter() - t0)
        page.close()
    met = "met" if statistics.median(opened) < TARGET_S and statistics.median(chip_on) < TARGET_S else "NOT met"
    met_all = "met" if statistics.median(whole) < TARGET_S else "NOT met"
    print(
        f"open #/jobs/{job_id} in a new tab -> first rows: {median_range(opened)} "
        f"({min(rendered):,}-{max(rendered):,} rows in the DOM of {args.frames:,})"
    )

    def mid(key: str) -> float:
        values = [p[key] for p in phases if p.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    print(f"  the whole list in the table (the last row reachable by scrolling): {median_range(whole)}")
    print(
        f"  in the page (median ms from navigation start): scripts loaded {mid('scripts_end'):.0f}, "
        f"DOMContentLoaded {mid('dom'):.0f}; the list in {mid('parts'):.0f} request(s): the first sent at "
        f"{mid('first_start'):.0f} (server's wait {mid('first_wait'):.0f}), in at {mid('first_end'):.0f}; "
        f"the rest: server's wait {mid('rest_wait'):.0f}, {mid('rest_bytes'):,.0f} bytes, in at {mid('last_end'):.0f}"
    )
    print(f"scroll from the first row to the last (list loaded): {median_range(to_end)}")
    print(
        f"RUNNING chip on -> only the {running} RUNNING rows: {median_range(chip_on)}; "
        f"off -> all rows again: {median_range(chip_off)}"
    )
    print(
        f"target: rows and a chip filter in < {TARGET_S:g} s (median): {met}; "
        f"the whole list in < {TARGET_S:g} s: {met_all}"
    )

    # -- live ticks --------------------------------------------------------------------------
    page = context.new_page()
    page.goto(f"{url}/#/jobs/{job_id}")
    page.wait_for_function(AT_END, arg=last_id, polling="raf")  # the first load is over: only ticks from here
    page.evaluate(TO_TOP)
    page.wait_for_timeout(1000)
    seen: list = []

    def record(request) -> None:
        seen.append(request)

    page.on("request", record)
    completed0 = played.completed
    played.start()
    t0 = time.monotonic()
    page.wait_for_timeout(args.seconds * 1000)  # (in the page: Playwright delivers the events meanwhile)
    page.evaluate("0")
    page.remove_listener("request", record)
    elapsed = time.monotonic() - t0
    played.stop.set()
    by_kind: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for request in seen:
        kind = kind_of(request.url, job_id)
        if kind is None:
            continue
        response = request.response()
        sizes = request.sizes()
        by_kind[kind].append(
            (
                response.status if response else 0,
                max(0, sizes["responseBodySize"]) + max(0, sizes["responseHeadersSize"]),
            )
        )
    ticks = len(by_kind.get("job", []))
    total = sum(b for rows in by_kind.values() for _, b in rows)
    print(
        f"live: {elapsed:.1f} s, {ticks} ticks, {played.completed - completed0} frames ended meanwhile, "
        f"live values changed every 0.5 s"
    )
    for kind, rows in sorted(by_kind.items()):
        statuses = ", ".join(
            f"{n}x {s}" for s, n in sorted({s: sum(1 for st, _ in rows if st == s) for s, _ in rows}.items())
        )
        print(f"  {kind:<22} {len(rows):>4} requests ({statuses}), {sum(b for _, b in rows):>9,} bytes")
    per_tick = total / ticks if ticks else float("nan")
    print(
        f"bytes per live tick (bodies + headers): {per_tick:,.0f} "
        f"(the whole frame list is {full_bytes:,}: {per_tick / full_bytes * 100:.2f} % of it)"
    )
    full = len(by_kind.get("frames (whole list)", []))
    print(f"whole-list fetches during the ticks: {full}")
    page.close()


if __name__ == "__main__":
    sys.exit(main())
