"""GetFrames reads only as many frames as its page needs (bench/bench_opencue.py: CueGUI's
first page of a 10,000-frame job), and answers exactly what reading them all answered; the
store's times parse as before."""

from __future__ import annotations

import calendar
import time
from pathlib import Path
from typing import Any

import pytest
from opencue_proto import job_pb2

from cuectl.cuebot import convert, jobs
from cuectl.cuebot.call import PROVEN, Call
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store
from cuectl.serve.auth import VIEWER, Principal

FS = job_pb2.FrameSearchCriteria
WAITING, SUCCEEDED = job_pb2.WAITING, job_pb2.SUCCEEDED
CRITERIA = [
    FS(),
    FS(page=1, limit=10),
    FS(page=2, limit=10),
    FS(page=3, limit=25),
    FS(limit=100),
    FS(page=9, limit=10),
    FS(offset=5, max_results=7),
    FS(offset=55, max_results=50),
    FS(offset=-3, max_results=2),
    FS(limit=-5),
    FS(page=0, limit=3),
    FS(layers=["a"], page=2, limit=4),
    FS(layers=["nope"], limit=5),
    FS(layers=["a", "b"], limit=7),
    FS(states=job_pb2.FrameStateSeq(frame_states=[WAITING]), limit=4),
    FS(states=job_pb2.FrameStateSeq(frame_states=[WAITING, SUCCEEDED]), limit=4),
    FS(frame_range="3-9", limit=3),
    FS(frames=["0004-b"]),
    FS(layers=["b"], frame_range="2-30", page=2, limit=3),
]


@pytest.fixture
def served(db_path: Path) -> Any:
    store = open_store(str(db_path), create=True)
    job_id = store.submit(
        spec_from_mapping(
            {
                "name": "pages",
                "layers": [
                    {"name": "a", "command": "true", "range": "1-30"},
                    {"name": "b", "command": "true", "range": "1-30"},
                ],
            },
            user="alice",
        ),
        now=time.time(),
    )
    # Some finished, so that a state picks some of each layer (SQLite's connection, as the benches use it).
    store.conn.execute("UPDATE frames SET state = 'SUCCEEDED' WHERE number % 3 = 0")  # type: ignore[attr-defined]
    calls: list[tuple[str, int]] = []
    real = store.list_frames

    def counted(**kwargs: Any) -> Any:
        calls.append((str(kwargs.get("layer")), int(kwargs["limit"])))
        return real(**kwargs)

    store.list_frames = counted  # type: ignore[method-assign]
    yield Call(store=store, who=Principal("alice", VIEWER, PROVEN), now=time.time()), job_id, calls
    store.close()


@pytest.mark.parametrize("criteria", CRITERIA, ids=lambda c: str(c).replace("\n", " ") or "default")
@pytest.mark.parametrize("layer", [None, "a"])
def test_a_page_is_what_reading_every_frame_gave(served, monkeypatch, criteria, layer):
    call, job_id, _ = served
    page = [f["id"] for f in jobs._search_frames(call, job_id, criteria, layer=layer)[1]]
    monkeypatch.setattr(jobs, "_page_end", lambda *_: jobs.MAX_FRAMES)
    assert page == [f["id"] for f in jobs._search_frames(call, job_id, criteria, layer=layer)[1]]


def test_cuegui_first_page_reads_only_that_page(served):
    call, job_id, calls = served
    request = job_pb2.JobGetFramesRequest(job=job_pb2.Job(id=str(job_id)), req=FS(page=1, limit=10))
    assert [f.name for f in jobs.job_get_frames(call, request).frames.frames][:3] == ["0001-a", "0002-a", "0003-a"]
    assert calls == [("None", 10)]
    calls.clear()
    jobs._search_frames(call, job_id, FS(frame_range="1-3"))  # filtered in Python: every frame read
    assert calls == [("None", 10_000)]


@pytest.mark.parametrize(
    "text",
    [
        "2026-12-06T04:30:45Z",
        "2026-12-06T04:30:45.019Z",
        "1970-01-01T00:00:00",
        "2016-12-31T23:59:60Z",
        "2026-02-30T00:00:00Z",
        "2026-12-06",
        "garbage",
        "",
    ],
)
def test_epoch_parses_as_strptime_did(text):
    whole = text.rstrip("Z").partition(".")[0]
    try:
        expected = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) if text else 0
    except ValueError:
        expected = 0
    assert convert.epoch(text) == expected
