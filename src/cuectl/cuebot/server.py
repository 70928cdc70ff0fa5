"""``cuectl serve --opencue``: a gRPC server speaking Cuebot's protocol from a cuectl store.

Every service of OpenCue's protos (the ``opencue-proto`` package, never a copy) is
registered: a method cuectl implements is answered by its handler (cuebot/jobs.py,
cuebot/farm.py); any other answers ``UNIMPLEMENTED`` naming the method, so no client ever
reads an empty "success" for a change that did not happen. Handlers are thin clients of
the store, like the CLI and the REST API: no scheduling rule of their own.

Each call is identified before its handler runs (cuebot/call.py): on loopback by the
kernel (cuebot/peer.py), elsewhere by the admin's choice of network.
"""

from __future__ import annotations

import functools
import importlib
import ipaddress
import logging
import pkgutil
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import grpc
from google.protobuf import message_factory

from cuectl.cuebot import peer
from cuectl.cuebot.cache import ReadCache, is_read
from cuectl.cuebot.call import CLAIMED, PROVEN, REMOTE, Call, Refused
from cuectl.errors import Conflict, CuectlError, InvalidInput, NotFound, NotOwner, StoreError, Unproven
from cuectl.sched.store.pool import StorePool
from cuectl.serve.auth import USER, VIEWER, Principal, peer_principal

log = logging.getLogger("cuectl.cuebot")
DEFAULT_ADDRESS = "127.0.0.1:8443"  # Cuebot's own port: where OpenCue's clients look
Handler = Callable[[Call, Any], Any]


@dataclass(frozen=True)
class Settings:
    db_url: str
    busy_timeout_s: float = 10.0
    trusted_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    threads: int = 16
    cache_s: float = 1.0  # how long an identical read is shared between clients (0: off)


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[::1]:PORT`` or ``:PORT`` -> (host, port); InvalidInput otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) < 65536:  # 0: the kernel picks (logged)
        raise InvalidInput(f"--opencue: {text!r} is not HOST:PORT (e.g. {DEFAULT_ADDRESS})")
    host = host.strip("[]") or "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput(
            f"--opencue: {host!r} is not an IP address (name the address to bind, e.g. 127.0.0.1 or 0.0.0.0)"
        ) from None
    return host, int(port_text)


def parse_networks(values: list[str]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            raise InvalidInput(f"--opencue-trust-network: {value!r} is not a network (e.g. 10.0.0.0/16)") from None
    return tuple(out)


# -- the method table ------------------------------------------------------------------------
def _all_methods() -> dict[str, tuple[Any, Any]]:
    """Every unary method of OpenCue's protos: '/pkg.Service/Method' -> (request, response) classes."""
    import opencue_proto

    table: dict[str, tuple[Any, Any]] = {}
    for info in pkgutil.iter_modules(opencue_proto.__path__):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"opencue_proto.{info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                table[f"/{service.full_name}/{method.name}"] = (
                    message_factory.GetMessageClass(method.input_type),
                    message_factory.GetMessageClass(method.output_type),
                )
    return table


def implemented() -> dict[str, Handler]:
    """What cuectl answers: '/pkg.Service/Method' -> handler(call, request) -> response."""
    from cuectl.cuebot import farm, jobs

    return {**jobs.METHODS, **farm.METHODS}


_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (NotOwner, grpc.StatusCode.PERMISSION_DENIED),
    (Unproven, grpc.StatusCode.PERMISSION_DENIED),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (StoreError, grpc.StatusCode.UNAVAILABLE),
)


def status_of(exc: CuectlError) -> grpc.StatusCode:
    for kind, code in _CODES:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.INTERNAL


