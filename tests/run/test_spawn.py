"""Frames started by ``posix_spawn`` (cuectl.run.spawn) behave as ``subprocess.Popen`` started
them: each test runs on both paths (``popen`` turns spawn off), with real processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cuectl.run import launch, spawn
from cuectl.run.launch import ExitInfo, FrameProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="frames read /proc/self")

PY = sys.executable
# What the frame reports about itself: its session, its open fds, its cwd.
REPORT = (
    "import os; print('sid', os.getsid(0) == os.getpid()); "
    "print('fds', sorted(int(f) for f in os.listdir('/proc/self/fd'))); print('cwd', os.getcwd())"
)


@pytest.fixture(params=["spawn", "popen"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "spawn":
        if not spawn.usable():
            pytest.fail("this suite runs on glibc 2.29+ Linux, where frames are spawned")
    else:
        monkeypatch.setattr(spawn, "_USABLE", False)
    return str(request.param)


def run(argv: list[str], tmp_path: Path, **kw: object) -> tuple[ExitInfo, str, FrameProcess]:
    log = tmp_path / "logs" / "job" / "frame.log"
    kw.setdefault("env", dict(os.environ))
    proc = FrameProcess.start(argv, log_path=log, **kw)  # type: ignore[arg-type]
    info = proc.wait(timeout=15)
    assert info is not None, "frame did not finish"
    return info, log.read_text(), proc


def report(log: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in log.splitlines() if line.split(" ", 1)[0] in ("sid", "fds", "cwd"))


def test_the_frame_starts_as_popen_starts_it(tmp_path: Path, way: str) -> None:
    """A session of its own, only 0-2 and the passed fd open, the asked directory; the
    worker's own directory unchanged."""
    passed = os.open(tmp_path / "lease.lock", os.O_RDWR | os.O_CREAT, 0o600)
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_w, True)  # what a worker may inherit from its parent
    work = tmp_path / "work"
    work.mkdir()
    here = os.getcwd()
    try:
        info, log, _ = run([PY, "-c", REPORT], tmp_path, cwd=work, pass_fds=[passed])
    finally:
        for fd in (passed, leaked_r, leaked_w):
            os.close(fd)
    assert info.exit_code == 0, log
    seen = report(log)
    assert seen["sid"] == "True"
    expected = {0, 1, 2, passed}
    listing = min(set(range(3, 1024)) - expected)  # the listing's own descriptor, the lowest free one
    assert set(eval(seen["fds"])) - {listing} == expected, seen
    assert seen["cwd"] == str(work)
    assert os.getcwd() == here


def test_the_signals_python_ignores_are_restored(tmp_path: Path, way: str) -> None:
    """SIGPIPE and SIGXFSZ, which the worker (Python) ignores, are back to their defaults in
    the frame (``restore_signals``); any other signal a program can see is as the worker
    has it (a worker under ``nohup`` passes SIGHUP ignored on, as Popen does). (glibc's
    posix_spawn leaves its two internal signals, 32 and 33, ignored: invisible to programs,
    whose libc installs its own handlers for them; docs/architecture.md.)"""
    info, log, _ = run(["sh", "-c", "exec grep SigIgn /proc/self/status"], tmp_path)
    assert info.exit_code == 0, log
    ignored = int(log.split("SigIgn:")[1].split()[0], 16)
    ours = int(next(line for line in open("/proc/self/status") if line.startswith("SigIgn:")).split()[1], 16)
    visible, restored = (1 << 31) - 1, (1 << (13 - 1)) | (1 << (25 - 1))  # signals 1-31; SIGPIPE, SIGXFSZ
    assert ours & restored == restored  # (what the test is about: Python ignores both)
    assert ignored & visible == ours & visible & ~restored, (hex(ignored), hex(ours))


