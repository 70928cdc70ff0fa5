"""`cuectl admin report` in-process on a store with known figures (see conftest.py for the
attempts and how each number below follows from them): every format's numbers."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest
from promtext import parse_prometheus

from cuectl.report import CSV_COLUMNS, EXTRA_KEYS, ROW_KEYS

REPORT_DIR = Path(__file__).parent
GIB = 1024**3
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-16GB"
WINDOW = ("--since", "2024-03-01T00:00:00Z", "--until", "2024-03-01T01:00:00Z")

# --by user over WINDOW, worked out by hand from conftest.py.
ALICE = {
    "group": "alice",
    "frames": 3,
    "succeeded": 2,
    "dead": 1,
    "retries": 1,
    "wall_seconds": 200.0,
    "gpu_seconds_allocated": 220.0,
    "gpu_seconds_busy": 90.0,
    "gpu_efficiency_pct": 40.91,
    # (55*100 + 20*50 + 0*30 + 75*40) / 220
    "gpu_util_mean_pct": 43.18,
    "gpu_memory_peak_bytes": 8 * GIB,
    "core_seconds": 380.0,
    # waits 10, 20, 30, 40 -> nearest rank: p50 = 2nd, p95 = 4th
    "wait_p50_s": 20.0,
    "wait_p95_s": 40.0,
    "gpu_seconds_wasted": 130.0,
    "attempts": 4,
}
BOB = {
    "group": "bob",
    "frames": 3,
    "succeeded": 2,
    "dead": 1,
    "retries": 0,
    "wall_seconds": 220.0,
    # the lost attempt never reported usage: charged wall (100 s) x 1 device, none busy
    "gpu_seconds_allocated": 100.0,
    "gpu_seconds_busy": 0.0,
    "gpu_efficiency_pct": 0.0,
    "gpu_util_mean_pct": None,
    "gpu_memory_peak_bytes": None,
    "core_seconds": 580.0,
    "wait_p50_s": 90.0,
    "wait_p95_s": 100.0,
    "gpu_seconds_wasted": 100.0,
    "attempts": 3,
}
TOTAL = {
    "group": "total",
    "frames": 6,
    "succeeded": 4,
    "dead": 2,
    "retries": 1,
    "wall_seconds": 420.0,
    "gpu_seconds_allocated": 320.0,
    "gpu_seconds_busy": 90.0,
    "gpu_efficiency_pct": 28.12,
    "gpu_util_mean_pct": 43.18,
    "gpu_memory_peak_bytes": 8 * GIB,
    "core_seconds": 960.0,
    "wait_p50_s": 40.0,
    "wait_p95_s": 100.0,
    "gpu_seconds_wasted": 230.0,
    "attempts": 7,
}


def report(cli, *args: str):
    res = cli("admin", "report", *WINDOW, *args)
    assert res.exit_code == 0, res
    return res


def subset(row: dict, expected: dict) -> dict:
    return {k: row[k] for k in expected}


def assert_row(row: dict, **expected) -> None:
    assert subset(row, expected) == expected


# -- JSON -----------------------------------------------------------------------------------
def test_json_by_user_known_numbers(cli, known_store):
    doc = report(cli, "--by", "user", "--format", "json").json()
    assert doc["by"] == "user"
    assert (doc["since"], doc["until"]) == ("2024-03-01T00:00:00.000Z", "2024-03-01T01:00:00.000Z")
    assert doc["generated_at"].endswith("Z")
    rows = doc["rows"]
    assert [r["group"] for r in rows] == ["alice", "bob"]  # allocated desc; carol only outside the window
    for row in rows:
        assert list(row) == [*ROW_KEYS, *EXTRA_KEYS]  # DESIGN §9 keys, in order, then the extras
    assert subset(rows[0], ALICE) == ALICE
    assert subset(rows[1], BOB) == BOB
    assert subset(doc["total"], TOTAL) == TOTAL


def test_json_alias_flag(cli, known_store):
    assert report(cli, "--by", "user", "--json").json()["rows"][0]["group"] == "alice"
    res = cli("admin", "report", "--json", "--format", "csv")
    assert res.exit_code == 2 and "error: --json conflicts with --format csv" in res.stderr


def test_by_job_rows_labels_and_order(cli, known_store):
    rows = report(cli, "--by", "job", "--json").json()["rows"]
    got = {r["group"]: r for r in rows}
    assert [r["group"] for r in rows] == ["1 train", "4 flaky", "2 mixed", "3 comp"]
    assert got["1 train"]["labels"] == {"job_id": "1", "job_name": "train"}
    assert_row(
        got["1 train"],
        frames=2,
        succeeded=1,
        dead=1,
        retries=1,
        wall_seconds=180.0,
        gpu_seconds_allocated=180.0,
        gpu_seconds_busy=60.0,
        gpu_seconds_wasted=120.0,
        gpu_efficiency_pct=33.33,
        gpu_util_mean_pct=36.11,
        gpu_memory_peak_bytes=4 * GIB,
        core_seconds=360.0,
        wait_p50_s=20.0,
        wait_p95_s=30.0,
    )
    comp = got["3 comp"]
    assert (comp["frames"], comp["succeeded"], comp["core_seconds"], comp["gpu_seconds_allocated"]) == (
        2,
        2,
        480.0,
        0.0,
    )
    assert comp["gpu_efficiency_pct"] is None and comp["gpu_util_mean_pct"] is None  # CPU only: unknown, not 0
    assert (comp["wait_p50_s"], comp["wait_p95_s"]) == (60.0, 90.0)
    assert (got["2 mixed"]["gpu_efficiency_pct"], got["4 flaky"]["dead"]) == (75.0, 1)


def test_by_layer_and_host(cli, known_store):
    layers = {r["group"]: r for r in report(cli, "--by", "layer", "--json").json()["rows"]}
    assert set(layers) == {"train/fit", "mixed/sim", "comp/beauty", "flaky/gpu"}
    assert layers["train/fit"]["labels"] == {"job_name": "train", "layer": "fit"}
    hosts = {r["group"]: r for r in report(cli, "--by", "host", "--json").json()["rows"]}
    # h1: train f1 (100) + f2 attempt 1 (50) + the lost flaky attempt (100); the dead train
    # frame's last attempt ran on h2, so h2 has that death and h1 the flaky one.
    assert {h: (r["gpu_seconds_allocated"], r["dead"], r["retries"], r["frames"]) for h, r in hosts.items()} == {
        "h1": (250.0, 1, 0, 3),
        "h2": (70.0, 1, 1, 2),
        "h3": (0.0, 0, 0, 2),
    }


def test_by_gpu_model_splits_mixed_attempts(cli, known_store):
    rows = report(cli, "--by", "gpu-model", "--json").json()["rows"]
    got = {r["group"]: r for r in rows}
    assert [r["group"] for r in rows] == [A100, "unknown", V100, "cpu"]
    # The A100+V100 attempt (alloc 40, busy 30) gives each model half of its GPU figures.
    assert_row(
        got[A100],
        gpu_seconds_allocated=170.0,
        gpu_seconds_busy=75.0,
        frames=3,
        dead=0,
        retries=0,
        gpu_util_mean_pct=47.06,
        wall_seconds=170.0,
    )  # util: (55*100 + 20*50 + 75*20) / 170
    assert_row(
        got[V100],
        gpu_seconds_allocated=50.0,
        gpu_seconds_busy=15.0,
        gpu_efficiency_pct=30.0,
        frames=2,
        dead=1,
        retries=1,
        gpu_util_mean_pct=30.0,
    )
    assert got["unknown"]["gpu_seconds_allocated"] == 100.0  # lost: devices known, models not reported
    assert got["cpu"]["frames"] == 2 and got["cpu"]["gpu_seconds_allocated"] == 0.0
    # GPU-seconds add up to the total; nothing is counted twice or lost in the split.
    assert sum(r["gpu_seconds_allocated"] for r in rows) == TOTAL["gpu_seconds_allocated"]
    assert sum(r["gpu_seconds_busy"] for r in rows) == TOTAL["gpu_seconds_busy"]


def test_by_day_is_utc_and_window_bounds(cli, known_store):
    res = cli("admin", "report", "--by", "day", "--since", "2024-02-29", "--until", "2024-03-02", "--json")
    assert res.exit_code == 0, res
    rows = {r["group"]: r for r in res.json()["rows"]}
    # "old" ended 2024-02-29T23:10Z; "late" at 01:00Z is inside this wider window.
    assert {d: r["frames"] for d, r in rows.items()} == {"2024-02-29": 1, "2024-03-01": 7}
    # [since, until): the attempt that ended exactly at --until is left out of WINDOW.
    assert report(cli, "--by", "user", "--json").json()["total"]["frames"] == 6


# -- CSV ------------------------------------------------------------------------------------
def test_csv_by_user_known_numbers(cli, known_store):
    text = report(cli, "--by", "user", "--format", "csv").stdout
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
    rows = list(reader)
    assert [r["group"] for r in rows] == ["alice", "bob"]

    def parsed(row: dict[str, str], expected: dict) -> dict:
        out = {}
        for key, want in expected.items():
            raw = row[key]
            out[key] = raw if key == "group" else (None if raw == "" else type(want or 0.0)(float(raw)))
        return out

    assert parsed(rows[0], ALICE) == ALICE
    assert parsed(rows[1], BOB) == BOB  # unknown values are empty cells
    assert rows[1]["gpu_util_mean_pct"] == "" and rows[1]["gpu_memory_peak_bytes"] == ""


# -- Prometheus -----------------------------------------------------------------------------
def test_prometheus_by_user_known_numbers(cli, known_store):
    samples, types = parse_prometheus(report(cli, "--by", "user", "--format", "prometheus").stdout)
    assert set(types.values()) == {"gauge"} and all(n.startswith("cuectl_report_") for n in types)

    def value(name: str, group: str, **extra: str) -> float | None:
        return samples.get((f"cuectl_report_{name}", frozenset({"by": "user", "group": group, **extra}.items())))

    expected = {
        "frames": (3, 3),
        "frames_succeeded": (2, 2),
        "frames_dead": (1, 1),
        "retries": (1, 0),
        "wall_seconds": (200, 220),
        "gpu_seconds_allocated": (220, 100),
        "gpu_seconds_busy": (90, 0),
        "gpu_seconds_wasted": (130, 100),
        "gpu_efficiency_ratio": (90 / 220, 0.0),
        "gpu_utilization_mean_ratio": (0.431818, None),
        "gpu_memory_peak_bytes": (8 * GIB, None),
        "core_seconds": (380, 580),
    }
    for name, (alice, bob) in expected.items():
        for group, want in (("alice", alice), ("bob", bob)):
            got = value(name, group)
            assert (got is None) == (want is None), (name, group, got)
            if want is not None:
                assert got == pytest.approx(want, abs=1e-6), (name, group)
    assert value("queue_wait_seconds", "alice", quantile="0.5") == 20
    assert value("queue_wait_seconds", "alice", quantile="0.95") == 40
    assert value("queue_wait_seconds", "bob", quantile="0.95") == 100
    generated = samples[("cuectl_report_generated_timestamp_seconds", frozenset({("by", "user")}))]
    assert generated > 1.7e9
    assert samples[("cuectl_report_window_seconds", frozenset({("by", "user")}))] == 3600


def test_prometheus_by_job_labels_escaped(cli, db_path):
    from cuectl.sched.spec import spec_from_mapping
    from cuectl.sched.store import FrameResult, open_store

    store = open_store(str(db_path))
    name = 'say "hi" \\ there'
    store.submit(
        spec_from_mapping({"name": name, "layers": [{"name": "l", "command": ["true"]}]}, user="u"), now=1000.0
    )
    layer = store.runnable_layers()[0]
    c = store.claim_frame(layer.layer_id, host="h", worker="w", gpu_uuids=[], now=1000.0, lease_s=60)
    store.complete_frame(
        c.frame_id, c.attempt, FrameResult(exit_code=0, started_at=1000.0, ended_at=1010.0), now=1010.0
    )
    store.close()
    res = cli("admin", "report", "--by", "job", "--since", "1970-01-01", "--format", "prometheus")
    assert res.exit_code == 0, res
    assert 'job_name="say \\"hi\\" \\\\ there"' in res.stdout
    samples, _ = parse_prometheus(res.stdout)
    labels = frozenset({"by": "job", "group": f"1 {name}", "job_id": "1", "job_name": name}.items())
    assert samples[("cuectl_report_wall_seconds", labels)] == 10


# -- table ------------------------------------------------------------------------------------
def test_table_shows_groups_wasted_and_total(cli, known_store):
    res = report(cli, "--by", "user")
    lines = res.stdout.splitlines()
    header = lines[0].split("\t")  # piped: tab-separated, header first
    assert header[:9] == ["GROUP", "FRAMES", "OK", "DEAD", "RETRIES", "WALL", "GPU-H ALLOC", "GPU-H BUSY", "WASTED"]
    cells = {line.split("\t")[0]: dict(zip(header, line.split("\t"))) for line in lines[1:]}
    assert list(cells) == ["alice", "bob", "TOTAL"]
    alice = cells["alice"]
    assert (alice["FRAMES"], alice["OK"], alice["DEAD"], alice["RETRIES"]) == ("3", "2", "1", "1")
    assert (alice["WALL"], alice["GPU-H ALLOC"], alice["GPU-H BUSY"], alice["WASTED"]) == (
        "3m20s",
        f"{220 / 3600:.2f}",
        f"{90 / 3600:.2f}",
        f"{130 / 3600:.2f}",
    )
    assert (alice["EFF%"], alice["UTIL%"], alice["PEAK MEM"], alice["WAIT P50/P95"]) == (
        "40.9",
        "43.2",
        "8.0 GiB",
        "20s/40s",
    )
    assert (cells["bob"]["UTIL%"], cells["bob"]["PEAK MEM"], cells["bob"]["EFF%"]) == ("-", "-", "0.0")
    assert cells["TOTAL"]["FRAMES"] == "6" and cells["TOTAL"]["EFF%"] == "28.1"
    assert "WASTED = allocated - busy" in res.stderr


def test_empty_window(cli, known_store):
    res = cli("admin", "report", "--since", "2020-01-01", "--until", "2020-01-02")
    assert res.exit_code == 0 and res.stdout == "" and "no frame attempts ended" in res.stderr
    doc = cli("admin", "report", "--since", "2020-01-01", "--until", "2020-01-02", "--json").json()
    assert doc["rows"] == [] and doc["total"]["frames"] == 0 and doc["total"]["gpu_efficiency_pct"] is None
    assert (
        cli("admin", "report", "--since", "2020-01-01", "--until", "2020-01-02", "--format", "csv").stdout
        == ",".join(CSV_COLUMNS) + "\n"
    )


def test_default_window_is_last_7_days(cli, known_store):
    # Every known attempt is from 2024: the default window (7d until now) has none of them.
    assert cli("admin", "report", "--json").json()["rows"] == []


# -- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (("--by", "team"), "--by: unknown grouping 'team'"),
        (("--format", "xml"), "--format: unknown format 'xml'"),
        (("--since", "yesterday"), "--since: invalid time 'yesterday'"),
        (("--until", "31/01/2024"), "--until: invalid time"),
        (("--since", "2024-03-02", "--until", "2024-03-01"), "must be before --until"),
        (("--since", "1d", "--until", "1d"), "must be before --until"),
        (("--output", "x.txt"), "--output needs a machine format"),
    ],
)
def test_bad_input_exits_2(cli, known_store, tmp_path, args, message):
    res = cli("admin", "report", *args)
    assert res.exit_code == 2, res
    assert res.stderr.startswith("error: ") and message in res.stderr and "Traceback" not in res.stderr
    assert res.stdout == ""


# -- --output -------------------------------------------------------------------------------
def test_output_is_written_atomically(cli, known_store, tmp_path):
    out_dir = tmp_path / "textfile"
    out_dir.mkdir()
    target = out_dir / "cuectl.prom"
    target.write_text("old contents\n")
    target.chmod(0o640)
    stdout_text = report(cli, "--by", "user", "--format", "prometheus").stdout
    res = report(cli, "--by", "user", "--format", "prometheus", "--output", str(target))
    assert res.stdout == "" and res.stderr == ""  # silent: cron mails whatever a job prints
    written = target.read_text()
    # Same document as stdout but for the generation time.
    strip = re.compile(r"^cuectl_report_generated_timestamp_seconds.*$", re.M)
    assert strip.sub("", written) == strip.sub("", stdout_text)
    assert sorted(p.name for p in out_dir.iterdir()) == ["cuectl.prom"]  # no temp file left behind
    assert target.stat().st_mode & 0o777 == 0o640  # an existing file keeps its mode
    new = out_dir / "report.json"
    report(cli, "--by", "job", "--json", "--output", str(new))
    assert json.loads(new.read_text())["rows"][0]["group"] == "1 train"
    assert new.stat().st_mode & 0o777 == 0o644  # readable by node_exporter's user


def test_output_into_missing_or_unwritable_dir_exits_1(cli, known_store, tmp_path):
    res = cli("admin", "report", "--format", "csv", "--output", str(tmp_path / "missing" / "r.csv"))
    assert res.exit_code == 1 and res.stderr.startswith("error: cannot write") and "Traceback" not in res.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    res = cli("admin", "report", "--format", "csv", "--output", str(blocker / "r.csv"))
    assert res.exit_code == 1 and "error: cannot write" in res.stderr
    # A directory nobody may create files in, root included (permission bits would not
    # stop root, which CI runs as): /proc.
    res = cli("admin", "report", "--format", "csv", "--output", "/proc/cuectl-report.csv")
    assert res.exit_code == 1 and "error: cannot write" in res.stderr and "Traceback" not in res.stderr
