"""`cuectl frame log [--follow] [--attempt N] [--tail N]` and the log footer (issue 17,
item 7), with real `cuectl worker` subprocesses on fake hosts (tests/worker/farmlib.py).

No timing is asserted: a follower is started, the worker does its work, and the follower
must exit by itself once the frame is done (with generous timeouts only against hangs)."""

from __future__ import annotations

import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "worker"))

from farmlib import Farm, cuectl_cmd  # noqa: E402

FOOTER = r"=== cuectl frame {id} attempt {n} ended \S+Z: {how} ==="


@pytest.fixture(params=["sqlite", "postgres"])
def any_farm(request: pytest.FixtureRequest, tmp_path: Path):
    """A farm on each store backend (PostgreSQL: the suite's server, tests/pgserver.py)."""
    f = Farm(tmp_path)
    if request.param == "postgres":
        pytest.importorskip("psycopg", reason="the postgres extra (psycopg 3) is not installed")
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        import pgserver

        try:
            server = pgserver.shared_server()
        except pgserver.PgUnavailable as exc:
            pytest.skip(f"PostgreSQL tests skipped: {exc}")
        name = server.create_database()
        f.db = server.url(name)  # type: ignore[assignment]  # every `cuectl --db` names the database
        f.worker_flags = ["--run-as-worker-user"]  # submitted through the superuser role
    yield f
    f.cleanup()


@pytest.fixture
def farm(tmp_path: Path):
    f = Farm(tmp_path)
    yield f
    f.cleanup()


def layer(name: str, command: Any, **kw: Any) -> dict[str, Any]:
    return {"name": name, "command": command, "range": "1", **kw}


def only_frame(farm: Farm, job: int) -> dict[str, Any]:
    (frame,) = farm.frames(job)
    return frame


def follower(farm: Farm, frame_id: int, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*cuectl_cmd(), "--db", str(farm.db), "frame", "log", str(frame_id), "--follow", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=farm.env(),
        start_new_session=True,
    )
    farm.procs.append(proc)
    return proc


def read_line(stream: IO[bytes], timeout: float = 60.0) -> str:
    """One line of a pipe, failing (not hanging) when none comes."""
    sel = selectors.DefaultSelector()
    sel.register(stream, selectors.EVENT_READ)
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        if not sel.select(max(0.0, deadline - time.monotonic())):
            raise AssertionError(f"no line within {timeout} s (got {data!r})")
        byte = stream.read1(1) if hasattr(stream, "read1") else stream.read(1)  # type: ignore[attr-defined]
        if not byte:
            break
        data += byte
    return data.decode()


def finish(proc: subprocess.Popen, timeout: float = 90.0) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode(), err.decode()


def log_of(farm: Farm, frame_id: int, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return farm.cuectl("frame", "log", str(frame_id), *args, check=check)


# -- --follow -----------------------------------------------------------------------------------
def test_follow_waits_for_a_waiting_frame_then_streams_it_and_exits_when_done(farm):
    job = farm.submit({"name": "later", "layers": [layer("w", "echo one; echo two")]})
    frame = only_frame(farm, job)
    assert frame["state"] == "WAITING"
    tail = follower(farm, frame["id"])
    first = read_line(tail.stderr)
    assert first.startswith(f"waiting for frame {frame['id']} to start (WAITING"), first
    assert tail.poll() is None  # it waits rather than exiting 1
    farm.start_worker(None, "--until-idle")
    code, out, err = finish(tail)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"=== cuectl frame {frame['id']} attempt 1 on ")
    assert lines[1:3] == ["one", "two"]
    assert re.fullmatch(FOOTER.format(id=frame["id"], n=1, how="exit 0"), lines[-1]), lines[-1]
    assert f"--- attempt 1 ended: exit 0; frame {frame['id']} is SUCCEEDED ---" in err


def test_follow_goes_on_into_the_retry_of_a_failed_attempt(any_farm):
    farm = any_farm
    command = 'echo "attempt $CUE_ATTEMPT"; test "$CUE_ATTEMPT" -ge 2 || exit 1'
    job = farm.submit({"name": "flaky", "layers": [layer("w", command, retries=1, retry_delay=0)]})
    frame = only_frame(farm, job)
    tail = follower(farm, frame["id"])
    assert read_line(tail.stderr).startswith("waiting for frame")
    farm.start_worker(None, "--until-idle")
    code, out, err = finish(tail)
    assert code == 0, err
    fid = frame["id"]
    assert out.index("attempt 1\n") < out.index(f"=== cuectl frame {fid} attempt 2 on ") < out.index("attempt 2\n")
    assert re.search(FOOTER.format(id=fid, n=1, how="exit 1"), out), out
    assert re.search(FOOTER.format(id=fid, n=2, how="exit 0") + r"\n\Z", out), out
    assert "--- attempt 1 ended: exit 1; following attempt 2 ---" in err
    assert f"--- attempt 2 ended: exit 0; frame {fid} is SUCCEEDED ---" in err
    # Each attempt keeps its own log.
    first = log_of(farm, fid, "--attempt", "1").stdout
    assert "attempt 1\n" in first and "attempt 2\n" not in first
    assert re.search(FOOTER.format(id=fid, n=1, how="exit 1") + r"\n\Z", first), first
    second = log_of(farm, fid, "--attempt", "2").stdout
    assert second == log_of(farm, fid).stdout and "attempt 2\n" in second and "attempt 1\n" not in second
    missing = log_of(farm, fid, "--attempt", "3", check=False)
    assert missing.returncode == 1 and "has had 2 attempts" in missing.stderr
    assert log_of(farm, fid, "--attempt", "0", check=False).returncode == 2


