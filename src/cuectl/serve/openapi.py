"""The REST API's OpenAPI document: FastAPI's generated one, typed.

The routes return the library's plain dicts and read some parameters as strings to
answer a bad value with the CLI's own message, so FastAPI alone documents untyped
answers and string parameters. This module adds what it cannot know: each operation's
answer body (serve/schemas.py), the errors it can give as ``application/problem+json``,
304 on the cached reads, the request bodies read by hand (the job spec, the priority),
the real types of the parameters read as strings, and the bearer security scheme.
"""

from __future__ import annotations

from typing import Any

from cuectl.report import GROUPINGS
from cuectl.sched import model as m
from cuectl.serve.problems import PROBLEM_JSON
from cuectl.serve.schemas import COMPONENTS, ref

API = "/api/v1"
JSON = "application/json"

# (method, path) -> (status, body schema name; None: text/plain). Every operation has one
# (tests/serve/test_openapi.py checks), so a new route cannot ship untyped.
ANSWERS: dict[tuple[str, str], tuple[int, str | None]] = {
    ("get", "/healthz"): (200, "Health"),
    ("get", "/readyz"): (200, "Ready"),
    ("get", "/metrics"): (200, None),
    ("get", f"{API}/whoami"): (200, "WhoAmI"),
    ("get", f"{API}/hosts"): (200, "HostList"),
    ("get", f"{API}/hosts/{{name}}"): (200, "HostDetail"),
    ("get", f"{API}/hosts/{{name}}/gpus"): (200, "HostGpus"),
    ("post", f"{API}/hosts/{{name}}/{{action}}"): (200, "HostDetail"),
    ("get", f"{API}/jobs"): (200, "JobList"),
    ("post", f"{API}/jobs"): (201, "Submitted"),
    ("get", f"{API}/jobs/{{job}}"): (200, "Job"),
    ("post", f"{API}/jobs/{{job}}/priority"): (200, "Job"),
    ("post", f"{API}/jobs/{{job}}/{{action}}"): (200, "Job"),
    ("get", f"{API}/jobs/{{job}}/frames"): (200, "FrameList"),
    ("get", f"{API}/frames/{{frame_id}}"): (200, "Frame"),
    ("post", f"{API}/frames/{{frame_id}}/{{action}}"): (200, "FramesChanged"),
    ("get", f"{API}/frames/{{frame_id}}/log"): (200, None),
    ("get", f"{API}/leases"): (200, "LeaseList"),
    ("get", f"{API}/report"): (200, "Report"),
}
# Answered from the shared cache with an ETag: If-None-Match may get a 304.
CACHED = {f"{API}/hosts", f"{API}/hosts/{{name}}", f"{API}/jobs", f"{API}/jobs/{{job}}", f"{API}/jobs/{{job}}/frames"}
BODIES = {f"{API}/jobs": "JobSpec", f"{API}/jobs/{{job}}/priority": "Priority"}
# The bodies a job is submitted as, by Content-Type (cuectl.sched.intake.FORMATS): a job spec
# or an Open Job Description template as JSON or YAML, an OpenCue XML spec.
_SPEC_OR_TEMPLATE = {"anyOf": [ref("JobSpec"), ref("JobTemplate")]}
_XML_SPEC = {
    "type": "string",
    "description": "An OpenCue job spec (docs/opencue-xml.md); its jobs are the token user's",
}
SUBMIT_BODIES: dict[str, dict[str, Any]] = {
    JSON: _SPEC_OR_TEMPLATE,
    "application/yaml": _SPEC_OR_TEMPLATE,
    "application/xml": _XML_SPEC,
}
_PAGE = {"type": "integer", "minimum": 1, "maximum": 10_000}
# Parameters the routes read as strings (to answer a bad one with the CLI's message): their real types.
PARAMETERS: dict[tuple[str, str], dict[str, Any]] = {
    (f"{API}/hosts", "vendor"): {"type": "string", "examples": ["NVIDIA", "AMD", "Apple", "Intel"]},
    (f"{API}/hosts", "state"): {"enum": ["UP", "DOWN"]},
    (f"{API}/hosts", "gpu_memory_min"): {"type": "string", "examples": ["24G", "80GiB", "24576"]},
    (f"{API}/jobs", "state"): {"enum": [m.JOB_PENDING, m.JOB_RUNNING, m.JOB_FINISHED]},
    (f"{API}/jobs", "limit"): _PAGE,
    (f"{API}/jobs", "offset"): {"type": "integer", "minimum": 0},
    (f"{API}/jobs", "order"): {"enum": ["asc", "desc"]},
    (f"{API}/jobs/{{job}}/frames", "state"): {"enum": list(m.FRAME_STATES)},
    (f"{API}/jobs/{{job}}/frames", "limit"): _PAGE,
    (f"{API}/jobs/{{job}}/frames", "after"): {"type": "integer", "minimum": 0},
    (f"{API}/jobs/{{job}}/frames", "ids"): {"type": "string", "pattern": "^[0-9]+(,[0-9]+)*$", "examples": ["1,2,3"]},
    (f"{API}/frames/{{frame_id}}/log", "tail"): {"type": "integer", "minimum": 0, "maximum": 100_000},
    (f"{API}/report", "by"): {"enum": list(GROUPINGS) + ["gpu_model"], "default": "job"},
    (f"{API}/report", "since"): {"type": "string", "default": "7d", "examples": ["7d", "12h", "2026-12-01"]},
    (f"{API}/report", "until"): {"type": "string", "examples": ["2026-12-04T12:00:00Z"]},
}
_EXAMPLES: dict[str, list[Any]] = {"job": ["1", "train-sweep"], "frame_id": [1], "name": ["gpu-node-01"]}
_ERRORS = {
    400: "a query parameter this path does not take, or a body that is not JSON",
    401: "no token, or an unknown or revoked one (WWW-Authenticate: Bearer)",
    403: "the token's role may not do this, or the job is someone else's",
    404: "no such job, frame, host or action",
    409: "a job name several jobs have, or an action that changes nothing",
    413: "a body over 4 MiB",
    415: "a body that is not application/json (a job may also be application/yaml or application/xml)",
    422: "a bad value: a parameter or a spec field (field names it)",
    503: "the store does not answer",
}


