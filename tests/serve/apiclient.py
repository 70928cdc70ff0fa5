"""An HTTP client for the `cuectl serve` tests (stdlib only) and a runner for the real server.

``Server`` starts ``python -m cuectl --db DB serve …`` as a subprocess on a free
127.0.0.1 port (or a Unix socket), waits for ``/healthz`` and stops it. ``Api`` sends
requests over TCP, TLS or a Unix socket with ``http.client`` and checks every error
response on the way: an RFC 9457 problem (``application/problem+json``), never a 500,
never a traceback. Imported by the tests through sys.path (pytest runs with
--import-mode=importlib), like farmlib and osusers.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

PROBLEM_JSON = "application/problem+json"
CUECTL = [sys.executable, "-m", "cuectl"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def isolated_env(base: Path, **extra: str) -> dict[str, str]:
    """The environment for cuectl subprocesses: nothing of the user's (store, locks, fake
    GPUs, log directory) leaks in; everything lives under ``base``."""
    env = dict(os.environ)
    for key in ("CUECTL_DB", "CUECTL_FAKE_GPUS", "CUECTL_LOG_DIR", "CUECTL_USER"):
        env.pop(key, None)
    env.update(
        {
            "XDG_STATE_HOME": str(base / "xdg-state"),
            "CUECTL_LOCK_DIR": str(base / "locks"),
            "CUECTL_CREATE_LOCK_DIR": "1",
            "CUECTL_LOCK_REGISTRY": str(base / "lock-registry"),
            "CUECTL_KILL_GRACE": "0.5",
            "NO_COLOR": "1",
        }
    )
    env.update(extra)
    return env


def cuectl(
    db: str | Path, *args: str, env: Mapping[str, str], check: bool = True, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [*CUECTL, "--db", str(db), *args], capture_output=True, text=True, env=dict(env), timeout=timeout, cwd=cwd
    )
    if check and res.returncode != 0:
        raise AssertionError(f"cuectl {' '.join(args)} exited {res.returncode}: {res.stderr}")
    return res


@dataclass(frozen=True)
class Token:
    id: int
    user: str
    role: str
    secret: str


def create_token(db: str | Path, user: str, role: str, *, env: Mapping[str, str]) -> Token:
    """``cuectl admin token create USER --role ROLE --json``: the one time the secret shows."""
    data = json.loads(cuectl(db, "admin", "token", "create", user, "--role", role, "--json", env=env).stdout)
    assert data["user"] == user and data["role"] == role and data["secret"], data
    return Token(int(data["id"]), user, role, data["secret"])


# -- responses ------------------------------------------------------------------------------------
@dataclass
class Resp:
    status: int
    headers: Message
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    @property
    def content_type(self) -> str:
        return (self.headers.get("content-type") or "").split(";")[0].strip()

    def json(self) -> Any:
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"Resp({self.status}, {self.content_type}, {self.text[:600]!r})"


def check_problem(resp: Resp, status: int, *, field: str | None = None, detail: str | None = None) -> dict[str, Any]:
    """``resp`` is the RFC 9457 problem ``status``, naming ``field`` when given."""
    assert resp.status == status, resp
    assert resp.content_type == PROBLEM_JSON, resp
    body = resp.json()
    assert body["status"] == status and body["title"] and body["detail"], body
    if field is not None:
        assert body.get("field") == field, body
    if detail is not None:
        assert detail in body["detail"], body
    return body


# -- connections -----------------------------------------------------------------------------------
class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: the server sees this process's uid (SO_PEERCRED)."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


@dataclass
class Api:
    """A client of one server: ``port`` (TCP), ``socket_path`` (Unix) and ``tls`` (an SSL
    context trusting the server's certificate)."""

    port: int | None = None
    socket_path: str | None = None
    tls: ssl.SSLContext | None = None
    token: str | None = None
    timeout: float = 30.0
    seen_errors: list[Resp] = field(default_factory=list)

    def with_token(self, token: "Token | str | None") -> "Api":
        secret = token.secret if isinstance(token, Token) else token
        return Api(self.port, self.socket_path, self.tls, secret, self.timeout, self.seen_errors)

    def connection(self) -> http.client.HTTPConnection:
        if self.socket_path is not None:
            return UnixHTTPConnection(self.socket_path, timeout=self.timeout)
        if self.tls is not None:
            return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=self.timeout, context=self.tls)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)

    def _headers(self, headers: Mapping[str, str] | None, body: Any) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.token is not None:
            out["Authorization"] = f"Bearer {self.token}"
        if body is not None and not isinstance(body, (bytes, str)):
            out["Content-Type"] = "application/json"
        out.update(headers or {})
        return {k: v for k, v in out.items() if v is not None}

    def request(
        self, method: str, path: str, body: Any = None, *, headers: Mapping[str, Optional[str]] | None = None
    ) -> Resp:
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = json.dumps(body).encode()
        conn = self.connection()
        try:
            conn.request(method, path, body=data, headers=self._headers(headers, body))  # type: ignore[arg-type]
            raw = conn.getresponse()
            resp = Resp(raw.status, raw.headers, raw.read())
        finally:
            conn.close()
        self._check(method, path, resp)
        return resp

    def _check(self, method: str, path: str, resp: Resp) -> None:
        """Every answer: never a server error, never a traceback; errors are problems."""
        assert resp.status < 500, (method, path, resp)
        if resp.status >= 400:  # (a 200 may hold anything: a frame's log can show a traceback)
            assert b"Traceback" not in resp.body and b'File "' not in resp.body, (method, path, resp)
            self.seen_errors.append(resp)
            assert resp.content_type == PROBLEM_JSON, (method, path, resp)
            problem = resp.json()
            assert problem["status"] == resp.status and isinstance(problem["detail"], str), problem

    def get(self, path: str, **kw: Any) -> Resp:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Resp:
        return self.request("POST", path, body, **kw)

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        resp = self.request(method, path, body)
        assert resp.status == status, (method, path, resp)
        return resp.json()

    def stream(self, path: str) -> Iterator[tuple[float, bytes]]:
        """A streamed GET: ``(monotonic time received, chunk)`` until the server ends it."""
        conn = self.connection()
        try:
            conn.request("GET", path, headers=self._headers(None, None))
            raw = conn.getresponse()
            assert raw.status == 200, (raw.status, raw.read())
            while chunk := raw.read1(65536):
                yield time.monotonic(), chunk
        finally:
            conn.close()


