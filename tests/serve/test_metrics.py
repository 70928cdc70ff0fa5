"""/metrics and /readyz figures (cuectl.serve.metrics) on a real store of each backend:
real jobs, a registered host with fake GPUs, frames claimed and completed through the store
API, a real local lease in a lock directory; the exposition is parsed back with
prometheus_client's own parser and checked value by value. The example alert rules are
checked against the names render() emits so they cannot drift."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import cuectl
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import FrameResult, HostInfo, Store, open_store
from cuectl.sched.store.base import LEASE_BUCKETS_S
from cuectl.serve.metrics import gpu_stats, render
from cuectl.top import snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pgserver  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "examples" / "prometheus-alerts.yaml"
NOW = 1_700_000_000.0
GIB = 1024**3
MODEL = "Tesla V100-SXM2-16GB"
# Names from users end up in label values: quote, backslash, line feed must not break lines.
JOB = 'shot"010\\final'  # job names refuse control characters
DOWN_HOST = 'old"node\\\nb'  # host names are not checked at all
UP_HOST = "node-1"
SCRAPE_AT = NOW + 610

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- stores of both backends (pg_server: tests/conftest.py) --------------------------------
@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        s = open_store(str(tmp_path / "s" / "cuectl.db"))
        yield s
        s.close()
        return
    server: pgserver.PgServer = request.getfixturevalue("pg_server")
    name = server.create_database()
    s = open_store(server.url(name))
    yield s
    s.close()
    server.drop_database(name)


# -- the farm ----------------------------------------------------------------------------------
def gpu(index: int, uuid: str) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid,
        "vendor": "NVIDIA",
        "model": MODEL,
        "backend": "fake",
        "memory_total_bytes": 16 * GIB,
    }


def submit(store: Store) -> tuple[int, int]:
    shot = store.submit(
        spec_from_mapping(
            {
                "name": JOB,
                "layers": [
                    {"name": "render", "command": ["true"], "range": "1-4", "gpus": 1, "retries": 0},
                    {"name": "comp", "command": ["true"], "range": "1-2", "depends": ["render"]},
                ],
            },
            user="alice",
        ),
        now=NOW,
    )
    train = store.submit(
        spec_from_mapping(
            {"name": "train", "layers": [{"name": "fit", "command": ["true"], "range": "1-3", "retries": 0}]},
            user="bob",
        ),
        now=NOW,
    )
    return shot, train


def claim(store: Store, layer: str, *, gpus: list[str], now: float) -> Any:
    [runnable] = [r for r in store.runnable_layers() if r.layer == layer]
    claimed = store.claim_frame(
        runnable.layer_id, host=UP_HOST, worker=f"{UP_HOST}:1", gpu_uuids=gpus, now=now, lease_s=3600.0
    )
    assert claimed is not None
    return claimed


def finish(store: Store, claimed: Any, *, code: int, start: float, end: float) -> None:
    result = FrameResult(exit_code=code, started_at=start, ended_at=end)
    assert store.complete_frame(claimed.frame_id, claimed.attempt, result, now=end) is not None


def make_farm(store: Store) -> dict[str, Any]:
    """Frames: render SUCCEEDED (GPU-a, 30 s), DEAD (GPU-b, 400 s), RUNNING (GPU-a since
    NOW+500), WAITING; comp 2 DEPEND; fit SUCCEEDED (no GPU), EATEN, WAITING.
    Hosts: UP_HOST (4 GPUs, heartbeat NOW+600 with live values for a, b, d) and DOWN_HOST
    (1 GPU, registered at NOW-300 and silent since)."""
    store.register_host(
        HostInfo(
            name=UP_HOST,
            cores=16,
            memory_bytes=64 * GIB,
            gpus=[gpu(0, "GPU-a"), gpu(1, "GPU-b"), gpu(2, "GPU-c"), gpu(3, "GPU-d")],
        ),
        now=NOW,
    )
    store.register_host(HostInfo(name=DOWN_HOST, cores=4, memory_bytes=8 * GIB, gpus=[gpu(0, "GPU-z")]), now=NOW - 300)
    shot, train = submit(store)
    finish(store, claim(store, "render", gpus=["GPU-a"], now=NOW), code=0, start=NOW, end=NOW + 30)
    finish(store, claim(store, "fit", gpus=[], now=NOW + 10), code=0, start=NOW + 10, end=NOW + 20)
    finish(store, claim(store, "render", gpus=["GPU-b"], now=NOW + 40), code=1, start=NOW + 40, end=NOW + 440)
    running = claim(store, "render", gpus=["GPU-a"], now=NOW + 500)
    fit_frames, _ = store.list_frames(job=train, state="WAITING")
    store.frame_action([fit_frames[0]["id"]], "eat", now=NOW + 505)
    live = {
        "at": NOW + 600,
        "devices": [
            {"uuid": "GPU-a", "utilization_pct": 42.0, "memory_used_bytes": 3 * GIB, "memory_free_bytes": 13 * GIB},
            {"uuid": "GPU-b", "utilization_pct": 0.0, "memory_used_bytes": 5 * GIB, "memory_free_bytes": 11 * GIB},
            {"uuid": "GPU-d", "utilization_pct": 0.0, "memory_used_bytes": 0, "memory_free_bytes": 16 * GIB},
        ],
    }
    store.heartbeat(
        UP_HOST,
        [running.frame_id],
        now=NOW + 600,
        lease_s=3600.0,
        live=live,
        attempts={running.frame_id: running.attempt},
    )
    return {"shot": shot, "train": train, "running": running}


@pytest.fixture
def api_lease(tmp_path: Path) -> Iterator[Path]:
    """A real `cuectl.lease()` (kind api) holding GPU-c in a lock directory of its own."""
    fake = tmp_path / "lease-gpus.yaml"
    fake.write_text(yaml.safe_dump({"devices": [{"model": MODEL, "memory": "16G", "uuid": "GPU-c"}]}))
    lock_dir = tmp_path / "lease-locks"
    with cuectl.lease(gpus=1, fake_file=fake, lock_dir=lock_dir, label="notebook"):
        yield lock_dir


def scrape(store: Store, lock_dir: Path, *, now: float = SCRAPE_AT) -> tuple[bytes, str, dict[str, Any]]:
    snap = snapshot(store, lock_dir=lock_dir, now=now, local_leases=True)
    body, content_type = render(store, snapshot=snap)
    return body, content_type, snap


def parse(body: bytes) -> tuple[Samples, dict[str, str]]:
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples, types


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


def lbl(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def device(host: str, uuid: str, index: int) -> dict[str, str]:
    return {"host": host, "uuid": uuid, "index": str(index), "model": MODEL}


# -- tests -------------------------------------------------------------------------------------
def test_frames_queue_and_jobs(store: Store, api_lease: Path) -> None:
    farm = make_farm(store)
    body, content_type, _ = scrape(store, api_lease)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    samples, types = parse(body)
    assert series(samples, "cuectl_frames") == {
        lbl(state="WAITING"): 2,
        lbl(state="DEPEND"): 2,
        lbl(state="RUNNING"): 1,
        lbl(state="SUCCEEDED"): 2,
        lbl(state="DEAD"): 1,
        lbl(state="EATEN"): 1,
    }
    assert series(samples, "cuectl_queue_depth") == {
        lbl(job_id=str(farm["shot"]), job_name=JOB, layer="render"): 1,
        lbl(job_id=str(farm["train"]), job_name="train", layer="fit"): 1,
    }
    assert samples[("cuectl_jobs_active", lbl())] == 2
    assert (types["cuectl_frames"], types["cuectl_queue_depth"], types["cuectl_jobs_active"]) == (
        "gauge",
        "gauge",
        "gauge",
    )


def test_lease_counter_and_histogram(store: Store, api_lease: Path) -> None:
    make_farm(store)
    samples, types = parse(scrape(store, api_lease)[0])
    assert types["cuectl_lease_acquisitions"] == "counter"
    assert types["cuectl_lease_duration_seconds"] == "histogram"
    # two finished attempts with a GPU (30 s, 400 s) and one RUNNING; the CPU-only frame is none
    assert samples[("cuectl_lease_acquisitions_total", lbl())] == 3
    buckets = {dict(labels)["le"]: v for labels, v in series(samples, "cuectl_lease_duration_seconds_bucket").items()}
    assert buckets == {
        "1.0": 0,
        "5.0": 0,
        "15.0": 0,
        "60.0": 1,
        "300.0": 1,
        "900.0": 2,
        "3600.0": 2,
        "14400.0": 2,
        "43200.0": 2,
        "86400.0": 2,
        "+Inf": 2,
    }
    assert len(buckets) == len(LEASE_BUCKETS_S) + 1
    assert samples[("cuectl_lease_duration_seconds_count", lbl())] == 2
    assert samples[("cuectl_lease_duration_seconds_sum", lbl())] == pytest.approx(430.0)
    # the RUNNING frame on GPU-a (since NOW+500) is the host's oldest lease
    assert series(samples, "cuectl_lease_oldest_age_seconds") == {lbl(host=UP_HOST): pytest.approx(110.0)}


def test_devices_hosts_and_holders(store: Store, api_lease: Path) -> None:
    make_farm(store)
    samples, _ = parse(scrape(store, api_lease)[0])
    a, b, c, d = (device(UP_HOST, f"GPU-{x}", i) for i, x in enumerate("abcd"))
    z = device(DOWN_HOST, "GPU-z", 0)
    # GPU-c (no live values in the heartbeat) and GPU-z (a silent host) have no used/utilisation sample
    assert series(samples, "cuectl_gpu_utilization_ratio") == {
        lbl(**a): pytest.approx(0.42),
        lbl(**b): 0.0,
        lbl(**d): 0.0,
    }
    assert series(samples, "cuectl_gpu_memory_used_bytes") == {lbl(**a): 3 * GIB, lbl(**b): 5 * GIB, lbl(**d): 0}
    assert series(samples, "cuectl_gpu_memory_total_bytes") == {lbl(**x): 16 * GIB for x in (a, b, c, d, z)}
    assert series(samples, "cuectl_gpu_held") == {
        lbl(**a, kind="frame"): 1,
        lbl(**b, kind="foreign"): 1,
        lbl(**c, kind="api"): 1,
        lbl(**d, kind=""): 0,
        lbl(**z, kind=""): 0,
    }
    assert series(samples, "cuectl_leases_held") == {
        lbl(kind="frame"): 1,
        lbl(kind="api"): 1,
        lbl(kind="worker"): 0,
        lbl(kind="run"): 0,
        lbl(kind="lease"): 0,
    }
    assert series(samples, "cuectl_host_up") == {lbl(host=UP_HOST): 1, lbl(host=DOWN_HOST): 0}
    assert series(samples, "cuectl_host_heartbeat_age_seconds") == {
        lbl(host=UP_HOST): pytest.approx(10.0),
        lbl(host=DOWN_HOST): pytest.approx(910.0),
    }


def test_gpu_stats(store: Store, api_lease: Path) -> None:
    make_farm(store)
    snap = scrape(store, api_lease)[2]
    # a (frame) and c (api lease) are leased; b is busy with a foreign process; d is free
    # on an UP host; z is free on a DOWN host: each device in exactly one state
    assert gpu_stats(snap, active_jobs=7) == {
        "total": 5,
        "leased": 2,
        "foreign_busy": 1,
        "available": 1,
        "unavailable": 1,
        "active_jobs": 7,
    }
    store.set_host_locked(UP_HOST, True)
    assert gpu_stats(scrape(store, api_lease)[2], active_jobs=2)["available"] == 0
    # without the local lease, c is free too
    assert gpu_stats(scrape(store, api_lease.parent / "no-locks")[2], active_jobs=2) == {
        "total": 5,
        "leased": 1,
        "foreign_busy": 1,
        "available": 0,
        "unavailable": 3,
        "active_jobs": 2,
    }
    store.set_host_locked(UP_HOST, False)
    assert gpu_stats(scrape(store, api_lease.parent / "no-locks")[2], active_jobs=2)["available"] == 2
    samples, _ = parse(scrape(store, api_lease)[0])
    assert series(samples, "cuectl_gpus") == {
        lbl(state="leased"): 2,
        lbl(state="foreign_busy"): 1,
        lbl(state="available"): 1,
        lbl(state="unavailable"): 1,
    }


def test_a_device_two_hosts_list_is_counted_once(store: Store, api_lease: Path) -> None:
    """A host registered again under another name leaves its old row behind (DOWN) with the
    same devices: the farm's device count must not double."""
    make_farm(store)
    store.register_host(
        HostInfo(name="renamed", cores=16, memory_bytes=64 * GIB, gpus=[gpu(0, "GPU-z")]), now=SCRAPE_AT
    )
    stats = gpu_stats(scrape(store, api_lease)[2], active_jobs=0)
    # GPU-z once, from the UP host "renamed" (free there), not from the silent DOWN_HOST
    assert stats == {"total": 5, "leased": 2, "foreign_busy": 1, "available": 2, "unavailable": 0, "active_jobs": 0}


