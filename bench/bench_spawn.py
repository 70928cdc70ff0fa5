#!/usr/bin/env python3
"""Would the worker dispatch faster if frames were started off its main thread? Prints
figures; asserts nothing.

    .venv/bin/python bench/bench_spawn.py [--frames 1000] [--work-ms 0.8,0.4] [--runs 3]

``os.posix_spawn`` (how the worker starts a frame: ``cuectl.run.spawn``) keeps the GIL
while the child execs, and glibc's vfork stops the calling thread until then: the worker's
in-process profile shows ~0.3–0.5 ms of each frame there. This drains ``--frames`` runs of
``true`` through 2 slots, with ``--work-ms`` of Python work on the main thread per
completion (the worker's store transaction and bookkeeping come before the next start),
two ways in the same run, alternating:

- main thread: ``os.posix_spawn``, as the worker does;
- helper thread: libc's ``posix_spawn`` through ctypes (ctypes lets go of the GIL) on a
  thread the main thread hands each start to, handling completions meanwhile.

The environment has ~80 variables, about a frame's.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import selectors
import shutil
import statistics
import threading
import time

TRUE = shutil.which("true") or "/bin/true"
ENV = {**os.environ, **{f"CUE_BENCH_{i}": "x" * 20 for i in range(60)}}


def _work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _ended(sel: selectors.BaseSelector, key: selectors.SelectorKey, work_s: float) -> None:
    """A frame's pidfd fired: reap it, then the main thread's work for its completion."""
    sel.unregister(key.fd)
    os.close(key.fd)
    os.waitpid(key.data, 0)
    _work(work_s)


def on_main_thread(frames: int, work_s: float) -> float:
    """Frames per second, each started by ``os.posix_spawn`` on this thread."""
    sel = selectors.DefaultSelector()
    started = done = 0

    def start() -> None:
        nonlocal started
        pid = os.posix_spawn(TRUE, ["true"], ENV)
        sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
        started += 1

    t0 = time.perf_counter()
    for _ in range(min(2, frames)):
        start()
    while done < frames:
        for key, _ in sel.select():
            _ended(sel, key, work_s)
            done += 1
            if started < frames:
                start()
    sel.close()
    return frames / (time.perf_counter() - t0)


def _libc_spawn() -> "ctypes._CFuncPtr":
    libc = ctypes.CDLL(None, use_errno=True)
    spawn = libc.posix_spawn
    spawn.argtypes = [
        ctypes.POINTER(ctypes.c_int),
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_char_p),
        ctypes.POINTER(ctypes.c_char_p),
    ]
    return spawn


def on_helper_thread(frames: int, work_s: float) -> float:
    """Frames per second, each started by libc's ``posix_spawn`` on a helper thread."""
    spawn = _libc_spawn()
    path = os.fsencode(TRUE)
    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    sel.register(wake_r, selectors.EVENT_READ, None)
    requests: queue.SimpleQueue[bool] = queue.SimpleQueue()
    pids: queue.SimpleQueue[int] = queue.SimpleQueue()

    def spawner() -> None:
        while requests.get():
            argv = (ctypes.c_char_p * 2)(b"true", None)
            items = [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in ENV.items()]
            envp = (ctypes.c_char_p * (len(items) + 1))(*items, None)
            pid = ctypes.c_int()
            err = spawn(ctypes.byref(pid), path, None, None, argv, envp)
            if err:
                raise OSError(err, os.strerror(err))
            pids.put(pid.value)
            os.write(wake_w, b"x")

    thread = threading.Thread(target=spawner, daemon=True)
    thread.start()
    requested = done = 0
    t0 = time.perf_counter()
    for _ in range(min(2, frames)):
        requests.put(True)
        requested += 1
    while done < frames:
        for key, _ in sel.select():
            if key.data is None:  # the helper started some
                os.read(wake_r, 64)
                while not pids.empty():
                    pid = pids.get()
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, pid)
                continue
            _ended(sel, key, work_s)
            done += 1
            if requested < frames:
                requests.put(True)
                requested += 1
    took = time.perf_counter() - t0
    requests.put(False)
    thread.join()
    sel.close()
    os.close(wake_r)
    os.close(wake_w)
    return frames / took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=1000)
    parser.add_argument("--work-ms", default="0.8,0.4", help="main-thread work per completion, ms (comma-separated)")
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per figure (median)")
    args = parser.parse_args()
    print(
        f"{args.frames} runs of {TRUE} through 2 slots, {len(ENV)} environment variables, "
        f"median of {args.runs} alternating runs"
    )
    for work_ms in (float(w) for w in args.work_ms.split(",")):
        main_rates, helper_rates = [], []
        for _ in range(args.runs):
            main_rates.append(on_main_thread(args.frames, work_ms / 1e3))
            helper_rates.append(on_helper_thread(args.frames, work_ms / 1e3))
        main_rate, helper_rate = statistics.median(main_rates), statistics.median(helper_rates)
        print(
            f"  {work_ms:.2f} ms of work a frame: main thread {main_rate:,.0f}/s, helper thread "
            f"{helper_rate:,.0f}/s, helper / main {helper_rate / main_rate:.2f}"
        )


if __name__ == "__main__":
    main()