# -- the server --------------------------------------------------------------------------------------
class Server:
    """A real ``cuectl serve`` process; ``api`` talks to it."""

    def __init__(
        self,
        db: str | Path,
        *,
        env: Mapping[str, str],
        log: Path,
        extra: tuple[str, ...] = (),
        socket_path: Path | None = None,
        certfile: Path | None = None,
        keyfile: Path | None = None,
        tls: ssl.SSLContext | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.db = str(db)
        self.env = dict(env)
        self.log = log
        self.port = None if socket_path else free_port()
        args = [*CUECTL, "--db", self.db, "serve", "--no-access-log", *extra]
        if socket_path is not None:
            args += ["--socket", str(socket_path)]
        else:
            args += ["--port", str(self.port)]
        if certfile is not None:
            args += ["--certfile", str(certfile)]
        if keyfile is not None:
            args += ["--keyfile", str(keyfile)]
        self._out = open(log, "ab")
        self.proc = subprocess.Popen(
            args, env=self.env, stdout=self._out, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True
        )
        self.api = Api(port=self.port, socket_path=str(socket_path) if socket_path else None, tls=tls)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"cuectl serve exited {self.proc.returncode}: {self.output()}")
            try:
                if self.api.get("/healthz").status == 200:
                    return
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"cuectl serve did not answer /healthz in {timeout:g} s: {self.output()}")

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


# -- the store, in this process (the same file or database the server serves) ------------------------
GIB = 1024**3
MIB = 1024**2


def new_store(db: Path) -> Path:
    """Create an empty SQLite store (owned by this process: its admin) and return its path."""
    from cuectl.sched.store import open_store

    db.parent.mkdir(parents=True, exist_ok=True)
    open_store(str(db), create=True).close()
    return db


@contextlib.contextmanager
def store_at(url: str | Path) -> Iterator[Any]:
    """The store the server serves, opened in this process (the same file or database)."""
    from cuectl.sched.store import open_store

    store = open_store(str(url), create=False)
    try:
        yield store
    finally:
        store.close()


def device(index: int, uuid: str, model: str, memory_bytes: int, vendor: str = "NVIDIA") -> dict[str, Any]:
    from cuectl.gpu.device import Device

    return Device(
        index=index,
        uuid=uuid,
        vendor=vendor,
        model=model,
        backend="fake",
        memory_total_bytes=memory_bytes,
        memory_free_bytes=memory_bytes,
    ).to_json()


def register_host(
    url: str | Path, name: str, gpus: list[dict[str, Any]], *, age_s: float = 0.0, locked: bool = False
) -> None:
    """A host as a worker registers it (``age_s`` ago: older than 60 s is DOWN)."""
    from cuectl.sched.store import HostInfo

    with store_at(url) as store:
        store.register_host(
            HostInfo(name=name, cores=8, memory_bytes=32 * GIB, gpus=gpus, version="test"), now=time.time() - age_s
        )
        if locked:
            store.set_host_locked(name, True)


def claim(url: str | Path, layer_id: int, *, host: str, gpu_uuids: tuple[str, ...] = (), lease_s: float = 600.0) -> Any:
    """Claim the layer's next WAITING frame as a worker would (the frame becomes RUNNING)."""
    with store_at(url) as store:
        claimed = store.claim_frame(
            layer_id, host=host, worker=f"{host}-w", gpu_uuids=list(gpu_uuids), now=time.time(), lease_s=lease_s
        )
    assert claimed is not None, f"nothing to claim in layer {layer_id}"
    return claimed


def layer_spec(name: str = "l", command: Any = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "command": command or ["true"], **extra}


def job_spec(name: str, *layers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "layers": list(layers) or [layer_spec()], **extra}
