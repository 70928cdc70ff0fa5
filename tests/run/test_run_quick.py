"""`cuectl run`'s quick path (cuectl.run.quick): after one full run it leases from its
per-user cache, exactly as the full path would (same device, environment, record, output,
exit status), and hands everything it is not sure of to the full path: other flags, the
wait queue, all devices held, a cache that changed, that is not the user's own, or that
someone else could write. Real processes, real lock files; behaviour only, never timing.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from entryprobe import ENTRY, noted, run_entry_noting
from hypothesis import given, settings
from hypothesis import strategies as st

import cuectl
from cuectl.run import child, lockfile, quick
from cuectl.run.lease import locks

from .conftest import STEP_TIMEOUT_S, V100, make_fake_host

SHOW_ENV = (
    "import json, os, sys; print(json.dumps({k: v for k, v in sorted(os.environ.items()) "
    "if k.startswith(('CUE_', 'CUDA_', 'NVIDIA_', 'ROCR_', 'HIP_'))}))"
)


def way_of(fast_or_typer: str, discovered: bool) -> str:
    """ "quick" (no discovery: no GPU backend loaded), "full" or "typer"."""
    return "typer" if fast_or_typer == "typer" else "full" if discovered else "quick"


def cuectl_run(
    tmp_path: Path, *args: str, full: bool = False, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], str]:
    """``cuectl run ARGS`` as a real process; (the result, "quick", "full" or "typer")."""
    out, way, discovered = run_entry_noting(tmp_path, ["run", *args], full=full, env=env)
    return out, way_of(way, discovered)


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Three V100s and an A100 (the A100 comes last in the matcher's preference: largest)."""
    fake = make_fake_host(
        tmp_path,
        [dict(V100) for _ in range(3)] + [{"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "81920MiB"}],
    )
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(fake.yaml_path))
    return fake


def warm(tmp_path: Path) -> None:
    """One full run, which leaves the cache the next run's quick path uses."""
    out, way = cuectl_run(tmp_path, "--", "true")
    assert (out.returncode, way) == (0, "full"), out.stderr
    assert Path(os.environ["CUECTL_RUN_CACHE"]).is_file()


def test_the_second_run_is_quick_and_the_same_as_the_full_path(host, tmp_path):
    first, way = cuectl_run(tmp_path, "--", sys.executable, "-c", SHOW_ENV)
    assert way == "full" and first.returncode == 0, first.stderr
    for args in ((), ("--gpus", "1"), ("--gpus", "0"), ("--label", "my job", "--no-wait"), ("--wait",)):
        quick_out, way = cuectl_run(tmp_path, *args, "--", sys.executable, "-c", SHOW_ENV)
        assert way == "quick", (args, quick_out.stderr)
        full_out, way = cuectl_run(tmp_path, *args, "--", sys.executable, "-c", SHOW_ENV, full=True)
        assert way == "typer"
        assert (quick_out.returncode, quick_out.stdout, quick_out.stderr) == (
            full_out.returncode,
            full_out.stdout,
            full_out.stderr,
        ), args
    env = json.loads(quick_out.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["NVIDIA_VISIBLE_DEVICES"] == host.uuids[0]


def test_exit_statuses_and_a_command_that_cannot_start(host, tmp_path):
    warm(tmp_path)
    out, way = cuectl_run(tmp_path, "--", "sh", "-c", "exit 7")
    assert (out.returncode, way) == (7, "quick")
    out, way = cuectl_run(tmp_path, "--", "sh", "-c", "kill -TERM $$")
    assert (out.returncode, way) == (128 + 15, "quick")
    missing = str(tmp_path / "no-such-command")
    out, way = cuectl_run(tmp_path, "--", missing)
    assert (out.returncode, way) == (127, "quick")
    assert out.stderr.splitlines()[-1] == f"error: {missing}: command not found"
    (tmp_path / "not-executable").write_text("")
    out, way = cuectl_run(tmp_path, "--", str(tmp_path / "not-executable"))
    assert (out.returncode, way) == (126, "quick")
    # Nothing stays held after a command that never started.
    with cuectl.lease(gpus=4):
        pass


def test_the_record_names_the_command_and_its_pid(host, tmp_path, lock_dir):
    warm(tmp_path)
    show = "import os, sys; print(os.getpid()); print(open(sys.argv[1]).read())"
    path = locks.lock_path(lock_dir, host.uuids[0])
    out, way = cuectl_run(tmp_path, "--label", 'train "a" é', "--", sys.executable, "-c", show, str(path))
    assert way == "quick" and out.returncode == 0, out.stderr
    pid, text = out.stdout.split("\n", 1)
    record = json.loads(text)
    assert record == {
        **record,
        "uuid": host.uuids[0],
        "index": 0,
        "pid": int(pid),
        "kind": "run",
        "holder": 'train "a" é',
        "label": 'train "a" é',
    }
    assert set(record) == {"uuid", "index", "pid", "holder", "kind", "label", "user", "host", "since"}


def test_a_held_device_is_skipped_in_the_matchers_order(host, tmp_path):
    warm(tmp_path)
    with cuectl.lease(devices=[0, 2]):
        out, way = cuectl_run(tmp_path, "--", sys.executable, "-c", SHOW_ENV)
        assert way == "quick" and json.loads(out.stdout)["NVIDIA_VISIBLE_DEVICES"] == host.uuids[1]
        with cuectl.lease(devices=[1]):
            out, way = cuectl_run(tmp_path, "--", sys.executable, "-c", SHOW_ENV)
            assert way == "quick" and json.loads(out.stdout)["NVIDIA_VISIBLE_DEVICES"] == host.uuids[3]
            with cuectl.lease(devices=[3], label="holder-x"):
                # Every device held: the full path refuses, naming the holders, as it always did.
                out, way = cuectl_run(tmp_path, "--no-wait", "--", "true")
                assert (out.returncode, way) == (1, "full") and "holder-x" in out.stderr


def test_a_live_waiter_sends_it_to_the_full_path(host, tmp_path):
    """First come, first served is the full path's (``WaitQueue.claims``): while anyone
    waits, the quick path steps aside, whatever the waiter wants."""
    warm(tmp_path)
    with cuectl.lease(devices=[3]):
        waiter = subprocess.Popen(
            [sys.executable, "-c", ENTRY, "run", "--gpu-model", "A100", "--", "true"],
            env={**os.environ, "ENTRY_PROBE": str(tmp_path / "waiter-probe")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        queue = Path(os.environ["CUECTL_LOCK_DIR"]) / "queue"
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while not list(queue.glob("*.ticket")) and time.monotonic() < deadline:
            time.sleep(0.02)  # a handshake with the waiter's ticket, not a pacing sleep
        assert list(queue.glob("*.ticket")), "the waiter never queued"
        out, way = cuectl_run(tmp_path, "--", sys.executable, "-c", SHOW_ENV)
        assert out.returncode == 0 and way == "full", out.stderr
        assert json.loads(out.stdout)["NVIDIA_VISIBLE_DEVICES"] == host.uuids[0]  # the A100 waiter wants no V100
    assert waiter.wait(timeout=STEP_TIMEOUT_S) == 0


def test_a_dead_waiters_ticket_does_not_stop_the_quick_path(host, tmp_path, lock_dir):
    warm(tmp_path)
    (lock_dir / "queue" / "00000000000000000001-999999-abcdef.ticket").write_text('{"candidates": [], "gpus": 1}')
    out, way = cuectl_run(tmp_path, "--", "true")
    assert (out.returncode, way) == (0, "quick"), out.stderr


def test_a_changed_fake_file_invalidates_the_cache(host, tmp_path, monkeypatch):
    warm(tmp_path)
    other = make_fake_host(tmp_path, [{"model": "NVIDIA L4", "vendor": "NVIDIA", "memory": "23034MiB"}], name="l4")
    host.yaml_path.write_text(other.yaml_path.read_text())
    out, way = cuectl_run(tmp_path, "--", sys.executable, "-c", SHOW_ENV)
    assert way == "full" and "NVIDIA L4" in out.stderr, out.stderr
    out, way = cuectl_run(tmp_path, "--", sys.executable, "-c", SHOW_ENV)
    assert way == "quick" and "NVIDIA L4" in out.stderr


def test_flags_it_does_not_know_and_frames_take_the_full_path(host, tmp_path):
    warm(tmp_path)
    for args in (
        ("--gpus", "2"),
        ("--gpu-model", "V100"),
        ("--device", "1"),
        ("--lock-dir", os.environ["CUECTL_LOCK_DIR"]),
    ):
        out, way = cuectl_run(tmp_path, *args, "--", "true")
        assert (out.returncode, way) == (0, "full"), (args, out.stderr)
    with cuectl.lease(gpus=1) as held:
        inside = {**held.env, "CUE_FRAME_ID": "f-1"}
        out, way = cuectl_run(tmp_path, "--gpus", "0", "--", "true", env=inside)
        assert way == "full", out.stderr


@pytest.mark.parametrize("spoil", ["group-writable", "garbage", "symlink", "off"])
def test_a_cache_it_cannot_trust_is_not_used(host, tmp_path, spoil):
    warm(tmp_path)
    cache = Path(os.environ["CUECTL_RUN_CACHE"])
    env: dict[str, str] = {}
    if spoil == "group-writable":
        cache.chmod(0o620)
    elif spoil == "garbage":
        cache.write_bytes(b"\x00not marshal\xff" * 10)
    elif spoil == "symlink":
        real = tmp_path / "elsewhere"
        cache.rename(real)
        cache.symlink_to(real)
    else:
        env["CUECTL_RUN_CACHE"] = "0"
    out, way = cuectl_run(tmp_path, "--", "true", env=env)
    assert (out.returncode, way) == (0, "full"), out.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the cache to another user")
def test_a_cache_of_another_users_is_not_used(host, tmp_path, os_users):
    """Root reading a cache that belongs to someone else (a sudo that kept HOME) ignores it:
    that user could have written any device into it."""
    (alice,) = os_users("alice")
    warm(tmp_path)
    cache = Path(os.environ["CUECTL_RUN_CACHE"])
    os.chown(cache, alice.uid, alice.gid)
    out, way = cuectl_run(tmp_path, "--", "true")
    assert (out.returncode, way) == (0, "full"), out.stderr
    assert cache.stat().st_uid == 0  # the full run replaced it with root's own (its directory is root's)


def test_leftovers_are_put_down_before_it_returns(host, tmp_path, lock_dir):
    """A command that leaves a process holding the lease behind (setsid + background): the
    quick path, like the full one, ends it so that the device is free when it returns."""
    warm(tmp_path)
    pidfile = tmp_path / "leftover.pid"
    pid_path = shlex.quote(str(pidfile))
    script = (
        f"setsid sh -c 'echo $$ > {pid_path}.tmp && mv {pid_path}.tmp {pid_path}; exec sleep 60' & "
        f"while [ ! -s {pid_path} ]; do sleep 0.01; done"
    )
    out, way = cuectl_run(tmp_path, "--", "sh", "-c", script)
    assert (out.returncode, way) == (0, "quick"), out.stderr
    leftover = int(pidfile.read_text())
    assert not locks.pid_alive(leftover) or Path(f"/proc/{leftover}/stat").read_text().split()[2] == "Z"
    with cuectl.lease(devices=[0]):
        pass  # free again


def test_signals_reach_the_commands_group(host, tmp_path):
    warm(tmp_path)
    ready = tmp_path / "ready"
    script = f"trap 'exit 42' TERM; touch {shlex.quote(str(ready))}; while :; do sleep 0.05; done"
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, "run", "--", "sh", "-c", script],
        env={**os.environ, "ENTRY_PROBE": str(tmp_path / "probe")},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + STEP_TIMEOUT_S
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=STEP_TIMEOUT_S) == 42
    assert way_of(*noted(tmp_path / "probe")) == "quick"


def test_inherited_descriptors_do_not_reach_the_command(host, tmp_path):
    """As subprocess's close_fds: a descriptor cuectl run inherited is not the command's;
    the lease's lock fd is."""
    warm(tmp_path)
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        show = "import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))"
        probe = tmp_path / "probe"
        out = subprocess.run(
            [sys.executable, "-c", ENTRY, "run", "--", sys.executable, "-c", show],
            env={**os.environ, "ENTRY_PROBE": str(probe)},
            capture_output=True,
            text=True,
            pass_fds=(w,),
            timeout=120,
        )
    finally:
        os.close(r)
        os.close(w)
    assert way_of(*noted(probe)) == "quick"
    fds = json.loads(out.stdout)
    assert w not in fds and len([f for f in fds if f > 2]) == 2  # the lock fd, and listdir's own


# -- the pieces, against what they stand in for ------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(), max_size=6))
def test_command_label_quotes_as_shlex_does(words):
    assert child.command_label(words, limit=10_000) == shlex.join(words)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.text(),
        st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False, allow_infinity=False),
        max_size=8,
    )
)
def test_records_encode_as_json_does(record):
    assert lockfile.encode_record(record) == json.dumps(record, separators=(",", ":")).encode()


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(), st.integers(), st.text(), st.text(), st.none() | st.text())
def test_a_fresh_record_encodes_as_json_does_the_first_time_and_after(uuid, index, pid, holder, kind, label):
    for _ in range(2):  # the second time from the part remembered
        record, data = lockfile.fresh_record(uuid, index, pid=pid, holder=holder, kind=kind, label=label)
        assert data == json.dumps(record, separators=(",", ":")).encode()
        assert record["pid"] == pid and record["label"] == label