class Dispatcher(grpc.GenericRpcHandler):
    """Routes every method path of OpenCue's services: identify, run, map errors."""

    def __init__(
        self,
        settings: Settings,
        bound: tuple[str, int],
        handlers: Mapping[str, Handler] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._bound = bound
        self._pool = StorePool(settings.db_url, busy_timeout_s=settings.busy_timeout_s)
        self._methods = _all_methods()
        self._handlers = dict(implemented() if handlers is None else handlers)
        self._cache = ReadCache(settings.cache_s)
        self._clock = clock

    def store(self) -> Any:
        """The calling thread's store connection."""
        return self._pool.get()

    def close(self) -> None:
        self._pool.close()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        path = handler_call_details.method
        classes = self._methods.get(path)
        if classes is None:
            return None  # not OpenCue's: grpc answers UNIMPLEMENTED itself
        request_class, response_class = classes
        handler = self._handlers.get(path)

        def run(request: Any, context: grpc.ServicerContext) -> Any:
            return self._run(path, handler, request, context)

        return grpc.unary_unary_rpc_method_handler(
            run, request_deserializer=request_class.FromString, response_serializer=response_class.SerializeToString
        )

    def _run(self, path: str, handler: Handler | None, request: Any, context: grpc.ServicerContext) -> Any:
        name = path.strip("/")
        try:
            if handler is None:
                raise Refused(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"cuectl does not implement {name} (docs/opencue-grpc.md lists what it does)",
                )
            store = self._pool.get()
            call = Call(store=store, who=self._identify(context, store), now=self._clock())
            if is_read(path):
                return self._cache.get(
                    path, request.SerializeToString(deterministic=True), lambda: handler(call, request)
                )
            answer = handler(call, request)
            self._cache.clear()  # a change: no client may read the state from before it
            return answer
        except Refused as exc:
            context.abort(exc.code, exc.message)
        except CuectlError as exc:
            message = exc.message if hasattr(exc, "message") else str(exc)
            context.abort(status_of(exc), f"{name}: {message}")
        except Exception:
            log.exception("%s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{name}: internal error (see the server's log)")
        raise AssertionError("unreachable")  # context.abort raises

    def _identify(self, context: grpc.ServicerContext, store: Any) -> Principal:
        address = peer.parse_grpc_peer(context.peer())
        if address is None:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, f"cannot tell who is calling from {context.peer()!r}")
        if peer.is_loopback(address[0]):
            host = None if self._bound[0] in ("0.0.0.0", "::") else self._bound[0]
            uid = peer.socket_owner(address, (host, self._bound[1]))
            if uid is None:
                raise Refused(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "cannot prove who is calling: no local socket of this connection was found "
                    "(a name the client sends is never taken on its own)",
                )
            if uid == _overflow_uid():
                # One uid for every user unmapped in this server's user namespace (peer.py):
                # taken for a person, they would all be one, and the admin where the store's
                # file is unmapped too (it reads as the same uid).
                raise Refused(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"cannot tell who is calling: the kernel shows the caller as uid {uid}, the overflow "
                    "uid of users with no mapping in this server's user namespace (or nobody), which "
                    "names no one in particular",
                )
            principal = peer_principal(uid, store)
            return Principal(principal.user, principal.role, PROVEN)
        client = ipaddress.ip_address(address[0])
        if any(client in network for network in self._settings.trusted_networks):
            return Principal("", USER, CLAIMED)
        return Principal("anonymous", VIEWER, REMOTE)


@functools.lru_cache(maxsize=1)
def _overflow_uid() -> int:
    """The uid the kernel shows for one it cannot map into the reader's user namespace
    (read once: it is fixed while the server runs, and every loopback call asks)."""
    try:
        return int(Path("/proc/sys/kernel/overflowuid").read_text())
    except (OSError, ValueError):
        return 65534  # the kernel's default


def build_server(settings: Settings, address: str) -> tuple[grpc.Server, Dispatcher, int]:
    """A started-ready (not started) server bound to ``address``; returns it, its
    dispatcher and the bound port (``:0``: the kernel's choice)."""
    host, port = parse_address(address)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.threads, thread_name_prefix="cuebot"),
        options=[("grpc.so_reuseport", 0)],
    )
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    bound = server.add_insecure_port(target)
    if not bound:
        raise InvalidInput(f"--opencue: cannot listen on {address} (in use, or not an address of this host)")
    dispatcher = Dispatcher(settings, (host, bound))
    server.add_generic_rpc_handlers([dispatcher])
    _add_gpu_service(server, dispatcher)
    return server, dispatcher, bound


def _add_gpu_service(server: grpc.Server, dispatcher: Dispatcher) -> None:
    """cuectl's own GPU messages (cuectl.gpu.v1, read-only), beside OpenCue's services."""
    from cuectl.cuebot.gpu_service import GpuServicer
    from cuectl.cuebot.proto import cuectl_gpu_pb2_grpc

    cuectl_gpu_pb2_grpc.add_GpuInterfaceServicer_to_server(GpuServicer(dispatcher.store), server)


def serve(settings: Settings, address: str, *, ready: Callable[[int], None] | None = None) -> None:
    """Serve until SIGINT/SIGTERM, then finish the calls in flight (5 s at most)."""
    import signal
    import threading

    server, dispatcher, port = build_server(settings, address)
    server.start()
    log.info("serving OpenCue's gRPC protocol on %s (port %d)", address, port)
    if ready is not None:
        ready(port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        stop.wait()
    finally:
        server.stop(5).wait()
        dispatcher.close()
