"""JSON Schemas of the REST API's bodies, for its OpenAPI document (serve/openapi.py).

The routes build their answers as plain dicts from the library (the same dicts `--json`
prints), so these schemas describe them rather than produce them: the shapes of
docs/json.md, the job spec of docs/job-spec.md, and RFC 9457 problems. The suite checks
the live server against them (tests/serve/test_openapi.py, Schemathesis), so a shape that
drifts from its schema fails there. Objects allow keys beyond those listed: docs/json.md
promises that keys may be added, never renamed or removed.
"""

from __future__ import annotations

from typing import Any

from cuectl.gpu.device import VENDORS
from cuectl.report import GROUPINGS
from cuectl.sched import model as m
from cuectl.sched.frameset import MAX_FRAME

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _or_null(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **extra: Any) -> Schema:
    return {"type": "object", "properties": properties, "required": list(required), **extra}


STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
TIME: Schema = {"type": "string", "description": "ISO 8601 UTC, 2026-12-02T18:53:46.865Z"}
STR_N, INT_N, NUM_N, TIME_N = _or_null(STR), _or_null(INT), _or_null(NUM), _or_null(TIME)
STRINGS: Schema = {"type": "array", "items": STR}
COUNTS: Schema = {"type": "object", "additionalProperties": INT}
ONE_OR_MANY: Schema = {"anyOf": [STR, STRINGS]}
SIZE: Schema = {
    "anyOf": [{"type": "integer", "minimum": 0}, STR],
    "description": "bytes, or 24G, 512M; a bare number in gpu_memory_min is MiB",
}
DURATION: Schema = {"anyOf": [{"type": "number", "minimum": 0}, STR], "description": "seconds, or 90s, 2h"}
LABEL: Schema = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,100}$"}
ENV: Schema = {
    "type": "object",
    "additionalProperties": {"type": ["string", "number", "boolean"]},
    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
}
DIRECTORY: Schema = {"type": "string", "minLength": 1}
VERSION: Schema = {
    "anyOf": [
        {"type": "string", "pattern": r"^\s*[0-9]{1,9}(\.[0-9]{1,9}){0,5}\s*$"},
        {"type": "number", "minimum": 0},
    ],
    "description": "a dotted version, compared numerically part by part (8.9 < 8.10, 535.104.05 < 550)",
    "examples": ["8.9", "535.104.05", "12.2"],
}

PROBLEM: Schema = _obj(
    {
        "type": {"type": "string", "description": "about:blank"},
        "title": STR,
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string", "description": "what the CLI would print after error:"},
        "field": {"type": "string", "description": "the input at fault: a query parameter, layers[0].gpus"},
        "hint": {"type": "string", "description": "what to do, as the CLI's hint: line"},
        "state": {"type": "string", "description": "a 409 for an action that changes nothing: the state it found"},
    },
    ("type", "title", "status", "detail"),
    description="An RFC 9457 problem (application/problem+json).",
)

HEALTH: Schema = _obj({"status": {"const": "ok"}, "version": STR}, ("status", "version"))
READY: Schema = _obj(
    {
        "status": {"const": "ready"},
        "gpus": _obj(
            {k: INT for k in ("total", "leased", "foreign_busy", "available", "unavailable", "active_jobs")},
            ("total", "leased", "foreign_busy", "available", "unavailable", "active_jobs"),
            description="Each device once: total = leased + foreign_busy + available + unavailable (docs/monitoring.md).",
        ),
        "active_jobs": INT,
    },
    ("status", "gpus", "active_jobs"),
)
WHOAMI: Schema = _obj(
    {
        "user": STR,
        "role": {"enum": ["viewer", "user", "admin"]},
        "via": {"enum": ["token", "peer", "anonymous"]},
        "token_id": INT_N,
        "read_only": BOOL,
    },
    ("user", "role", "via", "token_id", "read_only"),
)

