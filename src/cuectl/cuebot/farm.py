"""OpenCue's host, proc, allocation, facility, service, limit and system methods.

A host's idle share (cores, memory, GPUs) is what its running frames and ad-hoc leases
leave: one read of the running frames with what each books (``Store.running_bookings``),
never the totals. A proc is a running frame (its id is the frame's id).
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping, Sequence

import grpc
from opencue_proto import (
    comment_pb2,
    cue_pb2,
    facility_pb2,
    host_pb2,
    job_pb2,
    limit_pb2,
    service_pb2,
    show_pb2,
    subscription_pb2,
)

from cuectl.cuebot import convert, jobs
from cuectl.cuebot.call import Call, Refused
from cuectl.errors import InvalidInput, NotFound
from cuectl.sched import model as m
from cuectl.sched.views import frame_name

HOST = "/host.HostInterface/"
PROC = "/host.ProcInterface/"
ALLOC = "/facility.AllocationInterface/"
FACILITY = "/facility.FacilityInterface/"


def _leased(host: Mapping[str, Any]) -> set[str]:
    """Devices an ad-hoc lease (``cuectl run``, ``cuectl.lease()``) holds, as the host's
    worker last published them."""
    dispatch = ((host.get("live") or {}).get("dispatch") or {}).get("devices") or {}
    return {uuid for uuid, d in dispatch.items() if isinstance(d, Mapping) and d.get("state") == "lease"}


def hosts_pb(call: Call, hosts: Sequence[Mapping[str, Any]]) -> list[host_pb2.Host]:
    by_host: dict[str, list[dict[str, Any]]] = {}
    for booking in call.store.running_bookings():
        by_host.setdefault(str(booking["host"]), []).append(booking)
    return [convert.host(h, by_host.get(str(h["name"]), []), _leased(h)) for h in hosts]


def _all_hosts(call: Call) -> list[dict[str, Any]]:
    return call.store.list_hosts(now=call.store.clock(), down_after=m.HOST_DOWN_AFTER_S)


def _one_host(call: Call, name: str) -> dict[str, Any]:
    return call.store.get_host(name, now=call.store.clock(), down_after=m.HOST_DOWN_AFTER_S)


def _host_matches(pb: host_pb2.Host, r: host_pb2.HostSearchCriteria) -> bool:
    patterns = [re.compile(p) for p in r.regex]
    checks = (
        (r.hosts, lambda: pb.name in r.hosts),
        (r.ids, lambda: pb.id in r.ids),
        (r.regex, lambda: any(p.search(pb.name) for p in patterns)),
        (r.substr, lambda: any(s in pb.name for s in r.substr)),
        (r.allocs, lambda: pb.alloc_name in r.allocs),
        (r.states.state, lambda: pb.state in r.states.state),
        (r.lock_states.state, lambda: pb.lock_state in r.lock_states.state),
    )
    return all(check() for wanted, check in checks if len(wanted))


def get_hosts(call: Call, request: host_pb2.HostGetHostsRequest) -> Any:
    try:
        found = [pb for pb in hosts_pb(call, _all_hosts(call)) if _host_matches(pb, request.r)]
    except re.error as exc:
        raise InvalidInput(f"regex: {exc}") from None
    return host_pb2.HostGetHostsResponse(hosts=host_pb2.HostSeq(hosts=sorted(found, key=lambda h: h.name)))


def find_host(call: Call, request: Any) -> Any:
    return host_pb2.HostFindHostResponse(host=hosts_pb(call, [_one_host(call, request.name)])[0])


def get_host(call: Call, request: Any) -> Any:
    return host_pb2.HostGetHostResponse(host=hosts_pb(call, [_one_host(call, request.id)])[0])


def _log_path(call: Call, booking: Mapping[str, Any]) -> str:
    """Where CueGUI opens the proc's log: the link run/logs.py keeps to its attempt's log."""
    from cuectl.run.logs import rqlog_path

    name = frame_name(booking["number"], str(booking["layer_name"]))
    path = rqlog_path(
        os.path.join(os.path.abspath(call.store.log_dir), str(booking["job_id"])), str(booking["job_name"]), name
    )
    return str(path) if path is not None else ""


def procs_pb(call: Call, bookings: Sequence[Mapping[str, Any]]) -> list[host_pb2.Proc]:
    return [convert.proc(b, log_path=_log_path(call, b)) for b in bookings]


def host_get_procs(call: Call, request: Any) -> Any:
    _one_host(call, request.host.name)
    procs = procs_pb(call, call.store.running_bookings(request.host.name))
    return host_pb2.HostGetProcsResponse(procs=host_pb2.ProcSeq(procs=procs))


def _proc_matches(b: Mapping[str, Any], r: host_pb2.ProcSearchCriteria) -> bool:
    checks = (
        (r.hosts, lambda: b["host"] in r.hosts),
        (r.jobs, lambda: b["job_name"] in r.jobs),
        (r.layers, lambda: b["layer_name"] in r.layers),
        (r.shows, lambda: (b.get("job_show") or convert.DEFAULT_SHOW) in r.shows),
        (r.allocs, lambda: convert.ALLOCATION in r.allocs),
    )
    return all(check() for wanted, check in checks if len(wanted))


def get_procs(call: Call, request: host_pb2.ProcGetProcsRequest) -> Any:
    found = [b for b in call.store.running_bookings() if _proc_matches(b, request.r)]
    first = max(request.r.first_result - 1, 0) if request.r.first_result else 0
    if request.r.max_results:
        found = found[first : first + request.r.max_results[0]] if len(request.r.max_results) else found[first:]
    return host_pb2.ProcGetProcsResponse(procs=host_pb2.ProcSeq(procs=procs_pb(call, found)))


def _booking(call: Call, proc_id: str) -> dict[str, Any]:
    if proc_id.isdigit():
        for b in call.store.running_bookings():
            if b["id"] == int(proc_id):
                return b
    raise NotFound(f"no running proc {proc_id!r} (it may have finished)")


def proc_get_frame(call: Call, request: Any) -> Any:
    frame = jobs.get_frame(call, job_pb2.FrameGetFrameRequest(id=str(_booking(call, request.proc.id)["id"])))
    return host_pb2.ProcGetFrameResponse(frame=frame.frame)


def proc_get_job(call: Call, request: Any) -> Any:
    job = jobs.get_job(call, job_pb2.JobGetJobRequest(id=str(_booking(call, request.proc.id)["job_id"])))
    return host_pb2.ProcGetJobResponse(job=job.job)


def proc_get_layer(call: Call, request: Any) -> Any:
    b = _booking(call, request.proc.id)
    layer = jobs.get_layer(call, job_pb2.LayerGetLayerRequest(id=f"{b['job_id']}:{b['layer_id']}"))
    return host_pb2.ProcGetLayerResponse(layer=layer.layer)


def proc_get_host(call: Call, request: Any) -> Any:
    b = _booking(call, request.proc.id)
    return host_pb2.ProcGetHostResponse(host=hosts_pb(call, [_one_host(call, str(b["host"]))])[0])


def proc_kill(call: Call, request: Any) -> Any:
    b = _booking(call, request.proc.id)
    with call.acting(owner=str(b["job_user"])) as store:
        store.frames_action([int(b["id"])], "kill", now=call.now)
    return host_pb2.ProcKillResponse()


def _lock(call: Call, name: str, locked: bool) -> None:
    if call.who.role != "admin":
        raise Refused(
            grpc.StatusCode.PERMISSION_DENIED,
            f"locking a host is an admin's (root or the store's owner); {call.user or 'this caller'} is not one",
        )
    with call.acting() as store:
        store.set_host_locked(name, locked)


def lock(call: Call, request: Any) -> Any:
    _lock(call, request.host.name, True)
    return host_pb2.HostLockResponse()


def unlock(call: Call, request: Any) -> Any:
    _lock(call, request.host.name, False)
    return host_pb2.HostUnlockResponse()


def host_get_comments(call: Call, request: Any) -> Any:
    _one_host(call, request.host.name)
    return host_pb2.HostGetCommentsResponse(comments=comment_pb2.CommentSeq())  # cuectl keeps no comments


# -- allocations and facilities: one of each ----------------------------------------------------
def _allocation(call: Call) -> facility_pb2.Allocation:
    return convert.allocation(hosts_pb(call, _all_hosts(call)))


def _check_alloc(name: str) -> None:
    if name not in (convert.ALLOCATION, ""):
        raise NotFound(f"no allocation {name!r} (cuectl has one: {convert.ALLOCATION})")


def alloc_get_all(call: Call, request: Any) -> Any:
    return facility_pb2.AllocGetAllResponse(allocations=facility_pb2.AllocationSeq(allocations=[_allocation(call)]))


def alloc_find(call: Call, request: Any) -> Any:
    _check_alloc(request.name)
    return facility_pb2.AllocFindResponse(allocation=_allocation(call))


def alloc_get(call: Call, request: Any) -> Any:
    _check_alloc(request.id)
    return facility_pb2.AllocGetResponse(allocation=_allocation(call))


def alloc_get_default(call: Call, request: Any) -> Any:
    return facility_pb2.AllocGetDefaultResponse(allocation=_allocation(call))


def alloc_get_hosts(call: Call, request: Any) -> Any:
    _check_alloc(request.allocation.name or request.allocation.id)
    return facility_pb2.AllocGetHostsResponse(hosts=host_pb2.HostSeq(hosts=hosts_pb(call, _all_hosts(call))))


def alloc_get_subscriptions(call: Call, request: Any) -> Any:
    return facility_pb2.AllocGetSubscriptionsResponse(subscriptions=subscription_pb2.SubscriptionSeq())


def facility_get(call: Call, request: Any) -> Any:
    if request.name != convert.FACILITY:
        raise NotFound(f"no facility {request.name!r} (cuectl has one: {convert.FACILITY})")
    return facility_pb2.FacilityGetResponse(facility=facility_pb2.Facility(id=convert.FACILITY, name=convert.FACILITY))


def facility_allocations(call: Call, request: Any) -> Any:
    return facility_pb2.FacilityGetAllocationsResponse(
        allocations=facility_pb2.AllocationSeq(allocations=[_allocation(call)])
    )


# -- services, limits, shows' subscriptions, the system ----------------------------------------------
def default_services(call: Call, request: Any) -> Any:
    return service_pb2.ServiceGetDefaultServicesResponse(
        services=service_pb2.ServiceSeq(services=[convert.service(s) for s in call.store.list_services()])
    )


def get_service(call: Call, request: Any) -> Any:
    for entry in call.store.list_services():
        if entry["name"] == request.name:
            return service_pb2.ServiceGetServiceResponse(service=convert.service(entry))
    raise NotFound(f"no service {request.name!r}")


def limits_get_all(call: Call, request: Any) -> Any:
    return limit_pb2.LimitGetAllResponse(limits=[convert.limit(e) for e in call.store.list_limits()])


def _limit(call: Call, name: str) -> limit_pb2.Limit:
    """A limit by name (cuectl's limits are named; OpenCue's id is the name here)."""
    for entry in call.store.list_limits():
        if entry["name"] == name:
            return convert.limit(entry)
    raise NotFound(f"no limit {name!r}")


def limit_find(call: Call, request: Any) -> Any:
    return limit_pb2.LimitFindResponse(limit=_limit(call, request.name))


def limit_get(call: Call, request: Any) -> Any:
    return limit_pb2.LimitGetResponse(limit=_limit(call, request.id))


def limit_holds(call: Call, request: Any) -> Any:
    """Cuebot's reported holds of external limit tokens: cuectl's limits count running
    frames, none is held from outside."""
    return limit_pb2.LimitGetHoldsResponse(holds=[])


def show_subscriptions(call: Call, request: Any) -> Any:
    return show_pb2.ShowGetSubscriptionResponse(subscriptions=subscription_pb2.SubscriptionSeq())


def show_service_overrides(call: Call, request: Any) -> Any:
    from opencue_proto import service_pb2 as s

    return show_pb2.ShowGetServiceOverridesResponse(service_overrides=s.ServiceOverrideSeq())


def system_stats(call: Call, request: Any) -> Any:
    return cue_pb2.CueGetSystemStatsResponse(stats=convert.system_stats())


METHODS: dict[str, Callable[[Call, Any], Any]] = {
    HOST + "GetHosts": get_hosts,
    HOST + "FindHost": find_host,
    HOST + "GetHost": get_host,
    HOST + "GetProcs": host_get_procs,
    HOST + "Lock": lock,
    HOST + "Unlock": unlock,
    HOST + "GetComments": host_get_comments,
    PROC + "GetProcs": get_procs,
    PROC + "GetFrame": proc_get_frame,
    PROC + "GetJob": proc_get_job,
    PROC + "GetLayer": proc_get_layer,
    PROC + "GetHost": proc_get_host,
    PROC + "Kill": proc_kill,
    ALLOC + "GetAll": alloc_get_all,
    ALLOC + "Find": alloc_find,
    ALLOC + "Get": alloc_get,
    ALLOC + "GetDefault": alloc_get_default,
    ALLOC + "GetHosts": alloc_get_hosts,
    ALLOC + "GetSubscriptions": alloc_get_subscriptions,
    FACILITY + "Get": facility_get,
    FACILITY + "GetAllocations": facility_allocations,
    "/service.ServiceInterface/GetDefaultServices": default_services,
    "/service.ServiceInterface/GetService": get_service,
    "/limit.LimitInterface/GetAll": limits_get_all,
    "/limit.LimitInterface/Find": limit_find,
    "/limit.LimitInterface/Get": limit_get,
    "/limit.LimitInterface/GetHolds": limit_holds,
    "/show.ShowInterface/GetSubscriptions": show_subscriptions,
    "/show.ShowInterface/GetServiceOverrides": show_service_overrides,
    "/cue.CueInterface/GetSystemStats": system_stats,
}
