"""`cuectl admin service set|list|delete`, `submit --service/--show/--shot`, `job list
--show/--shot`, `job show` and `admin report --by show`, end to end through the CLI on a real
SQLite store (the test's user owns the store file, so it is an admin there)."""

from __future__ import annotations

import pytest
from cliresults import ok as _ok  # tests/cliresults.py (tests/ is on sys.path)
from cliresults import one_error as _one_error
from storedriver import finish_all  # tests/storedriver.py

from cuectl.sched.store import open_store

GIB = 1024**3


@pytest.fixture(autouse=True)
def _store(db_path):
    """The store exists (admin commands never create one: a mistyped --db must fail)."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    open_store(str(db_path)).close()


def _services(cli) -> list[dict]:
    return _ok(cli("admin", "service", "list", "--json")).json()["services"]


def test_set_list_update_clear_delete(cli):
    assert _services(cli) == []
    assert "no services" in _ok(cli("admin", "service", "list")).stderr
    out = _ok(
        cli(
            "admin",
            "service",
            "set",
            "render",
            "--cores",
            "4",
            "--memory",
            "8G",
            "--tags",
            "linux,fast",
            "--timeout",
            "2h",
        )
    ).stdout
    assert out.startswith("service render: cores 4, memory 8") and "tags linux,fast" in out and "timeout" in out
    row = _ok(
        cli("admin", "service", "set", "cuda", "--gpus", "2", "--gpu-memory", "24G", "--gpu-cuda-min", "12.2", "--json")
    ).json()
    assert row == {
        "name": "cuda",
        "cores": None,
        "memory_bytes": None,
        "gpus": 2,
        "gpu_memory_min_bytes": 24 * GIB,
        "tags": None,
        "timeout_s": None,
        "gpu_capability_min": None,
        "gpu_driver_min": None,
        "gpu_cuda_min": "12.2",
    }
    # An update keeps what it does not name; `none` clears a field.
    row = _ok(cli("admin", "service", "set", "render", "--cores", "8", "--timeout", "none", "--json")).json()
    assert (row["cores"], row["memory_bytes"], row["tags"], row["timeout_s"]) == (8.0, 8 * GIB, ["linux", "fast"], None)
    assert [s["name"] for s in _services(cli)] == ["cuda", "render"]
    table = _ok(cli("admin", "service", "list")).stdout.splitlines()
    assert table[0].split() == ["NAME", "CORES", "MEMORY", "GPUS", "GPU", "MEMORY", "TAGS", "TIMEOUT"]
    assert table[1].split()[:2] == ["cuda", "-"] and table[2].split()[:2] == ["render", "8"]
    assert _ok(cli("admin", "service", "delete", "cuda", "--json")).json() == {"name": "cuda", "deleted": True}
    res = cli("admin", "service", "delete", "cuda")
    assert res.exit_code == 1 and "error: no service 'cuda'" in res.stderr, res
    assert [s["name"] for s in _services(cli)] == ["render"]


@pytest.mark.parametrize(
    "args,start",
    [
        (("bad/name", "--cores", "1"), "error: NAME: invalid service name"),
        (("render", "--cores", "lots"), "error: --cores: expected a number"),
        (("render", "--cores", "0"), "error: --cores: must be more than 0"),
        (("render", "--gpus", "-1"), "error: --gpus: must be 0 or more"),
        (("render", "--gpus", "1.5"), "error: --gpus: expected a whole number"),
        (("render", "--memory", "8Q"), "error: --memory"),
        (("render", "--gpu-memory", "big"), "error: --gpu-memory"),
        (("render", "--tags", "a b"), "error: --tags"),
        (("render", "--timeout", "soon"), "error: --timeout"),
        (("render", "--timeout", "0"), "error: --timeout: must be more than 0"),
    ],
)
def test_bad_input_is_one_error_line_and_changes_nothing(cli, args, start):
    _ok(cli("admin", "service", "set", "render", "--cores", "2"))
    before = _services(cli)
    line = _one_error(cli("admin", "service", "set", *args))
    assert line.startswith(start), line
    assert _services(cli) == before


def test_non_admins_are_refused(cli, monkeypatch):
    from cuectl.sched.store import Actor
    from cuectl.sched.store.sqlite import SQLiteStore

    _ok(cli("admin", "service", "set", "render", "--cores", "2"))
    monkeypatch.setattr(SQLiteStore, "actor", lambda self: Actor("bob", False))
    for args in (("set", "render", "--cores", "64"), ("set", "mine"), ("delete", "render")):
        res = cli("admin", "service", *args)
        assert res.exit_code == 1 and res.stderr.startswith("error: ") and "only an admin" in res.stderr, res
    assert [(s["name"], s["cores"]) for s in _services(cli)] == [("render", 2.0)]  # reading is open


def test_submitted_layers_take_the_service_and_their_own_values_win(cli, tmp_path):
    _ok(
        cli("admin", "service", "set", "render", "--cores", "4", "--memory", "8G", "--tags", "linux", "--timeout", "1h")
    )
    _ok(cli("admin", "service", "set", "cuda", "--gpus", "1", "--gpu-memory", "16G"))
    job = _ok(cli("submit", "--json", "--name", "f", "--service", "render", "--cores", "2", "--", "true")).json()
    one = job["layers"][0]
    assert (one["cores"], one["memory_bytes"], one["tags"], one["timeout_s"]) == (2.0, 8 * GIB, ["linux"], 3600.0)
    job = _ok(cli("submit", "--json", "--name", "g", "--service", "cuda", "--", "true")).json()
    assert (job["layers"][0]["gpus"], job["layers"][0]["gpu_memory_min_bytes"]) == (1, 16 * GIB)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: y\nlayers:\n"
        "  - {name: a, command: ['true'], service: render}\n"
        "  - {name: b, command: ['true'], service: render, memory: 1G, tags: [mac], timeout: 5m}\n"
        "  - {name: c, command: ['true'], service: cuda, gpus: 2}\n"
    )
    job = _ok(cli("submit", "--json", str(spec))).json()
    got = [
        (x["cores"], x["memory_bytes"], x["gpus"], x["gpu_memory_min_bytes"], x["tags"], x["timeout_s"])
        for x in job["layers"]
    ]
    assert got == [
        (4.0, 8 * GIB, 0, 0, ["linux"], 3600.0),
        (4.0, GIB, 0, 0, ["mac"], 300.0),
        (1.0, 0, 2, 16 * GIB, [], None),
    ]
    # The flag overrides a one-layer spec's service, as other layer flags do.
    one = tmp_path / "one.yaml"
    one.write_text("name: o\nlayers:\n  - {name: a, command: ['true'], service: render}\n")
    job = _ok(cli("submit", "--json", str(one), "--service", "cuda")).json()
    assert (job["layers"][0]["gpus"], job["layers"][0]["cores"]) == (1, 1.0)


def test_unknown_service_is_one_error_and_submits_nothing(cli, tmp_path):
    _ok(cli("admin", "service", "set", "render", "--cores", "4"))
    line = _one_error(cli("submit", "--name", "f", "--service", "rendr", "--", "true"))
    assert "service: no service 'rendr'" in line, line
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: y\nlayers:\n  - {name: a, command: ['true'], service: render}\n"
        "  - {name: b, command: ['true'], service: nope}\n"
    )
    assert "layer b: service: no service 'nope'" in _one_error(cli("submit", str(spec)))
    assert _one_error(cli("submit", "--name", "f", "--service", "bad name", "--", "true")).startswith(
        "error: --service: invalid service name"
    )
    assert cli("job", "list", "--json").json()["jobs"] == []


def test_default_service(cli, tmp_path):
    _ok(cli("admin", "service", "set", "default", "--cores", "2", "--memory", "2G"))
    _ok(cli("admin", "service", "set", "big", "--memory", "64G"))
    job = _ok(cli("submit", "--json", "--name", "d", "--", "true")).json()
    assert (job["layers"][0]["cores"], job["layers"][0]["memory_bytes"]) == (2.0, 2 * GIB)
    job = _ok(cli("submit", "--json", "--name", "e", "--service", "big", "--", "true")).json()
    assert (job["layers"][0]["cores"], job["layers"][0]["memory_bytes"]) == (1.0, 64 * GIB)
    job = _ok(cli("submit", "--json", "--name", "e", "--memory", "1G", "--", "true")).json()
    assert (job["layers"][0]["cores"], job["layers"][0]["memory_bytes"]) == (2.0, GIB)
    _ok(cli("admin", "service", "delete", "default"))
    job = _ok(cli("submit", "--json", "--name", "f", "--", "true")).json()
    assert (job["layers"][0]["cores"], job["layers"][0]["memory_bytes"]) == (1.0, 0)


def test_show_shot_flags_job_show_and_list_filter(cli, tmp_path):
    a = _ok(cli("submit", "--json", "--name", "a", "--show", "fx", "--shot", "sh010", "--", "true")).json()
    assert (a["show"], a["shot"]) == ("fx", "sh010")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: b\nshow: fx\nshot: sh020\nlayers:\n  - {name: a, command: ['true']}\n")
    b = _ok(cli("submit", "--json", str(spec))).json()
    c = _ok(cli("submit", "--json", str(spec), "--show", "anim")).json()  # the flag replaces the spec's show
    assert [(j["show"], j["shot"]) for j in (b, c)] == [("fx", "sh020"), ("anim", "sh020")]
    d = _ok(cli("submit", "--json", "--name", "d", "--", "true")).json()
    assert (d["show"], d["shot"]) == (None, None)

    def ids(*flags):
        return [j["id"] for j in _ok(cli("job", "list", "--json", *flags)).json()["jobs"]]

    assert ids("--show", "fx") == [a["id"], b["id"]]
    assert ids("--shot", "sh020") == [b["id"], c["id"]]
    assert ids("--show", "fx", "--shot", "sh020") == [b["id"]]
    assert ids("--show", "nope") == []
    assert len(ids()) == 4
    shown = _ok(cli("job", "show", str(a["id"]))).stdout
    assert any(line.split() == ["show", "fx"] for line in shown.splitlines()), shown
    assert any(line.split() == ["shot", "sh010"] for line in shown.splitlines()), shown
    assert "show" not in _ok(cli("job", "show", str(d["id"]))).stdout.split()
    assert _one_error(cli("submit", "--name", "x", "--show", "a b", "--", "true")).startswith(
        "error: --show: invalid show name"
    )


def test_report_by_show(cli, db_path):
    for name, flags in (("a", ["--show", "fx"]), ("b", ["--show", "fx"]), ("c", [])):
        _ok(cli("submit", "--name", name, "--range", "1-2", *flags, "--", "true"))
    finish_all(db_path, ago=60)
    data = _ok(cli("admin", "report", "--by", "show", "--since", "1h", "--json")).json()
    assert data["by"] == "show"
    rows = {r["group"]: r["frames"] for r in data["rows"]}
    assert rows == {"fx": 4, "-": 2}  # jobs without a show are the group "-"
    prom = _ok(cli("admin", "report", "--by", "show", "--since", "1h", "--format", "prometheus")).stdout
    assert 'by="show",group="fx"' in prom and 'group="-"' in prom
    table = _ok(cli("admin", "report", "--by", "show", "--since", "1h")).stdout
    assert "fx" in table and "TOTAL" in table
