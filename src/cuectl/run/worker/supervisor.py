"""The supervisor: drives ``Worker.loop()`` — sleeps between iterations, wakes on a frame's
exit, a signal or queued work, turns signals into drain, abort or a new look for GPUs, and
decides when to stop — through the worker's public methods only; and ``ExitWatch``, which
notes frames' real end times while an iteration is held up."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Any, Callable

from cuectl.errors import Conflict, CuectlError, StoreError, StoreGone, StoreStalled

from .core import Worker
from .storeview import STORE_RETRY_MAX_S


# -- frames' real end times -----------------------------------------------------------------------
class ExitWatch:
    """Notes when running frames end while the loop is held up (a store call that waits on a
    silent server, a slow pass): the loop reaps a frame only when it gets back, and the end
    it records must be the frame's, not that (a 2 s frame read 8.4 s after an 8 s stall).
    A thread that looks every ``every`` s, and only while one iteration has lasted longer
    than ``after`` s: an idle or quick worker pays a timer wake-up, nothing per frame."""

    def __init__(self, worker: Worker, *, after: float = 0.2, every: float = 0.1) -> None:
        self.worker, self.after, self.every = worker, after, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cuectl-exit-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            since = self.worker.busy_since
            if since is None or time.monotonic() - since < self.after:
                continue
            for rf in list(self.worker.running.values()):
                rf.proc.note_exit()


# -- the supervisor ----------------------------------------------------------------------------
class Supervisor:
    """Drives ``Worker.loop()``: sleeps between iterations, wakes on child exit or signal,
    turns SIGTERM/SIGINT into drain (first) and abort (second), and SIGHUP into a look for
    GPUs that vanished or appeared (at the next iteration)."""

    def __init__(self, worker: Worker, *, on_iteration: Callable[[Worker], None] | None = None) -> None:
        self.worker = worker
        self.signals = 0
        self.last_signal = ""
        self.on_iteration = on_iteration
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # After a signal, a store call that has waited this long for its server is abandoned
    # (and the store not asked again for STALL_S), so the worker acts within 2 s.
    HUNG_CALL_S = 1.0
    STALL_S = 5.0

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        try:
            self.last_signal = signal.Signals(signum).name
        except ValueError:
            self.last_signal = f"signal {signum}"
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        # The loop acts on it at its next iteration: unless a store call hangs (a server
        # that stopped answering), which the alarm then abandons, so that a worker obeys
        # SIGTERM within 2 s whatever the store does. It keeps watching until the end.
        signal.setitimer(signal.ITIMER_REAL, 0.25, 0.25)

    def _on_hup(self, signum: int, frame: Any) -> None:
        """SIGHUP (`systemctl reload`, `kill -HUP`): find the GPUs again; not a stop signal."""
        self.worker.ask_rediscover()
        try:
            os.write(self._wake_w, b"h")
        except OSError:
            pass

    def _on_alarm(self, signum: int, frame: Any) -> None:
        store = self.worker.store
        since = store.calling_since
        if since is not None and time.monotonic() - since > self.HUNG_CALL_S:
            why = f"did not answer for {self.HUNG_CALL_S:g} s; abandoned the call to act on a signal"
            store.stall(self.STALL_S, why=why)
            raise StoreStalled(f"store {store.url} {why}")

    def install_signals(self, *, hangup_stops: bool = False) -> None:
        """SIGTERM/SIGINT drain (then abort); SIGHUP re-discovers the GPUs, unless
        ``hangup_stops`` (a worker in a terminal: there SIGHUP means the terminal is gone,
        and it drains as on SIGTERM)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        signal.signal(signal.SIGALRM, self._on_alarm)
        if hasattr(signal, "SIGHUP"):
            signal.signal(signal.SIGHUP, self._on_signal if hangup_stops else self._on_hup)

    def _start(self) -> bool:
        """Register and recover, retrying while the store is busy; False if told to stop."""
        w, delay = self.worker, 0.1
        said: str | None = None
        while True:
            w.write_heartbeat_file(force=True)  # alive while it waits for the store (liveness)
            try:
                w.register(w.store.clock())
                w.recover(w.store.clock())
                w.write_heartbeat_file(force=True)  # registered: ready
                locked = w.host_locked()
            except StoreError as exc:
                if w.warn and exc.message != said:
                    w.warn(f"store unavailable, retrying (back-off up to {STORE_RETRY_MAX_S:g} s): {exc.message}")
                said = exc.message  # one line per error, not one per try
                if self.signals:
                    return False
                time.sleep(delay)
                delay = min(delay * 2, STORE_RETRY_MAX_S)
                continue
            if locked and w.opts.until_idle:
                # Nothing could ever run here: say so instead of exiting 0 having done nothing.
                raise Conflict(
                    f"host {w.opts.name} is locked: an --until-idle worker would run nothing",
                    hint=f"cuectl host unlock {w.opts.name}",
                )
            if locked and w.say:
                w.say(f"host {w.opts.name} is locked: claiming nothing until `cuectl host unlock {w.opts.name}`")
            return True

    def _finished(self) -> bool:
        w = self.worker
        try:
            return w.done() or (w.opts.until_idle and w.is_idle())
        except StoreError:
            return False  # cannot tell now; look again next iteration

    def run(self) -> int:
        watch = ExitWatch(self.worker)
        watch.start()
        try:
            return self._run()
        finally:
            watch.stop()
            # Whatever ended the loop (idle, drained, a second signal, an error), this
            # process no longer works for the host: it signs off (still under the hung-call
            # watch, so a silent store cannot hold a signalled worker's exit).
            self.worker.sign_off()
            signal.setitimer(signal.ITIMER_REAL, 0)  # the hung-call watch ends with the loop
            self.worker.release_runfiles()

    def _run(self) -> int:
        w = self.worker
        if not self._start():
            return 130
        handled = 0
        while True:
            if self.signals > handled:
                handled = self.signals
                if handled == 1:
                    w.drain(self.last_signal or "asked to stop")
                else:
                    w.abort()
                    return 130
            # Every store call of an iteration, `_finished`'s look at the queue too, runs
            # marked busy: a frame that ends while one waits on a silent server keeps its
            # real end time (ExitWatch).
            w.busy_since = time.monotonic()
            try:
                stats = w.loop()
                finished = self._finished()
            except StoreGone:
                w.abort()  # its frames' results could never be recorded: stop them now
                raise
            finally:
                w.busy_since = None
            if self.on_iteration:
                self.on_iteration(w)
            if not finished and w.stranded():
                w.stop_without_store()  # raises: one error line, exit 1
            if finished:
                if w.opts.until_idle and w.too_big and not w.draining and not w.reached_max():
                    # Idle, but work is left that no frame here could ever take: say so
                    # rather than exit 0 as if the queue were done.
                    reasons = list(w.too_big.values())
                    more = f" (and {len(reasons) - 1} more layer(s))" if len(reasons) > 1 else ""
                    raise CuectlError(
                        f"idle, but waiting work can never run on this host: {reasons[0]}{more}",
                        hint="submit it with fewer --cores/--memory, or run it on a bigger host (`cuectl job why JOB`)",
                    )
                return 0
            if stats.claimed or stats.finished:
                continue  # a slot freed or work started: look again at once
            self._sleep(w)

    def _sleep(self, w: Worker) -> None:
        """Wait for a frame to exit, a signal, queued work (the store's NOTIFY, where it has
        one), or the next poll/heartbeat — whichever first."""
        timeout = w.wake_in(w.store.clock())
        fds = [self._wake_r]
        # PostgreSQL: the store's connection turns readable on NOTIFY, so new work is
        # dispatched at once instead of at the next poll (None: the store cannot tell).
        # A NOTIFY read with the last pass's results no longer makes it readable: the
        # store kept it, and we look at the queue again at once.
        store_fd = w.store.notify_fileno()
        if store_fd is not None:
            fds.append(store_fd)
            w.busy_since = time.monotonic()  # a store call (ExitWatch)
            try:
                if w.store.drain_notifications():
                    timeout = 0.0
            finally:
                w.busy_since = None
        pidfds = []
        for rf in w.running.values():
            if rf.proc.pid and hasattr(os, "pidfd_open"):
                try:
                    pidfds.append(os.pidfd_open(rf.proc.pid))
                except OSError:
                    timeout = min(timeout, 0.05)
            elif w.running:
                timeout = min(timeout, 0.05)
        try:
            ready, _, _ = select.select(fds + pidfds, [], [], timeout)
            if store_fd is not None and store_fd in ready:
                w.store.drain_notifications()
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 64)
                except OSError:
                    pass
        finally:
            for fd in pidfds:
                os.close(fd)
