"""OpenCue's job, layer, frame, group and show methods, answered from the store.

Each handler takes the call (cuebot/call.py) and the request message and returns the
response message. Reads go straight to the store; every change goes through
``call.acting`` (the store checks ownership again). Ids on the wire: a job's and a frame's
are cuectl's ids, a layer's is ``JOB:LAYER`` (both ids: the layer's job is then known
without a lookup), a show's and a group's are the show's name.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

from opencue_proto import comment_pb2, depend_pb2, job_pb2, show_pb2

from cuectl.cuebot import convert
from cuectl.cuebot.call import Call, owner_only
from cuectl.errors import InvalidInput, NotFound
from cuectl.sched.frameset import parse_frameset

log = logging.getLogger("cuectl.cuebot")
FRAME_PAGE = 1000  # Cuebot's default page of GetFrames
MAX_FRAMES = 100_000  # what one GetFrames reads at most (a page of the largest job)
JOB = "/job.JobInterface/"
LAYER = "/job.LayerInterface/"
FRAME = "/job.FrameInterface/"
GROUP = "/job.GroupInterface/"
SHOW = "/show.ShowInterface/"


# -- lookups ----------------------------------------------------------------------------
def _job_id(text: str) -> int:
    if not text.isdigit():
        raise NotFound(f"no job with id {text!r}")
    return int(text)


def _layer_ref(text: str) -> tuple[int, int]:
    job, sep, layer = text.partition(":")
    if not sep or not job.isdigit() or not layer.isdigit():
        raise NotFound(f"no layer with id {text!r}")
    return int(job), int(layer)


def _frame_id(text: str) -> int:
    if not text.isdigit():
        raise NotFound(f"no frame with id {text!r}")
    return int(text)


def log_dir(call: Call, job_id: int, job_name: str = "") -> str:
    """The directory CueGUI opens ``<job>.<frame>.rqlog`` in (run/logs.py keeps it:
    ``rqlog_dir`` of the job's log directory, joined as strings: a ``Path`` per job was a
    quarter of GetJobs over 10,000 jobs)."""
    from cuectl.run.logs import RQLOG_DIR

    # Absolute: CueGUI opens it from its own working directory (a store named by a relative
    # --db has a relative log dir).
    return os.path.join(os.path.abspath(call.store.log_dir), str(job_id), RQLOG_DIR)


def _reserved(bookings: Iterable[Mapping[str, Any]], key: str) -> dict[Any, tuple[float, int]]:
    out: dict[Any, tuple[float, int]] = {}
    for b in bookings:
        cores, gpus = out.get(b[key], (0.0, 0))
        out[b[key]] = (cores + float(b.get("cores") or 0.0), gpus + int(b.get("gpus") or 0))
    return out


def jobs_pb(call: Call, jobs: Sequence[Mapping[str, Any]]) -> list[job_pb2.Job]:
    reserved = (
        _reserved(call.store.running_bookings(), "job_id")
        if any((j.get("frame_counts") or {}).get("RUNNING") for j in jobs)
        else {}
    )
    return [convert.job(j, log_dir=log_dir(call, int(j["id"])), reserved=reserved.get(j["id"], (0.0, 0))) for j in jobs]


def _one_job(call: Call, job_id: int) -> dict[str, Any]:
    found = call.store.list_jobs(ids=[job_id])
    if not found:
        raise NotFound(f"no job with id {job_id}")
    return found[0]


# -- searching jobs ------------------------------------------------------------------------
def _matches(job: Mapping[str, Any], r: job_pb2.JobSearchCriteria, patterns: Sequence[re.Pattern[str]]) -> bool:
    name = str(job["name"])
    checks = (
        (r.ids, lambda: str(job["id"]) in r.ids),
        (r.jobs, lambda: name in r.jobs),
        (r.regex, lambda: any(p.search(name) for p in patterns)),
        (r.substr, lambda: any(s in name for s in r.substr)),
        (r.users, lambda: job.get("user") in r.users),
        (r.shows, lambda: convert.show_of(job) in r.shows),
        (r.shots, lambda: (job.get("shot") or "") in r.shots),
    )
    return all(check() for wanted, check in checks if len(wanted))


def _patterns(regex: Iterable[str]) -> list[re.Pattern[str]]:
    out = []
    for text in regex:
        try:
            out.append(re.compile(text))
        except re.error as exc:
            raise InvalidInput(f"regex {text!r}: {exc}") from None
    return out


def search_jobs(call: Call, r: job_pb2.JobSearchCriteria) -> list[dict[str, Any]]:
    """Cuebot's job search: every criterion given must match (each a list: any of it), in
    the cue only unless ``include_finished``; by name."""
    patterns = _patterns(r.regex)
    ids = [int(i) for i in r.ids if i.isdigit()] if len(r.ids) else None
    if ids is not None and not ids:
        return []
    one = {
        key: values[0]
        for key, values in (("user", r.users), ("show", r.shows), ("shot", r.shots), ("name", r.jobs))
        if len(values) == 1
    }
    if one.get("show") == convert.DEFAULT_SHOW:
        one.pop("show")  # jobs without a show are the default show's
    jobs = call.store.list_jobs(include_finished=r.include_finished, keep_failed=True, ids=ids, **one)
    return sorted((j for j in jobs if _matches(j, r, patterns)), key=lambda j: str(j["name"]))


def get_jobs(call: Call, request: job_pb2.JobGetJobsRequest) -> job_pb2.JobGetJobsResponse:
    return job_pb2.JobGetJobsResponse(jobs=job_pb2.JobSeq(jobs=jobs_pb(call, search_jobs(call, request.r))))


def get_job_names(call: Call, request: job_pb2.JobGetJobNamesRequest) -> job_pb2.JobGetJobNamesResponse:
    return job_pb2.JobGetJobNamesResponse(names=[str(j["name"]) for j in search_jobs(call, request.r)])


def _find_job(call: Call, name: str) -> dict[str, Any]:
    """Cuebot's findJob: the job of that name still in the cue."""
    jobs = call.store.list_jobs(include_finished=False, keep_failed=True, name=name)
    if not jobs:
        raise NotFound(f"no job named {name!r} in the cue")
    return jobs[-1]