def test_stale_samples_are_not_current(store: Store, api_lease: Path) -> None:
    """Values older than two of the worker's sampling intervals are left out (unknown now),
    the sample's age stays; a stale busy reading makes no device foreign."""
    make_farm(store)
    live = {
        "at": NOW + 600,
        "sample_interval_s": 1.0,
        "devices": [
            {"uuid": "GPU-b", "utilization_pct": 50.0, "memory_used_bytes": 5 * GIB, "sampled_at": NOW + 600},
            {"uuid": "GPU-d", "utilization_pct": 7.0, "memory_used_bytes": 0, "sampled_at": NOW + 609.5},
        ],
    }
    store.heartbeat(UP_HOST, [], now=NOW + 600, lease_s=3600.0, live=live)
    samples, _ = parse(scrape(store, api_lease)[0])  # at NOW + 610: b is 10 s old, d 0.5 s
    b, d = device(UP_HOST, "GPU-b", 1), device(UP_HOST, "GPU-d", 3)
    assert series(samples, "cuectl_gpu_utilization_ratio") == {lbl(**d): pytest.approx(0.07)}
    assert series(samples, "cuectl_gpu_sample_age_seconds") == {
        lbl(**b): pytest.approx(10.0),
        lbl(**d): pytest.approx(0.5),
    }
    held = series(samples, "cuectl_gpu_held")
    assert held[lbl(**b, kind="")] == 0 and held[lbl(**d, kind="foreign")] == 1