# -- hosts and devices -----------------------------------------------------------------------------
HOLDER: Schema = _obj(
    {"kind": STR, "frame_id": INT_N, "label": STR_N, "pid": INT_N, "user": STR_N},
    ("kind",),
    description="Who holds a device: a frame, a lease on the server's machine, or a process that is not cuectl's.",
)
HOST_DEVICE: Schema = _obj(
    {
        "index": INT_N,
        "uuid": STR,
        "vendor": STR_N,
        "model": STR_N,
        "memory_total_bytes": INT_N,
        "compute_capability": STR_N,
        "driver_version": STR_N,
        "cuda_version": STR_N,
        "utilization_pct": NUM_N,
        "memory_used_bytes": INT_N,
        "sampled_at": TIME_N,
        "sample_age_s": NUM_N,
        "holder": _or_null(ref("Holder")),
        "state": {"enum": ["ok", "drained", "lost"]},
        "reason": STR_N,
        "held_idle": {"type": "boolean"},
        "processes": {
            "type": "array",
            "items": _obj(
                {
                    "pid": INT,
                    "user": STR_N,
                    "memory_bytes": INT_N,
                    "utilization_pct": NUM_N,
                    "owner": {"enum": ["frame", "lease", "foreign"]},
                    "frame_id": INT_N,
                    "holder": STR_N,
                },
                ("pid", "owner"),
            ),
        },
    },
    ("uuid",),
    description="A device with its last live sample (docs/api.md, hosts): utilization_pct and "
    "memory_used_bytes are null once that is older than two of its worker's sampling "
    "intervals; sampled_at and sample_age_s say when it was read. state/reason: in service "
    "or not (docs/gpu-health.md); processes: whose each process on it is; held_idle: a frame "
    "holds it idle past its gpu_idle_limit.",
)
HOST: Schema = _obj(
    {
        "name": STR,
        "state": {"enum": ["UP", "DOWN"]},
        "locked": BOOL,
        "last_heartbeat": TIME_N,
        "devices": {"type": "array", "items": ref("HostDevice")},
    },
    ("name", "state", "locked", "devices"),
)
HOST_LIST: Schema = _obj({"hosts": {"type": "array", "items": ref("Host")}, "at": TIME}, ("hosts", "at"))
HOST_GPUS: Schema = _obj(
    {
        "host": STR,
        "state": {"enum": ["UP", "DOWN"]},
        "locked": BOOL,
        "gpus": {"type": "array", "items": ref("HostDevice")},
        "at": TIME,
    },
    ("host", "state", "locked", "gpus", "at"),
)
HOST_DETAIL: Schema = {
    "allOf": [
        ref("Host"),
        _obj(
            {
                "cores": NUM_N,
                "memory_bytes": INT_N,
                "tags": STRINGS,
                "version": STR_N,
                "worker_pid": INT_N,
                "running_frames": {"type": "array", "items": ref("Frame")},
            }
        ),
    ]
}

# -- jobs ----------------------------------------------------------------------------------------------
LAYER: Schema = _obj(
    {
        "id": INT,
        "name": STR,
        "command": ONE_OR_MANY,
        "range": STR,
        "chunk": INT,
        "gpus": INT,
        "gpu_vendor": STR_N,
        "gpu_models": STRINGS,
        "gpu_memory_min_bytes": INT_N,
        "gpu_capability_min": STR_N,
        "gpu_driver_min": STR_N,
        "gpu_cuda_min": STR_N,
        "cores": NUM,
        "memory_bytes": INT_N,
        "retries": INT,
        "timeout_s": NUM_N,
        "tags": STRINGS,
        "depends": {"type": "array", "items": {"type": "object"}},
        "env": {"type": "object"},
        "log_limit_bytes": INT_N,
        "max_running": INT_N,
        "limits": STRINGS,
        "retry_delay_s": NUM_N,
        "retry_on_gpu_oom": {"enum": ["same", "bigger"]},
        "gpu_escape": {"enum": ["warn", "kill", None]},
        "gpu_idle_limit_s": NUM_N,
        "gpu_idle_action": {"enum": ["warn", "kill", None]},
        "gpu_idle_util": NUM_N,
        "gpu_share_bytes": INT_N,
        "gpu_share_enforce": {"enum": ["warn", "kill", None]},
        "waiting_gpu_oom_bytes": INT,
        "cwd": STR_N,
    },
    ("id", "name", "command", "range", "chunk", "gpus"),
)
JOB_SUMMARY: Schema = _obj(
    {
        "id": INT,
        "name": STR,
        "user": STR,
        "submitted_by": STR_N,
        "priority": INT,
        "state": {"enum": [m.JOB_PENDING, m.JOB_FINISHED]},
        "paused": BOOL,
        "created_at": TIME,
        "finished_at": TIME_N,
        "outcome": {"enum": ["KILLED", "FAILED", "SUCCEEDED", None]},
        "project": STR_N,
        "show": STR_N,
        "shot": STR_N,
        "max_running": INT_N,
        "max_cores": NUM_N,
        "max_gpus": INT_N,
        "frame_counts": COUNTS,
        "pending_reason": STR_N,
        "display_state": {"enum": ["PENDING", "RUNNING", "KILLED", "FAILED", "SUCCEEDED"]},
        "outcome_reason": STR_N,
    },
    ("id", "name", "user", "priority", "state", "paused", "created_at", "frame_counts", "display_state"),
    description="A job as `cuectl job list --json` shows it (docs/json.md, job).",
)
JOB: Schema = {
    "allOf": [
        ref("JobSummary"),
        _obj(
            {
                "layers": {"type": "array", "items": ref("Layer")},
                "notify": {"type": "array", "items": {"type": "object"}},
                "depends": {"type": "array", "items": {"type": "object"}},
                "dependents": {"type": "array", "items": {"type": "object"}},
                "dead_dependencies": INT,
                "eaten_dependencies": INT,
            },
            ("layers",),
        ),
    ],
    "description": "A job with its layers and dependencies, as `cuectl job show --json`.",
}
JOB_LIST: Schema = _obj(
    {
        "jobs": {"type": "array", "items": ref("JobSummary")},
        "total": INT,
        "limit": INT,
        "offset": INT,
        "order": {"enum": ["asc", "desc"]},
    },
    ("jobs", "total", "limit", "offset"),
)