def find_job(call: Call, request: job_pb2.JobFindJobRequest) -> job_pb2.JobFindJobResponse:
    return job_pb2.JobFindJobResponse(job=jobs_pb(call, [_find_job(call, request.name)])[0])


def is_job_pending(call: Call, request: job_pb2.JobIsJobPendingRequest) -> job_pb2.JobIsJobPendingResponse:
    return job_pb2.JobIsJobPendingResponse(
        value=bool(call.store.list_jobs(include_finished=False, keep_failed=True, name=request.name))
    )


def get_job(call: Call, request: job_pb2.JobGetJobRequest) -> job_pb2.JobGetJobResponse:
    return job_pb2.JobGetJobResponse(job=jobs_pb(call, [_one_job(call, _job_id(request.id))])[0])


def get_current(call: Call, request: job_pb2.JobGetCurrentRequest) -> job_pb2.JobGetCurrentResponse:
    return job_pb2.JobGetCurrentResponse(job=jobs_pb(call, [_one_job(call, _job_id(request.job.id))])[0])


# -- layers -----------------------------------------------------------------------------------
def _layers_pb(call: Call, job: Mapping[str, Any]) -> list[job_pb2.Layer]:
    counts = call.store.layer_frame_counts(int(job["id"]))
    out = []
    for order, layer in enumerate(job["layers"]):
        running = counts.get(int(layer["id"]), {}).get("RUNNING", 0)
        reserved = (running * float(layer.get("cores") or 0.0), running * int(layer.get("gpus") or 0))
        pb = convert.layer(
            layer, job_id=int(job["id"]), counts=counts.get(int(layer["id"]), {}), order=order, reserved=reserved
        )
        pb.id = f"{job['id']}:{layer['id']}"
        out.append(pb)
    return out


def get_layers(call: Call, request: job_pb2.JobGetLayersRequest) -> job_pb2.JobGetLayersResponse:
    job = call.store.get_job(_job_id(request.job.id))
    return job_pb2.JobGetLayersResponse(layers=job_pb2.LayerSeq(layers=_layers_pb(call, job)))


