"""The store behind ``cuectl serve --socket``: every call goes over a local Unix socket to the
one process that may write the store (``CUECTL_DB=unix:/run/cuectl/api.sock``).

On a machine several people use, the store, its logs, receipts and lock directory belong
to a service account and nobody else can write them (docs/security.md). Users' commands
reach that store only through the server's socket, where the kernel says who is calling
(``SO_PEERCRED``) and the server acts as them (``Store.acting_as``): the same ownership
checks, the same rows, the same errors, so every command works unchanged — same flags,
same output, same exit codes. ``CALLS`` says which methods a caller may use at all; the
server (``cuectl.serve.storecalls``) enforces it, this module only forwards.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import time
from pathlib import Path
from typing import Any, Callable

from cuectl import errors
from cuectl.sched.model import JobSpec
from cuectl.sched.store import wire
from cuectl.sched.store.base import Actor, Store

PREFIX = "unix:"
PATH = "/api/v1/store/"  # + the method's name: POST {"args": [...], "kwargs": {...}}

# Who may call each method through the socket (the server enforces it):
#   read     anyone the server lets in (a viewer token too)
#   own      the user role: the store checks that the job is the caller's (or an admin's)
#   admin    admins only (root, the store's owner, an admin token)
#   service  only the store's owner (its uid, or root): workers, backups, migrations
# A method that is not here is never forwarded: a new store method stays closed until it is
# classified (tests/serve/test_store_socket.py checks that every method is).
READ, OWN, ADMIN, SERVICE = "read", "own", "admin", "service"
CALLS: dict[str, str] = {
    **dict.fromkeys(
        (
            "actor",
            "schema_version",
            "clock",
            "count_jobs",
            "list_jobs",
            "get_job",
            "list_frames",
            "frame_attempts",
            "get_frame",
            "frame_id",
            "select_frames",
            "list_hosts",
            "get_host",
            "host_inventories",
            "runnable_layers",
            "running_bookings",
            "running_on_host",
            "running_count",
            "has_unfinished_work",
            "layer_frame_counts",
            "usage_summary",
            "list_limits",
            "list_quotas",
            "list_services",
            "cap_reached",
            "farm_figures",
            "gpu_events",
            "gpu_event_counts",
            "device_states",
            "failed_attempts",
            "jobs_succeeded_elsewhere",
            "settings",
            "list_depends",
            "notify_defaults",
            "list_notifications",
            "prunable_jobs",
            "wait_for_work",
            "doctor_checks",
            "get_jobs",
            "caps_reached",
        ),
        READ,
    ),
    **dict.fromkeys(
        (
            "submit",
            "set_job_paused",
            "set_job_priority",
            "kill_job",
            "retry_job",
            "kill_jobs",
            "retry_jobs",
            "set_jobs_paused",
            "set_jobs_priority",
            "frame_action",
            "frames_action",
            "add_depend",
            "drop_depends",
            "prune",
            "drain_device",
            "undrain_device",
        ),
        OWN,
    ),
    **dict.fromkeys(
        (
            "set_limit",
            "set_quota",
            "set_service",
            "delete_service",
            "create_token",
            "list_tokens",
            "revoke_token",
            "forget_host",
            "set_host_locked",
            "set_setting",
            "set_notify_defaults",
            "integrity_problems",
        ),
        ADMIN,
    ),
    **dict.fromkeys(
        (
            "register_host",
            "sign_off_host",
            "claim_frame",
            "heartbeat",
            "record_live_usage",
            "record_gpu_events",
            "set_device_state",
            "complete_frame",
            "complete_and_claim",
            "complete_and_claim_many",
            "requeue_frame",
            "reap",
            "sweep_depends",
            "claim_notifications",
            "notification_delivered",
            "notification_failed",
            "release_notifications",
            "authenticate",
            "backup",
            "migrate",
            "layer_caps",
        ),
        SERVICE,
    ),
}
# Methods that are the client's own business, never a call: closing the connection, the
# stall guard of a worker, where a log lives, and the database's own wake-up channel.
LOCAL = frozenset({"close", "acting_as", "stall", "log_dir_of", "notify_fileno", "drain_notifications"})
WAIT_CAP_S = 10.0  # the longest ``wait_for_work`` the server blocks one of its threads for


def socket_path(url: str) -> Path | None:
    """The socket a store URL names (``unix:/path`` or ``unix:///path``), else None."""
    if not url.startswith(PREFIX):
        return None
    rest = url[len(PREFIX) :]
    return Path(rest[2:] if rest.startswith("///") else rest)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class RemoteStore(Store):
    """A ``Store`` whose every call is made by the server on the other end of ``path``."""

    local_path = None

    def __init__(self, path: Path, *, timeout_s: float = 60.0) -> None:
        self.path = path
        self.url = f"{PREFIX}{path}"
        self._timeout_s = timeout_s
        self._conn: _UnixConnection | None = None
        hello = self._call("hello", (), {})
        self.log_dir = Path(hello["log_dir"])
        self.older_log_dirs = tuple(Path(p) for p in hello.get("older_log_dirs", ()))
        # Receipts are read where they lie (pending reasons say whether a job is proven).
        self.receipt_dir = Path(hello["receipt_dir"]) if hello.get("receipt_dir") else None
        # The store behind the socket is what ``cuectl admin doctor`` and messages name.
        self.behind = str(hello.get("store", ""))

    # -- transport ------------------------------------------------------------------------------
    def _connection(self) -> _UnixConnection:
        if self._conn is None:
            self._conn = _UnixConnection(self.path, self._timeout_s)
        return self._conn

    def _call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        body = json.dumps({"args": wire.encode(list(args)), "kwargs": wire.encode(kwargs)}).encode()
        self.calling_since = time.monotonic()
        try:
            status, data = self._exchange(method, body)
        finally:
            self.calling_since = None
        if status == 200 and isinstance(data, dict):
            return data.get("result")
        raise _error_of(status, data, self.url)

    def _exchange(self, method: str, body: bytes) -> tuple[int, Any]:
        for attempt in (1, 2):  # a kept-alive connection the server closed meanwhile: once more, anew
            conn = self._connection()
            try:
                conn.request("POST", PATH + method, body=body, headers={"Content-Type": "application/json"})
                response = conn.getresponse()
                raw = response.read()
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine) as exc:
                self._drop()
                if attempt == 2 or not isinstance(
                    exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                ):
                    raise _unreachable(self.path, exc) from None
                continue
            except OSError as exc:
                self._drop()
                raise _unreachable(self.path, exc) from None
            try:
                return response.status, wire.loads(raw or b"{}")
            except ValueError:
                raise errors.StoreError(
                    f"{self.url}: the server's answer is not JSON (HTTP {response.status})",
                    hint="is a cuectl serve --socket listening there?",
                ) from None
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- what is never a call -------------------------------------------------------------
    def close(self) -> None:
        self._drop()

    def _begin_acting(self, actor: Actor) -> None:
        raise errors.NotOwner(
            "a store reached through a socket acts as the socket's caller only",
            hint="run the server on the store itself (cuectl serve --db PATH)",
        )

    def notify_fileno(self) -> int | None:
        return None

    def drain_notifications(self) -> bool:
        return False

    def stall(self, seconds: float, why: str = "stopped answering") -> None:
        self._drop()
        raise errors.StoreStalled(f"{self.url} {why} (waited {seconds:g} s)")

    def submit(self, spec: JobSpec, *, now: float) -> int:
        # The server expands the frames again from each layer's range (it never believes a
        # client's): the chunks stay here, and a 100,000-frame job is a small request.
        return int(self._call("submit", (dataclasses.replace(spec, chunks=()),), {"now": now}))

    def wait_for_work(self, timeout: float) -> bool:
        return bool(self._call("wait_for_work", (min(max(timeout, 0.0), WAIT_CAP_S),), {}))