def test_user_names_cannot_break_the_format(store: Store, api_lease: Path) -> None:
    make_farm(store)
    text = scrape(store, api_lease)[0].decode()
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*\})? \S+$')
    for line in text.splitlines():
        assert line.startswith("# ") or sample.match(line), f"bad line {line!r}"
    assert 'job_name="shot\\"010\\\\final"' in text
    assert 'host="old\\"node\\\\\\nb"' in text
    samples, _ = parse(text.encode())
    assert samples[("cuectl_host_up", lbl(host=DOWN_HOST))] == 0


def test_empty_store(store: Store, tmp_path: Path) -> None:
    samples, types = parse(scrape(store, tmp_path / "no-locks", now=NOW)[0])
    assert set(series(samples, "cuectl_frames").values()) == {0}
    assert len(series(samples, "cuectl_frames")) == 6
    assert series(samples, "cuectl_queue_depth") == {}
    assert samples[("cuectl_jobs_active", lbl())] == 0
    assert samples[("cuectl_lease_acquisitions_total", lbl())] == 0
    assert set(series(samples, "cuectl_lease_duration_seconds_bucket").values()) == {0}
    assert samples[("cuectl_lease_duration_seconds_sum", lbl())] == 0
    assert series(samples, "cuectl_host_up") == {}
    assert "cuectl_gpu_held" in types and series(samples, "cuectl_gpu_held") == {}


