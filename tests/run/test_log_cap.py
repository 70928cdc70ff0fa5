"""Frame logs: capped to head + tail per attempt, opened without following links
(docs/reliability.md "Frame logs", docs/security.md "Frame logs"). Real subprocesses."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from cuectl.run.launch import FrameProcess, UnsafeLogPath, open_frame_log

PY = sys.executable
KIB = 1024
MIB = 1024 * KIB

# Writes a head line, `total` bytes of numbered filler lines in `chunk`-byte writes (with a
# pause between writes, so a polling worker sees the log grow), then a tail line.
WRITER = r"""
import os, sys, time
total, chunk, pause = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
os.write(1, b"HEAD-MARK\n")
n = 0
written = 0
while written < total:
    lines = []
    size = 0
    while size < chunk:
        line = b"line %09d ............................................\n" % n
        lines.append(line); size += len(line); n += 1
    data = b"".join(lines)
    os.write(1, data)
    written += len(data)
    time.sleep(pause)
os.write(1, b"TAIL-MARK last=%d\n" % (n - 1))
"""


def start(tmp_path: Path, argv: list[str], **kw) -> tuple[FrameProcess, Path]:
    log = tmp_path / "logs" / "7" / "0001-render.1.log"
    proc = FrameProcess.start(argv, env=dict(os.environ), log_path=log, **kw)
    return proc, log


def test_a_huge_log_keeps_its_head_and_tail_within_the_limit(tmp_path: Path) -> None:
    limit = 64 * KIB
    proc, log = start(
        tmp_path, [PY, "-c", WRITER, str(8 * MIB), str(MIB), "0"], log_limit=limit, header="=== header ==="
    )
    info = proc.wait(timeout=30)
    assert info is not None and info.exit_code == 0
    data = log.read_bytes()
    note = data[data.rindex(b"=== cuectl:") :]
    assert len(data) - len(note) <= limit, len(data)
    assert data.startswith(b"=== header ===\nHEAD-MARK\n")
    assert b"reached its limit of 65536 bytes" in data
    assert b"TAIL-MARK" in data and data.count(b"\0") == 0
    assert note.startswith(b"=== cuectl: ") and b"bytes of output were cut" in note
    # The kept tail is the most recent output, in order, right up to the last line.
    tail = data[data.index(b"follows ===\n") + len(b"follows ===\n") : data.index(b"TAIL-MARK")]
    numbers = [int(line.split()[1]) for line in tail.splitlines()[1:] if line.startswith(b"line ")]
    last = int(data.split(b"TAIL-MARK last=")[1].split()[0])
    assert numbers and numbers == list(range(numbers[0], last + 1))


def test_the_log_is_cut_back_while_the_frame_runs(tmp_path: Path) -> None:
    """A frame that keeps writing never lets its log grow much past the limit: what one
    poll interval allows. Its writes go on at the new end after a cut (O_APPEND), so the
    file never gets a hole of zeros."""
    limit = 256 * KIB
    chunk = 64 * KIB
    proc, log = start(tmp_path, [PY, "-c", WRITER, str(6 * MIB), str(chunk), "0.005"], log_limit=limit)
    biggest = 0
    deadline = time.monotonic() + 30
    while proc.poll() is None and time.monotonic() < deadline:
        biggest = max(biggest, log.stat().st_size)
        time.sleep(0.01)
    info = proc.poll()
    assert info is not None and info.exit_code == 0
    assert biggest <= limit + limit // 4 + 8 * chunk, biggest
    data = log.read_bytes()
    assert data.count(b"\0") == 0
    assert data.startswith(b"HEAD-MARK\n") and b"TAIL-MARK" in data
    assert len(data) <= limit + 200


def test_a_log_under_the_limit_is_untouched(tmp_path: Path) -> None:
    proc, log = start(tmp_path, [PY, "-c", WRITER, str(200 * KIB), str(64 * KIB), "0"], log_limit=MIB)
    assert proc.wait(timeout=30).exit_code == 0
    data = log.read_bytes()
    assert b"cuectl" not in data and data.startswith(b"HEAD-MARK") and b"TAIL-MARK" in data


def test_no_limit_means_no_cap(tmp_path: Path) -> None:
    proc, log = start(tmp_path, [PY, "-c", WRITER, str(300 * KIB), str(64 * KIB), "0"], log_limit=None)
    assert proc.wait(timeout=30).exit_code == 0
    assert log.stat().st_size > 300 * KIB


# ----------------------------------------------------------------------------- links


def test_a_symlink_where_the_log_goes_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    job_dir = tmp_path / "logs" / "7"
    job_dir.mkdir(parents=True)
    (job_dir / "0001-render.1.log").symlink_to(victim)
    with pytest.raises(UnsafeLogPath, match="symbolic link"):
        start(tmp_path, ["echo", "hello"], header="=== header ===")
    assert victim.read_text() == "precious\n"


def test_a_symlinked_job_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "7").symlink_to(elsewhere)
    with pytest.raises(UnsafeLogPath, match="symbolic link"):
        start(tmp_path, ["echo", "hello"])
    assert list(elsewhere.iterdir()) == []


def test_a_fifo_where_the_log_goes_cannot_hang_the_worker(tmp_path: Path) -> None:
    job_dir = tmp_path / "logs" / "7"
    job_dir.mkdir(parents=True)
    os.mkfifo(job_dir / "0001-render.1.log")
    t0 = time.monotonic()
    with pytest.raises(UnsafeLogPath):
        start(tmp_path, ["echo", "hello"])
    assert time.monotonic() - t0 < 2


def test_a_path_outside_the_given_log_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    with pytest.raises(UnsafeLogPath):
        open_frame_log(root / "7" / "x" / ".." / "0001-a.1.log", log_root=root)
    with pytest.raises(UnsafeLogPath):
        open_frame_log(tmp_path / "other" / "7" / "0001-a.1.log", log_root=root)
