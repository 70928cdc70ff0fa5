"""Errors as RFC 9457 ``application/problem+json``: one mapping from the library's exception
hierarchy to HTTP statuses, never a stack trace in a response."""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from cuectl import errors as e

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("cuectl.serve")

_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class Problem(Exception):
    """An HTTP error raised by the API layer itself (auth, malformed requests)."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        field: str | None = None,
        hint: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status, self.detail, self.field, self.hint = status, detail, field, hint
        self.headers = headers or {}
        self.extra = extra or {}  # RFC 9457 extension members (a no-op's ``state``)


def status_of(exc: e.CuectlError) -> int:
    """The one mapping of library errors to statuses."""
    if isinstance(exc, e.InvalidInput):
        return 422
    if isinstance(exc, e.NotFound):
        return 404
    if isinstance(exc, (e.NotOwner, e.Unproven)):
        return 403
    if isinstance(exc, e.Conflict):
        return 409
    if isinstance(exc, (e.StoreUnreachable, e.StoreBusy, e.StoreGone)):
        return 503
    return 500 if isinstance(exc, e.StoreError) else 409


_UNKNOWN_KEY = re.compile(r"unknown key '([^']{1,100})'")


def field_of(message: str) -> str | None:
    """The field an ``InvalidInput`` message names: the library writes ``<field>: <what>``
    (``layers[0].gpus: must be ...``, ``--role: ...``); an unknown key is itself the field."""
    head, sep, rest = message.partition(": ")
    prefix = head.strip().lstrip("-") if sep and head.strip() and " " not in head.strip() else ""
    unknown = _UNKNOWN_KEY.match(rest if prefix else message)
    if unknown:
        return f"{prefix}.{unknown.group(1)}" if prefix else unknown.group(1)
    return prefix or None


def response(
    status: int,
    detail: str,
    *,
    field: str | None = None,
    hint: str | None = None,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if field:
        body["field"] = field
    if hint:
        body["hint"] = hint
    body.update(extra or {})
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


async def on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return response(exc.status, exc.detail, field=exc.field, hint=exc.hint, headers=exc.headers, extra=exc.extra)


async def on_cuectl_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, e.CuectlError)
    status = status_of(exc)
    field = field_of(exc.message) if status == 422 else None
    hint = exc.hint
    if isinstance(exc, e.NotOwner) and hint and "--force" in hint:
        hint = "ask its owner, or an admin"  # the CLI's --force has no API counterpart
    return response(status, exc.message, field=field, hint=hint)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    # Starlette's own (unknown path, wrong method): same shape as ours.
    status = int(getattr(exc, "status_code", 500))
    detail = getattr(exc, "detail", None) or _TITLES.get(status, "Error")
    return response(status, str(detail), headers=getattr(exc, "headers", None))


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    # FastAPI's parameter validation (a query or path value of the wrong type).
    errors: list[dict[str, Any]] = getattr(exc, "errors", lambda: [])()
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body")]
    field = ".".join(loc) or None
    detail = f"{field}: {first.get('msg', 'invalid value')}" if field else str(first.get("msg", "invalid request"))
    return response(422, detail, field=field)


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # A bug: logged with its traceback on the server, never sent to the client.
    log.error("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    return response(500, "internal error (logged by the server)")