def test_an_inherited_descriptor_does_not_reach_the_frame(tmp_path: Path, way: str) -> None:
    """close_fds: a descriptor inherited without close-on-exec stays with the worker. The
    frame's reader sees end of file only if no other copy of the write end is open."""
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        info, log, _ = run([PY, "-c", "import os, sys; os.fstat(int(sys.argv[1]))", str(w)], tmp_path)
    finally:
        os.close(r)
        os.close(w)
    assert info.exit_code == 1 and "Bad file descriptor" in log, log


def _at_least(found: str, wanted: tuple[int, int]) -> bool:
    major, minor = (int(part) for part in found.split(".")[:2])
    return (major, minor) >= wanted


def test_inherited_descriptors_are_marked_close_on_exec_in_one_call_where_the_system_can() -> None:
    """Linux 5.11+ with glibc 2.34+: one close_range(2) marks them close-on-exec in the
    worker, so the file actions hold the kept descriptors only, and no listing is made."""
    kernel = os.uname().release.split("-")[0]
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0.0").split()[1]
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        actions = spawn.fd_actions([r])
        if not (_at_least(kernel, (5, 11)) and _at_least(glibc, (2, 34))):
            pytest.fail(f"this suite runs where close_range(2) can mark descriptors (Linux {kernel}, glibc {glibc})")
        assert actions == [(os.POSIX_SPAWN_DUP2, r, r)]
        assert not os.get_inheritable(w)
    finally:
        os.close(r)
        os.close(w)


def test_where_descriptors_cannot_be_marked_at_once_they_are_closed_in_the_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No close_range (older glibc or kernel): each inherited descriptor gets a close action.
    monkeypatch.setattr(spawn, "_CLOSE_RANGE", False)
    r, w = os.pipe()
    os.set_inheritable(w, True)
    try:
        assert (os.POSIX_SPAWN_CLOSE, w) in spawn.fd_actions([])
        assert os.get_inheritable(w)  # this process's own copy is left as it was
        info, log, _ = run([PY, "-c", "import os, sys; os.fstat(int(sys.argv[1]))", str(w)], tmp_path)
    finally:
        os.close(r)
        os.close(w)
    assert info.exit_code == 1 and "Bad file descriptor" in log, log