# -- frames --------------------------------------------------------------------------------------------
ATTEMPT: Schema = _obj(
    {
        "attempt": INT,
        "host": STR_N,
        "outcome": STR_N,
        "started_at": TIME_N,
        "ended_at": TIME_N,
        "exit_code": INT_N,
        "exit_signal": INT_N,
        "timed_out": _or_null(BOOL),
        "failure_kind": STR_N,
        "failure": STR_N,
        "gpu_uuids": STRINGS,
        "gpu_util_mean_pct": NUM_N,
        "gpu_util_max_pct": NUM_N,
        "gpu_memory_peak_bytes": INT_N,
        "gpu_seconds": NUM_N,
        "gpu_idle_seconds": NUM_N,
    },
    ("attempt",),
)
FRAME: Schema = _obj(
    {
        "id": INT,
        "job_id": INT,
        "job": STR,
        "layer": STR,
        "number": INT,
        "frames": STR,
        "name": STR,
        "state": {"enum": list(m.FRAME_STATES)},
        "attempts": INT,
        "host": STR_N,
        "gpu_uuids": STRINGS,
        "exit_code": INT_N,
        "exit_signal": INT_N,
        "started_at": TIME_N,
        "ended_at": TIME_N,
        "gpu_util_mean_pct": NUM_N,
        "gpu_util_max_pct": NUM_N,
        "gpu_memory_peak_bytes": INT_N,
        "gpu_seconds": NUM_N,
        "max_rss_bytes": INT_N,
        "pending_action": {"enum": ["kill", "retry", "eat", None]},
        "failure": STR_N,
        "retry_at": TIME_N,
        "gpu_oom_bytes": INT_N,
        "pending_reason": STR_N,
        "gpu_util_pct": NUM_N,
        "gpu_memory_used_bytes": INT_N,
        "gpu_sampled_at": TIME_N,
        "attempt_history": {"type": "array", "items": ref("Attempt")},
        "samples": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "array"}}},
        "samples_attempt": INT_N,
        "gpu_events": {
            "type": "array",
            "items": _obj(
                {
                    "kind": {"type": "string"},
                    "device": STR_N,
                    "pid": INT_N,
                    "at": TIME_N,
                    "detail": STR_N,
                    "device_index": INT_N,
                    "memory_bytes": INT_N,
                    "host": STR_N,
                    "frame_id": INT_N,
                    "attempt": INT_N,
                },
                ("kind", "device", "pid", "at", "detail"),
            ),
        },
    },
    ("id", "job_id", "job", "layer", "number", "name", "state", "attempts"),
    description="A frame (docs/json.md, frame); samples, samples_attempt and gpu_events (docs/gpu-health.md) "
    "in GET /frames/{id} only.",
)
FRAME_LIST: Schema = _obj(
    {"frames": {"type": "array", "items": ref("Frame")}, "total": INT, "limit": INT, "next_after": INT_N},
    ("frames", "total", "limit", "next_after"),
)
FRAMES_CHANGED: Schema = _obj({"frames": {"type": "array", "items": ref("Frame")}}, ("frames",))

