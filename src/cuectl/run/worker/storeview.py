"""The store as the worker sees it: ``WorkerStore``, the store methods the worker calls (a
narrow protocol every ``Store`` satisfies), and ``StoreView``, its outage accounting (back-off,
one warning an outage, "store back") and the reports of finished attempts it has not
recorded yet (``Pending``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Protocol, Sequence

from cuectl.errors import StoreError
from cuectl.sched.store import (
    Actor,
    ClaimedFrame,
    DeviceState,
    FrameResult,
    GpuEvent,
    HostInfo,
    HostShape,
    LiveUsage,
    RunnableLayer,
)

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker

#: A store that failed is asked again after this, doubled at each failure up to the max
#: (docs/reliability.md, "Disk full"); the loop goes on meanwhile (frames, logs, signals).
STORE_RETRY_FIRST_S = 0.1
STORE_RETRY_MAX_S = 5.0


class WorkerStore(Protocol):
    """The part of ``cuectl.sched.store.Store`` a worker uses (docs/architecture.md): what a
    fake store for a worker test must provide, and all a worker may call."""

    url: str
    receipt_dir: Path | None
    calling_since: float | None

    def clock(self) -> float: ...
    def stall(self, seconds: float, why: str = ...) -> None: ...
    def notify_fileno(self) -> int | None: ...
    def drain_notifications(self) -> bool: ...
    # the host
    def register_host(self, host: HostInfo, *, now: float) -> None: ...
    def sign_off_host(self, name: str, worker_pid: int | None, *, now: float) -> bool: ...
    def host_inventories(self) -> dict[str, tuple[list[Mapping[str, Any]], bool, list[str]]]: ...
    def heartbeat(
        self,
        host: str,
        frame_ids: Iterable[int],
        *,
        now: float,
        lease_s: float,
        live: Mapping[str, Any] | None = ...,
        attempts: Mapping[int, int] | None = ...,
    ) -> dict[int, str | None]: ...
    def record_live_usage(self, host: str, usage: Sequence[LiveUsage], *, now: float) -> list[int]: ...
    def record_gpu_events(self, host: str, events: Sequence[GpuEvent]) -> int: ...
    # sick devices (run/worker/health.py)
    def actor(self) -> Actor: ...
    def device_states(self, host: str | None = ...) -> list[DeviceState]: ...
    def set_device_state(self, host: str, uuid: str, state: str, reason: str | None, *, now: float) -> bool: ...
    def failed_attempts(self, host: str, since: float) -> list[tuple[int, tuple[str, ...], float]]: ...
    def jobs_succeeded_elsewhere(self, job_ids: Sequence[int], host: str, uuid: str) -> set[int]: ...
    # dispatch
    def runnable_layers(
        self, *, limit: int = ..., after: tuple[Any, ...] | None = ..., host: HostShape | None = ...
    ) -> list[RunnableLayer]: ...
    def cap_reached(self, layer_id: int) -> str | None: ...
    def claim_frame(
        self,
        layer_id: int,
        *,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str],
        now: float,
        lease_s: float,
        log_dir: Path | str | None = ...,
    ) -> ClaimedFrame | None: ...
    def complete_and_claim_many(
        self,
        reports: Sequence[tuple[int, int, FrameResult]],
        layer_id: int,
        count: int,
        *,
        reported_at: float,
        host: str,
        worker: str,
        gpu_uuids: Sequence[str] = ...,
        now: float,
        lease_s: float,
        log_dir: Path | str | None = ...,
    ) -> tuple[list[str | None], list[ClaimedFrame]]: ...
    def complete_frame(self, frame_id: int, attempt: int, result: FrameResult, *, now: float) -> str | None: ...
    # recovery, reaping, idleness
    def running_on_host(self, host: str) -> list[dict[str, Any]]: ...
    def requeue_frame(self, frame_id: int, attempt: int, *, now: float, reason: str) -> str | None: ...
    def release_notifications(self, claimed_by_prefix: str, *, keep: str | None = ...) -> int: ...
    def reap(self, *, now: float) -> list[int]: ...
    def sweep_depends(self, *, now: float) -> int: ...
    def running_count(self) -> int: ...


@dataclass
class Pending:
    """A finished attempt whose report the store has not recorded yet: it goes with the
    iteration's next claim, else on its own at the iteration's end (``Worker.loop``), and
    waits for a later iteration while the store is busy or unreachable."""

    frame_id: int
    attempt: int
    result: FrameResult
    # Its place in this iteration's ``LoopStats.ended`` (whose state the report fills in);
    # None once the iteration that ended it is over.
    ended: int | None = None


@dataclass
class StoreView:
    """Whether the store answers (an outage: since when, how many failed iterations, when
    to ask again, what to say) and the results waiting for it."""

    worker: "Worker"
    pending: list[Pending] = field(default_factory=list)
    errors: int = 0
    down_since: float | None = None  # wall clock of the first failed call of an outage
    down_calls: int = 0
    # An outage (docs/reliability.md, "Disk full"): its start on the monotonic clock, when
    # the store may be called again (back-off, STORE_RETRY_FIRST_S doubling to
    # STORE_RETRY_MAX_S), its latest error, and the error last warned about (one line each).
    down_mono: float | None = None
    retry_at: float | None = None
    error: str | None = None
    warned: str | None = None
    # The store failed the last call (live write, heartbeat, claim): no live-usage write, an
    # optional extra, until a call gets through.
    live_paused: bool = False
    ok_at: float | None = None  # wall clock of the last store call that got through

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, exc: StoreError) -> None:
        """Busy, unreachable or full store: running frames go on, their results wait in
        `pending`, claiming resumes once it answers. It is asked again after a back-off that
        doubles from STORE_RETRY_FIRST_S to STORE_RETRY_MAX_S, not at every iteration (a full
        disk was retried 2 to 40 times a second, by --poll, for as long as it lasted), and the
        warning is one line per outage (again only if the error changes), not one per try."""
        self.live_paused = True
        self.errors += 1
        if self.down_since is None:
            self.down_since, self.down_mono = time.time(), time.monotonic()
        self.down_calls += 1
        delay = min(STORE_RETRY_MAX_S, STORE_RETRY_FIRST_S * 2 ** min(self.down_calls - 1, 16))
        self.retry_at = time.monotonic() + delay
        self.error = exc.message
        if exc.message != self.warned:
            self.warned = exc.message
            self.worker.tell_warn(
                f"store unavailable, retrying (back-off up to {STORE_RETRY_MAX_S:g} s; frames "
                f"keep running, their results wait here): {exc.message}"
            )

    def answered(self) -> None:
        """An iteration's store calls all got through: an outage, if any, is over."""
        self.live_paused = False
        if self.down_since is not None:
            self.worker.tell_say(
                f"store back after {time.time() - self.down_since:.1f} s ({self.down_calls} failed iteration(s))"
            )
            self.down_since, self.down_calls = None, 0
            self.down_mono = self.retry_at = self.error = self.warned = None

    def waiting(self) -> bool:
        """Is the store down and its back-off not over (no store call now)?"""
        return self.retry_at is not None and time.monotonic() < self.retry_at

    def report(self, frame_id: int, attempt: int, result: FrameResult, ended: int | None = None) -> str | None:
        try:
            state = self.worker.store.complete_frame(frame_id, attempt, result, now=self.worker.store.clock())
        except StoreError:
            # The store is busy or unreachable: keep the result and retry next iteration
            # (the frame's lease is still extended by our heartbeats meanwhile).
            self.pending.append(Pending(frame_id, attempt, result, ended))
            return None
        self.reported(ended, state)
        return state

    def reported(self, ended: int | None, state: str | None) -> None:
        """A report is recorded: what this iteration says of its frame (``ended``: its place
        in ``stats.ended``, None if another iteration ended it) gets the new state."""
        if ended is not None:
            stats = self.worker.stats
            claim, info, _ = stats.ended[ended]
            stats.ended[ended] = (claim, info, state)

    def flush(self) -> None:
        """Record the waiting results, oldest first; a store error is raised (the loop's
        outage handling: back-off, one warning) with the rest still waiting. It used to be
        swallowed here, so a store that took claims and heartbeats but not results looked
        healthy while the results waited for ever."""
        store = self.worker.store
        while self.pending:
            p = self.pending[0]
            state = store.complete_frame(p.frame_id, p.attempt, p.result, now=store.clock())
            del self.pending[0]
            self.reported(p.ended, state)
