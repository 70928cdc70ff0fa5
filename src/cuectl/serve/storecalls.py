"""``POST /api/v1/store/{method}``: the store's own calls, made for the caller by the one
process that may write the store (the other end of ``cuectl.sched.store.remote``).

This is how every user-facing command reaches a store that only a service account can
write (``CUECTL_DB=unix:/run/cuectl/api.sock``, docs/deploy.md): the server knows the
caller from the kernel (the socket peer's uid) or a token, lets them call only what
``remote.CALLS`` allows their role, and makes the call acting as them, so the store's own
ownership checks apply exactly as to the REST API's routes. What a client sends is decoded
without pickle, each object field checked against its type (``wire.decode(typed=True)``);
a submitted job is validated again here and made the caller's.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from cuectl.errors import CuectlError, InvalidInput
from cuectl.sched.store import Store, remote, wire
from cuectl.serve.auth import ADMIN, USER, Principal
from cuectl.serve.problems import Problem, response, status_of

# Calls only some backends answer, and what the others' answer means: no checks of its own.
NONE_HERE: dict[str, Any] = {"doctor_checks": []}
# Admin calls whose store checks the caller itself (``_admin_only``): the same message as on
# the file. The others (no check in a store every member could write) are checked here.
ADMIN_CHECKED_BY_STORE = frozenset(
    {
        "set_limit",
        "set_quota",
        "set_service",
        "delete_service",
        "create_token",
        "list_tokens",
        "revoke_token",
        "forget_host",
        "set_setting",
        "set_notify_defaults",
    }
)
ADMIN_WORDS = {"set_host_locked": "host lock", "integrity_problems": "admin doctor's integrity check"}
ROLE_OF_CLASS = {remote.READ: None, remote.OWN: USER, remote.ADMIN: ADMIN}


def is_service(who: Principal) -> bool:
    """The caller is the store's owner: this server's own uid, or root, on the socket. Only
    they may call what workers and maintenance call (claims, heartbeats, backups)."""
    return who.via == "peer" and who.uid is not None and who.uid in (0, os.geteuid())


def check_allowed(who: Principal, method: str) -> str:
    """The method's class if ``who`` may call it, else ``Problem`` 404 (no such call) or 403."""
    kind = remote.CALLS.get(method)
    if kind is None:
        raise Problem(404, f"no store call {method!r}")
    if is_service(who):
        return kind
    if kind == remote.SERVICE:
        raise Problem(
            403,
            f"{method}: only the store's owner (the service account or root) may do this, not {who.user}",
            hint="workers, backups and migrations run as the store's owner",
        )
    role = ROLE_OF_CLASS[kind]
    if role == ADMIN and method in ADMIN_CHECKED_BY_STORE:
        return kind  # the store refuses a non-admin itself, in the words the CLI prints on the file
    if role is not None and not who.can(role):
        what = ADMIN_WORDS.get(method, method)
        raise Problem(
            403,
            f"{what}: only an admin may do this, not {who.user}"
            if role == ADMIN
            else f"{what}: the {who.role} role of {who.user} may not do this (needs {role} or admin)",
            hint="ask an admin (root or the store's owner)" if role == ADMIN else None,
        )
    return kind


def arguments(body: Any) -> tuple[list[Any], dict[str, Any]]:
    """The call's positional and keyword arguments, decoded and type-checked."""
    if not isinstance(body, dict) or set(body) - {"args", "kwargs"}:
        raise InvalidInput('a store call is {"args": [...], "kwargs": {...}}')
    args = wire.decode(body.get("args", []), typed=True)
    kwargs = wire.decode(body.get("kwargs", {"__dict": []}), typed=True)
    if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidInput("a store call's args must be a list and its kwargs a mapping of names")
    return args, kwargs


def hello(store: Store) -> dict[str, Any]:
    """What a client needs before its first call: where the frame logs are (read directly,
    as the kernel allows) and what store it talks to (for messages)."""
    return {
        "log_dir": str(store.log_dir),
        "older_log_dirs": [str(p) for p in store.older_log_dirs],
        "receipt_dir": str(store.receipt_dir) if store.receipt_dir else None,
        "store": store.url,
        "schema_version": store.schema_version(),
    }