# -- leases and the report -----------------------------------------------------------------------------
LEASE: Schema = {
    "allOf": [ref("Holder"), _obj({"host": STR, "uuid": STR_N, "index": INT_N, "model": STR_N}, ("host",))]
}
LEASE_LIST: Schema = _obj({"leases": {"type": "array", "items": ref("Lease")}, "at": TIME}, ("leases", "at"))
REPORT_ROW: Schema = _obj(
    {
        "group": STR,
        "frames": INT,
        "succeeded": INT,
        "dead": INT,
        "retries": INT,
        "attempts": INT,
        "wall_seconds": NUM,
        "gpu_seconds_allocated": NUM,
        "gpu_seconds_busy": NUM,
        "gpu_seconds_wasted": NUM,
        "gpu_efficiency_pct": NUM_N,
        "gpu_util_mean_pct": NUM_N,
        "gpu_memory_peak_bytes": INT_N,
        "core_seconds": NUM,
        "wait_p50_s": NUM_N,
        "wait_p95_s": NUM_N,
        "labels": {"type": "object"},
    },
    ("group", "frames"),
)
REPORT: Schema = _obj(
    {
        "by": {"enum": list(GROUPINGS)},
        "since": TIME,
        "until": TIME,
        "generated_at": TIME,
        "rows": {"type": "array", "items": ref("ReportRow")},
        "total": _or_null(ref("ReportRow")),
    },
    ("by", "since", "until", "rows"),
    description="`cuectl admin report --format json`.",
)