def test_a_fresh_records_remembered_part_is_never_taken_for_equal_values_of_another_type():
    # True == 1 and both hash alike: a head kept for index 1 must not be written for True.
    for index in (1, True, 1, True):
        record, data = lockfile.fresh_record("GPU-1", index, pid=7, holder="h", kind="api", label=None)
        assert data == json.dumps(record, separators=(",", ":")).encode()


def test_the_kind_and_queue_names_match_the_lock_module():
    assert quick.KIND_RUN == locks.KIND_RUN and quick.QUEUE_DIRNAME == locks.QUEUE_DIRNAME


def test_the_hardware_key_changes_with_a_mig_instance_or_a_device_node(tmp_path, monkeypatch):
    root = tmp_path / "root"
    caps = root / "proc/driver/nvidia/capabilities/gpu0/mig"
    (caps / "gi1" / "ci0").mkdir(parents=True)
    (root / "dev").mkdir()
    (root / "dev" / "nvidia0").write_text("")
    before = quick._hardware(str(root))
    assert quick._hardware(str(root)) == before
    (caps / "gi2" / "ci0").mkdir(parents=True)
    after_mig = quick._hardware(str(root))
    assert after_mig != before
    (root / "dev" / "nvidia1").write_text("")
    assert quick._hardware(str(root)) != after_mig


def test_the_cache_file_is_private(host, tmp_path):
    warm(tmp_path)
    mode = stat.S_IMODE(Path(os.environ["CUECTL_RUN_CACHE"]).stat().st_mode)
    assert mode == 0o600
