"""Helpers for tests/cuebot: `cuectl serve --opencue` run for real, and OpenCue's own
clients (cueadmin, cueman, pycue, pyoutline) run against it as subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

BIN = Path(sys.executable).parent


def cuectl_cmd() -> list[str]:
    exe = BIN / "cuectl"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def subprocess_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **{key: str(value) for key, value in extra.items()}}


SERVING = re.compile(r"serving OpenCue's gRPC protocol on \S+ \(port (\d+)\)")


@dataclass
class CuebotServer:
    proc: subprocess.Popen[str]
    port: int
    address: str
    log: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"{self.address}:{self.port}" if ":" not in self.address else f"[{self.address}]:{self.port}"

    def client_env(self, tmp_path: Path, **extra: str) -> dict[str, str]:
        """The environment an OpenCue client needs to reach this server and nothing else:
        CUEBOT_HOSTS names it (a host with a port is used as is), and OPENCUE_CONFIG_FILE an
        empty config of the test's own, so no user's ~/.config/opencue is read."""
        config = tmp_path / "opencue.yaml"
        if not config.exists():
            config.write_text("cuebot.timeout: 10000\n")
        return subprocess_env(CUEBOT_HOSTS=self.target, OPENCUE_CONFIG_FILE=str(config), **extra)

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return "".join(self.log)


def start_server(
    db: Path | str,
    *,
    address: str = "127.0.0.1",
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> CuebotServer:
    """``cuectl --db DB serve --opencue ADDRESS:0 ARGS``; waits for its "serving" line (the
    port the kernel chose). ``argv``: run this command instead (e.g. as another user)."""
    host = f"[{address}]" if ":" in address else address
    command = (
        list(argv) if argv is not None else [*cuectl_cmd(), "--db", str(db), "serve", "--opencue", f"{host}:0", *args]
    )
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env or subprocess_env()
    )
    log: list[str] = []
    deadline = time.monotonic() + 30
    assert proc.stdout is not None
    port = None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        log.append(line)
        found = SERVING.search(line)
        if found:
            port = int(found.group(1))
            break
    if port is None:
        proc.kill()
        raise AssertionError("cuectl serve --opencue did not start:\n" + "".join(log))
    server = CuebotServer(proc, port, address, log)
    threading.Thread(target=_drain, args=(proc, log), daemon=True).start()
    return server


def _drain(proc: subprocess.Popen[str], log: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)


def client(name: str) -> list[str]:
    """An OpenCue client's executable in this venv (cueadmin, cueman)."""
    return [str(BIN / name)]


def run_client(argv: Sequence[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=timeout)


def python_client(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run pycue/pyoutline code in a fresh interpreter (pycue keeps one channel per process)."""
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