def test_each_call_is_independent(tmp_path: Path) -> None:
    """No global registry: two stores in one process, each scrape shows only its own."""
    import prometheus_client

    one, two = open_store(str(tmp_path / "1" / "s.db")), open_store(str(tmp_path / "2" / "s.db"))
    try:
        submit(one)
        for _ in range(2):  # a second render of the same store registers nothing twice
            samples, _ = parse(scrape(one, tmp_path / "no-locks", now=NOW)[0])
            assert samples[("cuectl_jobs_active", lbl())] == 2
        samples, _ = parse(scrape(two, tmp_path / "no-locks", now=NOW)[0])
        assert samples[("cuectl_jobs_active", lbl())] == 0
    finally:
        one.close()
        two.close()
    assert not any(name.startswith("cuectl_") for name in prometheus_client.REGISTRY._names_to_collectors)


# -- the example alert rules -------------------------------------------------------------------
def test_alert_rules_use_only_emitted_metrics(tmp_path: Path, api_lease: Path) -> None:
    store = open_store(str(tmp_path / "s" / "cuectl.db"))
    try:
        make_farm(store)
        samples, _ = parse(scrape(store, api_lease)[0])
    finally:
        store.close()
    emitted = {name for name, _ in samples}
    rules = yaml.safe_load(ALERTS.read_text())
    [group] = rules["groups"]
    assert group["name"] == "cuectl"
    names = [r["alert"] for r in group["rules"]]
    assert len(names) == len(set(names)) >= 4
    for rule in group["rules"]:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]
        used = set(re.findall(r"\bcuectl_[a-z0-9_]+", rule["expr"]))
        assert used, rule["alert"]
        assert used <= emitted, f"{rule['alert']}: {sorted(used - emitted)} not emitted by render()"
        # label matchers name labels the metric has
        for metric, matchers in re.findall(r"\b(cuectl_[a-z0-9_]+)\{([^}]*)\}", rule["expr"]):
            for label in re.findall(r"([a-z_]+)\s*=", matchers):
                assert any(label in dict(labels) for n, labels in samples if n == metric), (metric, label)
