"""Frames addressed by name wherever a frame id is taken (issue 41, section 4):
``JOB/FRAME`` — the job's id or unique name, ``/``, the frame's name as ``job show`` and
``frame list`` print it (``sweep2/0003-main``). Resolved by the store (``Store.frame_id``),
so the CLI and any other client read names by one rule. A real SQLite store; `frame log`
reads a log a real worker wrote."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from cuectl.errors import Conflict, InvalidInput, NotFound
from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store

sys.path.append(str(Path(__file__).resolve().parent.parent / "worker"))  # (last: conftest stays tests/conftest.py)

from farmlib import Farm  # noqa: E402

NOW = time.time()


def submit(db: Path, name: str, layers: list[dict]) -> int:
    store = open_store(str(db))
    try:
        return store.submit(spec_from_mapping({"name": name, "layers": layers}, user="alice"), now=NOW)
    finally:
        store.close()


def frames(cli, job: int) -> dict[str, int]:
    listed = cli("frame", "list", "--job", str(job), "--json").json()["frames"]
    return {f["name"]: f["id"] for f in listed}


@pytest.fixture
def sweep(cli, db_path) -> tuple[int, dict[str, int]]:
    submit(db_path, "other", [{"name": "main", "command": ["true"], "range": "1-4"}])  # the same frame names
    job = submit(
        db_path,
        "sweep2",
        [{"name": "main", "command": ["true"], "range": "1-4"}, {"name": "comp", "command": ["true"], "range": "3-4"}],
    )
    return job, frames(cli, job)


@pytest.mark.parametrize("ref", ["sweep2/0003-main", "{job}/0003-main", "sweep2/3-main", " sweep2/0003-main "])
def test_frame_show_by_name(cli, sweep, ref):
    job, ids = sweep
    res = cli("frame", "show", ref.format(job=job), "--json")
    assert res.exit_code == 0, res
    assert res.json()["id"] == ids["0003-main"] and res.json()["job_id"] == job


def test_the_number_alone_where_one_layer_has_it(cli, sweep):
    _, ids = sweep
    assert cli("frame", "show", "sweep2/1", "--json").json()["id"] == ids["0001-main"]
    res = cli("frame", "show", "sweep2/3")  # main and comp both have frame 3
    assert res.exit_code == 1 and "sweep2/0003-main, sweep2/0003-comp" in res.stderr, res


def test_an_id_is_still_an_id(cli, sweep):
    _, ids = sweep
    assert cli("frame", "show", str(ids["0002-main"]), "--json").json()["name"] == "0002-main"


def test_kill_retry_eat_by_name(cli, sweep):
    job, ids = sweep
    res = cli("frame", "kill", "sweep2/0001-main", f"{job}/0004-comp", "--json")
    assert res.exit_code == 0, res
    assert [(f["id"], f["state"]) for f in res.json()["frames"]] == [
        (ids["0001-main"], "DEAD"),
        (ids["0004-comp"], "DEAD"),
    ]
    assert cli("frame", "retry", "sweep2/0001-main", "--json").json()["frames"][0]["state"] == "WAITING"
    assert cli("frame", "eat", "sweep2/0002-main", "--json").json()["frames"][0]["state"] == "EATEN"


def test_a_bad_name_changes_nothing(cli, sweep):
    job, _ = sweep
    res = cli("frame", "kill", "sweep2/0001-main", "sweep2/0009-main")
    assert res.exit_code == 1 and "job" in res.stderr and "no frame '0009-main'" in res.stderr, res
    assert cli("job", "show", str(job), "--json").json()["frame_counts"] == {"WAITING": 6}


@pytest.mark.parametrize(
    "ref,error",
    [
        ("sweep2", InvalidInput),
        ("sweep2/", InvalidInput),
        ("/0001-main", InvalidInput),
        ("sweep2/main", InvalidInput),
        ("nope/0001-main", NotFound),
        ("sweep2/0001-render", NotFound),
        ("sweep2/3", Conflict),
        ("sweep2/99999999999999999999-main", NotFound),
        ("sweep2/-99999999999999999999", NotFound),
    ],
)
def test_store_frame_id_refusals(db_path, sweep, ref, error):
    store = open_store(str(db_path))
    try:
        with pytest.raises(error):
            store.frame_id(ref)
    finally:
        store.close()


def test_a_job_name_with_a_slash(cli, db_path):
    job = submit(db_path, "shots/sq010", [{"name": "main", "command": ["true"], "range": "1"}])
    res = cli("frame", "show", "shots/sq010/0001-main", "--json")
    assert res.exit_code == 0 and res.json()["job_id"] == job, res


def test_bad_form_is_exit_2(cli, sweep):
    res = cli("frame", "log", "sweep2")
    assert res.exit_code == 2 and res.stderr.startswith("error: frame 'sweep2': expected a frame id or JOB/FRAME"), res


def test_frame_log_by_name_of_a_frame_a_worker_ran(tmp_path):
    farm = Farm(tmp_path)
    try:
        farm.submit(
            {
                "name": "sweep2",
                "layers": [{"name": "main", "range": "1-3", "command": ["sh", "-c", "echo frame #IFRAME# here"]}],
            }
        )
        farm.run_worker(None)
        res = farm.cuectl("frame", "log", "sweep2/0003-main")
        assert "frame 3 here" in res.stdout and "frame 2 here" not in res.stdout, res
    finally:
        farm.cleanup()


def test_frame_log_of_a_frame_not_run_yet_says_so(cli, sweep):
    res = cli("frame", "log", "sweep2/0001-main")
    assert res.exit_code == 1, res
    assert "has not run yet (WAITING): it has no log" in res.stderr and "--attempt" not in res.stderr


def test_completion_offers_frame_names_after_the_job(db_path, sweep):
    from cli.test_completion import complete, values

    job, _ = sweep
    assert values("bash", complete("bash", "cuectl frame log sweep2/000", db=db_path).stdout) == [
        "sweep2/0001-main",
        "sweep2/0002-main",
        "sweep2/0003-main",
        "sweep2/0004-main",
        "sweep2/0003-comp",
        "sweep2/0004-comp",
    ]
    assert values("bash", complete("bash", f"cuectl frame kill {job}/0004-c", db=db_path).stdout) == [
        f"{job}/0004-comp"
    ]
    assert values("bash", complete("bash", "cuectl frame show nope/0", db=db_path).stdout) == []
