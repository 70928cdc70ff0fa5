"""Worker test helpers: real `cuectl worker` subprocesses on a real SQLite store with fake GPUs.

Imported by the tests through sys.path (pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

PROBE = str(Path(__file__).with_name("probe.py"))


def cuectl_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


class Farm:
    """One store, any number of fake hosts, a ledger the frames write to."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "farm.db"
        self.ledger = tmp / "ledger.jsonl"
        self.procs: list[subprocess.Popen] = []
        self.worker_flags: list[str] = []  # given to every worker this farm starts

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("CUECTL_FAKE_GPUS", None)
        env["CUECTL_KILL_GRACE"] = "0.5"
        env.update(extra)
        return env

    def host(self, name: str, devices: list[dict[str, Any]], *, state: bool = False) -> Path:
        path = self.tmp / f"{name}.yaml"
        doc: dict[str, Any] = {"host": name, "devices": devices}
        if state:
            doc["state_dir"] = str(self.tmp / f"{name}-state")
            Path(doc["state_dir"]).mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(doc))
        return path

    def cuectl(self, *args: str, check: bool = True, fake: Path | None = None) -> subprocess.CompletedProcess:
        env = self.env(**({"CUECTL_FAKE_GPUS": str(fake)} if fake else {}))
        # In the test's tmp dir: a job submitted here runs its frames here (submit's directory).
        res = subprocess.run(
            [*cuectl_cmd(), "--db", str(self.db), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=self.tmp,
        )
        if check and res.returncode != 0:
            raise AssertionError(f"cuectl {args} exited {res.returncode}: {res.stderr}")
        return res

    def submit(self, spec: dict[str, Any]) -> int:
        path = self.tmp / f"job-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return int(self.cuectl("submit", str(path)).stdout.strip())

    def probe(self, *args: str) -> list[str]:
        return [sys.executable, PROBE, str(self.ledger), *args]

    def worker_args(self, *extra: str, lease: str = "2", poll: str = "0.05") -> list[str]:
        return [
            *cuectl_cmd(),
            "--db",
            str(self.db),
            "worker",
            "--poll",
            poll,
            "--lease-timeout",
            lease,
            "--sample-interval",
            "0.2",
            *self.worker_flags,
            *extra,
        ]

    def start_worker(
        self, fake: Path | None, *extra: str, env: dict[str, str] | None = None, lease: str = "2"
    ) -> subprocess.Popen:
        e = self.env(**({"CUECTL_FAKE_GPUS": str(fake)} if fake else {}))
        e.update(env or {})
        # Frames run in the worker's cwd: the test's tmp dir, so nothing lands in the repo.
        proc = subprocess.Popen(
            self.worker_args(*extra, lease=lease),
            env=e,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            cwd=self.tmp,
        )
        self.procs.append(proc)
        return proc

    def run_worker(self, fake: Path | None, *extra: str, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
        proc = self.start_worker(fake, "--until-idle", *extra, env=env)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def events(self) -> list[dict[str, Any]]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["event"] == "start"]

    def frames(self, job: int) -> list[dict[str, Any]]:
        return json.loads(self.cuectl("frame", "list", "--job", str(job), "--json").stdout)["frames"]

    def job(self, job: int) -> dict[str, Any]:
        return json.loads(self.cuectl("job", "show", str(job), "--json").stdout)

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)


V100 = {"model": "Tesla V100-SXM2-16GB", "vendor": "NVIDIA", "memory": "16160MiB"}
A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}
RTX4090 = {"model": "NVIDIA GeForce RTX 4090", "vendor": "NVIDIA", "memory": "24564MiB"}
MI100 = {"model": "AMD Instinct MI100", "vendor": "AMD", "memory": "32GiB"}


def intervals_overlap(events: list[dict[str, Any]], key) -> list[tuple]:
    """Pairs of (start, end) runs of the same key (device) that overlap in time."""
    runs: dict[Any, list[tuple[float, float]]] = {}
    starts = {e["pid"]: e for e in events if e["event"] == "start"}
    for e in events:
        if e["event"] in ("end", "killed") and e["pid"] in starts:
            s = starts[e["pid"]]
            for k in key(s):
                runs.setdefault(k, []).append((s["t"], e["t"]))
    bad = []
    for k, spans in runs.items():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            if b0 < a1:
                bad.append((k, (a0, a1), (b0, b1)))
    return bad


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not count)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False