def typed(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (FastAPI's generated document) with the types this module adds."""
    components = schema.setdefault("components", {})
    generated = {
        k: v for k, v in components.get("schemas", {}).items() if k not in ("HTTPValidationError", "ValidationError")
    }  # FastAPI's 422 body: ours is a problem
    components["schemas"] = {**generated, **COMPONENTS}
    components["securitySchemes"] = {
        "bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "A token from `cuectl admin token create USER --role ROLE`",
        }
    }
    for path, operations in schema.get("paths", {}).items():
        for method, operation in operations.items():
            _operation(path, method, operation)
    return schema


def _operation(path: str, method: str, operation: dict[str, Any]) -> None:
    secured = path.startswith(API) or path == "/metrics"
    if secured:
        operation["security"] = [{"bearer": []}]
    for parameter in operation.get("parameters", []):
        name = parameter["name"]
        if parameter["in"] == "query" and (path, name) in PARAMETERS:
            parameter["schema"] = dict(PARAMETERS[path, name])
        elif parameter["in"] == "path" and name in _EXAMPLES:
            parameter.setdefault("examples", {f"e{i}": {"value": v} for i, v in enumerate(_EXAMPLES[name])})
    if path == f"{API}/jobs" and method == "post":
        operation["requestBody"] = {
            "required": True,
            "content": {media: {"schema": dict(schema)} for media, schema in SUBMIT_BODIES.items()},
        }
    elif path in BODIES and method == "post":
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(BODIES[path])}}}
    responses: dict[str, Any] = {}
    answer = ANSWERS.get((method, path))
    if answer is not None:
        status, body = answer
        kept = operation.get("responses", {}).get(str(status), {})
        content = {JSON: {"schema": ref(body)}} if body else {"text/plain": {"schema": {"type": "string"}}}
        responses[str(status)] = {"description": kept.get("description") or "done", "content": content}
    else:  # untyped: left as FastAPI made it (the suite refuses it)
        responses.update({k: v for k, v in operation.get("responses", {}).items() if k != "422"})
    if method == "get" and path in CACHED:
        responses["304"] = {"description": "If-None-Match named the current ETag: no body"}
    for status in _errors(path, method, secured):
        responses[str(status)] = {"description": _ERRORS[status], "content": {PROBLEM_JSON: {"schema": ref("Problem")}}}
    operation["responses"] = responses


def _errors(path: str, method: str, secured: bool) -> list[int]:
    statuses = [400, 422]
    if secured:
        statuses.append(401)
    if method == "post":
        statuses += [403, 404, 409]  # the owner check; a job a spec depends on; a no-op action
    if "{" in path:
        statuses.append(404)
    if "{job}" in path:
        statuses.append(409)  # a name that several jobs have
    if path in BODIES and method == "post":
        statuses += [413, 415]
    if path != "/healthz":
        statuses.append(503)
    return sorted(set(statuses))
