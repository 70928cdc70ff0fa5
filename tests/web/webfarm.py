"""The browser tests' farm: a real ``cuectl serve`` subprocess on 127.0.0.1 (a free port)
over a real SQLite store, tokens made by ``cuectl admin token create``, real ``cuectl
worker`` subprocesses on fake GPUs, and the same store opened in this process where a test
needs a state no worker would hold still (a frame RUNNING for minutes, a registered host).

Every subprocess gets the isolated environment the autouse fixture of tests/conftest.py
gives a test (its own XDG_STATE_HOME, CUECTL_LOCK_DIR, CUECTL_LOCK_REGISTRY; no CUECTL_DB,
CUECTL_FAKE_GPUS or CUECTL_LOG_DIR of the user's), rooted in the module's directory: the
server and its workers share one store, one log directory and one lock directory.

Imported by the tests through sys.path (pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import yaml

try:  # (missing, the browser fixture fails with the fix rather than every module failing to import)
    from playwright.sync_api import expect
except ImportError:  # pragma: no cover
    expect = None

GIB = 1024**3
CUECTL = [sys.executable, "-m", "cuectl"]
# Debian's Chromium (scripts/test.sh installs it); never a browser Playwright downloads.
CHROMIUM = os.environ.get("CUECTL_CHROMIUM") or "/usr/bin/chromium"
SKIP_ENV = "CUECTL_SKIP_BROWSER"


def chromium_problem() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return (
            "the Python package 'playwright' is missing: `bash scripts/test.sh` installs it (pip install -e '.[test]')"
        )
    exe = shutil.which(CHROMIUM) if os.sep not in CHROMIUM else (CHROMIUM if os.access(CHROMIUM, os.X_OK) else None)
    if exe is None:
        return (
            f"Chromium was not found at {CHROMIUM}: `bash scripts/test.sh` installs it when run as root "
            f"(apt-get install chromium); otherwise `sudo apt-get install chromium`, or point "
            f"CUECTL_CHROMIUM at a Chromium binary. {SKIP_ENV}=1 skips the browser tests on purpose"
        )
    return None


def launch_browser(playwright: Any) -> Any:
    # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def isolated_env(base: Path, **extra: str) -> dict[str, str]:
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


@dataclass(frozen=True)
class Token:
    id: int
    user: str
    role: str
    secret: str


@dataclass
class Reply:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class WebFarm:
    """One store, one server, tokens and workers; ``stop()`` ends every process it started."""

    def __init__(self, base: Path, *, cache_s: float = 1.0) -> None:
        self.base = base
        self.db = base / "store" / "cuectl.db"
        self.db.parent.mkdir(parents=True, exist_ok=True)
        self.env = isolated_env(base)
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        # The store is created by this process's OS user, who is therefore its admin.
        from cuectl.sched.store import open_store

        open_store(str(self.db), create=True, log_dir=self.db.parent / "logs").close()
        self.tokens: dict[str, Token] = {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = self._spawn(
            "serve",
            [
                *CUECTL,
                "--db",
                str(self.db),
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-access-log",
                "--cache",
                str(cache_s),
            ],
        )
        self._wait_ready()

    # -- processes ---------------------------------------------------------------------------
    def cuectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [*CUECTL, "--db", str(self.db), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            cwd=self.base,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"cuectl {' '.join(args)} exited {res.returncode}: {res.stderr}")
        return res

    def _spawn(self, what: str, argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen:
        log = self.base / f"{what}-{len(self.procs)}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                env=dict(env or self.env),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.base,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise AssertionError(f"cuectl serve exited {self.server.returncode}: {self.output()}")
            try:
                if self.request("GET", "/healthz").status == 200:
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"cuectl serve did not answer /healthz in {timeout:g} s: {self.output()}")

    def output(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in self.logs if p.exists())

    def fake_gpus(
        self, host: str, devices: list[dict[str, Any]], *, live: Mapping[int, Mapping[str, Any]] = ()
    ) -> Path:
        """A fake-GPU file for ``host`` (src/cuectl/gpu/fake.py); ``live`` maps a device
        index to its live values (``utilization_pct``, ``memory_used_bytes``), which every
        sample of that device then reads."""
        state = self.base / f"gpu-state-{host}"
        state.mkdir(exist_ok=True)
        for index, values in dict(live).items():
            (state / f"{index}.json").write_text(json.dumps(values))
        path = self.base / f"gpus-{host}.yaml"
        path.write_text(yaml.safe_dump({"host": host, "state_dir": str(state), "devices": devices}))
        return path

    def start_worker(self, fake: Path, *extra: str) -> subprocess.Popen:
        """``cuectl worker`` on ``fake`` GPUs, sampling every 0.2 s, running frames as this
        user (not as the token's user, which has no OS account here)."""
        env = dict(self.env, CUECTL_FAKE_GPUS=str(fake))
        return self._spawn(
            "worker",
            [
                *CUECTL,
                "--db",
                str(self.db),
                "worker",
                "--poll",
                "0.1",
                "--sample-interval",
                "0.2",
                "--lease-timeout",
                "4",
                "--cores",
                "4",
                "--run-as-worker-user",
                *extra,
            ],
            env,
        )

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)

    # -- tokens and the API ------------------------------------------------------------------
    def token(self, user: str, role: str, *, fresh: bool = False) -> Token:
        """``user``'s token of ``role`` (the same one each call, unless ``fresh``)."""
        key = f"{user}/{role}"
        if fresh or key not in self.tokens:
            data = json.loads(self.cuectl("admin", "token", "create", user, "--role", role, "--json").stdout)
            self.tokens[key] = Token(int(data["id"]), user, role, data["secret"])
        return self.tokens[key]

    def request(self, method: str, path: str, body: Any = None, token: Token | None = None) -> Reply:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token.secret}")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return Reply(resp.status, resp.read())
        except urllib.error.HTTPError as err:
            return Reply(err.code, err.read())

    def api(self, method: str, path: str, body: Any = None, *, token: Token, status: int = 200) -> Any:
        reply = self.request(method, "/api/v1" + path, body, token)
        assert reply.status == status, (method, path, reply.status, reply.body[:600])
        return reply.json()

    def submit(self, token: Token, name: str, *layers: dict[str, Any], **extra: Any) -> dict[str, Any]:
        spec = {"name": name, "layers": list(layers) or [{"name": "main", "command": ["true"]}], **extra}
        return self.api("POST", "/jobs", spec, token=token, status=201)

    def frames(self, job_id: int, token: Token) -> list[dict[str, Any]]:
        return self.api("GET", f"/jobs/{job_id}/frames?attempts=false&limit=10000", token=token)["frames"]

    # -- the store in this process -----------------------------------------------------------
    @contextlib.contextmanager
    def store(self) -> Iterator[Any]:
        from cuectl.sched.store import open_store

        store = open_store(str(self.db), create=False, log_dir=self.db.parent / "logs")
        try:
            yield store
        finally:
            store.close()

    def register_host(self, name: str, gpus: list[dict[str, Any]]) -> None:
        """A host as its worker registers it (``gpus``: ``Device.to_json()`` dicts; [] for none)."""
        from cuectl.sched.store import HostInfo

        with self.store() as store:
            store.register_host(
                HostInfo(name=name, cores=8, memory_bytes=64 * GIB, gpus=gpus, version="test"), now=time.time()
            )

    def claim(self, layer_id: int, *, host: str, gpu_uuids: tuple[str, ...] = ()) -> Any:
        """The layer's next WAITING frame claimed as a worker on ``host`` would (RUNNING, with
        a ten-minute lease: it stays RUNNING while the test looks at it)."""
        with self.store() as store:
            claimed = store.claim_frame(
                layer_id, host=host, worker=f"{host}-w", gpu_uuids=list(gpu_uuids), now=time.time(), lease_s=600.0
            )
        assert claimed is not None, f"nothing to claim in layer {layer_id}"
        return claimed

    def live(self, host: str, claimed: Any, util: float, memory_bytes: int) -> None:
        """Publish a RUNNING frame's live GPU values as its worker does each sample."""
        from cuectl.sched.store.base import LiveUsage

        now = time.time()
        with self.store() as store:
            store.record_live_usage(
                host,
                [
                    LiveUsage(
                        frame_id=claimed.frame_id,
                        attempt=claimed.attempt,
                        sampled_at=now,
                        util_pct=util,
                        memory_used_bytes=memory_bytes,
                        samples={},
                    )
                ],
                now=now,
            )

    def complete(self, claimed: Any, exit_code: int = 0) -> None:
        """End a frame claimed with ``claim`` as its worker would."""
        from cuectl.sched.store.base import FrameResult

        now = time.time()
        with self.store() as store:
            store.complete_frame(
                claimed.frame_id,
                claimed.attempt,
                FrameResult(exit_code=exit_code, started_at=now - 1, ended_at=now),
                now=now,
            )


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "a condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