def _forwarder(name: str) -> Callable[..., Any]:
    def call(self: RemoteStore, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``Store.{name}``, made by the server behind the socket."
    return call


for _name in CALLS:
    if _name not in RemoteStore.__dict__:
        setattr(RemoteStore, _name, _forwarder(_name))
RemoteStore.__abstractmethods__ = frozenset()  # each was set just above, as a forwarder


def connect(path: Path) -> Store:
    """The store behind the socket ``path``."""
    # Each abstract method is a forwarder, set on the class just above: mypy cannot see it.
    return RemoteStore(path)  # type: ignore[abstract]


def _unreachable(path: Path, exc: BaseException) -> errors.StoreError:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
        return errors.StoreUnreachable(
            f"no store server at {path} ({reason})",
            hint="start it: cuectl serve --socket PATH (docs/deploy.md, shared mode)",
        )
    if isinstance(exc, PermissionError):
        return errors.StoreError(
            f"{path}: permission denied", hint="the socket must be mode 0666 in a directory you may enter"
        )
    return errors.StoreUnreachable(
        f"the store server at {path} did not answer ({reason})", hint="check that `cuectl serve --socket` is running"
    )


def _error_of(status: int, data: Any, url: str) -> errors.CuectlError:
    """The server's problem as the exception the store itself would have raised."""
    data = data if isinstance(data, dict) else {}
    message = str(data.get("detail") or data.get("title") or f"HTTP {status}")
    hint = data.get("hint")
    name = data.get("error")
    cls = getattr(errors, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, errors.CuectlError)):
        cls = (
            errors.InvalidInput
            if status in (400, 422)
            else (errors.NotOwner if status in (401, 403) else errors.StoreError)
        )
    try:
        exc = cls(message, hint=hint if isinstance(hint, str) else None)
    except TypeError:
        exc = errors.StoreError(message, hint=hint if isinstance(hint, str) else None)
    if "holders" in data and hasattr(exc, "holders"):
        exc.holders = list(data["holders"])
    return exc


SUFFIX = ".sock"  # ``cuectl serve --socket /var/lib/cuectl/cuectl.db.sock``: found beside the store


def beside(file: Path) -> Path | None:
    """The socket beside a SQLite store (``<file>.sock``) when this process should use it:
    the store is not this user's to write (a service account's, docs/deploy.md), and a
    socket is there. Root and the file's owner open the file itself."""
    import os
    import stat

    sock = file.with_name(file.name + SUFFIX)
    try:
        if not stat.S_ISSOCK(os.stat(sock).st_mode):
            return None
        owner = os.stat(file).st_uid
    except OSError:
        return None
    uid = os.geteuid()
    return None if uid in (0, owner) else sock
