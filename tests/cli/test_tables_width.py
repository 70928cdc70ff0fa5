"""Tables on a terminal of 80 and 160 columns (issue 41, §5): `frame list`, `job list`,
`host list` and `cuectl top` run on a real pseudo-terminal of that width (the window size set
on the pty, no COLUMNS variable). Every line fits, every row stays on one line (no word split
across lines), times are short (`21:34:34`, `Mar 01`, `2024-03-01`), long names are elided
with `…`, and states and utilisation are coloured — not with NO_COLOR, and piped output keeps
its documented tab-separated form with whole names and ISO times.

The store is a real SQLite file written through the store API, so every value is known."""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

import pytest
from conftest import cuectl_cmd
from rich.cells import cell_len
from ttydriver import on_terminal  # tests/ttydriver.py (tests/ is on sys.path)

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, LiveUsage, open_store

GIB = 1024**3
NOW = time.time()
T_OLD = 1709294400.0  # 2024-03-01T12:00:00Z: shown as a date with its year
T_WEEK = NOW - 3 * 86400  # three days ago: month and day
LONG = "sweep2-lighting-final-comp-v003"  # 31 characters: elided at 80 columns, whole at 160
SHORT = "comp-v12-abc"  # 12 characters, with a pending reason of ~400
HOST = "render-node-07"
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-7]|9[0-7]|38;[25][0-9;]*)m")  # a foreground colour


def _gpu(index: int) -> dict:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "vendor": "NVIDIA",
        "model": "NVIDIA A100-SXM4-80GB",
        "backend": "fake",
        "memory_total_bytes": 80 * GIB,
    }


def _claim_one(store, job_id: int, now: float, gpu: str):
    [layer] = [r for r in store.runnable_layers() if r.job_id == job_id][:1]
    claimed = store.claim_frame(layer.layer_id, host=HOST, worker=f"{HOST}:1", gpu_uuids=[gpu], now=now, lease_s=600.0)
    assert claimed is not None
    return claimed


def _finish(store, claimed, at: float, code: int) -> None:
    store.complete_frame(
        claimed.frame_id, claimed.attempt, FrameResult(exit_code=code, started_at=at, ended_at=at + 5), now=at + 5
    )


@pytest.fixture(scope="module")
def farm(tmp_path_factory) -> dict:
    """One host (two A100s, one at 90 %), a long-named job with a SUCCEEDED, a DEAD, a
    RUNNING and a WAITING frame, a job finished in 2024, one three days ago, and a short-named
    job whose four layers cannot run anywhere (a long pending reason)."""
    db = tmp_path_factory.mktemp("tables") / "store.db"
    user = getpass.getuser()  # the pending reason then names no user problem
    store = open_store(str(db))
    try:
        store.register_host(
            HostInfo(name=HOST, cores=64, memory_bytes=512 * GIB, gpus=[_gpu(0), _gpu(1)]), now=T_OLD - 60
        )
        old = store.submit(
            spec_from_mapping(
                {"name": "old-job", "layers": [{"name": "main", "command": ["true"], "range": "1"}]}, user=user
            ),
            now=T_OLD,
        )
        _finish(store, _claim_one(store, old, T_OLD, "GPU-0"), T_OLD, 0)
        week = store.submit(
            spec_from_mapping(
                {"name": "last-week", "layers": [{"name": "main", "command": ["true"], "range": "1"}]}, user=user
            ),
            now=T_WEEK,
        )
        _finish(store, _claim_one(store, week, T_WEEK, "GPU-0"), T_WEEK, 0)
        main = store.submit(
            spec_from_mapping(
                {
                    "name": LONG,
                    "layers": [{"name": "main", "command": ["true"], "range": "1-4", "gpus": 1, "retries": 0}],
                },
                user=user,
            ),
            now=NOW - 60,
        )
        _finish(store, _claim_one(store, main, NOW - 50, "GPU-0"), NOW - 50, 0)
        _finish(store, _claim_one(store, main, NOW - 40, "GPU-0"), NOW - 40, 1)
        running = _claim_one(store, main, NOW - 30, "GPU-1")
        _BEATS[db] = (running.frame_id, running.attempt)
        _beat(db, store)
        store.submit(
            spec_from_mapping(
                {
                    "name": SHORT,
                    "layers": [
                        {"name": f"big-layer-{i}", "command": ["true"], "range": "1-2", "gpus": 8} for i in range(4)
                    ],
                },
                user=user,
            ),
            now=NOW,
        )
    finally:
        store.close()
    return {"db": db, "running": running.frame_id}


