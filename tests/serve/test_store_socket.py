"""The store protocol behind ``cuectl serve --socket`` (sched/store/remote.py, wire.py,
serve/storecalls.py): every store method classified, values that cross intact, and what a
hostile client sends refused with one clear error. The contract suites run whole on this
backend (tests/sched/conftest.py, "socket"); tests/cli runs both ways; root-only attacks by
real users are in tests/worker/test_shared_socket.py."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import base, remote, wire
from cuectl.sched.store.postgres import PostgresStore
from cuectl.sched.store.sqlite import SQLiteStore

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from conftest import cuectl_cmd  # noqa: E402


def test_every_store_method_is_classified_once() -> None:
    """A new store method is closed to the socket until someone decides who may call it."""
    public = {
        name
        for cls in (SQLiteStore, PostgresStore)
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_") and callable(value)
    }
    unclassified = public - set(remote.CALLS) - remote.LOCAL
    assert not unclassified, f"classify these in remote.CALLS or remote.LOCAL: {sorted(unclassified)}"
    assert not set(remote.CALLS) & remote.LOCAL
    assert set(remote.CALLS) <= public


def test_records_cross_intact() -> None:
    spec = spec_from_mapping(
        {
            "name": "j",
            "notify": [{"on": ["failed"], "webhook": "https://example.invalid/h"}],
            "layers": [
                {
                    "name": "a",
                    "command": ["echo", "#IFRAME#"],
                    "range": "1-5",
                    "chunk": 2,
                    "env": {"K": "v"},
                    "tags": ["gpu"],
                    "limits": ["nuke"],
                },
                {"name": "b", "command": "echo b", "depends": ["a"], "type": "Post"},
            ],
        },
        user="u",
        frame_limit=100,
    )
    values = [
        spec,
        base.HostInfo("h", 2.0, 1 << 30, ({"uuid": "GPU-1", "memory": 1},), ("t",), 7, "1"),
        base.FrameResult(0, usage={"GPU-1": {"util": 1.5}}, permanent=True),
        {1: [("x", 2.5)], "k": frozenset({"a"})},
        float("inf"),
        Path("/x/y"),
        (1, (2, None)),
    ]
    for value in values:
        sent = json.dumps(wire.encode(value))
        assert wire.decode(json.loads(sent), typed=True) == value  # the server's way: checked
        assert wire.loads(sent) == value  # the client's: in one pass of the parser


@pytest.mark.parametrize(
    "body, says",
    [
        ({"__dc": "LayerSpec", "f": {"name": "a", "command": {"__dict": [["x", 1]]}}}, "LayerSpec.command"),
        ({"__dc": "ClaimedFrame", "f": {"frame_id": "1"}}, "ClaimedFrame.frame_id"),
        ({"__dc": "Popen", "f": {}}, "no known kind"),
        ({"__dc": "Notify", "f": {"kind": "command", "target": "x", "shell": True}}, "unknown field 'shell'"),
        ({"__set": [{"__set": []}], "x": 1}, "no known form"),
        ({"__dict": [[[1], 2]]}, "mapping key"),
    ],
)
def test_a_hostile_value_is_refused_with_its_field(body, says) -> None:
    with pytest.raises(InvalidInput) as err:
        wire.decode(body, typed=True)
    assert says in err.value.message


def test_nesting_is_bounded() -> None:
    deep: object = 1
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(InvalidInput, match="nests deeper"):
        wire.decode(deep, typed=True)


def test_the_cli_says_one_line_when_no_server_answers(tmp_path: Path) -> None:
    res = subprocess.run(
        [*cuectl_cmd(), "--db", f"unix:{tmp_path}/none.sock", "job", "list"], capture_output=True, text=True
    )
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.splitlines()[0] == f"error: no store server at {tmp_path}/none.sock (No such file or directory)"
    assert "Traceback" not in res.stderr


def test_serve_refuses_another_servers_socket(tmp_path: Path) -> None:
    res = subprocess.run(
        [*cuectl_cmd(), "--db", f"unix:{tmp_path}/s.sock", "serve", "--socket", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and res.stderr.startswith("error: cuectl serve needs the store itself")


def test_a_call_that_is_not_one_and_bad_arguments(socket_store) -> None:
    from cuectl.errors import NotFound

    with pytest.raises(NotFound, match="no store call 'drop_everything'"):
        socket_store._call("drop_everything", (), {})
    with pytest.raises(InvalidInput, match="get_job"):
        socket_store._call("get_job", (), {"nonsense": 1})
    with pytest.raises(NotFound):  # the store's own error, as the store raised it
        socket_store.get_job(12345)


@pytest.fixture
def socket_store(tmp_path: Path):
    import shutil
    import tempfile

    import storesocket

    from cuectl.sched.store import open_store

    db = tmp_path / "q.db"
    open_store(str(db)).close()
    short = Path(tempfile.mkdtemp(prefix="cs-", dir="/tmp"))
    try:
        with storesocket.serving(str(db), short / "api.sock") as url:
            store = open_store(url)
            yield store
            store.close()
    finally:
        shutil.rmtree(short, ignore_errors=True)
