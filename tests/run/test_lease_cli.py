"""`cuectl run` and `cuectl gpu leases`, registered the way the root app registers them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

import cuectl
from cuectl.errors import DevicesBusy
from cuectl.gpu import discover
from cuectl.run.lease import list_leases, prepare_lock_dir, try_lock

SHOW_ENV = (
    "import json, os, sys; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('CUE_', 'CUDA_', 'NVIDIA_'))})); sys.exit(int(sys.argv[1]))"
)
# Prints "ready", then waits for a line on stdin (its stdin is the test's pipe to `cuectl run`).
READY_THEN_WAIT = "import sys; print('ready', flush=True); sys.stdin.readline()"


def run_cli(lease_cli, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(lease_cli(*args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_run_gives_the_command_the_isolation_env_and_returns_its_status(gpus4, lease_cli):
    out = run_cli(lease_cli, "run", "--gpus", "2", "--no-wait", "--", sys.executable, "-c", SHOW_ENV, "7")
    assert out.returncode == 7, out.stderr
    env = json.loads(out.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["CUE_GPUS"] == "2"
    assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus4.uuids[:2])
    assert "leased gpu 0" in out.stderr


def test_run_passes_the_commands_own_options_through(gpus4, lease_cli):
    out = run_cli(lease_cli, "run", sys.executable, "-c", "import sys; print(sys.argv[1:])", "--gpus", "-x")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--gpus', '-x']"


def test_run_with_no_gpus_hides_them_all(gpus4, lease_cli):
    out = run_cli(lease_cli, "run", "--gpus", "0", "--", sys.executable, "-c", SHOW_ENV, "0")
    env = json.loads(out.stdout)
    assert (env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"], env["CUE_GPUS"]) == ("-1", "void", "0")


def test_run_releases_when_the_command_exits(gpus4, lease_cli):
    assert run_cli(lease_cli, "run", "--gpus", "4", "--", "true").returncode == 0
    with cuectl.lease(gpus=4):
        pass


def test_run_returns_128_plus_the_signal_that_ended_the_command(gpus4, lease_cli):
    out = run_cli(lease_cli, "run", "--", "sh", "-c", "kill -KILL $$")
    assert out.returncode == 128 + signal.SIGKILL


def test_run_no_wait_exits_1_naming_who_holds_the_devices(gpus4, spawn, lease_cli):
    holder = spawn(gpus=4, label="train-a")
    holder.event("acquired")
    out = run_cli(lease_cli, "run", "--no-wait", "--", "true")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot lease 1 device now")
    assert "train-a" in out.stderr and f"pid {holder.pid}" in out.stderr


def test_run_wait_timeout_exits_1(gpus4, spawn, lease_cli):
    spawn(gpus=4, label="hog").event("acquired")
    out = run_cli(lease_cli, "run", "--timeout", "0.3", "--", "true")
    assert out.returncode == 1
    assert "waiting" in out.stderr and "no lease after waiting 0.3 s" in out.stderr


@pytest.mark.parametrize(
    "args, code, words",
    [
        (["--device", "9", "--", "true"], 2, "no device '9'"),
        (["--gpu-vendor", "Matrox", "--", "true"], 2, "unknown vendor"),
        (["--no-wait", "--timeout", "5", "--", "true"], 2, "only meaningful when waiting"),
        ([], 2, "no command given"),
        (["--gpu-model", "A100", "--", "true"], 1, "can ever satisfy"),
        (["--", "/nonexistent/cmd"], 127, "command not found"),
    ],
)
def test_run_rejects_bad_requests(gpus4, lease_cli, args, code, words):
    out = run_cli(lease_cli, "run", *args)
    assert out.returncode == code, out.stderr
    assert words in out.stderr


def test_run_forwards_sigterm_to_the_command(gpus4, spawn, lease_cli):
    trap = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('got TERM', flush=True); sys.exit(5)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    runner = spawn.argv(lease_cli("run", "--", sys.executable, "-c", trap))
    assert runner.line() == "ready"
    os.kill(runner.pid, signal.SIGTERM)  # to `cuectl run`, not to the command
    assert runner.line() == "got TERM"
    assert runner.wait() == 5


def test_the_lease_outlives_a_killed_cuectl_run_for_as_long_as_its_command(gpus4, spawn, lease_cli, lock_dir):
    runner = spawn.argv(
        lease_cli("run", "--device", "0", "--label", "research", "--", sys.executable, "-c", READY_THEN_WAIT)
    )
    assert runner.line() == "ready"
    os.kill(runner.pid, signal.SIGKILL)  # cuectl run dies; its command (own process group) lives on
    runner.wait()
    with pytest.raises(DevicesBusy) as caught:
        cuectl.lease(devices=[0])
    [who] = caught.value.holders
    assert who["label"] == "research" and who["kind"] == "run" and who["pid"] != runner.pid  # the command's pid
    runner.send("done")  # the command reads it and exits
    assert runner.proc.stdout.read() == ""
    deadline = time.monotonic() + 10  # a grandchild: its lock goes a moment after its stdout
    while time.monotonic() < deadline:
        try:
            cuectl.lease(devices=[0]).release()
            break
        except DevicesBusy:
            time.sleep(0.005)
    else:
        raise AssertionError("device 0 still leased after the command ended")


def test_gpu_leases_lists_every_holder_kind(gpus4, spawn, lease_cli, lease_app, lock_dir):
    api = spawn(devices=[0], label="svc")
    api.event("acquired")
    worker_lock = try_lock(prepare_lock_dir(lock_dir), discover().devices[1], holder="frame 42")
    runner = spawn.argv(
        lease_cli("run", "--device", "2", "--label", "research", "--", sys.executable, "-c", READY_THEN_WAIT)
    )
    assert runner.line() == "ready"
    out = CliRunner().invoke(lease_app, ["gpu", "leases", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    leases = {lease["index"]: lease for lease in data["leases"]}
    assert set(leases) == {0, 1, 2}
    assert (leases[0]["kind"], leases[0]["holder"], leases[0]["pid"]) == ("api", "svc", api.pid)
    assert (leases[1]["kind"], leases[1]["holder"], leases[1]["pid"]) == ("worker", "frame 42", os.getpid())
    assert (leases[2]["kind"], leases[2]["label"]) == ("run", "research")
    for lease in data["leases"]:
        assert lease["since"].endswith("Z") and lease["uuid"] == gpus4.uuids[lease["index"]]
    assert [d["lease"] is None for d in data["devices"]] == [False, False, False, True]

    table = CliRunner().invoke(lease_app, ["gpu", "leases"])
    assert table.exit_code == 0
    lines = table.stdout.splitlines()
    assert lines[0].split("\t")[:4] == ["GPU", "MODEL", "UUID", "HOLDER"]
    assert [line.split("\t")[3] for line in lines[1:]] == ["svc", "frame 42", "research", "(free)"]
    worker_lock.release()
    runner.send("done")
    assert runner.wait() == 0


def test_gpu_leases_without_a_lock_dir_lists_free_devices(gpus4, lease_app, tmp_path):
    out = CliRunner().invoke(lease_app, ["gpu", "leases", "--json", "--lock-dir", str(tmp_path / "nowhere")])
    assert out.exit_code == 0
    data = json.loads(out.stdout)
    assert data["leases"] == [] and len(data["devices"]) == 4
    assert not (tmp_path / "nowhere").exists()  # a read-only command creates nothing
    assert list_leases(tmp_path / "nowhere") == []


def _read_until(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    import select

    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise AssertionError(f"no {marker!r} on the terminal; got {seen!r}")
        seen += os.read(fd, 4096)
    return seen


def _wait_exit(pid: int, fd: int, timeout: float) -> int:
    """The child's wait status, draining its terminal meanwhile (a full pty would block it);
    AssertionError with what it printed if it has not exited in ``timeout`` s."""
    import select

    seen = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                pass
    raise AssertionError(f"still running {timeout:g} s after Ctrl-C; the terminal showed {seen[-500:]!r}")


def test_interactive_command_gets_the_terminal_and_ctrl_c(gpus4, lease_cli):
    """At a terminal the command must be able to read it (a background process group would
    be stopped by SIGTTIN: a hang) and Ctrl-C must reach it once, as without `cuectl run`."""
    assert ctrl_c_at_a_terminal(lease_cli("run", "--", *TERMINAL_COMMAND)) == 128 + signal.SIGINT


#: Reads a line from its terminal, echoes it, then waits for Ctrl-C's SIGINT and dies of
#: it — exiting 99 instead if a second SIGINT follows within 0.3 s (Ctrl-C must arrive once).
#: SIGINT is blocked before the echo and taken with sigwait: a plain second ``input()``
#: lost the Ctrl-C now and then on a loaded machine (CPython runs a signal's handler between
#: bytecodes, and one that arrives after the last check but before ``read()`` blocks waits
#: for the read to return: a hang, which CI hit twice).
TERMINAL_COMMAND = (
    sys.executable,
    "-c",
    "import os, signal\n"
    "line = input()\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
    "print('echo:' + line, flush=True)\n"
    "signal.sigwait({signal.SIGINT})\n"
    "if signal.sigtimedwait({signal.SIGINT}, 0.3) is not None:\n"
    "    os._exit(99)\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
    "os.kill(os.getpid(), signal.SIGINT)\n",
)


def ctrl_c_at_a_terminal(argv: list[str]) -> int:
    """Run ``argv`` (a `cuectl run` of TERMINAL_COMMAND) on a pty as a session leader, type a
    line, check it is echoed, press Ctrl-C; its exit code. Every GPU is free afterwards."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        try:
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    try:
        _read_until(fd, b"leased gpu 0")
        os.write(fd, b"hello\n")
        _read_until(fd, b"echo:hello")
        os.write(fd, b"\x03")  # Ctrl-C: SIGINT to the terminal's foreground process group
        status = _wait_exit(pid, fd, timeout=30.0)  # bounded: a lost Ctrl-C fails, never hangs the suite
        return os.waitstatus_to_exitcode(status)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ChildProcessError, ProcessLookupError):
            pass
        os.close(fd)
        with cuectl.lease(gpus=4):
            pass


def test_the_real_root_app_registers_both_commands(gpus4, cli):
    leases = cli("gpu", "leases", "--json", db=False)
    assert leases.exit_code == 0, leases
    assert [d["lease"] for d in leases.json()["devices"]] == [None] * 4
    ran = cli("run", "--no-wait", "--gpus", "4", "--", "sh", "-c", "exit 3", db=False)
    assert ran.exit_code == 3, ran
    assert "leased gpu 0" in ran.stderr
