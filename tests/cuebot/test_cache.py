"""Reads shared between OpenCue clients for a moment (cuebot/cache.py), and never across a
change made through the server."""

from __future__ import annotations

import threading
import time

from cuectl.cuebot.cache import ReadCache, is_read


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reads_by_name():
    assert is_read("/job.JobInterface/GetJobs") and is_read("/job.JobInterface/FindJob")
    assert is_read("/job.JobInterface/IsJobPending")
    assert not is_read("/job.JobInterface/Kill") and not is_read("/job.JobInterface/LaunchSpec")


def test_an_answer_lives_ttl_and_a_change_ends_it():
    clock, builds = Clock(), []
    cache = ReadCache(1.0, clock=clock)

    def build() -> int:
        builds.append(clock.now)
        return len(builds)

    assert cache.get("/a", b"r", build) == 1
    clock.now = 0.9
    assert cache.get("/a", b"r", build) == 1  # shared
    assert cache.get("/a", b"other", build) == 2  # another request: its own answer
    clock.now = 1.0
    assert cache.get("/a", b"r", build) == 3  # never older than ttl
    cache.clear()
    assert cache.get("/a", b"r", build) == 4  # a change through the server
    assert ReadCache(0, clock=clock).get("/a", b"r", build) == 5  # --cache 0: off


def test_a_read_begun_before_a_change_is_not_kept():
    cache = ReadCache(10.0)
    answers = iter([1, 2])

    def build() -> int:
        cache.clear()  # a change lands while this read is under way
        return next(answers)

    assert cache.get("/a", b"r", build) == 1
    assert cache.get("/a", b"r", lambda: 3) == 3


def test_concurrent_misses_build_once():
    cache, builds, gate = ReadCache(10.0), [], threading.Event()

    def build() -> str:
        builds.append(1)
        gate.wait(5)
        return "answer"

    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("/a", b"r", build))) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert results == ["answer"] * 8 and len(builds) == 1


def test_the_server_shares_reads_and_a_pause_through_it_is_seen_at_once(cuebot, db_path, tmp_path):
    import os
    import pwd

    import grpc
    from opencue_proto import job_pb2, job_pb2_grpc

    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import open_store

    server = cuebot()
    store = open_store(str(db_path), create=False)
    me = pwd.getpwuid(os.getuid()).pw_name
    job_id = store.submit(
        spec_from_mapping({"name": "j", "layers": [{"name": "l", "command": ["true"]}]}, user=me), now=time.time()
    )
    with grpc.insecure_channel(server.target) as channel:
        stub = job_pb2_grpc.JobInterfaceStub(channel)
        ask = job_pb2.JobGetJobsRequest(r=job_pb2.JobSearchCriteria(ids=[str(job_id)]))
        assert not stub.GetJobs(ask, timeout=10).jobs.jobs[0].is_paused
        store.set_job_paused(job_id, True, force=True)  # behind the server's back: seen within 1 s
        deadline = time.monotonic() + 5
        while not stub.GetJobs(ask, timeout=10).jobs.jobs[0].is_paused:
            assert time.monotonic() < deadline, "a cached answer outlived its second"
            time.sleep(0.1)
        stub.Resume(job_pb2.JobResumeRequest(job=job_pb2.Job(id=str(job_id))), timeout=10)
        assert not stub.GetJobs(ask, timeout=10).jobs.jobs[0].is_paused  # a change through it: seen at once
    store.close()
