"""The worker package's seams (issue 38): each concern a module of its own and of modest
size, the supervisor driving the worker through its public methods only, every store
offering what ``WorkerStore`` lists, and the dispatch state published as it was."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from cuectl.run import worker as package
from cuectl.run.worker import dispatch, storeview, supervisor

PACKAGE = Path(package.__file__).parent


def test_every_module_stays_well_under_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert {
        "core.py",
        "dispatch.py",
        "proofs.py",
        "running.py",
        "storeview.py",
        "inventory.py",
        "recovery.py",
        "supervisor.py",
    } <= set(sizes)
    assert max(sizes.values()) < 600, sizes


def test_the_supervisor_uses_no_private_name_of_the_worker():
    tree = ast.parse(inspect.getsource(supervisor))
    private = sorted(
        {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("w", "worker")
            and node.attr.startswith("_")
        }
        | {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "worker"
            and node.attr.startswith("_")
        }
    )
    assert private == []


def _protocol_members() -> set[str]:
    names = set(storeview.WorkerStore.__annotations__)
    names |= {n for n, v in vars(storeview.WorkerStore).items() if callable(v) and not n.startswith("_")}
    return names


@pytest.mark.parametrize(
    "module, cls",
    [
        ("cuectl.sched.store.sqlite", "SQLiteStore"),
        ("cuectl.sched.store.postgres", "PostgresStore"),
        ("cuectl.sched.store.remote", "RemoteStore"),
    ],
)
def test_every_store_offers_what_the_worker_calls(module, cls):
    store_class = getattr(pytest.importorskip(module), cls)
    members = _protocol_members()
    assert len(members) >= 20
    missing = sorted(
        n
        for n in members
        if not hasattr(store_class, n)
        and n not in getattr(store_class, "__annotations__", {})
        and not any(n in getattr(b, "__annotations__", {}) for b in store_class.__mro__)
    )
    assert missing == []


def test_the_worker_calls_only_what_the_protocol_lists():
    """Every ``store.X`` the worker's modules call is a member of ``WorkerStore``."""
    members = _protocol_members()
    called = set()
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and (
                (isinstance(node.value, ast.Name) and node.value.id == "store")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "store")
            ):
                called.add(node.attr)
    assert called and called <= members, sorted(called - members)


def test_dispatch_decisions_are_frozen_and_publish_the_same_doc():
    for cls in (dispatch.Reservation, dispatch.DeviceState, dispatch.DispatchState, dispatch.Look):
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    reservation = dispatch.Reservation(
        layer_id=3,
        since=10.0,
        job_id=1,
        job="shot",
        layer="render",
        priority=5,
        needs="2 \u00d7 GPU",
        free=1,
        uuids=("GPU-a",),
        until=1810.0,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        reservation.free = 2  # type: ignore[misc]
    state = dispatch.DispatchState(
        at=12.0,
        accepting=True,
        schedule=None,
        allowed_users=("ada",),
        gpu_only=False,
        run_as_submitter=True,
        cores=4.0,
        cores_free=2.0,
        memory_bytes=8,
        memory_free_bytes=4,
        devices={
            "GPU-a": dispatch.DeviceState("reserved", None, None, 7),
            "GPU-b": dispatch.DeviceState("lease", "cuectl run pid 4 (bob)", None, None),
        },
        reservation=reservation,
    )
    assert state.to_json() == {
        "at": 12.0,
        "accepting": True,
        "schedule": None,
        "allowed_users": ["ada"],
        "gpu_only": False,
        "run_as_submitter": True,
        "cores": 4.0,
        "cores_free": 2.0,
        "memory_bytes": 8,
        "memory_free_bytes": 4,
        "devices": {
            "GPU-a": {"state": "reserved", "holder": None, "frame_id": None, "memory_free_bytes": 7},
            "GPU-b": {
                "state": "lease",
                "holder": "cuectl run pid 4 (bob)",
                "frame_id": None,
                "memory_free_bytes": None,
            },
        },
        "reservation": {
            "layer_id": 3,
            "since": 10.0,
            "job_id": 1,
            "job": "shot",
            "layer": "render",
            "priority": 5,
            "needs": "2 \u00d7 GPU",
            "free": 1,
            "uuids": ["GPU-a"],
            "until": 1810.0,
        },
    }
    assert state.news_key() == (("GPU-b", "lease", "cuectl run pid 4 (bob)"),)