def test_the_program_is_searched_on_the_frames_path(tmp_path: Path, way: str) -> None:
    """The layer's PATH, not the worker's, finds the program; a non-executable file of that
    name earlier on it is passed over, as execvpe does."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "cuectl-test-tool").write_text("#!/bin/sh\necho wrong\n")  # not executable
    tool = second / "cuectl-test-tool"
    tool.write_text("#!/bin/sh\necho found it\n")
    tool.chmod(0o755)
    env = dict(os.environ, PATH=f"{first}:{second}:/usr/bin:/bin")
    info, log, _ = run(["cuectl-test-tool"], tmp_path, env=env)
    assert info.exit_code == 0 and "found it" in log and "wrong" not in log, log


def test_only_a_non_executable_candidate_gives_126(tmp_path: Path, way: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cuectl-test-tool").write_text("#!/bin/sh\necho hi\n")
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin")
    info, log, _ = run(["cuectl-test-tool"], tmp_path, env=env)
    assert info.exit_code == 126 and "Permission denied" in log and "cuectl-test-tool" in log, log


def test_a_relative_program_runs_from_the_frames_directory(tmp_path: Path, way: str) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = work / "render.sh"
    script.write_text('#!/bin/sh\necho rendered in "$PWD"\n')
    script.chmod(0o755)
    info, log, _ = run(["./render.sh"], tmp_path, cwd=work)
    assert info.exit_code == 0 and f"rendered in {work}" in log, log


def test_a_missing_directory_gives_127_and_leaves_the_worker_where_it_was(tmp_path: Path, way: str) -> None:
    here = os.getcwd()
    info, log, proc = run(["true"], tmp_path, cwd=tmp_path / "nope")
    assert info.exit_code == 127 and "nope" in log, log
    assert proc.pid == 0 and os.getcwd() == here


def test_a_missing_program_names_itself(tmp_path: Path, way: str) -> None:
    info, log, _ = run(["cuectl-no-such-tool"], tmp_path, env=dict(os.environ, PATH=str(tmp_path)))
    assert info.exit_code == 127 and "No such file or directory: cuectl-no-such-tool" in log, log


def test_a_worker_of_another_identity_keeps_popen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Frames run as another user (setuid) are started by subprocess: posix_spawn cannot."""
    seen: list[dict] = []
    real = launch.subprocess.Popen

    def popen(*args: object, **kwargs: object) -> object:
        seen.append(dict(kwargs))
        kwargs.pop("user"), kwargs.pop("group"), kwargs.pop("extra_groups")  # we are not root: run as ourselves
        return real(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    log_fd = os.open(tmp_path / "f.log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        child = launch._start_child(
            ["true"], dict(os.environ), log_fd, None, (), {"user": 12345, "group": 12345, "extra_groups": []}
        )
        assert isinstance(child, real)
        child.wait()
        assert seen and seen[0]["start_new_session"] and seen[0]["close_fds"]
        assert isinstance(launch._start_child(["true"], dict(os.environ), log_fd, None, (), {}), launch.Spawned)
    finally:
        os.close(log_fd)


def test_resolve_follows_execvpe(tmp_path: Path) -> None:
    exe = tmp_path / "tool"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    (tmp_path / "dir.d").mkdir()
    assert spawn.resolve("./x", {}) == "./x"
    assert spawn.resolve("tool", {"PATH": f"/nonexistent:{tmp_path}"}) == str(exe)
    with pytest.raises(PermissionError):
        spawn.resolve("dir.d", {"PATH": str(tmp_path)})  # a directory: EACCES, as execve says
    with pytest.raises(FileNotFoundError):
        spawn.resolve("tool", {"PATH": "/nonexistent"})
    assert spawn.resolve("sh", {}) in ("/bin/sh", "/usr/bin/sh")  # no PATH: execvpe's default


def test_the_worker_comes_back_to_wherever_it_is_now(tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Spawning in a frame's directory returns to the directory the process is in at that
    moment, not to one it was in at an earlier spawn."""
    work, first, second = tmp_path / "work", tmp_path / "first", tmp_path / "second"
    for d in (work, first, second):
        d.mkdir()
    monkeypatch.chdir(first)
    run(["true"], tmp_path, cwd=work)
    assert os.getcwd() == str(first)
    os.chdir(second)
    run(["true"], tmp_path, cwd=work)
    assert os.getcwd() == str(second)


def test_a_worker_whose_own_directory_was_removed_still_starts_frames(
    tmp_path: Path, way: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    work, gone = tmp_path / "work", tmp_path / "gone"
    work.mkdir()
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    info, log, _ = run([PY, "-c", REPORT], tmp_path, cwd=work)
    assert info.exit_code == 0 and report(log)["cwd"] == str(work), log
    assert os.stat(".").st_nlink == 0  # still in the removed directory, as before


def test_when_the_way_back_cannot_be_opened_popen_starts_the_frame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not spawn.usable():
        pytest.fail("this suite runs on glibc 2.29+ Linux, where frames are spawned")
    work = tmp_path / "work"
    work.mkdir()
    real_open = os.open

    def no_dot(path: object, flags: int, *args: object, **kwargs: object) -> int:
        if path == ".":
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(spawn.os, "open", no_dot)
    log_fd = real_open(tmp_path / "f.log", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        child = launch._start_child([PY, "-c", REPORT], dict(os.environ), log_fd, str(work), (), {})
    finally:
        os.close(log_fd)
    assert isinstance(child, launch.subprocess.Popen)
    assert child.wait() == 0 and report((tmp_path / "f.log").read_text())["cwd"] == str(work)