# -- the browser side ----------------------------------------------------------------------------
def login(page: Any, farm: WebFarm, token: Token, *, remember: bool = False) -> None:
    """Log in through the form, as a person does, and land on the jobs page."""
    page.goto(farm.url + "/#/login")
    page.fill("#token", token.secret)
    if remember:
        page.check("#remember")
    page.click("#login-submit")
    expect(page.locator("#whoami")).to_have_text(token.user)
    page.wait_for_url("**/#/jobs")


def mark_page(page: Any) -> None:
    """Tag the loaded document: ``assert_not_reloaded`` proves it is still the same one."""
    page.evaluate("window.__cuectlTestMark = 'same-document'")


def assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__cuectlTestMark") == "same-document", "the page was reloaded"


class RequestLog:
    """Every request the page makes from now on, until ``stop()``. Playwright delivers the
    events while the test is inside one of its calls: wait with ``page.wait_for_timeout``
    or an ``expect``, not ``time.sleep``, while recording."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.requests: list[Any] = []

        def handler(request: Any) -> None:
            self.requests.append(request)

        self._handler = handler
        page.on("request", handler)

    def stop(self) -> list[Any]:
        self.page.evaluate("0")  # a round trip: the events sent before it are delivered
        self.page.remove_listener("request", self._handler)
        return list(self.requests)