def test_follow_of_a_dead_frame_prints_its_log_and_says_so(farm):
    job = farm.submit({"name": "bad", "layers": [layer("w", "echo bad; exit 3", retries=0)]})
    assert farm.run_worker(None).returncode == 0
    fid = only_frame(farm, job)["id"]
    code, out, err = finish(follower(farm, fid))
    assert code == 0  # streaming a log succeeded; the frame's fate is on stderr
    assert "bad\n" in out and re.search(FOOTER.format(id=fid, n=1, how="exit 3"), out)
    assert f"frame {fid} is DEAD" in err
    # --attempt with --follow on a finished attempt: its log, then it stops.
    code, out2, err2 = finish(follower(farm, fid, "--attempt", "1"))
    assert code == 0 and out2 == out and "attempt 1 ended: exit 3" in err2


def test_ctrl_c_stops_a_follower_quietly_with_130(farm):
    job = farm.submit({"name": "never", "layers": [layer("w", "true")]})
    tail = follower(farm, only_frame(farm, job)["id"])
    assert read_line(tail.stderr).startswith("waiting for frame")
    tail.send_signal(signal.SIGINT)
    code, out, err = finish(tail)
    assert (code, out, err) == (130, "", "")


def test_follow_of_an_unknown_frame_is_not_found(farm):
    farm.submit({"name": "x", "layers": [layer("w", "true")]})
    code, _, err = finish(follower(farm, 999_999))
    assert code == 1 and "no frame 999999" in err


def test_tail_prints_the_last_lines_then_follows(farm):
    command = "for i in 1 2 3 4 5 6 7 8 9 10; do echo line $i; done"
    job = farm.submit({"name": "tail", "layers": [layer("w", command)]})
    assert farm.run_worker(None).returncode == 0
    fid = only_frame(farm, job)["id"]
    lines = log_of(farm, fid, "--tail", "3").stdout.splitlines()
    assert lines[:2] == ["line 9", "line 10"] and re.fullmatch(FOOTER.format(id=fid, n=1, how="exit 0"), lines[2])
    assert log_of(farm, fid, "--tail", "0").stdout == ""
    code, out, _ = finish(follower(farm, fid, "--tail", "3"))
    assert code == 0 and out.splitlines() == lines


# -- the footer -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command, timeout, how",
    [
        ("exit 7", None, "exit 7"),
        ("kill -KILL $$", None, r"killed by signal 9 \(SIGKILL\)"),
        ("kill -TERM $$", None, r"killed by signal 15 \(SIGTERM\)"),
        ("exec sleep 30", "1s", "timed out after 1 s, stopped with SIGTERM"),
        ("trap '' TERM; sleep 30", "1s", r"timed out after 1 s, SIGKILL after the 0\.5 s grace period"),
    ],
)
def test_the_footer_says_how_the_attempt_ended(farm, command, timeout, how):
    spec = layer("w", f"echo started; {command}", retries=0, **({"timeout": timeout} if timeout else {}))
    job = farm.submit({"name": "end", "layers": [spec]})
    assert farm.run_worker(None).returncode == 0  # the farm's CUECTL_KILL_GRACE is 0.5
    frame = only_frame(farm, job)
    lines = log_of(farm, frame["id"]).stdout.splitlines()
    assert "started" in lines
    assert re.fullmatch(FOOTER.format(id=frame["id"], n=1, how=how), lines[-1]), lines[-1]


def test_the_footer_of_a_frame_killed_by_its_user(farm):
    job = farm.submit({"name": "long", "layers": [layer("w", "echo started; exec sleep 60", retries=0)]})
    fid = only_frame(farm, job)["id"]
    tail = follower(farm, fid)
    farm.start_worker(None, "--until-idle")
    farm.wait_for(lambda: only_frame(farm, job)["state"] == "RUNNING", what="the frame to run")
    farm.cuectl("frame", "kill", str(fid))
    code, out, err = finish(tail)
    assert code == 0, err
    assert re.search(
        FOOTER.format(id=fid, n=1, how=r"killed by user request \(kill\), stopped with SIGTERM") + r"\n\Z", out
    ), out
    assert f"frame {fid} is DEAD" in err


def test_the_footer_is_kept_when_the_log_was_cut(farm):
    command = "i=0; while [ $i -lt 20000 ]; do echo line-$i-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done; exit 4"
    job = farm.submit({"name": "big", "layers": [layer("w", command, retries=0, log_limit="64K")]})
    assert farm.run_worker(None).returncode == 0
    frame = only_frame(farm, job)
    text = log_of(farm, frame["id"]).stdout
    assert "output was cut here" in text
    lines = text.splitlines()
    assert lines[-2].startswith("=== cuectl: ") and "were cut from the middle" in lines[-2]
    assert re.fullmatch(FOOTER.format(id=frame["id"], n=1, how="exit 4"), lines[-1]), lines[-1]
    assert "line-19999-" in lines[-3]
