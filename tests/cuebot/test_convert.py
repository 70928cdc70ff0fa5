"""cuectl's shapes as OpenCue's messages (cuebot/convert.py): the rules of the mapping table
in docs/opencue-grpc.md, one by one, on the shapes the store returns."""

from __future__ import annotations

from opencue_proto import depend_pb2, host_pb2, job_pb2

from cuectl.cuebot import convert

GIB = 1024**3


def job_dict(**over):
    base = {
        "id": 7,
        "name": "show-shot-alice_lighting",
        "user": "alice",
        "priority": 50,
        "state": "PENDING",
        "paused": False,
        "created_at": "2026-12-06T04:30:45.019Z",
        "finished_at": None,
        "outcome": None,
        "show": "show",
        "shot": "shot",
        "max_cores": None,
        "max_gpus": 4,
        "frame_counts": {"RUNNING": 2, "WAITING": 1, "DEAD": 0},
    }
    return {**base, **over}


def test_job_states_as_opencue_shows_them():
    assert convert.job(job_dict()).state == job_pb2.PENDING
    finished = job_dict(
        state="FINISHED", outcome="SUCCEEDED", finished_at="2026-12-06T05:00:00Z", frame_counts={"SUCCEEDED": 3}
    )
    assert convert.job(finished).state == job_pb2.FINISHED
    assert convert.job(finished).stop_time == 1796533200
    # DEAD frames: Cuebot keeps the job PENDING ("Failing") until retried, eaten or killed.
    failing = job_dict(
        state="FINISHED", outcome="FAILED", finished_at="2026-12-06T05:00:00Z", frame_counts={"SUCCEEDED": 2, "DEAD": 1}
    )
    pb = convert.job(failing)
    assert (pb.state, pb.stop_time, pb.job_stats.dead_frames) == (job_pb2.PENDING, 0, 1)
    assert convert.in_cue(failing) and not convert.in_cue(finished)
    assert convert.job(job_dict(state="FINISHED", outcome="KILLED", frame_counts={"DEAD": 1})).state == job_pb2.FINISHED


def test_job_fields_ids_times_show_and_stats():
    pb = convert.job(job_dict(show=None), log_dir="/logs/7/rqlog", layers=2, reserved=(2.0, 2))
    assert (pb.id, pb.name, pb.user, pb.priority, pb.show, pb.group, pb.log_dir) == (
        "7",
        "show-shot-alice_lighting",
        "alice",
        50,
        convert.DEFAULT_SHOW,
        convert.DEFAULT_SHOW,
        "/logs/7/rqlog",
    )
    assert pb.start_time == 1796531445 and pb.max_gpus == 4.0
    stats = pb.job_stats
    assert (
        stats.total_frames,
        stats.running_frames,
        stats.waiting_frames,
        stats.pending_frames,
        stats.total_layers,
        stats.reserved_cores,
        stats.reserved_gpus,
    ) == (3, 2, 1, 1, 2, 2.0, 2)


def test_layer_memory_in_kib_gpu_memory_for_the_whole_frame():
    layer = {
        "id": 3,
        "name": "render",
        "command": ["render", "-f", "#IFRAME#"],
        "range": "1-10",
        "chunk": 2,
        "gpus": 2,
        "gpu_memory_min_bytes": 16 * GIB,
        "cores": 4.0,
        "memory_bytes": 8 * GIB,
        "tags": ["gpu"],
        "limits": ["nuke"],
        "timeout_s": 7200,
    }
    pb = convert.layer(layer, job_id=7, counts={"RUNNING": 1, "SUCCEEDED": 4}, order=0)
    assert (pb.min_memory, pb.min_gpu_memory, pb.min_gpus, pb.max_gpus) == (8 * 1024**2, 32 * 1024**2, 2.0, 2.0)
    assert (pb.min_cores, pb.chunk_size, pb.command, pb.timeout, pb.parent_id) == (
        4.0,
        2,
        "render -f #IFRAME#",
        120,
        "7",
    )
    assert (pb.layer_stats.total_frames, pb.layer_stats.succeeded_frames) == (5, 4)


def frame_dict(**over):
    base = {
        "id": 12,
        "job_id": 7,
        "job": "j",
        "layer": "render",
        "number": 1,
        "name": "0001-render",
        "state": "WAITING",
        "attempts": 0,
        "host": None,
        "exit_code": None,
        "exit_signal": None,
        "started_at": None,
        "ended_at": None,
        "max_rss_bytes": None,
        "gpu_memory_peak_bytes": None,
        "gpu_memory_used_bytes": None,
        "gpu_seconds": None,
    }
    return {**base, **over}