# The host's heartbeat and live values, written anew before each command: the module's tests
# may run minutes after the fixture on a loaded machine (pytest-xdist), and a host whose
# heartbeat is a minute old reads DOWN, a sample older than two intervals reads its age.
_BEATS: dict[Path, tuple[int, int]] = {}


def _beat(db: Path, store=None) -> None:
    if db not in _BEATS:
        return
    if store is None:
        store = open_store(str(db))
        try:
            return _beat(db, store)
        finally:
            store.close()
    frame_id, attempt = _BEATS[db]
    now = time.time()
    store.record_live_usage(HOST, [LiveUsage(frame_id, attempt, now, 90.0, 3 * GIB)], now=now)
    store.heartbeat(
        HOST,
        [frame_id],
        now=now,
        lease_s=3600.0,
        attempts={frame_id: 1},
        live={
            "at": now,
            "devices": [
                {"uuid": "GPU-0", "utilization_pct": 0.0, "memory_used_bytes": 0, "memory_free_bytes": 80 * GIB},
                {"uuid": "GPU-1", "utilization_pct": 90.0, "memory_used_bytes": 3 * GIB, "memory_free_bytes": 77 * GIB},
            ],
        },
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    # UTC, so the times expected below are known; a 256-colour terminal, as most are.
    return {**env, "TZ": "UTC", "TERM": "xterm-256color", "CUECTL_LOCK_DIR": "/nonexistent-locks", **extra}


def _lines(raw: str) -> list[str]:
    return [line.rstrip() for line in CSI.sub("", raw).split("\n") if line.strip()]


def _elided(name: str, row: str) -> bool:
    """Whether ``row`` shows ``name`` elided in the middle: both its ends, `…` between."""
    return any(
        name.startswith(head) and name.endswith(tail) and len(head) >= 3 and len(tail) >= 3
        for head, tail in re.findall(r"(\S+)…(\S+)", row)
    )


def _today(at: float) -> str:
    """``at`` as a table shows a time of today (in UTC); as a day, were it run at midnight."""
    day = time.gmtime(at)
    if day[:3] != time.gmtime()[:3]:
        return f"{MONTHS[day.tm_mon - 1]} {day.tm_mday:02d}"
    return time.strftime("%H:%M:%S", day)


def _json(db: Path, *args: str) -> dict:
    _beat(db)
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), *args, "--json"], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _show(db: Path, width: int, *args: str, **env: str) -> tuple[str, list[str]]:
    """What ``cuectl args`` shows on a terminal ``width`` wide, and its lines, each of
    which fits (a table's row, or a `key: value` line short enough)."""
    _beat(db)
    code, raw = on_terminal([*cuectl_cmd(), "--db", str(db), *args], answer=None, columns=width, env=_env(**env))
    assert code == 0, raw
    lines = _lines(raw)
    for line in lines:
        assert cell_len(line) <= width or line.startswith("log_path "), (width, line)
    return raw, lines