# -- request bodies ------------------------------------------------------------------------------------
_DEPEND: Schema = {
    "anyOf": [
        STR,
        INT,
        _obj(
            {
                "layer": STR,
                "type": {"enum": ["layer", "frame", "previous", "any"]},
                "frame": INT,
                "job": {"anyOf": [STR, INT]},
            },
            additionalProperties=False,
        ),
    ]
}
_DEPENDS: Schema = {"anyOf": [_DEPEND, {"type": "array", "items": _DEPEND}]}
_NOTIFY: Schema = _obj(
    {"on": {"anyOf": [STR, STRINGS]}, "command": ONE_OR_MANY, "webhook": STR, "email": STR}, additionalProperties=False
)
_ARG: Schema = {"type": "string", "pattern": "^[^\\x00]*$"}  # no NUL: exec() could not pass it
_X_KEYS: dict[str, Schema] = {"^x-": {}}  # ignored keys: a place for YAML anchors (docs/job-spec.md)
_PRINTS = "[^\\x00-\\x1f\\x7f-\\x9f]"  # no control characters
_JOB_NAME = f"^{_PRINTS}*[^0-9\\x00-\\x1f\\x7f-\\x9f]{_PRINTS}*$"
LAYER_SPEC: Schema = _obj(
    {
        "name": LABEL,
        "command": {
            "anyOf": [_ARG | {"minLength": 1}, {"type": "array", "items": _ARG, "minItems": 1}],
            "description": "an argv list, or one string run by sh -c (docs/job-spec.md, Commands)",
        },
        "range": {"anyOf": [STR, INT], "description": "a frame range, 1-100x2"},
        "chunk": {"type": "integer", "minimum": 1, "maximum": MAX_FRAME},
        "gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
        "gpu_vendor": {"type": "string", "examples": list(VENDORS)},
        "gpu_models": ONE_OR_MANY,
        "gpu_memory_min": SIZE,
        "gpu_capability_min": VERSION,
        "gpu_driver_min": VERSION,
        "gpu_cuda_min": VERSION,
        "cores": {"type": "number", "minimum": 0.1},
        "memory": SIZE,
        "retries": {"type": "integer", "minimum": 0, "maximum": 1000},
        "timeout": DURATION,
        "env": ENV,
        "tags": ONE_OR_MANY,
        "depends": _DEPENDS,
        "log_limit": SIZE,
        "max_running": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "limits": ONE_OR_MANY,
        "retry_delay": DURATION,
        "retry_on_gpu_oom": {"type": "string", "enum": ["same", "bigger"]},
        "gpu_escape": {"type": "string", "enum": ["warn", "kill"]},
        "gpu_idle_limit": DURATION,
        "gpu_idle_action": {"type": "string", "enum": ["warn", "kill"]},
        "gpu_idle_util": {"type": "number", "minimum": 0, "maximum": 100},
        "gpu_share": SIZE,
        "gpu_share_enforce": {"type": "string", "enum": ["warn", "kill"]},
        "cwd": DIRECTORY,
        "type": {"type": "string", "examples": ["Render", "Util", "Post"]},
        "service": ONE_OR_MANY,
    },
    ("name", "command"),
    additionalProperties=False,
    description="A layer of the job spec (docs/job-spec.md, Layer fields).",
)
JOB_SPEC: Schema = _obj(
    {
        "name": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "pattern": _JOB_NAME,
            "description": "1-200 characters that print as themselves, not only digits (a JOB of digits is an id)",
        },
        "priority": INT,
        "paused": BOOL,
        "env": ENV,
        "layers": {"type": "array", "items": ref("LayerSpec"), "minItems": 1, "maxItems": 1000},
        "project": LABEL,
        "show": LABEL,
        "shot": LABEL,
        "max_running": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "max_cores": {"type": "number", "minimum": 0.1},
        "max_gpus": {"type": "integer", "minimum": 0},
        "cwd": DIRECTORY,
        "export": ONE_OR_MANY,
        "notify": {"type": "array", "items": _NOTIFY, "maxItems": 20},
        "depends": _DEPENDS,
    },
    ("name", "layers"),
    additionalProperties=False,
    patternProperties=_X_KEYS,
    description="The job spec of docs/job-spec.md, as JSON; the job is the token user's.",
)
# An Open Job Description template (docs/openjd.md): checked by the server, not here.
JOB_TEMPLATE: Schema = _obj(
    {
        "specificationVersion": {"const": "jobtemplate-2023-09"},
        "name": STR,
        "parameterDefinitions": {"type": "array", "items": {"type": "object"}},
        "steps": {"type": "array", "items": {"type": "object"}, "minItems": 1},
    },
    ("specificationVersion", "name", "steps"),
    description="An Open Job Description job template (docs/openjd.md); its parameters: ?param=NAME=VALUE.",
)
# What POST /api/v1/jobs answers: the job, or every job of an OpenCue spec (a list, always);
# with warnings, what the spec asks that cuectl cannot honour (?strict=true refuses it).
_WARNINGS: Schema = {"type": "array", "items": STR}
SUBMITTED_JOBS: Schema = _obj(
    {"jobs": {"type": "array", "items": ref("Job"), "minItems": 1}, "warnings": _WARNINGS},
    ("jobs",),
    description="The jobs of an OpenCue XML spec, in submit order.",
)
SUBMITTED: Schema = {
    "anyOf": [{"allOf": [ref("Job"), _obj({"warnings": _WARNINGS})]}, ref("SubmittedJobs")],
    "description": "The job submitted; for an OpenCue XML spec, its jobs.",
}
PRIORITY: Schema = _obj(
    {"priority": {"type": "integer", "minimum": -2147483647, "maximum": 2147483647}},
    ("priority",),
    additionalProperties=False,
)

COMPONENTS: dict[str, Schema] = {
    "Problem": PROBLEM,
    "Health": HEALTH,
    "Ready": READY,
    "WhoAmI": WHOAMI,
    "Holder": HOLDER,
    "HostDevice": HOST_DEVICE,
    "Host": HOST,
    "HostList": HOST_LIST,
    "HostGpus": HOST_GPUS,
    "HostDetail": HOST_DETAIL,
    "Layer": LAYER,
    "JobSummary": JOB_SUMMARY,
    "Job": JOB,
    "JobList": JOB_LIST,
    "Attempt": ATTEMPT,
    "Frame": FRAME,
    "FrameList": FRAME_LIST,
    "FramesChanged": FRAMES_CHANGED,
    "Lease": LEASE,
    "LeaseList": LEASE_LIST,
    "ReportRow": REPORT_ROW,
    "Report": REPORT,
    "LayerSpec": LAYER_SPEC,
    "JobSpec": JOB_SPEC,
    "JobTemplate": JOB_TEMPLATE,
    "Priority": PRIORITY,
    "Submitted": SUBMITTED,
    "SubmittedJobs": SUBMITTED_JOBS,
}
