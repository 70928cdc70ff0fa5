"""Helpers for test_opencue_clients.py: one store served by `cuectl serve --opencue`, real
`cuectl worker` processes on fake GPUs draining it, and OpenCue's unmodified clients
(cueadmin, cueman, pycue, pyoutline) run against the server as subprocesses, their printed
tables read back column by column."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml
from cuebotlib import CuebotServer, client, cuectl_cmd, python_client, run_client, subprocess_env

HOST = "gpubox"
A100 = {"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "80GiB"}
KIB_PER_GIB = 1024 * 1024


class OpenCueFarm:
    """A served store, its fake 2-GPU host ``gpubox`` and the workers started for it."""

    def __init__(self, tmp: Path, db: Path, server: CuebotServer, fake: Path) -> None:
        self.tmp, self.db, self.server, self.fake = tmp, db, server, fake
        self.env = server.client_env(tmp)
        self.workers: list[subprocess.Popen[str]] = []

    # -- cuectl, the store's own view ------------------------------------------------------
    def cuectl(self, *args: str) -> str:
        res = subprocess.run(
            [*cuectl_cmd(), "--db", str(self.db), *args],
            capture_output=True,
            text=True,
            env=subprocess_env(),
            cwd=self.tmp,
            timeout=60,
        )
        assert res.returncode == 0, f"cuectl {args}: {res.stderr}"
        return res.stdout

    def submit(self, *args: str) -> int:
        return int(self.cuectl("submit", *args).strip())

    def submit_spec(self, spec: dict[str, Any]) -> int:
        path = self.tmp / f"{spec['name']}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return self.submit(str(path))

    def job(self, job: int) -> dict[str, Any]:
        return json.loads(self.cuectl("job", "show", str(job), "--json"))  # type: ignore[no-any-return]

    def frames(self, job: int) -> dict[str, dict[str, Any]]:
        """``cuectl frame list --job J --json``, by frame name."""
        return {f["name"]: f for f in json.loads(self.cuectl("frame", "list", "--job", str(job), "--json"))["frames"]}

    def states(self, job: int) -> dict[str, str]:
        """Each frame's state read from the store in this process (cheap enough to poll)."""
        from cuectl.sched.store import open_store

        store = open_store(str(self.db), create=False)
        try:
            frames, _total = store.list_frames(job=job, limit=1000)
        finally:
            store.close()
        return {f["name"]: f["state"] for f in frames}

    def wait_states(self, job: int, wanted: dict[str, str], timeout: float = 30.0) -> None:
        wait_for(
            lambda: self.states(job) == wanted,
            f"frames of job {job} to be {wanted}",
            timeout,
            lambda: f"they are {self.states(job)}",
        )

    # -- the worker ---------------------------------------------------------------------------
    def start_worker(self, *extra: str) -> subprocess.Popen[str]:
        """`cuectl worker` on the fake host: 4 CPU slots, so its two GPUs bound what runs."""
        proc = subprocess.Popen(
            [
                *cuectl_cmd(),
                "--db",
                str(self.db),
                "worker",
                "--poll",
                "0.05",
                "--lease-timeout",
                "5",
                "--sample-interval",
                "0.5",
                "--cores",
                "4",
                *extra,
            ],
            env=subprocess_env(CUECTL_FAKE_GPUS=str(self.fake), CUECTL_KILL_GRACE="0.5"),
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.workers.append(proc)
        return proc

    def stop(self) -> str:
        """Stop the workers (their whole process group: frames too); their output."""
        out = []
        for proc in self.workers:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            text, _ = proc.communicate(timeout=30)
            out.append(text or "")
        return "".join(out)

    # -- OpenCue's clients ----------------------------------------------------------------------
    def cueadmin(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_client([*client("cueadmin"), *args], self.env)

    def cueman(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        res = run_client([*client("cueman"), *args], self.env)
        if ok:
            assert res.returncode == 0 and "Error" not in res.stderr, f"cueman {args}: {res.stderr}"
        return res

    def pycue(self, code: str, env: dict[str, str] | None = None) -> Any:
        """Run pycue code (``out`` a dict it fills) in a fresh interpreter; ``out`` back."""
        script = PYCUE_PRELUDE + textwrap.dedent(code) + "\nprint('OUT=' + json.dumps(out))\n"
        res = python_client(script, env or self.env)
        assert res.returncode == 0, res.stderr
        line = [text for text in res.stdout.splitlines() if text.startswith("OUT=")][-1]
        return json.loads(line[4:])


PYCUE_PRELUDE = """
import json
import grpc
import opencue
from opencue_proto import depend_pb2, host_pb2, job_pb2
api = opencue.api
out = {}
def fields(message, *names):
    # those fields of a message as they came (repeated ones as lists, messages as dicts)
    def value(v):
        if hasattr(v, "DESCRIPTOR"):
            return {f.name: value(getattr(v, f.name)) for f in v.DESCRIPTOR.fields}
        return [value(x) for x in v] if hasattr(v, "__len__") and not isinstance(v, (str, bytes)) else v
    return {name: value(getattr(message, name)) for name in names}
"""


def wait_for(
    predicate: Callable[[], Any], what: str, timeout: float = 30.0, explain: Callable[[], str] | None = None
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {explain()}" if explain else ""))
        time.sleep(0.1)


# -- reading the clients' tables ----------------------------------------------------------------
def fixed_columns(line: str, widths: Sequence[int]) -> list[str]:
    """A row printed with ``%-Ns`` columns one space apart, cut at the widths, stripped."""
    cells, at = [], 0
    for width in widths:
        cells.append(line[at : at + width].strip())
        at += width + 1
    return cells


def table(text: str, header: str) -> list[str]:
    """The rows printed after the line starting with ``header`` (a dashes line skipped)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    return [line for line in lines[start + 1 :] if line.strip() and not set(line) <= {"-"}]


#: cueadmin/output.py's formats, as widths
FRAME_COLUMNS = (35, 11, 15, 13, 12, 9, 5, 7, 5)  # displayFrames: cueman -lf
JOB_COLUMNS = (56, 15, 5, 7, 8, 5, 8, 8)  # displayJobs: cueadmin -lji
PROC_ROW = re.compile(r"^(\S+)\s+(\S+)\s+(\S+) of (\S+) \((\S+)%\)\s+(\S+)\s+/ (\S+)\s+")  # displayProcs


def frame_rows(text: str) -> dict[str, dict[str, str]]:
    """``cueman -lf``: frame name -> its columns."""
    names = ("frame", "status", "host", "start", "end", "runtime", "mem", "retry", "exit")
    rows = [dict(zip(names, fixed_columns(line, FRAME_COLUMNS))) for line in table(text, "Frame ")]
    return {row["frame"]: row for row in rows}


def host_row(text: str, name: str) -> dict[str, str]:
    """``cueadmin -lh``: the host's columns (Idle is ``[ cores / memory ]``)."""
    for line in table(text, "Host "):
        t = line.split()
        if t[0] == name:
            assert (t[8], t[10], t[12]) == ("[", "/", "]"), line
            keys = ("host", "load", "nimby", "free_mem", "free_swap", "free_mcp", "cores", "mem")
            row = dict(zip(keys, t[:8]))
            row.update(
                idle_cores=t[9],
                idle_mem=t[11],
                os=t[13],
                uptime=t[14],
                state=t[15],
                locked=t[16],
                alloc=t[17],
                thread=t[18],
            )
            return row
    raise AssertionError(f"no host {name} in:\n{text}")