@pytest.mark.parametrize("width", [80, 160])
def test_frame_list_fits(farm, width):
    db = farm["db"]
    frames = _json(db, "frame", "list")["frames"]
    raw, lines = _show(db, width, "frame", "list")
    header, rows = lines[0], lines[1:]
    assert header.split()[:2] == ["ID", "JOB"] and "STATE" in header and "STARTED" in header
    # One line a row, in order: nothing wrapped onto a second line.
    assert [row.split()[0] for row in rows] == [str(f["id"]) for f in frames]
    by_id = {row.split()[0]: row for row in rows}
    for f in frames:
        row = by_id[str(f["id"])]
        assert f" {f['state']} " in row + " "  # the whole word, never SUCCEE/DED
        assert f["name"] in row or _elided(f["name"], row)
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:", raw)  # no ISO times on a terminal
    main = [f for f in frames if f["job"] == LONG]
    started = datetime.fromisoformat(main[0]["started_at"]).timestamp()
    assert _today(started) in by_id[str(main[0]["id"])]
    [old] = [f for f in frames if f["job"] == "old-job"]
    [week] = [f for f in frames if f["job"] == "last-week"]
    assert "2024-03-01" in by_id[str(old["id"])]
    local = time.gmtime(T_WEEK)
    assert f"{MONTHS[local.tm_mon - 1]} {local.tm_mday:02d}" in by_id[str(week["id"])]
    if width == 80:
        assert LONG not in raw and all(_elided(LONG, by_id[str(f["id"])]) for f in main)  # elided, not wrapped
        assert "GPUS" not in header  # the least useful columns go first
    else:
        assert LONG in raw and "GPUS" in header and "HOST" in header and "GPU UTIL/MEM" in header
        assert f"{HOST}" in by_id[str(farm["running"])] and "90% 3.0 GiB" in by_id[str(farm["running"])]
    # Colours: SUCCEEDED green, RUNNING yellow, DEAD red.
    assert re.search(r"\x1b\[32mSUCCEEDED", raw) and re.search(r"\x1b\[33mRUNNING", raw)
    assert re.search(r"\x1b\[31mDEAD", raw)
    if width == 160:
        assert re.search(r"\x1b\[31m90% 3\.0 GiB", raw)  # heavy use (nvitop's thresholds)


@pytest.mark.parametrize("width", [80, 160])
def test_job_list_fits(farm, width):
    db = farm["db"]
    jobs = _json(db, "job", "list")["jobs"]
    raw, lines = _show(db, width, "job", "list")
    rows = lines[1:]
    assert [row.split()[0] for row in rows] == [str(j["id"]) for j in jobs]
    [short] = [row for row in rows if row.split()[0] == str(next(j["id"] for j in jobs if j["name"] == SHORT))]
    assert f" {SHORT} " in short and short.endswith("…")  # the name whole, the long reason cut
    if width == 80:
        assert LONG not in raw and any(_elided(LONG, row) for row in rows)
    else:
        assert LONG in raw and "PRI" in lines[0]
    assert re.search(r"\x1b\[32mSUCCEEDED", raw)


@pytest.mark.parametrize("width", [80, 160])
def test_host_list_fits(farm, width):
    raw, lines = _show(farm["db"], width, "host", "list")
    [row] = lines[1:]
    assert row.startswith(HOST) and "2x NVIDIA A100-SXM4-80GB" in row
    assert not re.search(r"\d{4}-\d\d-\d\dT", raw)
    assert re.search(r"\b\d\d:\d\d:\d\d\b|[A-Z][a-z]{2} \d\d", row)  # LAST HEARTBEAT, short
    if width == 160:
        assert "LOCKED" in lines[0] and "CORES" in lines[0]


@pytest.mark.parametrize("width", [80, 160])
def test_top_fits_and_keeps_the_job_name(farm, width):
    """`cuectl top` live: every line fits; a 12-character job name stays whole beside a
    ~400-character pending reason, which is cut instead (it used to be the other way)."""
    _beat(farm["db"])
    code, raw = on_terminal(
        [*cuectl_cmd(), "--db", str(farm["db"]), "top", "--interval", "0.2"],
        answer=b"q",
        prompt=b"Waiting jobs",
        columns=width,
        env=_env(),
    )
    assert code == 0, raw
    screen = raw.replace("\x1b[H", "\n")  # each redraw starts at the top left
    lines = _lines(screen)
    for line in lines:
        assert cell_len(line) <= width, (width, line)
    [job] = [j for j in _json(farm["db"], "top")["waiting"] if j["name"] == SHORT]
    assert len(job["pending_reason"]) > 300
    [waiting] = {line for line in lines if line.startswith(f"{job['id']} {SHORT} ")}  # the name whole
    assert waiting.endswith("…") and job["pending_reason"][:20] in waiting  # the reason cut
    # Every column of the waiting jobs stays (rich squeezed USER, PRI and WAITING to nothing).
    [head] = {line for line in lines if line.startswith("JOB ")}  # the same at every redraw
    assert head.split()[:4] == ["JOB", "USER", "PRI", "WAITING"]
    if width == 160:
        [long_job] = [j for j in _json(farm["db"], "top")["waiting"] if j["name"] == LONG]
        assert any(line.startswith(f"{long_job['id']} {LONG} ") for line in lines)
    assert any(line.startswith(HOST) for line in lines)
    assert f"{farm['running']} 0003-main" in screen
    assert "(q quits)" in screen  # the summary line wraps between words, not cropped at the edge
    assert re.search(r"\x1b\[31m90%", raw) and re.search(r"\x1b\[32mUP", raw)


