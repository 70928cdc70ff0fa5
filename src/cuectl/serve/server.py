"""Running the API: uvicorn over TCP (127.0.0.1 by default, TLS with a certificate and
key) or over a local Unix socket whose peers are identified by the kernel (SO_PEERCRED)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from pathlib import Path
from typing import Any

from cuectl.errors import InvalidInput
from cuectl.serve.auth import PEER_UID_KEY

DEFAULT_PORT = 8448  # OpenCue's REST gateway port: where users of that look first


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket, from the kernel."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _with_peer(app: Any, uid: int) -> Any:
    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope = {**scope, PEER_UID_KEY: uid}
        await app(scope, receive, send)

    return wrapped


def _peer_protocol() -> type:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class PeerCredProtocol(H11Protocol):
        """h11 over a Unix socket, each connection's requests tagged with the peer's uid
        (read once, when the connection is accepted: it cannot change afterwards)."""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None and sock.family == socket.AF_UNIX:
                self.app = _with_peer(self.app, peer_uid(sock))

    return PeerCredProtocol


def check_tls(certfile: str | None, keyfile: str | None) -> None:
    if bool(certfile) != bool(keyfile):
        raise InvalidInput("--certfile and --keyfile go together", hint="give both for TLS, or neither")
    for flag, path in (("--certfile", certfile), ("--keyfile", keyfile)):
        if path and not os.access(path, os.R_OK):
            raise InvalidInput(f"{flag}: cannot read {path}")


def serve(
    app: Any,
    *,
    host: str,
    port: int,
    uds: str | None,
    certfile: str | None,
    keyfile: str | None,
    log_level: str = "info",
    access_log: bool = True,
) -> None:
    """Serve ``app`` until SIGINT/SIGTERM (uvicorn finishes requests in flight first)."""
    import uvicorn

    check_tls(certfile, keyfile)
    # proxy_headers off: uvicorn would otherwise believe X-Forwarded-For from any local
    # process (only the access log uses the client address; it should not be forgeable).
    options: dict[str, Any] = {
        "log_level": log_level,
        "access_log": access_log,
        "lifespan": "on",
        "server_header": False,
        "timeout_graceful_shutdown": 5,
        "proxy_headers": False,
    }
    if uds:
        path = Path(uds)
        if path.is_symlink() or (path.exists() and not path.is_socket()):
            raise InvalidInput(f"--socket: {uds} exists and is not a socket", hint="remove it or choose another path")
        if path.exists():
            path.unlink()  # a socket left by a previous run (uvicorn would fail to bind)
        config = uvicorn.Config(app, uds=str(path), http=_peer_protocol(), **options)
    else:
        config = uvicorn.Config(
            app, host=host, port=port, http="auto", ssl_certfile=certfile, ssl_keyfile=keyfile, **options
        )
    uvicorn.Server(config).run()
