"""The shortcuts ``usage_sql.summarise`` takes to stay fast, checked against the plain ways
on both backends: ``--by gpu-model``'s total waits taken from the rows its groups' waits
are read from (and the fallback when some attempt is in no model group), waits read keyed
by job id for the groupings of a job, and the per-list waits of attempts with recorded
models."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

from cuectl.report import percentile
from cuectl.sched import usage_sql
from cuectl.sched.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: the helpers beside this file
from test_usage_sql import WINDOW, add_attempt, add_frames, load, random_farm  # noqa: E402

FIELDS = ("frames", "attempts", "succeeded", "retries", "dead", "gpu_memory_peak_bytes")
FLOATS = ("wall_seconds", "core_seconds", "gpu_seconds_allocated", "gpu_seconds_busy", "util_weighted", "util_weight")


def assert_same(got, want) -> None:
    assert tuple(getattr(got, f) for f in FIELDS) == tuple(getattr(want, f) for f in FIELDS)
    for name in FLOATS:
        assert math.isclose(getattr(got, name), getattr(want, name), rel_tol=1e-9, abs_tol=1e-6), name
    assert got.waits == want.waits


def set_models(store, frame_id: int, text: str) -> None:
    sql = "UPDATE attempts SET gpu_models = ? WHERE frame_id = ?"
    if isinstance(store, SQLiteStore):
        store.conn.execute(sql, (text, frame_id))
    else:
        store._call(lambda conn: conn.execute(sql.replace("?", "%s"), (text, frame_id)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gpu_model_total_is_the_window_total(store, seed):
    load(store, random_farm(random.Random(seed), 40))
    _, window = store.usage_summary(**WINDOW, by=None)
    groups, total = store.usage_summary(**WINDOW, by="gpu-model")
    assert groups and total is not None and window is not None
    assert_same(total, window)


def test_gpu_model_total_when_an_attempt_is_in_no_group(store, monkeypatch):
    # A recorded list without models puts its attempt in no model group (as before); the
    # window's total still counts it: the fallback adds the window up afresh.
    load(store, random_farm(random.Random(4), 20))
    (frame,) = add_frames(store, 1, job="empty")
    add_attempt(
        store,
        frame,
        uuids=("GPU-9",),
        models=("A100",),
        alloc=10.0,
        busy=5.0,
        util=50.0,
        waiting=WINDOW["since"] + 5,
        mem=7,
    )
    set_models(store, frame, json.dumps([]))

    calls: list[str] = []
    read = usage_sql._read_waits

    def counted(fetch, dialect, by, *args):
        calls.append(str(by))
        return read(fetch, dialect, by, *args)

    monkeypatch.setattr(usage_sql, "_read_waits", counted)
    groups, total = store.usage_summary(**WINDOW, by="gpu-model")
    _, window = store.usage_summary(**WINDOW, by=None)
    assert total is not None and window is not None
    assert calls[:2] == ["gpu-model", "None"]  # the window's waits read afresh
    assert_same(total, window)
    assert groups


@pytest.mark.parametrize("by", ["job", "user", "project", "show", "layer", "host", "day", "gpu-model"])
def test_waits_and_without_total(store, by):
    load(store, random_farm(random.Random(9), 50))
    groups, total = store.usage_summary(**WINDOW, by=by)
    bare, none = store.usage_summary(**WINDOW, by=by, with_total=False)
    assert none is None
    assert {g.key: (g.attempts, g.waits) for g in groups} == {g.key: (g.attempts, g.waits) for g in bare}
    _, window = store.usage_summary(**WINDOW, by=None)
    assert total is not None and window is not None
    for g in groups:
        assert g.waits == sorted(g.waits)
    assert [percentile(total.waits, p) for p in (50, 95)] == [percentile(window.waits, p) for p in (50, 95)]
    if by != "gpu-model":  # each attempt in one group: the groups' waits are the window's
        assert sorted(w for g in groups for w in g.waits) == window.waits


def test_duplicate_models_in_a_list_count_the_attempt_once(store):
    (frame,) = add_frames(store, 1)
    add_attempt(
        store,
        frame,
        uuids=("GPU-0", "GPU-1", "GPU-2"),
        models=("A100", "A100", "V100"),
        alloc=30.0,
        busy=15.0,
        util=50.0,
        waiting=WINDOW["since"],
        start=WINDOW["since"] + 4,
    )
    groups, total = store.usage_summary(**WINDOW, by="gpu-model")
    rows = {g.key[0]: g for g in groups}
    assert (rows["A100"].attempts, rows["V100"].attempts, total.attempts) == (1, 1, 1)
    assert (rows["A100"].waits, rows["V100"].waits, total.waits) == ([4.0], [4.0], [4.0])
    assert math.isclose(rows["A100"].gpu_seconds_allocated, 20.0) and math.isclose(total.gpu_seconds_allocated, 30.0)