def test_no_color_and_piped(farm):
    """NO_COLOR: the same fitted table without a colour; piped: the documented
    tab-separated lines, every cell whole (full names, ISO times), no escape at all."""
    db = farm["db"]
    raw, lines = _show(db, 80, "frame", "list", NO_COLOR="1")
    assert not COLOUR.search(raw) and "SUCCEEDED" in raw and any(_elided(LONG, line) for line in lines)
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "frame", "list"], capture_output=True, text=True, timeout=60, env=_env()
    )
    assert res.returncode == 0 and "\x1b" not in res.stdout
    header, *rows = res.stdout.splitlines()
    assert header.split("\t") == [
        "ID",
        "JOB",
        "FRAME",
        "STATE",
        "TRIES",
        "HOST",
        "GPUS",
        "GPU UTIL/MEM",
        "EXIT",
        "STARTED",
        "PENDING REASON",
    ]
    cells = [row.split("\t") for row in rows]
    assert all(len(c) == 11 for c in cells)
    assert any(c[1] == LONG and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", c[9]) for c in cells)
    reasons = {str(f["id"]): f["pending_reason"] for f in _json(db, "frame", "list")["frames"]}
    assert all(c[10] == (reasons[c[0]] or "-") for c in cells) and any(len(c[10]) > 60 for c in cells)


def test_frame_show_attempts_fit(farm):
    """`frame show`'s attempt table: its times short, one line at 80 columns (its `key: value`
    lines above keep the ISO times, as documented)."""
    db = farm["db"]
    [dead] = [f for f in _json(db, "frame", "list")["frames"] if f["state"] == "DEAD"]
    raw, lines = _show(db, 80, "frame", "show", str(dead["id"]))
    head = next(i for i, line in enumerate(lines) if line.startswith("ATTEMPT "))
    [attempt] = lines[head + 1 :]
    started = datetime.fromisoformat(dead["started_at"]).timestamp()
    assert attempt.split()[:2] == ["1", HOST] and attempt.endswith("exit 1")
    assert _today(started) in attempt and _today(started + 5) in attempt


def test_worker_live_view_fits(tmp_path):
    """`cuectl worker` on a terminal: its table of running frames fits a 60-column window
    (the job's 41-character name elided in the middle, never folded onto a second line)."""
    db, gpus = tmp_path / "store.db", tmp_path / "gpus.yaml"
    gpus.write_text("host: h1\ndevices:\n  - {model: NVIDIA A100-SXM4-80GB, vendor: NVIDIA, memory: 80G}\n")
    name = LONG + "-with-more"
    env = _env(CUECTL_FAKE_GPUS=str(gpus))
    res = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "submit", "--name", name, "--gpus", "1", "--", "sleep", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    code, raw = on_terminal(
        [*cuectl_cmd(), "--db", str(db), "worker", "--until-idle", "--poll", "0.05"], answer=None, columns=60, env=env
    )
    assert code == 0, raw
    lines = _lines(raw.replace("\r", "\n"))
    rows = [line for line in lines if line.startswith("1 0001-")]
    assert rows and all(_elided(name, row) and cell_len(row) <= 60 for row in rows), rows
    heads = [line for line in lines if line.startswith("FRAME ")]
    assert heads and all(head.split() == ["FRAME", "JOB", "ATTEMPT", "GPUS", "ELAPSED"] for head in heads)
