"""A frame that ended is recorded together with the frame its slot starts next: one store
transaction (one commit on SQLite) rather than two, and at the iteration's end when nothing
is claimed. Real frames (``true``), a real SQLite file, the in-process worker."""

from __future__ import annotations

import os
import time

from cuectl import config
from cuectl.sched.spec import spec_from_flags


def wait_for_exit(worker, timeout: float = 10.0) -> None:
    """Until every running frame's process has exited (not yet collected by the worker)."""
    deadline = time.monotonic() + timeout
    for rf in worker.running.values():
        while rf.proc.pid and not rf.proc.finished:
            try:
                if os.waitid(os.P_PID, rf.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    break
            except ChildProcessError:
                break
            assert time.monotonic() < deadline, "frame did not exit"
            time.sleep(0.01)


def traced_loop(store, worker):
    """One worker iteration; its stats and the SQL statements it ran (with their values)."""
    statements: list[str] = []
    store.conn.set_trace_callback(statements.append)
    try:
        return worker.loop(), statements
    finally:
        store.conn.set_trace_callback(None)


def test_a_finished_frame_and_the_next_claim_are_one_transaction(solo):
    store, worker = solo
    # Two cores a frame on a two-core host: one slot, so each iteration ends one frame and
    # starts the next.
    job_id = store.submit(
        spec_from_flags(name="one-slot", command=["true"], range="1-3", cores=2, user=config.current_user()),
        now=time.time(),
    )
    stats = worker.loop()
    assert stats.claimed == 1 and len(worker.running) == 1
    first = next(iter(worker.running))
    wait_for_exit(worker)

    stats, statements = traced_loop(store, worker)
    assert stats.finished == 1 and stats.claimed == 1
    assert [(c.frame_id, state) for c, _, state in stats.ended] == [(first, "SUCCEEDED")]
    writes = [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT") or s.startswith("UPDATE frames SET state")]
    # The completion's UPDATE and the claim's inside one BEGIN ... COMMIT (the trace shows
    # statements with their values).
    assert [w.split(",")[0] for w in writes] == [
        "BEGIN IMMEDIATE",
        "UPDATE frames SET state = 'SUCCEEDED'",
        "UPDATE frames SET state = 'RUNNING'",
        "COMMIT",
    ], writes
    assert worker.pending == []
    assert store.get_frame(first)["state"] == "SUCCEEDED"

    # The last frame: nothing to claim after it, so its report is written on its own at
    # the end of the iteration that collected it.
    wait_for_exit(worker)
    worker.loop()
    wait_for_exit(worker)
    last = next(iter(worker.running))
    stats = worker.loop()
    assert stats.claimed == 0 and [(c.frame_id, state) for c, _, state in stats.ended] == [(last, "SUCCEEDED")]
    assert worker.pending == [] and worker.running == {}
    assert store.get_job(job_id)["state"] == "FINISHED"


def test_a_busy_iteration_reads_neither_the_queue_nor_notifications_again(solo):
    """An iteration that ends a frame and starts the next of the same job: the dispatch read
    is the kept one (nothing changed it: SQLite's data_version), and no notification can be
    due (the job still runs here). The iteration that ends the job's last frame looks."""
    store, worker = solo
    store.submit(
        spec_from_flags(name="one-slot", command=["true"], range="1-3", cores=2, user=config.current_user()),
        now=time.time(),
    )
    worker.loop()
    wait_for_exit(worker)
    worker.loop()  # frame 1 ends, frame 2 starts (the first forced notification read was before)
    wait_for_exit(worker)

    stats, statements = traced_loop(store, worker)  # frame 2 ends, frame 3 starts
    assert stats.finished == 1 and stats.claimed == 1
    assert not [s for s in statements if "FROM notifications" in s], statements
    assert not [s for s in statements if "FROM layers l JOIN jobs j" in s], statements
    assert "PRAGMA data_version" in statements

    wait_for_exit(worker)
    stats, statements = traced_loop(store, worker)  # frame 3, the job's last, ends: its job may have finished
    assert stats.finished == 1 and stats.claimed == 0
    assert [s for s in statements if "FROM notifications" in s], statements


def test_two_frames_of_a_job_ending_together_neither_ask_about_their_job_nor_write_it(solo):
    """Both slots' frames end in one iteration: their reports go in one transaction with
    the claims of the job's next two frames, which prove the job unfinished, so it never
    asks whether the job is done, and writes nothing to it (it is PENDING already). Its
    last frames' transaction, which claims nothing, asks, and finishes it."""
    store, worker = solo
    job_id = store.submit(
        spec_from_flags(name="two-slots", command=["true"], range="1-6", user=config.current_user()), now=time.time()
    )
    worker.loop()
    assert len(worker.running) == 2
    wait_for_exit(worker)
    stats, statements = traced_loop(store, worker)
    assert stats.finished == 2 and stats.claimed == 2
    assert not [s for s in statements if s.startswith("SELECT state, EXISTS")], statements
    assert not [s for s in statements if s.startswith("UPDATE jobs")], statements
    while worker.running or store.get_job(job_id)["state"] != "FINISHED":
        wait_for_exit(worker)
        worker.loop()
    assert store.get_job(job_id)["frame_counts"] == {"SUCCEEDED": 6}