def call(store: Store, who: Principal, method: str, body: Any, *, frame_limit: int | None) -> Any:
    """Make the call for ``who``; the result as ``wire.encode`` sends it."""
    if method == "hello":
        return wire.encode(hello(store))
    if method == "integrity_problems" and not who.can(ADMIN):
        return wire.encode(None)  # doctor for a user: "skipped: no check a client can run"
    check_allowed(who, method)
    args, kwargs = arguments(body)
    if method == "submit":
        args, kwargs = _submission(who, args, kwargs, frame_limit)
    if method == "actor" and not is_service(who):
        return wire.encode(who.actor())
    if method == "wait_for_work":
        args = [min(float(args[0]) if args and isinstance(args[0], (int, float)) else 0.0, remote.WAIT_CAP_S)]
    fn = getattr(store, method, None)
    if fn is None and method in NONE_HERE:
        return wire.encode(NONE_HERE[method])
    if fn is None:
        raise InvalidInput(f"{method}: this store ({type(store).__name__}) has no such call")
    try:
        if is_service(who):
            result = fn(*args, **kwargs)
        else:
            with store.acting_as(who.actor()):
                result = fn(*args, **kwargs)
    except TypeError as exc:  # wrong arguments for the method: the client's mistake, said plainly
        if "argument" in str(exc):
            raise InvalidInput(f"{method}: {exc}") from None
        raise
    if method == "get_job" and isinstance(result, dict):
        result = _private(result, who)
    if method == "get_jobs" and isinstance(result, list):
        result = [_private(job, who) for job in result]
    return wire.encode(result)


def _private(job: dict[str, Any], who: Principal) -> dict[str, Any]:
    """Another user's job with the credentials in its environment masked (``job show
    --show-secrets`` shows only one's own: before the one-writer model any member could
    read them in the file; now only its owner, an admin or the service does)."""
    from cuectl.sched.views import mask_env

    owner = job.get("submitted_by") or job.get("user")
    if is_service(who) or who.role == ADMIN or owner == who.user:
        return job
    for layer in job.get("layers") or []:
        if isinstance(layer.get("env"), dict):
            layer["env"] = mask_env(layer["env"])
    return job


def _submission(
    who: Principal, args: list[Any], kwargs: dict[str, Any], frame_limit: int | None
) -> tuple[list[Any], dict[str, Any]]:
    from cuectl.sched.model import JobSpec
    from cuectl.sched.spec import recheck

    spec = args[0] if args else kwargs.get("spec")
    if not isinstance(spec, JobSpec):
        raise InvalidInput("submit: expected a job spec")
    # The store's owner could write any row into the file itself: its jobs keep the user
    # they name (as a library caller's do). Anyone else's job is theirs, whatever it says.
    checked = recheck(spec, user=spec.user if is_service(who) else who.user, frame_limit=frame_limit)
    rest = {k: v for k, v in kwargs.items() if k != "spec"}
    return [checked, *args[1:]], rest


def is_change(method: str) -> bool:
    """Whether a call changes what readers see (the API's shared read cache is emptied)."""
    return remote.CALLS.get(method) in (remote.OWN, remote.ADMIN) or method in (
        "register_host",
        "sign_off_host",
        "claim_frame",
        "complete_frame",
        "complete_and_claim",
        "complete_and_claim_many",
        "requeue_frame",
        "reap",
    )


def error_response(exc: CuectlError) -> Any:
    """A library error as a problem carrying its class, so the client raises the same one
    (and the CLI exits with the same code and line)."""
    extra: dict[str, Any] = {"error": type(exc).__name__}
    holders = getattr(exc, "holders", None)
    if holders:
        extra["holders"] = wire.encode(holders)
    return response(status_of(exc), exc.message, hint=exc.hint, extra=extra)


def problem_response(exc: Problem) -> Any:
    """The API layer's own refusal (authentication, a method not allowed, a malformed body)
    with the library error the CLI raises for it."""
    error = {404: "NotFound", 401: "NotOwner", 403: "NotOwner"}.get(exc.status, "InvalidInput")
    return response(exc.status, exc.detail, hint=exc.hint, extra={"error": error})


def result_body(result: Any) -> Mapping[str, Any]:
    return {"result": result}
