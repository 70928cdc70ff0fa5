"""`cuectl worker --probe`: the heartbeat file a real worker keeps, read the way a
Kubernetes exec probe (or any supervisor) would; and the worker's refusal to start where it
cannot run (Windows)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from farmlib import V100, Farm, cuectl_cmd


def probe(farm: Farm, name: str, *extra: str) -> subprocess.CompletedProcess:
    # No --db: the probe never opens the store. The environment is the worker's
    # (XDG_STATE_HOME from the test's fixture), as it is for an exec probe in its container.
    return subprocess.run(
        [*cuectl_cmd(), "worker", "--probe", "--name", name, *extra],
        capture_output=True,
        text=True,
        env=farm.env(),
        timeout=60,
    )


def error_lines(res: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in res.stderr.splitlines() if ln.strip()]


def test_probe_passes_while_the_worker_loops_and_fails_when_it_stops_or_dies(farm: Farm) -> None:
    fake = farm.host("probe-01", [V100])
    worker = farm.start_worker(fake)
    farm.wait_for(lambda: probe(farm, "probe-01").returncode == 0, timeout=60, what="a passing probe")
    # Ready once it has registered with its store (the first heartbeat may come before).
    ok = farm.wait_for(
        lambda: (r := probe(farm, "probe-01", "--ready")).returncode == 0 and r,
        timeout=60,
        what="a passing readiness probe",
    )
    assert "probe-01" in ok.stdout and f"pid {worker.pid}" in ok.stdout

    # A stopped loop writes nothing: once the file is older than --max-age, the probe fails.
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        stuck = farm.wait_for(
            lambda: (r := probe(farm, "probe-01", "--max-age", "1")).returncode and r,
            timeout=60,
            what="the probe to notice the stopped worker",
        )
        assert stuck.returncode == 1
        (line,) = error_lines(stuck)
        assert line.startswith("error: ") and "stuck" in line and "Traceback" not in stuck.stderr
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    farm.wait_for(
        lambda: probe(farm, "probe-01", "--max-age", "1").returncode == 0,
        timeout=60,
        what="the probe to pass again after SIGCONT",
    )

    # Killed: its last heartbeat is recent, but no process writes it any more.
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(30)
    dead = probe(farm, "probe-01", "--max-age", "3600")
    assert dead.returncode == 1
    (line,) = error_lines(dead)
    assert line.startswith("error: ") and "not running" in line


def test_probe_of_a_worker_that_never_ran_fails_in_one_line(farm: Farm) -> None:
    res = probe(farm, "nobody-here")
    assert res.returncode == 1
    (line,) = error_lines(res)
    assert line.startswith("error: ") and "nobody-here" in line and "heartbeat" in line


def test_a_worker_waiting_for_its_store_is_alive_but_not_ready(farm: Farm) -> None:
    """Liveness must not restart a worker that waits for a database server that is not up
    yet (it starts working when the server does); readiness says it is not connected."""
    port = _closed_port()
    proc = subprocess.Popen(
        [*cuectl_cmd(), "--db", f"postgresql://cuectl@127.0.0.1:{port}/cuectl", "worker", "--name", "waiting-01"],
        env=farm.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    farm.procs.append(proc)
    res = farm.wait_for(
        lambda: (r := probe(farm, "waiting-01")).returncode == 0 and r,
        timeout=60,
        what="the waiting worker's heartbeat",
    )
    assert "store reached never" in res.stdout
    not_ready = probe(farm, "waiting-01", "--ready")
    assert not_ready.returncode == 1
    (line,) = error_lines(not_ready)
    assert "has not reached its store" in line
    assert proc.poll() is None, "the worker waits for its store instead of exiting"


def _closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then closed: connections are refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_probe_options_are_checked(cli) -> None:
    res = cli("worker", "--ready")
    assert res.exit_code == 2 and "--ready goes with --probe" in res.stderr
    res = cli("worker", "--probe", "--max-age", "0")
    assert res.exit_code == 2


# -- where the worker cannot run ----------------------------------------------------------------


def test_worker_on_windows_is_one_clear_error(cli, monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    """Simulated in-process: os.name says "nt", as on Windows. The refusal comes before the
    worker opens (or creates) the store or discovers GPUs."""
    monkeypatch.setattr(os, "name", "nt")
    res = cli("worker", "--until-idle")
    assert res.exit_code == 1, res
    (line, hint) = res.stderr.splitlines()
    assert line.startswith("error: cuectl worker cannot run on Windows")
    assert hint.startswith("hint: ") and "WSL" in hint
    assert not db_path.exists()


def test_worker_without_fcntl_is_one_clear_error(cli, monkeypatch: pytest.MonkeyPatch, db_path: Path) -> None:
    """Simulated in-process the way Windows fails: ``import fcntl`` raises ImportError (the
    worker modules are dropped from sys.modules so that they would be imported afresh)."""
    monkeypatch.setitem(sys.modules, "fcntl", None)
    for mod in [
        m for m in sys.modules if m.startswith(("cuectl.run.worker", "cuectl.run.service", "cuectl.run.lease"))
    ]:
        monkeypatch.delitem(sys.modules, mod)
    res = cli("worker", "--until-idle")
    assert res.exit_code == 1, res
    assert res.stderr.splitlines()[0].startswith("error: cuectl worker cannot run on a system without fcntl")
    assert "internal error" not in res.stderr and "Traceback" not in res.stderr
    assert not db_path.exists()
