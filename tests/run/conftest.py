"""Fixtures for the lease tests: four fake GPUs with a live-state dir, the per-test lock dir
(the root conftest points CUECTL_LOCK_DIR at tmp_path), and real holder processes driven by
a line protocol (``lease_child.py``) so that every wait is a handshake, not a sleep."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

HERE = Path(__file__).resolve().parent
CHILD = HERE / "lease_child.py"
RACE = HERE / "lease_race.py"
CLI_APP = HERE / "lease_cli_app.py"
#: Generous upper bound for one handshake on a loaded 2-core CI machine; never a pacing sleep.
STEP_TIMEOUT_S = 30.0
V100 = {"model": "Tesla V100-SXM2-16GB", "vendor": "NVIDIA", "memory": "16160MiB"}


@dataclass
class FakeHost:
    yaml_path: Path
    state_dir: Path
    uuids: list[str]

    def set_used(self, index: int, used_bytes: int) -> None:
        """Pretend something uses ``used_bytes`` of device ``index`` (fake backend state)."""
        tmp = self.state_dir / f".{index}.json.tmp"
        tmp.write_text(json.dumps({"utilization_pct": 50, "memory_used_bytes": used_bytes}))
        tmp.replace(self.state_dir / f"{index}.json")


def make_fake_host(tmp_path: Path, devices: list[dict[str, Any]], name: str = "gpus") -> FakeHost:
    state_dir = tmp_path / f"{name}-state"
    state_dir.mkdir()
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"host": "lease-test", "state_dir": str(state_dir), "devices": devices}))
    from cuectl.gpu import discover

    return FakeHost(path, state_dir, [d.uuid for d in discover("fake", fake_file=path).devices])


@pytest.fixture
def gpus4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    """Four identical V100s, selected through CUECTL_FAKE_GPUS (children inherit it)."""
    host = make_fake_host(tmp_path, [dict(V100) for _ in range(4)])
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(host.yaml_path))
    return host


@pytest.fixture
def lock_dir() -> Path:
    return Path(os.environ["CUECTL_LOCK_DIR"])


class Child:
    """A real process holding (or trying to hold) a lease; see lease_child.py."""

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=env,
        )
        self.pid = self.proc.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def line(self, timeout: float = STEP_TIMEOUT_S) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"child {self.pid} said nothing for {timeout} s") from None
        if line is None:
            raise AssertionError(f"child {self.pid} ended (rc={self.proc.wait()}): {self.proc.stderr.read()}")
        return line.rstrip("\n")

    def event(self, expected: str | None = None, timeout: float = STEP_TIMEOUT_S) -> dict[str, Any]:
        """The next protocol event (a JSON line); asserts its kind when given."""
        while True:
            text = self.line(timeout)
            if text.startswith("{"):
                break
        event = json.loads(text)
        if expected is not None:
            assert event["event"] == expected, event
        return event

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def close_stdin(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, timeout: float = STEP_TIMEOUT_S) -> int:
        return self.proc.wait(timeout)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass


@pytest.fixture
def spawn() -> Iterator[Any]:
    """``spawn(gpus=1, wait=False, hold=True, ...)`` starts a lease_child; all are killed at the end."""
    children: list[Child] = []

    def start(**params: Any) -> Child:
        child = Child([sys.executable, str(CHILD), json.dumps(params)])
        children.append(child)
        return child

    def start_argv(argv: list[str]) -> Child:
        child = Child(argv)
        children.append(child)
        return child

    start.argv = start_argv  # type: ignore[attr-defined]
    yield start
    for child in children:
        child.kill_group()
        try:
            child.proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        for stream in (child.proc.stdin, child.proc.stdout, child.proc.stderr):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass


def cli_argv(*args: str) -> list[str]:
    """A real `cuectl …` process for the lease commands (see lease_cli_app.py)."""
    return [sys.executable, str(CLI_APP), *args]


@pytest.fixture
def lease_cli():
    """``lease_cli("run", "--no-wait", "--", "true")`` -> argv of a real `cuectl` process."""
    return cli_argv


@pytest.fixture
def lease_app():
    """The stand-in root app (lease_cli_app.build()) for in-process CliRunner tests."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lease_cli_app", CLI_APP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build()


@pytest.fixture
def race():
    """``race(n=100, wait=False)``: run lease_race.py, return its JSON summary."""

    def run(**params: Any) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, str(RACE), json.dumps(params)], capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    return run


@pytest.fixture(autouse=True)
def _fresh_discovery() -> Iterator[None]:
    """Each test's fake GPUs are new files; drop whatever an earlier test discovered."""
    from cuectl.run import lease

    lease.forget_discovery()
    yield
    lease.forget_discovery()