def test_frames_exit_status_retry_count_and_last_resource():
    waiting = convert.frame(frame_dict())
    assert (waiting.exit_status, waiting.retry_count, waiting.last_resource, waiting.start_time) == (-1, 0, "", 0)
    booking = {"cores": 1.0, "gpus": 1, "memory_bytes": 0, "gpu_memory_min_bytes": 0}
    running = convert.frame(
        frame_dict(state="RUNNING", attempts=2, host="gpu-01", started_at="2026-12-06T04:30:45Z"), booking=booking
    )
    assert (running.state, running.retry_count, running.last_resource) == (job_pb2.RUNNING, 1, "gpu-01/1.00/1")
    # A running frame never reserves 0: CueGUI would read "0 of 0".
    assert running.reserved_memory == convert.MIN_RESERVED_KIB > 0
    dead = convert.frame(
        frame_dict(state="DEAD", attempts=3, host="gpu-01", exit_code=3, ended_at="2026-12-06T05:00:00Z"),
        layer_of=booking,
    )
    assert (dead.state, dead.exit_status, dead.stop_time, dead.reserved_memory) == (job_pb2.DEAD, 3, 1796533200, 0)
    assert convert.frame(frame_dict(state="DEAD", exit_signal=9)).exit_status == 137


def test_host_idle_share_comes_from_running_frames_and_leases():
    gpus = [{"uuid": f"GPU-{i}", "memory_total_bytes": 24 * GIB, "memory_free_bytes": 20 * GIB} for i in range(3)]
    host = {
        "name": "gpu-01",
        "state": "UP",
        "locked": False,
        "cores": 16.0,
        "memory_bytes": 64 * GIB,
        "gpus": gpus,
        "tags": ["gpu"],
        "last_heartbeat": "2026-12-06T04:30:45Z",
    }
    bookings = [
        {"cores": 4.0, "memory_bytes": 8 * GIB, "gpu_uuids": ["GPU-0"]},
        {"cores": 2.0, "memory_bytes": 0, "gpu_uuids": []},
    ]
    pb = convert.host(host, bookings, leased={"GPU-2"})
    assert (pb.gpus, pb.idle_gpus, pb.cores, pb.idle_cores) == (3.0, 1.0, 16.0, 10.0)
    assert pb.idle_memory == 64 * 1024**2 - 8 * 1024**2 - convert.MIN_RESERVED_KIB
    assert (pb.gpu_memory, pb.idle_gpu_memory) == (72 * 1024**2, 24 * 1024**2)
    assert (pb.alloc_name, pb.state, pb.lock_state, pb.id) == (convert.ALLOCATION, host_pb2.UP, host_pb2.OPEN, "gpu-01")
    idle = convert.host(host, [])
    assert (idle.idle_gpus, idle.idle_cores, idle.idle_memory) == (3.0, 16.0, 64 * 1024**2)


def test_depend_types_by_name():
    row = {
        "id": 4,
        "type": "frame-by-frame",
        "state": "waiting",
        "job": {"id": 7, "name": "comp"},
        "layer": "comp",
        "frame": None,
        "on_job": {"id": 6, "name": "render"},
        "on_layer": "beauty",
        "on_frame": 3,
        "any_frame": False,
    }
    pb = convert.depend(row)
    assert (pb.type, pb.target, pb.active, pb.depend_on_frame, pb.depend_er_frame) == (
        depend_pb2.FRAME_BY_FRAME,
        depend_pb2.EXTERNAL,
        True,
        "0003-beauty",
        "",
    )
    assert (
        convert.depend({**row, "state": "dropped", "type": "layer-on-sim-frame"}).type == depend_pb2.LAYER_ON_SIM_FRAME
    )


def test_whiteboard_holds_the_jobs_as_job_messages_and_the_groups_counts():
    # opencue-proto's NestedGroup.inline_jobs is `repeated Job`: CueGUI's Monitor Cue shows
    # them as they are (a NestedJob there could not even be built), and the group row its stats.
    jobs = [convert.job(job_dict()), convert.job(job_dict(id=8, name="show-shot-alice_comp"))]
    stats = convert.group("show", [job_dict(), job_dict(id=8)], reserved=(2.0, 2)).group_stats
    pb = convert.nested_group("show", jobs, stats)
    back = job_pb2.NestedGroup.FromString(pb.SerializeToString())
    assert (back.id, back.name, list(back.jobs)) == ("show", "show", ["7", "8"])
    assert [j.name for j in back.inline_jobs] == ["show-shot-alice_lighting", "show-shot-alice_comp"]
    assert back.inline_jobs[0].job_stats.running_frames == 2
    assert (back.stats.running_frames, back.stats.waiting_frames, back.stats.reserved_gpus) == (4, 2, 2)


def test_a_frame_number_that_is_no_integer_does_not_break_a_listing():
    """SQLite keeps any value in frames.number: a hostile edit shows, it never raises."""
    pb = convert.frame(frame_dict(number="x", name="x-render"))
    assert (pb.number, pb.name) == (0, "x-render")
    assert convert.frame(frame_dict(number=2**40)).number == 0
    booking = {
        "id": 5,
        "number": "x",
        "layer_name": "render",
        "job_name": "j",
        "host": "h",
        "cores": 1.0,
        "gpus": 0,
        "memory_bytes": 0,
    }
    assert convert.proc(booking).frame_name == "x-render"
