"""Sampling the devices: every local device each interval (idle ones and what others run on
them too), a frame's own devices when it starts and ends, the live values written for the
frames, and the latest values of each device that the heartbeat publishes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from cuectl.errors import StoreError
from cuectl.gpu.device import Device
from cuectl.run import launch
from cuectl.sched.store import LiveUsage
from cuectl.units import iso

from . import shares
from .running import RunningFrame

if TYPE_CHECKING:
    from cuectl.run.worker.core import Worker


@dataclass
class Sampling:
    worker: "Worker"
    # Every local device's latest values and when they were read (uuid -> entry of the live
    # doc, ``sampled_at`` in epoch seconds until published), from whichever sample saw it
    # last: the interval's sample of all devices, a frame's own, a dispatch pass's.
    device_values: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_device_sample: float = 0.0  # when the next sample of every device is due
    # When the latest sample of every device was taken, and the one whose values the store
    # has (a heartbeat or a publish between heartbeats sent it): see ``sample``.
    tick_at: float = 0.0
    tick_published_at: float = 0.0

    def due(self, now: float) -> bool:
        """Is a sample due: every device's (each interval, frames or not), or a frame's first?"""
        w = self.worker
        if w.devices and w.sampler is not None and now >= self.next_device_sample:
            return True
        running = w.running
        return bool(running) and now >= min(r.next_sample for r in running.values())

    def sample(self, now: float) -> None:
        """Each interval, one sampler call reads every local device and the processes of
        every running frame (so idle devices, and what others run on them, are seen too), and
        the heartbeat publishes the result at once; in between, a frame just started gets one
        sample of its own devices (short frames get data too)."""
        w = self.worker
        interval = w.opts.sample_interval_s
        tick = bool(w.devices) and w.sampler is not None and now >= self.next_device_sample
        due = [rf for rf in w.running.values() if tick or now >= rf.next_sample]
        for rf in due:
            rf.next_sample = now + interval
        sampled = [rf for rf in due if rf.devices]
        if tick:
            self.next_device_sample = now + interval
            self.tick_at = now
            self.sample_frames(sampled, now, every_device=True)
            w.health.check(now)  # sick devices out of service (run/worker/health.py)
            # Readers take a value older than two intervals for unknown. The heartbeat
            # carries the latest sample; between heartbeats the host row alone is written
            # only when the values the store has would be more than 1.5 intervals old at the
            # next heartbeat. Publishing every tick wrote the host row twice as often as
            # the heartbeats do (8 writes a minute against 4 at the defaults); this is 6.
            if (
                now < w.next_heartbeat
                and not w.link.live_paused
                and w.next_heartbeat - self.tick_published_at > 1.5 * interval
            ):
                w.publish(now)
        else:
            self.sample_frames(sampled, now)
        self.publish_live(sampled, now)

    def publish_live(self, frames: Sequence[RunningFrame], now: float) -> None:
        """Write the latest values and the series so far of the frames just sampled: one
        transaction per sampling tick for all of them (docs/accounting.md, live values).
        The sample taken at a frame's start is not written: a frame shorter than one
        interval costs no store write beyond its completion, which stores the series."""
        w = self.worker
        live = []
        for rf in frames:
            if rf.lost or rf.proc.finished or rf.usage.last_at != now or rf.usage.samples_taken < 2:
                continue
            util, mem = rf.usage.current()
            live.append(
                LiveUsage(
                    frame_id=rf.claim.frame_id,
                    attempt=rf.claim.attempt,
                    sampled_at=now,
                    util_pct=util,
                    memory_used_bytes=mem,
                    samples=rf.usage.series_json(),
                )
            )
        if not live or w.link.live_paused:
            return
        try:
            w.store.record_live_usage(w.opts.name, live, now=now)
        except StoreError:
            # Best effort: a later tick writes the series again, the completion in full. Not
            # before another store call gets through, though: each call to a lost server
            # waits for it, and the loop must keep noticing frames that end.
            w.link.live_paused = True

    def sample_frames(self, frames: Sequence[RunningFrame], now: float, *, every_device: bool = False) -> None:
        """Sample the devices of ``frames`` (and, ``every_device``, all local devices) with
        the frames' processes, in one sampler call."""
        w = self.worker
        sampler = w.sampler
        if (not frames and not every_device) or sampler is None:
            return
        uuids = sorted(
            {u for rf in frames for u in rf.claim.gpu_uuids} | ({d.uuid for d in w.devices} if every_device else set())
        )
        if not uuids:
            return
        pids: set[int] = set()
        frame_pids = {}
        table = launch.process_table() if any(not rf.proc.finished for rf in frames) else {}
        for rf in frames:
            if not rf.proc.finished:
                rf.seen_pids |= rf.proc.pids(table)
            frame_pids[rf.claim.frame_id] = set(rf.seen_pids)
            pids |= frame_pids[rf.claim.frame_id]
        try:
            # Each interval's sample of every device lists every process on them: whose
            # each is (gpuwatch.py) is how escapes, foreign use and idle devices are seen.
            samples = sampler(uuids, sorted(pids), every_process=every_device)
        except Exception:
            return
        for rf in frames:
            rf.usage.add(samples, frame_pids[rf.claim.frame_id], now)
        shares.check(w, frames, now)  # share frames against their memory budgets
        self.note_samples(samples, now)
        if every_device:
            w.gpuwatch.observe(samples, now)

    def note_samples(self, samples: Mapping[str, Any], now: float) -> None:
        """Keep each sampled device's values with the time they were read and the frame of
        this worker that held the device then (a reader must not take a frame's own use, seen
        just before it ended, for another program's)."""
        holders = {u: fid for fid, r in self.worker.running.items() for u in r.claim.gpu_uuids}
        for s in samples.values():
            self.device_values[s.uuid] = {
                "uuid": s.uuid,
                "utilization_pct": s.utilization_pct,
                "memory_used_bytes": s.memory_used_bytes,
                "memory_free_bytes": s.memory_free_bytes,
                "sampled_at": now,
                "frame_id": holders.get(s.uuid),
            }
        watch = self.worker.gpuwatch
        idle = watch.held_idle()
        for uuid, entry in self.device_values.items():
            # Whose processes run on it (pid, user, memory, owner), from the last sample of
            # every device, and whether a frame holds it idle (docs/gpu-health.md).
            entry["processes"] = watch.process_entries(uuid)
            entry["held_idle"] = uuid in idle

    def live_devices(self, now: float) -> list[Device]:
        """The inventory with live free memory (one batch sample), so busy cards are skipped;
        the sample is also what the host publishes of each device until a later one."""
        w = self.worker
        if not w.devices or w.sampler is None:
            return list(w.devices)
        try:
            samples = w.sampler([d.uuid for d in w.devices], [])
        except Exception:  # a flaky backend must not stop dispatch: use static values
            return list(w.devices)
        self.note_samples(samples, now)
        out = []
        for d in w.devices:
            s = samples.get(d.uuid)
            if s is not None and s.memory_free_bytes is not None:
                d = replace(d, memory_free_bytes=s.memory_free_bytes, utilization_pct=s.utilization_pct)
            out.append(d)
        return out

    def live_entries(self) -> dict[str, Any]:
        """The devices part of the live doc: every device's latest sample with its own time
        (each device always, never only the last tick's) and the sampling interval readers
        judge their age by; empty before any sample."""
        if not self.device_values:
            return {}
        w = self.worker
        wanted = {d.uuid for d in w.devices} | {u for r in w.running.values() for u in r.claim.gpu_uuids}
        entries = [v for u, v in self.device_values.items() if u in wanted]
        if not entries:
            return {}
        return {
            "at": max(v["sampled_at"] for v in entries),
            "sample_interval_s": w.opts.sample_interval_s,
            "devices": [{**v, "sampled_at": iso(v["sampled_at"])} for v in entries],
        }
