"""The REST API's routes: ``create_app(settings)`` returns the ASGI app ``cuectl serve`` runs.

Every route is a thin layer over the library, like the CLI commands: parse the request,
call the store (acting as the caller for changes), return JSON. Reads are open to every
authenticated caller; changes need the ``user`` role and pass the store's own ownership
check. Store calls block, so routes are plain ``def`` functions: FastAPI runs them in its
thread pool, and each thread keeps its own store connection (``StorePool``).

Hot reads (``GET /api/v1/jobs``, ``/hosts``, ``/jobs/{id}/frames``) are answered from a
cache shared by every client for ``cache_s`` (1 s by default), keyed by the full URL, and
carry an ``ETag``: a monitor polling every second with ``If-None-Match`` gets ``304`` and
no body while nothing changed. A change made through the API empties the cache.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import operator
import os
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate, count
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from fastapi import Depends, FastAPI, Query, Request
from fastapi import Path as PathParam  # pathlib.Path is the other Path here
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from cuectl import __version__
from cuectl.errors import CuectlError, InvalidInput, NotFound
from cuectl.sched import model as m
from cuectl.sched.hostfilter import device_matches, parse_memory_min, parse_vendor, parse_versions
from cuectl.sched.store import Store
from cuectl.sched.store.pool import StorePool
from cuectl.serve import problems
from cuectl.serve.auth import ADMIN, USER, VIEWER, Principal, identify, require
from cuectl.serve.problems import Problem

API = "/api/v1"
log = logging.getLogger("cuectl.serve")
MAX_BODY_BYTES = 4 * 1024 * 1024  # a job spec; 10,000 frames of a range are a few bytes
MAX_JSON_DEPTH = 64  # a job spec nests about 6 levels; deeper is refused (400), never a RecursionError
MAX_PAGE = 10_000
MAX_ID = 2**63 - 1  # ids are 64-bit in both databases: a larger number names nothing
JOB_ACTIONS = ("pause", "resume", "kill", "retry")
FRAME_ACTIONS = ("retry", "kill", "eat")
HOST_ACTIONS = ("lock", "unlock")


@dataclass(frozen=True)
class Settings:
    db_url: str
    busy_timeout_s: float = 10.0
    anonymous_read: bool = False
    cache_s: float = 1.0
    lock_dir: Optional[Path] = None  # this host's device locks (``GET /leases``, who holds a device)
    frame_limit: Optional[int] = None  # frames per submitted job (the CLI's CUECTL_FRAME_LIMIT)
    log_poll_s: float = 0.5


class ResponseCache:
    """URL -> (body, etag, read at): shared by every client, so N monitors polling the
    same page cost one store read per ``ttl_s``.

    No answer is older than ``ttl_s`` (docs/api.md promises it), counted from when its
    store read began. Within that bound the cache refreshes ahead: a page near the end of
    its life (``_refresh_at``) is still answered at once while one rebuild of it runs on
    the cache's own thread, so a steady poller never waits for a rebuild. A page past its
    whole life (nobody asked near its end) is never answered: its callers wait for one
    fresh build, as for a page never built. Without the refresh ahead, every request arriving during a slow
    rebuild rebuilt the same page in its own thread (measured in bench/bench_api.py:
    seconds per request); without the bound, an expired page of any age was served once
    more while it rebuilt (a poller slower than the cache read a job finished 20 s before
    as PENDING)."""

    def __init__(self, ttl_s: float, size: int = 512, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._size = size
        self._clock = clock  # a test's own clock: ages without sleeping
        self._entries: OrderedDict[str, tuple[bytes, str, float]] = OrderedDict()
        self._building: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._generation = 0  # bumped by clear(): a rebuild started before a change is not kept
        self._refresher: ThreadPoolExecutor | None = None
        self._took: dict[str, float] = {}  # how long each page's last build took

    def _age(self, entry: tuple[bytes, str, float] | None) -> float:
        return float("inf") if entry is None else self._clock() - entry[2]

    def _refresh_at(self, key: str) -> float:
        """The age from which a page is rebuilt ahead: three of its last builds before the
        end of its life (one that slows down under load still ends in time), at least a
        tenth of the life, at most half. Rebuilding every page at half its life doubled
        the store reads that N pollers cause (bench/bench_api.py: a worker's drain on the
        same machine ran 25 % slower while 50 monitors polled, against 1-2 % before)."""
        took = self._took.get(key)
        lead = self.ttl_s / 2 if took is None else min(self.ttl_s / 2, max(self.ttl_s / 10, 3 * took))
        return self.ttl_s - lead

    def get(self, key: str, build: Callable[[], Any]) -> tuple[bytes, str]:
        if self.ttl_s <= 0:
            return _encode(build())
        with self._lock:
            entry = self._entries.get(key)
            age = self._age(entry)
            flight = self._building.setdefault(key, threading.Lock())
        if entry is not None and age < self.ttl_s:
            if age >= self._refresh_at(key) and flight.acquire(blocking=False):  # refresh ahead, once
                self._executor().submit(self._rebuild, key, build, flight)
            return entry[0], entry[1]
        with flight:  # too old or never built: build it, or wait for the build under way
            with self._lock:
                done = self._entries.get(key)
                if done is not None and self._age(done) < self.ttl_s:
                    return done[0], done[1]
            return self._store(key, build)

    def _rebuild(self, key: str, build: Callable[[], Any], flight: threading.Lock) -> None:
        try:
            self._store(key, build)
        except Exception:
            log.warning("refreshing %s failed; the next request builds it", key, exc_info=True)
            with self._lock:
                self._entries.pop(key, None)
        finally:
            flight.release()

    def _store(self, key: str, build: Callable[[], Any]) -> tuple[bytes, str]:
        with self._lock:
            generation = self._generation
        read_at = self._clock()  # before the read: the page is at least this fresh
        body, etag = _encode(build())
        took = self._clock() - read_at
        with self._lock:
            if generation == self._generation:
                self._entries[key] = (body, etag, read_at)
                self._took[key] = took
                self._entries.move_to_end(key)
                while len(self._entries) > self._size:
                    self._took.pop(self._entries.popitem(last=False)[0], None)
        return body, etag

    def _executor(self) -> ThreadPoolExecutor:
        # Two threads, kept: each keeps its store connection (StorePool) between rebuilds.
        with self._lock:
            if self._refresher is None:
                self._refresher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cuectl-cache")
            return self._refresher

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._took.clear()
            self._generation += 1

    def close(self) -> None:
        with self._lock:
            refresher, self._refresher = self._refresher, None
        if refresher is not None:
            refresher.shutdown(wait=False, cancel_futures=True)


def _encode(data: Any) -> tuple[bytes, str]:
    """The body and its ETag. A page stamped with the time it was read (``at``: the host
    list) would get a new tag on every read, so a poller would never see a 304: the tag
    leaves ``at`` out and is weak (same content, maybe another ``at``)."""
    body = json.dumps(data, separators=(",", ":"), default=str).encode()
    if isinstance(data, dict) and "at" in data:
        content = json.dumps({k: v for k, v in data.items() if k != "at"}, separators=(",", ":"), default=str)
        return body, 'W/"' + hashlib.blake2b(content.encode(), digest_size=12).hexdigest() + '"'
    return body, '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


def _opaque(tag: str) -> str:
    # If-None-Match compares weakly (RFC 9110 13.1.2): W/"x" and "x" match.
    tag = tag.strip()
    return tag[2:] if tag.startswith("W/") else tag


def _conditional(request: Request, body: bytes, etag: str) -> Response:
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    wanted = {_opaque(v) for v in request.headers.get("if-none-match", "").split(",")}
    if "*" in wanted or _opaque(etag) in wanted:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type="application/json", headers=headers)


def _int_param(value: str | None, name: str, *, low: int, high: int | None = None) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except ValueError:
        raise Problem(422, f"{name}: {value!r} is not a whole number", field=name) from None
    if number < low or (high is not None and number > high):
        bound = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise Problem(422, f"{name}: must be {bound}, got {number}", field=name)
    return number


def _choice(value: str | None, name: str, allowed: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    if value.upper() not in allowed:
        raise Problem(422, f"{name}: {value!r} is not one of {', '.join(allowed)}", field=name)
    return value.upper()


# A control character (a NUL above all) in a path or a query value names nothing the API
# has: no job, host, layer or user name holds one. PostgreSQL cannot even take a NUL in a
# text parameter (psycopg raises), and a filesystem call raises ValueError on one, so such a
# request is refused before authentication, the store or the filesystem see it.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_ESCAPE = re.compile(rb"%(?:[01][0-9A-Fa-f]|7[Ff])|[\x00-\x1f\x7f]")  # in the raw query string


class RefuseControlCharacters:
    """ASGI middleware: a request whose decoded path or query holds a control character is a
    400 problem. The monitor's files (``/static/...``) are left to web.py, which answers 404
    for any name that is not one of its files."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and not scope.get("path", "").startswith("/static/")
            and (_CONTROL.search(scope.get("path", "")) or _CONTROL_ESCAPE.search(scope.get("query_string", b"")))
        ):
            where = "path" if _CONTROL.search(scope.get("path", "")) else "query"
            resp = problems.response(
                400,
                f"the request's {where} holds a control character (a NUL, a newline...)",
                hint="names and values here never hold one",
            )
            await resp(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    pool = StorePool(settings.db_url, busy_timeout_s=settings.busy_timeout_s)
    cache = ResponseCache(settings.cache_s)
    app = FastAPI(
        title="cuectl",
        version=__version__,
        description="The cuectl REST API: GPU inventory, jobs, frames, leases and reports (docs/api.md).",
        openapi_url=f"{API}/openapi.json",
        docs_url=None,
        redoc_url=None,  # the docs pages load JS from a CDN
        dependencies=[Depends(_known_query)],
    )
    setattr(app, "openapi", lambda: _openapi(app))  # noqa: B010 - FastAPI's documented way to extend the document
    app.state.pool = pool
    app.state.settings = settings
    app.state.cache = cache
    app.add_exception_handler(Problem, problems.on_problem)
    app.add_exception_handler(CuectlError, problems.on_cuectl_error)
    app.add_exception_handler(StarletteHTTPException, problems.on_http_error)
    app.add_exception_handler(RequestValidationError, problems.on_validation_error)
    app.add_exception_handler(Exception, problems.on_unexpected)
    app.add_middleware(RefuseControlCharacters)
    app.router.add_event_handler("shutdown", cache.close)
    app.router.add_event_handler("shutdown", pool.close)
    from cuectl.serve import web

    web.mount(app)  # the monitor's pages at / (static files of the package; they use this API only)

    def caller(request: Request) -> Principal:
        return identify(
            request.headers, request.scope, pool.get(), now=time.time(), anonymous_read=settings.anonymous_read
        )

    async def cached(request: Request, build: Callable[[], Any]) -> Response:
        """A hot read: the caller's token and the page in one trip to the thread pool (these
        routes are async for that: a sync dependency plus a sync route were two trips, the
        larger part of a 304's cost under a hundred polling monitors)."""
        key = request.url.path + "?" + str(request.url.query)

        def read() -> tuple[bytes, str]:
            caller(request)
            return cache.get(key, build)

        body, etag = await run_in_threadpool(read)
        return _conditional(request, body, etag)

    def change(who: Principal, what: str, fn: Callable[[Store], Any]) -> Any:
        """Run a change as ``who`` (the store checks ownership again), then drop cached pages."""
        require(who, USER, what)
        store = pool.get()
        with store.acting_as(who.actor()):
            result = fn(store)
        cache.clear()
        return result

    # -- health ---------------------------------------------------------------------------
    @app.get("/healthz", tags=["health"], summary="The process is alive")
    def healthz() -> dict[str, Any]:
        return {"status": "ok", "version": __version__}

    @app.get("/readyz", tags=["health"], summary="The store answers; GPU totals")
    def readyz() -> Response:
        from cuectl.serve.metrics import gpu_stats
        from cuectl.top import snapshot

        try:
            store = pool.get()
            snap = snapshot(store, lock_dir=settings.lock_dir, frame_limit=MAX_PAGE, waiting=False)
            active = store.count_jobs(include_finished=False)
            store.authenticate("cuectl_readiness-probe", now=time.time())  # every request reads the tokens
        except CuectlError as exc:
            return problems.response(503, f"the store is not ready: {exc.message}", hint=exc.hint)
        return JSONResponse({"status": "ready", "gpus": gpu_stats(snap, active_jobs=active), "active_jobs": active})

    @app.get("/metrics", tags=["health"], summary="Prometheus exposition", response_class=PlainTextResponse)
    def metrics(who: Principal = Depends(caller)) -> Response:
        from cuectl.serve.metrics import render
        from cuectl.top import snapshot

        store = pool.get()
        body, content_type = render(
            store, snapshot=snapshot(store, lock_dir=settings.lock_dir, frame_limit=MAX_PAGE, waiting=False)
        )
        return Response(body, media_type=content_type)

    # -- who am I ------------------------------------------------------------------------------
    @app.get(f"{API}/whoami", tags=["auth"], summary="The caller's user and role")
    def whoami(who: Principal = Depends(caller)) -> dict[str, Any]:
        return who.to_json()

    # -- hosts ---------------------------------------------------------------------------------
    def _hosts(
        vendor: str | None,
        model: str | None,
        memory_min: int | None,
        state: str | None,
        versions: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        from cuectl.top import snapshot

        snap = snapshot(pool.get(), lock_dir=settings.lock_dir, frame_limit=MAX_PAGE, waiting=False)
        hosts = []
        for host in snap["hosts"]:
            if state is not None and host["state"] != state:
                continue
            devices = [
                d
                for d in host["devices"]
                if device_matches(d, vendor=vendor, model=model, memory_min=memory_min, versions=versions)
            ]
            if (vendor or model or memory_min or versions) and not devices:
                continue
            hosts.append({**host, "devices": devices})
        return {"hosts": hosts, "at": snap["at"]}

    @app.get(f"{API}/hosts", tags=["hosts"], summary="Hosts and their GPUs with live values and holders")
    async def list_hosts(
        request: Request,
        vendor: Optional[str] = Query(None, description="NVIDIA, AMD, Apple or Intel"),
        model: Optional[str] = Query(
            None, description="Model words or glob, as in gpu_models (A100, 'RTX 4090', '*4090*')"
        ),
        gpu_memory_min: Optional[str] = Query(None, description="Memory per device: 24G, 24576 (MiB)"),
        state: Optional[str] = Query(None, description="UP or DOWN"),
        gpu_capability_min: Optional[str] = Query(
            None, description="CUDA compute capability per device, at least: 8.9"
        ),
        gpu_driver_min: Optional[str] = Query(None, description="Driver version per device, at least: 535.104.05"),
        gpu_cuda_min: Optional[str] = Query(None, description="The driver's CUDA version, at least: 12.2"),
    ) -> Response:
        memory = _memory_param(gpu_memory_min)
        wanted_state = _choice(state, "state", ("UP", "DOWN"))
        wanted_vendor = _vendor_param(vendor)
        versions = _versions_param(
            {"gpu_capability_min": gpu_capability_min, "gpu_driver_min": gpu_driver_min, "gpu_cuda_min": gpu_cuda_min}
        )
        return await cached(request, lambda: _hosts(wanted_vendor, model, memory, wanted_state, versions))

    @app.get(f"{API}/hosts/{{name}}/gpus", tags=["hosts"], summary="One host's GPUs with live values")
    def host_gpus(name: str, who: Principal = Depends(caller)) -> dict[str, Any]:
        data = _hosts(None, None, None, None)
        for host in data["hosts"]:
            if host["name"] == name:
                return {
                    "host": name,
                    "state": host["state"],
                    "locked": host["locked"],
                    "gpus": host["devices"],
                    "at": data["at"],
                }
        raise NotFound(f"no host {name!r}", hint="GET /api/v1/hosts lists them")

    def _host(name: str) -> dict[str, Any]:
        """One host as the monitor's host page shows it: the ``/hosts`` entry (devices with
        live values and holders), its facts (``cuectl host show``) and its RUNNING frames."""
        store = pool.get()
        facts = store.get_host(name, now=store.clock(), down_after=m.HOST_DOWN_AFTER_S)  # 404 if unknown
        entry = next((h for h in _hosts(None, None, None, None)["hosts"] if h["name"] == name), None)
        if entry is None:  # forgotten between the two reads
            raise NotFound(f"no host {name!r}", hint="GET /api/v1/hosts lists them")
        frames, _ = store.list_frames(ids=facts["running_frames"][:1000], limit=1000)
        keep = ("cores", "memory_bytes", "tags", "version", "worker_pid")
        return {**entry, **{k: facts[k] for k in keep}, "running_frames": [_public_frame(f) for f in frames]}

    @app.get(
        f"{API}/hosts/{{name}}",
        tags=["hosts"],
        summary="A host: its GPUs with live values and holders, its facts and its RUNNING frames",
    )
    async def show_host(name: str, request: Request) -> Response:
        return await cached(request, lambda: _host(name))

    @app.post(
        f"{API}/hosts/{{name}}/{{action}}",
        tags=["hosts"],
        summary="lock (no new frames; running ones finish) or unlock a host: admins only",
    )
    def host_action(
        name: str,
        action: str = PathParam(json_schema_extra={"enum": list(HOST_ACTIONS)}),
        who: Principal = Depends(caller),
    ) -> dict[str, Any]:
        if action not in HOST_ACTIONS:
            raise Problem(404, f"no host action {action!r} (one of {', '.join(HOST_ACTIONS)})")
        if not who.can(ADMIN):  # where a farm dispatches is the admins' call, not a job owner's
            raise Problem(403, f"{action} a host: only an admin may (the {who.role} role of {who.user} may not)")
        change(who, action, lambda s: s.set_host_locked(name, action == "lock"))
        return _host(name)

    # -- jobs ----------------------------------------------------------------------------------
    def _jobs(
        user: str | None, state: str | None, name: str | None, active: bool, limit: int, offset: int, newest_first: bool
    ) -> dict[str, Any]:
        from cuectl.sched.pending import add_pending_reasons

        store = pool.get()
        exact = name if name is not None and not any(c in name for c in "*?[") else None
        # RUNNING is not a stored state (a PENDING job with a running frame, views.job_display_state):
        # like a glob name, it is filtered here and paged after.
        running = state == m.JOB_RUNNING
        filters: dict[str, Any] = {
            "include_finished": not active,
            "user": user,
            "state": m.JOB_PENDING if running else state,
            "name": exact,
        }
        if (name is not None and exact is None) or running:
            rows = [
                j
                for j in store.list_jobs(**filters, newest_first=newest_first)
                if (exact is not None or name is None or fnmatch.fnmatchcase(j["name"], name))
                and (not running or j["display_state"] == m.JOB_RUNNING)
            ]
            total, page = len(rows), rows[offset : offset + limit]
        else:
            total = store.count_jobs(**filters)
            page = store.list_jobs(**filters, limit=limit, offset=offset, newest_first=newest_first)
        return {
            "jobs": add_pending_reasons(store, page),
            "total": total,
            "limit": limit,
            "offset": offset,
            "order": "desc" if newest_first else "asc",
        }

    @app.get(f"{API}/jobs", tags=["jobs"], summary="Jobs with frame counts and pending reasons")
    async def list_jobs(
        request: Request,
        user: Optional[str] = Query(None),
        state: Optional[str] = Query(
            None, description="PENDING (not finished, running or not), RUNNING (a frame runs) or FINISHED"
        ),
        name: Optional[str] = Query(None, description="Exact name or glob (render-*)"),
        active: bool = Query(False, description="Hide finished jobs"),
        limit: Optional[str] = Query(None, description=f"Page size (default 1000, at most {MAX_PAGE})"),
        offset: Optional[str] = Query(None),
        order: Optional[str] = Query(None, description="asc (oldest first, the default) or desc (newest first)"),
    ) -> Response:
        page = _int_param(limit, "limit", low=1, high=MAX_PAGE) or 1000
        start = _int_param(offset, "offset", low=0, high=MAX_ID) or 0
        wanted = _choice(state, "state", (m.JOB_PENDING, m.JOB_RUNNING, m.JOB_FINISHED))
        newest_first = _choice(order, "order", ("ASC", "DESC")) == "DESC"
        return await cached(request, lambda: _jobs(user, wanted, name, active, page, start, newest_first))

    @app.get(f"{API}/jobs/{{job}}", tags=["jobs"], summary="A job with its layers, frame counts and pending reason")
    async def show_job(job: str, request: Request) -> Response:
        from cuectl.sched.pending import describe_job

        ref = _job_ref(job)  # polled every second by the monitor's job page: cached, with an ETag
        return await cached(request, lambda: _public_job(describe_job(pool.get(), ref)))

    # The body (JobSpec as JSON or YAML, a template, an OpenCue spec) and every answer's schema: serve/openapi.py.
    @app.post(
        f"{API}/jobs",
        tags=["jobs"],
        status_code=201,
        summary="Submit a job: a job spec (JSON or YAML), an Open Job Description template or an OpenCue "
        "XML spec, told by the Content-Type",
    )
    async def submit_job(
        request: Request,
        param: list[str] = Query(
            [], description="NAME=VALUE: a job parameter of an Open Job Description template (repeatable)"
        ),
        strict: bool = Query(
            False,
            description="Refuse a spec with anything cuectl cannot honour (else each is in the answer's warnings)",
        ),
    ) -> Response:
        from cuectl.sched import intake

        who = await run_in_threadpool(caller, request)
        source = await _submitted_source(request)
        # The submit context, built here once: the token's user and the server's frame limit
        # (no directory or environment of the caller's: relative paths and export: are refused).
        context = intake.SubmitContext(user=who.user, frame_limit=settings.frame_limit)

        def submit(store: Store) -> dict[str, Any]:
            from cuectl.sched.pending import describe_job

            if isinstance(source, intake.Source):
                loaded = intake.load(source, context, params=param, strict=strict)
            else:  # JSON, read as JSON is (depth-checked): errors name the field alone
                notes: list[str] = []
                job_spec = intake.load_mapping(source, context, params=param, notes=notes)
                if strict and notes:
                    raise InvalidInput(
                        f"{len(notes)} thing(s) cannot be honoured: " + "; ".join(notes),
                        hint="leave out strict to submit anyway (each is a warning then)",
                    )
                loaded = intake.Loaded((job_spec,), intake.SPEC, "body", ((),), tuple(notes))
            ids = intake.submit(store, loaded, now=time.time())
            jobs = [_public_job(describe_job(store, job_id)) for job_id in ids]
            # An OpenCue spec may hold several jobs: a list, always (as `cuectl submit job.xml --json`).
            out: dict[str, Any] = {"jobs": jobs} if loaded.format == intake.OPENCUE_XML else jobs[0]
            if loaded.notes:
                out["warnings"] = list(loaded.notes)
            return out

        out = await run_in_threadpool(change, who, "submit", submit)
        first = out["jobs"][0]["id"] if "jobs" in out else out["id"]
        return JSONResponse(out, status_code=201, headers={"Location": f"{API}/jobs/{first}"})

    @app.post(f"{API}/jobs/{{job}}/priority", tags=["jobs"], summary='Set a job\'s priority: {"priority": N}')
    async def job_priority(job: str, request: Request) -> Response:
        who = await run_in_threadpool(caller, request)
        data = await _json_body(request)
        if not isinstance(data, dict) or "priority" not in data:
            raise Problem(422, "priority: required (a whole number)", field="priority")
        value = data["priority"]
        if isinstance(value, bool) or not isinstance(value, int):
            raise Problem(422, f"priority: {value!r} is not a whole number", field="priority")
        ref = _job_ref(job)
        out = await run_in_threadpool(change, who, "priority", lambda s: s.set_job_priority(ref, value))
        return JSONResponse(_public_job(out))

    @app.post(f"{API}/jobs/{{job}}/{{action}}", tags=["jobs"], summary="pause, resume, kill or retry a job")
    def job_action(
        job: str,
        action: str = PathParam(json_schema_extra={"enum": list(JOB_ACTIONS)}),
        who: Principal = Depends(caller),
    ) -> dict[str, Any]:
        if action not in JOB_ACTIONS:
            raise Problem(404, f"no job action {action!r} (one of {', '.join(JOB_ACTIONS)}, priority)")
        ref = _job_ref(job)
        now = time.time()
        calls: dict[str, Callable[[Store], dict[str, Any]]] = {
            "pause": lambda s: s.set_job_paused(ref, True),
            "resume": lambda s: s.set_job_paused(ref, False),
            "kill": lambda s: s.kill_job(ref, now=now),
            "retry": lambda s: s.retry_job(ref, now=now),
        }

        def act(store: Store) -> dict[str, Any]:
            before = store.get_job(ref)
            after = calls[action](store)  # first: the owner check answers a stranger, not "nothing to do"
            noop = _job_noop(action, before)
            if noop and (after["state"], after.get("frame_counts")) == (before["state"], before.get("frame_counts")):
                raise Problem(409, noop, extra={"state": before["state"]})
            return after

        return _public_job(change(who, action, act))

    # -- frames --------------------------------------------------------------------------------
    def _frames(
        job: str | int,
        state: str | None,
        layer: str | None,
        limit: int,
        after: int | None,
        attempts: bool,
        ids: list[int] | None = None,
    ) -> dict[str, Any]:
        store = pool.get()
        frames, total = store.list_frames(job=job, layer=layer, state=state, limit=limit, after=after, ids=ids)
        from cuectl.sched.why import frame_reasons

        frame_reasons(store, frames)  # WAITING/DEPEND frames: why, as `cuectl frame list` says it
        if attempts and frames:
            history = store.frame_attempts([f["id"] for f in frames])
            for f in frames:
                f["attempt_history"] = history.get(f["id"], [])
        more = len(frames) == limit
        return {
            "frames": frames,
            "total": total,
            "limit": limit,
            "next_after": frames[-1]["id"] if frames and more else None,
        }

    @app.get(
        f"{API}/jobs/{{job}}/frames",
        tags=["frames"],
        summary="A job's frames with live GPU use (RUNNING) and per-attempt usage",
    )
    async def list_frames(
        job: str,
        request: Request,
        state: Optional[str] = Query(None, description=", ".join(m.FRAME_STATES)),
        layer: Optional[str] = Query(None),
        limit: Optional[str] = Query(None, description=f"Page size (default 1000, at most {MAX_PAGE})"),
        after: Optional[str] = Query(None, description="Frames with a larger id: next_after of the previous page"),
        attempts: bool = Query(True, description="Include each frame's attempt_history"),
        ids: Optional[str] = Query(
            None,
            description="Only these frame ids (comma-separated, at "
            "most 1000): a monitor refreshing frames that "
            "changed",
        ),
    ) -> Response:
        wanted = _choice(state, "state", m.FRAME_STATES)
        page = _int_param(limit, "limit", low=1, high=MAX_PAGE) or 1000
        cursor = _int_param(after, "after", low=0, high=MAX_ID)
        only = _id_list(ids, "ids", most=1000)
        ref = _job_ref(job)  # an unknown job is a 404 from list_frames, on a cache miss only
        return await cached(request, lambda: _frames(ref, wanted, layer, page, cursor, attempts, only))

    @app.get(f"{API}/frames/{{frame_id}}", tags=["frames"], summary="A frame with its samples and attempts")
    def show_frame(frame_id: int, who: Principal = Depends(caller)) -> dict[str, Any]:
        _check_frame_id(frame_id)
        store = pool.get()
        return _public_frame(store.get_frame(frame_id))

    @app.post(f"{API}/frames/{{frame_id}}/{{action}}", tags=["frames"], summary="retry, kill or eat a frame")
    def frame_action(
        frame_id: int,
        action: str = PathParam(json_schema_extra={"enum": list(FRAME_ACTIONS)}),
        who: Principal = Depends(caller),
    ) -> dict[str, Any]:
        if action not in FRAME_ACTIONS:
            raise Problem(404, f"no frame action {action!r} (one of {', '.join(FRAME_ACTIONS)})")
        _check_frame_id(frame_id)
        now = time.time()

        def act(store: Store) -> list[dict[str, Any]]:
            before = store.get_frame(frame_id)
            frames = store.frame_action([frame_id], action, now=now)
            noop = _frame_noop(action, before)
            if noop and frames and all(frames[0].get(k) == before.get(k) for k in _FRAME_ACTION_KEYS):
                raise Problem(409, noop, extra={"state": before["state"]})
            return frames

        return {"frames": [_public_frame(f) for f in change(who, action, act)]}

    @app.get(
        f"{API}/frames/{{frame_id}}/log",
        tags=["frames"],
        response_class=PlainTextResponse,
        summary="A frame's log (latest attempt): tail=N lines, follow=true streams while it runs",
    )
    async def frame_log(
        frame_id: int, request: Request, tail: Optional[str] = Query(None), follow: bool = Query(False)
    ) -> Response:
        await run_in_threadpool(caller, request)
        lines = _int_param(tail, "tail", low=0, high=100_000)
        _check_frame_id(frame_id)

        # In the thread pool: the first call on a thread opens its store (a connection).
        def frame_and_log_dir() -> tuple[dict[str, Any], Path]:
            frame = pool.get().get_frame(frame_id)
            return frame, pool.get().log_dir_of(frame.get("log_path"))

        frame, log_dir = await run_in_threadpool(frame_and_log_dir)
        from cuectl.run import framelog  # the same reading and following as `cuectl frame log`

        if not frame.get("log_path"):
            raise NotFound(f"frame {frame['id']} has no log yet (state {frame['state']})")
        # Only inside the store's log directory, never through a link (the path comes from
        # rows a client may have written, and the server may run as root).
        fd = framelog.open_log(log_dir, frame["log_path"], frame["id"])
        if not follow:
            try:
                return Response(framelog.read_log(fd, lines), media_type="text/plain; charset=utf-8")
            finally:
                os.close(fd)
        steps = framelog.follow(
            fd,
            frame,
            int(frame.get("attempts") or 0),
            tail=lines,
            poll_s=settings.log_poll_s,
            file_poll_s=settings.log_poll_s,
        )

        async def stream() -> Any:
            try:
                async for data in framelog.drive_async(
                    steps, lambda: run_in_threadpool(lambda: pool.get().get_frame(frame_id))
                ):
                    yield data
            finally:
                os.close(fd)

        return StreamingResponse(
            stream(), media_type="text/plain; charset=utf-8", headers={"Cache-Control": "no-cache"}
        )

    # -- leases and reports -------------------------------------------------------------------
    @app.get(f"{API}/leases", tags=["leases"], summary="Devices held now: frames (farm-wide) and this host's leases")
    def leases(who: Principal = Depends(caller)) -> dict[str, Any]:
        from cuectl.top import snapshot

        snap = snapshot(pool.get(), lock_dir=settings.lock_dir, frame_limit=MAX_PAGE, waiting=False)
        held = []
        for host in snap["hosts"]:
            for device in host["devices"]:
                if device.get("holder"):
                    held.append(
                        {
                            "host": host["name"],
                            "uuid": device.get("uuid"),
                            "index": device.get("index"),
                            "model": device.get("model"),
                            **device["holder"],
                        }
                    )
        return {"leases": held, "at": snap["at"]}

    @app.get(f"{API}/report", tags=["report"], summary="GPU accounting: the groupings and figures of `admin report`")
    def report(
        who: Principal = Depends(caller),
        by: str = Query("job"),
        since: str = Query("7d"),
        until: Optional[str] = Query(None),
    ) -> Response:
        from cuectl import report as reports

        store = pool.get()
        now = time.time()
        try:
            group = reports.check_by(by)
        except InvalidInput as exc:
            raise Problem(422, exc.message.replace("--by", "by", 1), field="by") from None
        try:
            start, end = reports.parse_window(since, until, now=now)
        except InvalidInput as exc:
            field = "until" if "--until" in exc.message else "since"
            raise Problem(422, exc.message.replace(f"--{field}", field, 1), field=field) from None
        rows, total = reports.run_report(store, by=group, since=start, until=end)
        text = reports.render_json(rows, reports.report_meta(by=group, since=start, until=end, generated_at=now), total)
        return Response(text, media_type="application/json")

    # -- the store's own calls, for the CLI on a store only this server may write ----------
    # (cuectl.sched.store.remote; docs/api.md, "The store protocol"). Not in the OpenAPI
    # document: it is the CLI's, versioned with it, and its bodies are tagged store values.
    @app.post(f"{API}/store/{{method}}", include_in_schema=False)
    async def store_call(method: str, request: Request) -> Response:
        from cuectl.serve import storecalls

        data = await _json_body(request)

        def run() -> Any:
            store = pool.get()
            who = caller(request)
            result = storecalls.call(store, who, method, data, frame_limit=settings.frame_limit)
            if storecalls.is_change(method):
                cache.clear()
            return result

        try:
            result = await run_in_threadpool(run)
        except CuectlError as exc:
            return storecalls.error_response(exc)
        except Problem as exc:
            return storecalls.problem_response(exc)
        return JSONResponse(storecalls.result_body(result))

    return app


# -- helpers outside the app: pure, testable -------------------------------------------------------
def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated document, typed by serve/openapi.py: answer and request bodies, errors
    as problems, the bearer-token scheme every /api/v1 route uses."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        from cuectl.serve.openapi import typed

        app.openapi_schema = typed(
            get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        )
    return app.openapi_schema


def _public_job(job: dict[str, Any]) -> dict[str, Any]:
    from cuectl.sched.views import mask_env

    # The receipt's file name is the SQLite proof's handle: of no use to a client.
    job.pop("receipt", None)
    # Secret-looking env values are masked as in `job show` (describe_job does it for reads;
    # the store's own answers to pause/kill/priority... carry them unmasked).
    for layer in job.get("layers") or []:
        if isinstance(layer.get("env"), dict):
            layer["env"] = mask_env(layer["env"])
    return job


def _public_frame(frame: dict[str, Any]) -> dict[str, Any]:
    # log_path is a path on the worker host: GET .../log reads it for the client.
    frame.pop("log_path", None)
    return frame


_FRAME_ACTION_KEYS = ("state", "pending_action", "retry_at")  # what a frame action changes


def _frame_noop(action: str, frame: dict[str, Any]) -> str | None:
    """Why ``action`` leaves this frame as it is (the store's rules), or None: the API says
    so with a 409 rather than a 200 that reads as done."""
    state, label = frame["state"], f"frame {frame['id']} ({frame.get('name')})"
    if action == "kill" and state in m.DONE_STATES:
        return f"{label} is {state}: nothing to kill"
    if action == "eat" and state == m.EATEN:
        return f"{label} is EATEN already"
    if action == "retry" and state == m.DEPEND:
        return f"{label} waits on its dependencies (DEPEND): it runs once they are met"
    if action == "retry" and state == m.WAITING and not frame.get("retry_at"):
        return f"{label} is WAITING already: it runs when a device or slot frees"
    return None


def _job_noop(action: str, job: dict[str, Any]) -> str | None:
    """Why a job's ``kill`` or ``retry`` would change nothing, or None (pause and resume are
    idempotent: the job is in the state asked for either way)."""
    label = f"job {job['id']} ({job['name']})"
    counts = job.get("frame_counts") or {}
    if action == "kill" and job["state"] == m.JOB_FINISHED:
        return f"{label} is FINISHED: nothing to kill"
    if action == "retry" and not (counts.get(m.DEAD) or counts.get(m.EATEN)):
        return f"{label} has no DEAD or EATEN frame: nothing to retry"
    return None


def _job_ref(value: str) -> str | int:
    if not (value.isascii() and value.isdigit()):  # "²" is a digit to str.isdigit, not to int()
        return value
    if int(value) > MAX_ID:  # the database could not even compare it (OverflowError)
        raise NotFound(f"no job {value!r}", hint="GET /api/v1/jobs lists them")
    return int(value)


def _check_frame_id(frame_id: int) -> None:
    if not -MAX_ID - 1 <= frame_id <= MAX_ID:
        raise NotFound(f"no frame {frame_id}", hint="GET /api/v1/jobs/{job}/frames lists them")


def _id_list(value: str | None, name: str, *, most: int) -> list[int] | None:
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if len(parts) > most:
        raise Problem(422, f"{name}: at most {most} ids, got {len(parts)}", field=name)
    if not all(p.isdigit() for p in parts):
        raise Problem(422, f"{name}: give frame ids separated by commas (1,2,3)", field=name)
    if any(int(p) > MAX_ID for p in parts):
        raise Problem(422, f"{name}: ids go up to {MAX_ID}", field=name)
    return [int(p) for p in parts]


def _vendor_param(value: str | None) -> str | None:
    try:
        return parse_vendor(value, "vendor")  # the CLI's own check: `host list --vendor nvidai` is refused too
    except InvalidInput as exc:
        raise Problem(422, exc.message, field="vendor") from None


async def _known_query(request: Request) -> None:
    """Every route takes only the query parameters it declares: a misspelt filter
    (``?stat=DEAD``) would otherwise be ignored, and its answer look filtered when it is not.
    Async: FastAPI would run a plain function on its thread pool, one more trip for every
    request (the hot reads are async to avoid just that)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    # The API's routes only: the monitor's page and files (not in the schema) ignore a
    # link's ?utm_source= or a proxy's cache-buster, as any web page does.
    if dependant is None or not getattr(route, "include_in_schema", False):
        return
    known: frozenset[str] | None = getattr(route, "_cuectl_query_names", None)
    if known is None:  # once per route
        known = _query_names(dependant)
        setattr(route, "_cuectl_query_names", known)  # noqa: B010 - typed Any | None: a plain assignment is refused
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        raise Problem(
            400,
            f"unknown query parameter{'s' if len(unknown) > 1 else ''} {', '.join(repr(u) for u in unknown)}",
            field=unknown[0],
            hint=f"this path takes {', '.join(sorted(known))}" if known else "this path takes none",
        )


def _query_names(dependant: Any) -> frozenset[str]:
    """The query parameters a route declares, its dependencies' included."""
    found = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        found |= _query_names(sub)
    return frozenset(found)


def _memory_param(value: str | None) -> int | None:
    try:
        return parse_memory_min(value, "gpu_memory_min")
    except InvalidInput as exc:
        raise Problem(422, exc.message, field="gpu_memory_min") from None


def _versions_param(given: Mapping[str, str | None]) -> dict[str, str]:
    try:
        return parse_versions(given, lambda field: field)
    except InvalidInput as exc:
        raise Problem(422, exc.message, field=exc.message.split(":", 1)[0]) from None


async def _submitted_source(request: Request) -> Any:
    """A submitted job's body: parsed JSON (``application/json``, the default), or a
    ``cuectl.sched.intake.Source`` of the format its ``Content-Type`` names (YAML: a job
    spec or an Open Job Description template; XML: an OpenCue spec), read as a spec file
    is (UTF-8; errors start with ``body:``)."""
    from cuectl.sched import intake

    content_type = request.headers.get("content-type", "application/json")
    media = content_type.split(";", 1)[0].strip().lower()
    if "json" in content_type or media not in intake.FORMATS:
        return await _json_body(
            request,
            also="application/yaml (a job spec or an Open Job Description template) "
            "or application/xml (an OpenCue spec)",
        )
    raw = await _body_bytes(request)
    try:
        text = intake.decode(raw, "body")
    except InvalidInput as exc:
        raise Problem(400, exc.message, field="body") from None
    return intake.source_from_text(text, name="body", format=intake.FORMATS[media])


async def _body_bytes(request: Request) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise Problem(413, f"the body is larger than {MAX_BODY_BYTES} bytes", field="body")
    return bytes(body)


async def _json_body(request: Request, also: str | None = None) -> Any:
    if "json" not in request.headers.get("content-type", "application/json"):
        raise Problem(415, "send the body as application/json" + (f", {also}" if also else ""))
    body = await _body_bytes(request)
    try:
        data = json.loads(body or b"null")
    except RecursionError:  # the parser's own recursion, past the interpreter's limit
        raise Problem(400, f"the body is nested more than {MAX_JSON_DEPTH} levels deep", field="body") from None
    except ValueError as exc:
        raise Problem(400, f"the body is not valid JSON: {exc}", field="body") from None
    if _too_deep(bytes(body), MAX_JSON_DEPTH):  # what reads it next (the spec's checks) need not recurse far
        raise Problem(400, f"the body is nested more than {MAX_JSON_DEPTH} levels deep", field="body")
    return data


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_OPEN_TWO = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def _too_deep(body: bytes, most: int) -> bool:
    """Do arrays and objects nest more than ``most`` levels in ``body``, a valid JSON text?
    Without recursing: strings out, brackets only, then the running count of open ones, all
    in C (a 4 MiB body of brackets takes about as long as parsing it)."""
    encoding = json.detect_encoding(body)
    if encoding != "utf-8":  # json.loads takes UTF-16 and UTF-32 too
        body = body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    if body.count(b"[") + body.count(b"{") <= most:  # a spec's few brackets: nothing more to do
        return False
    marks = _JSON_STRING.sub(b"", body).translate(_OPEN_TWO, _NOT_BRACKET)  # opening 2, closing 0
    # After i brackets, o of them opening, the depth is o - (i - o) = 2o - i.
    return max(map(operator.sub, accumulate(marks), count(1)), default=0) > most


__all__ = ["Settings", "create_app", "ADMIN", "USER", "VIEWER"]