def _layer(call: Call, layer_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    job_id, wanted = _layer_ref(layer_id)
    job = call.store.get_job(job_id)
    for layer in job["layers"]:
        if int(layer["id"]) == wanted:
            return job, layer
    raise NotFound(f"no layer with id {layer_id!r}")


def _layer_pb(call: Call, job: Mapping[str, Any], name: str) -> job_pb2.Layer:
    for pb in _layers_pb(call, job):
        if pb.name == name:
            return pb
    raise NotFound(f"job {job['name']!r} has no layer {name!r}")


def get_layer(call: Call, request: job_pb2.LayerGetLayerRequest) -> job_pb2.LayerGetLayerResponse:
    job, layer = _layer(call, request.id)
    return job_pb2.LayerGetLayerResponse(layer=_layer_pb(call, job, str(layer["name"])))


def find_layer(call: Call, request: job_pb2.LayerFindLayerRequest) -> job_pb2.LayerFindLayerResponse:
    job = call.store.get_job(int(_find_job(call, request.job)["id"]))
    return job_pb2.LayerFindLayerResponse(layer=_layer_pb(call, job, request.layer))


def get_output_paths(call: Call, request: Any) -> job_pb2.LayerGetOutputPathsResponse:
    _layer(call, request.layer.id)
    return job_pb2.LayerGetOutputPathsResponse(output_paths=[])  # cuectl records no output paths


# -- frames -----------------------------------------------------------------------------------
def _frames(
    call: Call,
    job_id: int,
    *,
    layer: str | None = None,
    state: str | None = None,
    cap: int = MAX_FRAMES,
    changed_since: float | None = None,
) -> list[dict[str, Any]]:
    """The job's frames in dispatch order, the first ``cap`` at most."""
    frames: list[dict[str, Any]] = []
    after = None
    while len(frames) < cap:
        want = min(10_000, cap - len(frames))
        page, _total = call.store.list_frames(
            job=job_id, layer=layer, state=state, limit=want, after=after, changed_since=changed_since
        )
        frames.extend(page)
        if len(page) < want:
            break
        after = page[-1]["id"]
    return frames


def _frame_filter(r: job_pb2.FrameSearchCriteria) -> Callable[[Mapping[str, Any]], bool]:
    states = {convert.STATE_NAMES.get(s) for s in r.states.frame_states}
    numbers: set[int] | None = None
    if r.frame_range:
        try:
            numbers = set(parse_frameset(r.frame_range))
        except InvalidInput as exc:
            raise InvalidInput(f"frame_range {r.frame_range!r}: {exc.message}") from None
    ids, names, layers = set(r.ids), set(r.frames), set(r.layers)

    def keep(f: Mapping[str, Any]) -> bool:
        return (
            (not ids or str(f["id"]) in ids)
            and (not names or f["name"] in names)
            and (not layers or f["layer"] in layers)
            and (not states or f["state"] in states)
            and (numbers is None or f["number"] in numbers)
        )

    return keep


def _page_end(r: job_pb2.FrameSearchCriteria, only_layer: str | None, only_state: str | None) -> int:
    """How many frames of the store's answer (already filtered by ``only_layer`` and
    ``only_state``) the page needs at most: its end when nothing else filters them, or
    every frame. CueGUI's first page of a 10,000-frame job reads 1,000, not 10,000."""
    others = len(r.ids) or len(r.frames) or r.frame_range or len(r.layers) > 1 or len(r.states.frame_states) > 1
    if (
        others
        or (len(r.layers) == 1 and r.layers[0] != only_layer)
        or (len(r.states.frame_states) == 1 and only_state is None)
        or min(r.offset, r.limit, r.max_results) < 0
    ):
        return MAX_FRAMES
    if r.max_results or r.offset:
        return min(r.offset + (r.max_results or FRAME_PAGE), MAX_FRAMES)
    return min(max(r.page, 1) * (r.limit or FRAME_PAGE), MAX_FRAMES)


def _page(frames: list[dict[str, Any]], r: job_pb2.FrameSearchCriteria) -> list[dict[str, Any]]:
    """Cuebot's paging: ``page`` from 1 with ``limit`` per page (default 1,000), or
    ``offset``/``max_results`` when given."""
    if r.max_results or r.offset:
        return frames[r.offset : r.offset + (r.max_results or FRAME_PAGE)]
    limit = r.limit or FRAME_PAGE
    page = max(r.page, 1)
    return frames[(page - 1) * limit : page * limit]


def frames_pb(call: Call, job: Mapping[str, Any], frames: Sequence[Mapping[str, Any]]) -> list[job_pb2.Frame]:
    layers = {str(layer["name"]): layer for layer in job.get("layers") or []}
    bookings = (
        {b["id"]: b for b in call.store.running_bookings()} if any(f["state"] == "RUNNING" for f in frames) else {}
    )
    return [
        convert.frame(f, booking=bookings.get(f["id"]), layer_of=layers.get(str(f["layer"])), now=call.now)
        for f in frames
    ]


def _search_frames(
    call: Call, job_id: int, r: job_pb2.FrameSearchCriteria, layer: str | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    job = call.store.get_job(job_id)
    only_layer = layer or (r.layers[0] if len(r.layers) == 1 else None)
    wanted = r.states.frame_states
    only_state = convert.STATE_NAMES.get(wanted[0]) if len(wanted) == 1 else None
    keep = _frame_filter(r)  # once, not once a frame
    frames = [
        f
        for f in _frames(call, job_id, layer=only_layer, state=only_state, cap=_page_end(r, only_layer, only_state))
        if keep(f)
    ]
    return job, _page(frames, r)


def job_get_frames(call: Call, request: job_pb2.JobGetFramesRequest) -> job_pb2.JobGetFramesResponse:
    job, frames = _search_frames(call, _job_id(request.job.id), request.req)
    return job_pb2.JobGetFramesResponse(frames=job_pb2.FrameSeq(frames=frames_pb(call, job, frames)))


def layer_get_frames(call: Call, request: job_pb2.LayerGetFramesRequest) -> job_pb2.LayerGetFramesResponse:
    job, layer = _layer(call, request.layer.id)
    _, frames = _search_frames(call, int(job["id"]), request.s, layer=str(layer["name"]))
    return job_pb2.LayerGetFramesResponse(frames=job_pb2.FrameSeq(frames=frames_pb(call, job, frames)))


def frame_get_frames(call: Call, request: job_pb2.FrameGetFramesRequest) -> job_pb2.FrameGetFramesResponse:
    """pycue's ``opencue.api.getFrames(job_name, ...)``: a job's frame search by the job's name."""
    job, frames = _search_frames(call, int(_find_job(call, request.job)["id"]), request.r)
    return job_pb2.FrameGetFramesResponse(frames=job_pb2.FrameSeq(frames=frames_pb(call, job, frames)))


def _frame(call: Call, frame_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    frame = call.store.get_frame(_frame_id(frame_id))
    return call.store.get_job(int(frame["job_id"])), frame


def get_frame(call: Call, request: job_pb2.FrameGetFrameRequest) -> job_pb2.FrameGetFrameResponse:
    job, frame = _frame(call, request.id)
    return job_pb2.FrameGetFrameResponse(frame=frames_pb(call, job, [frame])[0])


def find_frame(call: Call, request: job_pb2.FrameFindFrameRequest) -> job_pb2.FrameFindFrameResponse:
    job = _find_job(call, request.job)
    frame_id = call.store.frame_id(f"{job['id']}/{request.frame:04d}-{request.layer}")
    return get_frame(call, job_pb2.FrameGetFrameRequest(id=str(frame_id)))


def get_updated_frames(call: Call, request: job_pb2.JobGetUpdatedFramesRequest) -> job_pb2.JobGetUpdatedFramesResponse:
    """Frames that started, ended or went back to waiting since ``last_check``, and every
    running one (its memory and GPU use change all the time): CueGUI's frame view polls
    this between full reads. The store selects them (``list_frames(changed_since=)``), so a
    poll of a big job with little happening reads little."""
    job_record = _one_job(call, _job_id(request.job.id))
    layers = {layer.name for layer in request.layer_filter.layers}
    changed = [
        f
        for f in _frames(call, int(job_record["id"]), changed_since=float(request.last_check))
        if not layers or f["layer"] in layers
    ]
    bookings = {b["id"]: b for b in call.store.running_bookings()} if changed else {}
    updated = [convert.updated_frame(f, bookings.get(f["id"])) for f in changed]
    return job_pb2.JobGetUpdatedFramesResponse(
        state=convert.job_state(job_record),
        server_time=int(call.now),
        updated_frames=job_pb2.UpdatedFrameSeq(updated_frames=updated),
    )


# -- dependencies --------------------------------------------------------------------------------
def _depends(
    call: Call, job_id: int, *, waits: bool, layer: str | None = None, number: int | None = None
) -> depend_pb2.DependSeq:
    lists = call.store.list_depends(job_id)
    rows = (
        lists["depends"]
        if waits
        else lists["dependents"] + [d for d in lists["depends"] if (d.get("on_job") or {}).get("id") == job_id]
    )
    key, frame_key = ("layer", "frame") if waits else ("on_layer", "on_frame")
    if not waits:
        rows = [d for d in rows if (d.get("on_job") or {}).get("id") == job_id]
    if layer is not None:
        rows = [d for d in rows if d.get(key) in (None, layer)]
    if number is not None:
        rows = [d for d in rows if d.get(frame_key) in (None, number)]
    return depend_pb2.DependSeq(depends=[convert.depend(d) for d in rows if d.get("state") != "dropped"])


def job_depends_on(call: Call, request: Any) -> Any:
    return job_pb2.JobGetWhatThisDependsOnResponse(depends=_depends(call, _job_id(request.job.id), waits=True))


def job_dependents(call: Call, request: Any) -> Any:
    return job_pb2.JobGetWhatDependsOnThisResponse(depends=_depends(call, _job_id(request.job.id), waits=False))


def job_get_depends(call: Call, request: Any) -> Any:
    return job_pb2.JobGetDependsResponse(depends=_depends(call, _job_id(request.job.id), waits=True))


def layer_depends_on(call: Call, request: Any) -> Any:
    job, layer = _layer(call, request.layer.id)
    return job_pb2.LayerGetWhatThisDependsOnResponse(
        depends=_depends(call, int(job["id"]), waits=True, layer=str(layer["name"]))
    )


def layer_dependents(call: Call, request: Any) -> Any:
    job, layer = _layer(call, request.layer.id)
    return job_pb2.LayerGetWhatDependsOnThisResponse(
        depends=_depends(call, int(job["id"]), waits=False, layer=str(layer["name"]))
    )


def frame_depends_on(call: Call, request: Any) -> Any:
    _, frame = _frame(call, request.frame.id)
    return job_pb2.FrameGetWhatThisDependsOnResponse(
        depends=_depends(call, int(frame["job_id"]), waits=True, layer=str(frame["layer"]), number=int(frame["number"]))
    )


def frame_dependents(call: Call, request: Any) -> Any:
    _, frame = _frame(call, request.frame.id)
    return job_pb2.FrameGetWhatDependsOnThisResponse(
        depends=_depends(
            call, int(frame["job_id"]), waits=False, layer=str(frame["layer"]), number=int(frame["number"])
        )
    )


def _drop(call: Call, job: Mapping[str, Any], layer: str | None = None, number: int | None = None) -> None:
    """Satisfy what the job (its layer, that frame) waits on: OpenCue's DropDepends and
    MarkAsWaiting (a DEPEND frame waits no longer)."""
    ids = None
    if layer is not None:
        ids = [
            int(d["id"])
            for d in call.store.list_depends(int(job["id"]))["depends"]
            if d.get("layer") in (None, layer) and (number is None or d.get("frame") in (None, number))
        ]
    with call.acting(owner=str(job["user"])) as store:
        if ids == []:  # nothing to drop: still the owner's or an admin's to ask
            owner_only(store, job)
            return
        store.drop_depends(int(job["id"]), ids, now=call.now)


def job_drop_depends(call: Call, request: Any) -> Any:
    _drop(call, _one_job(call, _job_id(request.job.id)))
    return job_pb2.JobDropDependsResponse()


def layer_drop_depends(call: Call, request: Any) -> Any:
    job, layer = _layer(call, request.layer.id)
    _drop(call, job, str(layer["name"]))
    return job_pb2.LayerDropDependsResponse()


def frame_drop_depends(call: Call, request: Any) -> Any:
    job, frame = _frame(call, request.frame.id)
    _drop(call, job, str(frame["layer"]), int(frame["number"]))
    return job_pb2.FrameDropDependsResponse()


def frame_mark_as_waiting(call: Call, request: Any) -> Any:
    job, frame = _frame(call, request.frame.id)
    if frame["state"] == "DEPEND":
        _drop(call, job, str(frame["layer"]), int(frame["number"]))
    return job_pb2.FrameMarkAsWaitingResponse()


# -- changes ---------------------------------------------------------------------------------------
def _job_change(call: Call, job_pb: job_pb2.Job, change: Callable[[Any, int], Any], claimed: str = "") -> None:
    job = _one_job(call, _job_id(job_pb.id))
    with call.acting(owner=str(job["user"]), claimed=claimed or None) as store:
        change(store, int(job["id"]))


def pause(call: Call, request: Any) -> Any:
    _job_change(call, request.job, lambda s, j: s.set_job_paused(j, True))
    return job_pb2.JobPauseResponse()


def resume(call: Call, request: Any) -> Any:
    _job_change(call, request.job, lambda s, j: s.set_job_paused(j, False))
    return job_pb2.JobResumeResponse()


def kill(call: Call, request: job_pb2.JobKillRequest) -> Any:
    _job_change(call, request.job, lambda s, j: s.kill_job(j, now=call.now), request.username)
    return job_pb2.JobKillResponse()


def set_priority(call: Call, request: Any) -> Any:
    _job_change(call, request.job, lambda s, j: s.set_job_priority(j, int(request.val)))
    return job_pb2.JobSetPriorityResponse()


def _frames_action(call: Call, job: Mapping[str, Any], ids: list[int], action: str, claimed: str = "") -> None:
    with call.acting(owner=str(job["user"]), claimed=claimed or None) as store:
        if not ids:  # nothing matched: still the owner's or an admin's to ask, never an empty success
            owner_only(store, job)
        for start in range(0, len(ids), 1000):
            store.frames_action(ids[start : start + 1000], action, now=call.now)


def _searched_ids(
    call: Call, job_pb: job_pb2.Job, r: job_pb2.FrameSearchCriteria, *, running_only: bool = False
) -> tuple[dict[str, Any], list[int]]:
    """The job's frames the search matches; ``running_only``: of those, the running ones
    (Cuebot's KillFrames kills the procs of the matched frames: a waiting frame has none)."""
    job = _one_job(call, _job_id(job_pb.id))
    keep = _frame_filter(r)
    return job, [
        int(f["id"]) for f in _frames(call, int(job["id"])) if keep(f) and (not running_only or f["state"] == "RUNNING")
    ]


#: The frames each action applies to, as Cuebot picks them (retry: DEAD and EATEN ones
#: unless the search names states; kill: running ones; eat: any not done).
_ACTION_STATES = {
    "retry": {"DEAD", "EATEN", "SUCCEEDED", "WAITING", "DEPEND"},
    "kill": {"RUNNING"},
    "eat": {"WAITING", "DEPEND", "DEAD", "RUNNING"},
}


def _job_frames_action(call: Call, request: Any, action: str, claimed: str = "") -> None:
    job, ids = _searched_ids(call, request.job, request.req, running_only=action == "kill")
    _frames_action(call, job, ids, action, claimed)


def _layer_action(call: Call, request: Any, action: str, claimed: str = "") -> None:
    job, layer = _layer(call, request.layer.id)
    wanted = _ACTION_STATES[action] if action != "retry" else {"DEAD", "EATEN"}
    ids = [int(f["id"]) for f in _frames(call, int(job["id"]), layer=str(layer["name"])) if f["state"] in wanted]
    _frames_action(call, job, ids, action, claimed)


def _frame_action(call: Call, request: Any, action: str, claimed: str = "") -> None:
    job, frame = _frame(call, request.frame.id)
    # Cuebot kills a frame's proc: a frame not running has none, and stays as it is
    # (asked by its owner or an admin all the same: _frames_action with nothing to change).
    ids = [] if action == "kill" and frame["state"] != "RUNNING" else [int(frame["id"])]
    _frames_action(call, job, ids, action, claimed)


# -- submitting --------------------------------------------------------------------------------------
def _launch(call: Call, spec: str) -> list[int]:
    from cuectl.sched import opencue_xml

    if call.who.via == "remote":
        with call.acting():  # refuses, with the read-only message
            pass
    user = call.user if call.who.via == "kernel" else opencue_xml.spec_user(spec)
    with call.acting(claimed=user) as store:
        return opencue_xml.import_and_submit(
            store,
            spec,
            source="LaunchSpec",
            user=user,
            now=call.now,
            warn=lambda text: log.warning("%s (submitted by %s)", text, user),
        )


def launch_spec(call: Call, request: job_pb2.JobLaunchSpecRequest) -> job_pb2.JobLaunchSpecResponse:
    ids = _launch(call, request.spec)
    return job_pb2.JobLaunchSpecResponse(names=[str(j["name"]) for j in call.store.list_jobs(ids=ids)])


def launch_spec_and_wait(call: Call, request: Any) -> job_pb2.JobLaunchSpecAndWaitResponse:
    ids = _launch(call, request.spec)
    return job_pb2.JobLaunchSpecAndWaitResponse(jobs=job_pb2.JobSeq(jobs=jobs_pb(call, call.store.list_jobs(ids=ids))))


def get_comments(call: Call, request: Any) -> Any:
    _one_job(call, _job_id(request.job.id))
    return job_pb2.JobGetCommentsResponse(comments=comment_pb2.CommentSeq())  # cuectl keeps no comments


# -- shows and groups: one show per job's show, one group per show -------------------------------------
def _by_show(call: Call, include_finished: bool = False) -> dict[str, list[dict[str, Any]]]:
    shows: dict[str, list[dict[str, Any]]] = {convert.DEFAULT_SHOW: []}
    for job in call.store.list_jobs(include_finished=include_finished, keep_failed=True):
        shows.setdefault(convert.show_of(job), []).append(job)
    return shows


def _show_jobs(call: Call, name: str) -> list[dict[str, Any]]:
    shows = _by_show(call)
    if name not in shows:
        raise NotFound(f"no show {name!r}")
    return shows[name]


def _reserved_by_show(call: Call, shows: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, tuple[float, int]]:
    """(cores, gpus) the running frames of each show's jobs hold now (Cuebot's reserved cores)."""
    if not any((j.get("frame_counts") or {}).get("RUNNING") for jobs in shows.values() for j in jobs):
        return {}
    by_job = _reserved(call.store.running_bookings(), "job_id")
    held = {name: [by_job.get(j["id"], (0.0, 0)) for j in jobs] for name, jobs in shows.items()}
    return {name: (sum(c for c, _ in pairs), sum(g for _, g in pairs)) for name, pairs in held.items()}


def _shows_pb(call: Call, shows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[show_pb2.Show]:
    reserved = _reserved_by_show(call, shows)
    return [convert.show(name, jobs, reserved.get(name, (0.0, 0))) for name, jobs in sorted(shows.items())]


def _group_pb(call: Call, name: str) -> job_pb2.Group:
    jobs = _show_jobs(call, name)
    return convert.group(name, jobs, _reserved_by_show(call, {name: jobs}).get(name, (0.0, 0)))


def get_shows(call: Call, request: Any) -> Any:
    shows = _shows_pb(call, _by_show(call))
    return show_pb2.ShowGetShowsResponse(shows=show_pb2.ShowSeq(shows=shows))


def get_active_shows(call: Call, request: Any) -> Any:
    shows = _shows_pb(call, _by_show(call))
    return show_pb2.ShowGetActiveShowsResponse(shows=show_pb2.ShowSeq(shows=shows))


def find_show(call: Call, request: Any) -> Any:
    return show_pb2.ShowFindShowResponse(show=_shows_pb(call, {request.name: _show_jobs(call, request.name)})[0])


def get_root_group(call: Call, request: Any) -> Any:
    return show_pb2.ShowGetRootGroupResponse(group=_group_pb(call, request.show.name))


def show_get_groups(call: Call, request: Any) -> Any:
    group = _group_pb(call, request.show.name)
    return show_pb2.ShowGetGroupsResponse(groups=job_pb2.GroupSeq(groups=[group]))


def show_get_jobs(call: Call, request: Any) -> Any:
    return show_pb2.ShowGetJobsResponse(jobs=job_pb2.JobSeq(jobs=jobs_pb(call, _show_jobs(call, request.show.name))))


def get_whiteboard(call: Call, request: Any) -> Any:
    name = request.show.name
    jobs = _show_jobs(call, name)
    stats = convert.group(name, jobs, _reserved_by_show(call, {name: jobs}).get(name, (0.0, 0))).group_stats
    return show_pb2.ShowGetJobWhiteboardResponse(whiteboard=convert.nested_group(name, jobs_pb(call, jobs), stats))


def get_group(call: Call, request: Any) -> Any:
    return job_pb2.GroupGetGroupResponse(group=_group_pb(call, request.id))


def find_group(call: Call, request: Any) -> Any:
    if request.name != request.show:
        raise NotFound(f"show {request.show!r} has one group, {request.show!r}")
    return job_pb2.GroupFindGroupResponse(group=_group_pb(call, request.show))


def group_get_jobs(call: Call, request: Any) -> Any:
    return job_pb2.GroupGetJobsResponse(jobs=job_pb2.JobSeq(jobs=jobs_pb(call, _show_jobs(call, request.group.id))))


def group_get_groups(call: Call, request: Any) -> Any:
    _show_jobs(call, request.group.id)
    return job_pb2.GroupGetGroupsResponse(groups=job_pb2.GroupSeq())  # no subgroups


def _frames_method(
    action: str, scope: Callable[..., None], response: Callable[[], Any], claims: bool = False
) -> Callable[[Call, Any], Any]:
    """A retry/eat/kill method over ``scope``'s frames (a job's search, a layer's, one
    frame); ``claims``: the request carries a user name (OpenCue's kill requests do)."""

    def method(call: Call, request: Any) -> Any:
        scope(call, request, action, request.username if claims else "")
        return response()

    return method


METHODS: dict[str, Callable[[Call, Any], Any]] = {
    JOB + "GetJobs": get_jobs,
    JOB + "GetJobNames": get_job_names,
    JOB + "FindJob": find_job,
    JOB + "GetJob": get_job,
    JOB + "GetCurrent": get_current,
    JOB + "IsJobPending": is_job_pending,
    JOB + "GetLayers": get_layers,
    JOB + "GetFrames": job_get_frames,
    JOB + "GetUpdatedFrames": get_updated_frames,
    JOB + "GetWhatThisDependsOn": job_depends_on,
    JOB + "GetWhatDependsOnThis": job_dependents,
    JOB + "GetDepends": job_get_depends,
    JOB + "DropDepends": job_drop_depends,
    JOB + "GetComments": get_comments,
    JOB + "LaunchSpec": launch_spec,
    JOB + "LaunchSpecAndWait": launch_spec_and_wait,
    JOB + "Pause": pause,
    JOB + "Resume": resume,
    JOB + "Kill": kill,
    JOB + "SetPriority": set_priority,
    JOB + "RetryFrames": _frames_method("retry", _job_frames_action, job_pb2.JobRetryFramesResponse),
    JOB + "EatFrames": _frames_method("eat", _job_frames_action, job_pb2.JobEatFramesResponse),
    JOB + "KillFrames": _frames_method("kill", _job_frames_action, job_pb2.JobKillFramesResponse, claims=True),
    LAYER + "GetLayer": get_layer,
    LAYER + "FindLayer": find_layer,
    LAYER + "GetFrames": layer_get_frames,
    LAYER + "GetOutputPaths": get_output_paths,
    LAYER + "GetWhatThisDependsOn": layer_depends_on,
    LAYER + "GetWhatDependsOnThis": layer_dependents,
    LAYER + "DropDepends": layer_drop_depends,
    LAYER + "RetryFrames": _frames_method("retry", _layer_action, job_pb2.LayerRetryFramesResponse),
    LAYER + "EatFrames": _frames_method("eat", _layer_action, job_pb2.LayerEatFramesResponse),
    LAYER + "KillFrames": _frames_method("kill", _layer_action, job_pb2.LayerKillFramesResponse, claims=True),
    FRAME + "GetFrame": get_frame,
    FRAME + "FindFrame": find_frame,
    FRAME + "GetFrames": frame_get_frames,
    FRAME + "Retry": _frames_method("retry", _frame_action, job_pb2.FrameRetryResponse),
    FRAME + "Eat": _frames_method("eat", _frame_action, job_pb2.FrameEatResponse),
    FRAME + "Kill": _frames_method("kill", _frame_action, job_pb2.FrameKillResponse, claims=True),
    FRAME + "MarkAsWaiting": frame_mark_as_waiting,
    FRAME + "GetWhatThisDependsOn": frame_depends_on,
    FRAME + "GetWhatDependsOnThis": frame_dependents,
    FRAME + "DropDepends": frame_drop_depends,
    GROUP + "GetGroup": get_group,
    GROUP + "FindGroup": find_group,
    GROUP + "GetJobs": group_get_jobs,
    GROUP + "GetGroups": group_get_groups,
    SHOW + "GetShows": get_shows,
    SHOW + "GetActiveShows": get_active_shows,
    SHOW + "FindShow": find_show,
    SHOW + "GetRootGroup": get_root_group,
    SHOW + "GetGroups": show_get_groups,
    SHOW + "GetJobs": show_get_jobs,
    SHOW + "GetJobWhiteboard": get_whiteboard,
}
