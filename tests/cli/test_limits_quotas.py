"""`cuectl admin limit|quota`, the submit flags for caps and projects, and `admin report
--by project`, end to end through the CLI on a real SQLite store (the test's user owns the
store file, so it is an admin there)."""

from __future__ import annotations

import pytest
from cliresults import ok as _ok  # tests/cliresults.py (tests/ is on sys.path)
from cliresults import one_error as _one_error
from storedriver import finish_all  # tests/storedriver.py

from cuectl.sched.store import open_store


@pytest.fixture(autouse=True)
def _store(db_path):
    """The store exists (admin commands never create one: a mistyped --db must fail)."""
    db_path.parent.mkdir(parents=True, exist_ok=True)
    open_store(str(db_path)).close()


def test_limit_set_list_delete(cli):
    out = _ok(cli("admin", "limit", "set", "nuke", "3")).stdout
    assert out.strip() == "limit nuke: at most 3 running (0 now, 0 waiting)"
    assert _ok(cli("admin", "limit", "set", "arnold", "10", "--json")).json() == {
        "name": "arnold",
        "max_running": 10,
        "running": 0,
        "waiting": 0,
    }
    _ok(cli("submit", "--name", "lic", "--range", "1-4", "--limit", "nuke", "--", "true"))
    listing = _ok(cli("admin", "limit", "list", "--json")).json()
    assert listing == {
        "limits": [
            {"name": "arnold", "max_running": 10, "running": 0, "waiting": 0},
            {"name": "nuke", "max_running": 3, "running": 0, "waiting": 4},
        ]
    }
    plain = _ok(cli("admin", "limit", "list")).stdout.splitlines()
    assert plain[0].split("\t") == ["NAME", "MAX RUNNING", "RUNNING", "WAITING"]
    assert plain[2].split("\t") == ["nuke", "3", "0", "4"]
    # A limit unfinished frames hold cannot go away (exit 1); an unused one can.
    res = cli("admin", "limit", "delete", "nuke")
    assert res.exit_code == 1 and "held by unfinished frames" in res.stderr, res
    assert _ok(cli("admin", "limit", "delete", "arnold", "--json")).json() == {"name": "arnold", "deleted": True}
    assert [r["name"] for r in cli("admin", "limit", "list", "--json").json()["limits"]] == ["nuke"]
    res = cli("admin", "limit", "delete", "arnold")
    assert res.exit_code == 1 and "no limit 'arnold'" in res.stderr, res


def test_empty_listings(cli):
    assert _ok(cli("admin", "limit", "list", "--json")).json() == {"limits": []}
    assert _ok(cli("admin", "quota", "list", "--json")).json() == {"quotas": []}
    res = _ok(cli("admin", "limit", "list"))
    assert res.stdout == "" and "no limits" in res.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("admin", "limit", "set", "bad name", "3"),
        ("admin", "limit", "set", "nuke", "many"),
        ("admin", "limit", "set", "nuke", "2000000"),
        ("admin", "quota", "set", "group", "x", "--gpus", "1"),
        ("admin", "quota", "set", "user", "ann"),
        ("admin", "quota", "set", "user", "ann", "--gpus", "-1"),
        ("admin", "quota", "set", "user", "ann", "--cores", "-2"),
        ("admin", "quota", "set", "project", "no/slash", "--gpus", "1"),
        ("admin", "quota", "delete", "team", "x"),
        ("submit", "--name", "x", "--limit", "nope", "--", "true"),
        ("submit", "--name", "x", "--max-running", "0", "--", "true"),
        ("submit", "--name", "x", "--max-gpus", "-1", "--", "true"),
        ("submit", "--name", "x", "--max-cores", "0", "--", "true"),
        ("submit", "--name", "x", "--project", "a b", "--", "true"),
        ("submit", "--name", "x", "--retry-delay", "soon", "--", "true"),
    ],
)
def test_bad_input_is_one_error_line_and_changes_nothing(cli, args):
    _ok(cli("admin", "limit", "set", "keep", "1"))
    before = (
        cli("admin", "limit", "list", "--json").json(),
        cli("admin", "quota", "list", "--json").json(),
        cli("job", "list", "--json").json(),
    )
    _one_error(cli(*args))
    after = (
        cli("admin", "limit", "list", "--json").json(),
        cli("admin", "quota", "list", "--json").json(),
        cli("job", "list", "--json").json(),
    )
    assert after == before


def test_quota_set_list_delete(cli):
    out = _ok(cli("admin", "quota", "set", "user", "ann", "--gpus", "4")).stdout
    assert out.strip() == "quota of user ann: at most 4 GPUs running (0 GPUs, 0 cores now)"
    assert _ok(cli("admin", "quota", "set", "project", "show1", "--gpus", "8", "--cores", "16.5", "--json")).json() == {
        "kind": "project",
        "name": "show1",
        "max_gpus": 8,
        "max_cores": 16.5,
        "gpus_in_use": 0,
        "cores_in_use": 0.0,
    }
    # set replaces the quota as a whole: a cap not given is off
    _ok(cli("admin", "quota", "set", "user", "ann", "--cores", "2"))
    quotas = _ok(cli("admin", "quota", "list", "--json")).json()["quotas"]
    assert [(q["kind"], q["name"], q["max_gpus"], q["max_cores"]) for q in quotas] == [
        ("project", "show1", 8, 16.5),
        ("user", "ann", None, 2.0),
    ]
    plain = _ok(cli("admin", "quota", "list")).stdout.splitlines()
    assert plain[0].split("\t") == ["KIND", "NAME", "GPUS", "CORES"]
    assert plain[1].split("\t") == ["project", "show1", "0/8", "0/16.5"]
    assert plain[2].split("\t") == ["user", "ann", "0/-", "0/2"]
    assert _ok(cli("admin", "quota", "delete", "user", "ann", "--json")).json() == {
        "kind": "user",
        "name": "ann",
        "deleted": True,
    }
    res = cli("admin", "quota", "delete", "user", "ann")
    assert res.exit_code == 1 and "no quota for user 'ann'" in res.stderr, res
    assert [q["name"] for q in cli("admin", "quota", "list", "--json").json()["quotas"]] == ["show1"]


def test_non_admins_are_refused(cli, monkeypatch):
    from cuectl.sched.store import Actor
    from cuectl.sched.store.sqlite import SQLiteStore

    _ok(cli("admin", "limit", "set", "nuke", "3"))
    # What the store sees for an account that neither owns the file nor is root.
    monkeypatch.setattr(SQLiteStore, "actor", lambda self: Actor("bob", False))
    for args in (
        ("admin", "limit", "set", "nuke", "30"),
        ("admin", "limit", "delete", "nuke"),
        ("admin", "quota", "set", "user", "bob", "--gpus", "99"),
        ("admin", "quota", "delete", "user", "x"),
    ):
        res = cli(*args)
        assert res.exit_code == 1 and res.stderr.startswith("error: ") and "only an admin" in res.stderr, res
    assert _ok(cli("admin", "limit", "list", "--json")).json()["limits"][0]["max_running"] == 3  # reading is open
    assert _ok(cli("admin", "quota", "list", "--json")).json() == {"quotas": []}


def test_submit_flags_reach_the_job(cli):
    _ok(cli("admin", "limit", "set", "lic", "2"))
    job = _ok(
        cli(
            "submit",
            "--json",
            "--name",
            "caps",
            "--range",
            "1-5",
            "--project",
            "show1",
            "--max-running",
            "3",
            "--max-cores",
            "4.5",
            "--max-gpus",
            "2",
            "--limit",
            "lic",
            "--retry-delay",
            "1m",
            "--",
            "true",
        )
    ).json()
    assert (job["project"], job["max_running"], job["max_cores"], job["max_gpus"]) == ("show1", 3, 4.5, 2)
    layer = job["layers"][0]
    assert (layer["limits"], layer["retry_delay_s"]) == (["lic"], 60.0)


SPEC = """name: fromspec
project: old
max_running: 5
layers:
  - name: a
    command: [echo, '#IFRAME#']
    range: 1-3
"""


def test_job_level_flags_replace_a_specs_own(cli, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    job = _ok(cli("submit", "--json", str(spec), "--project", "new", "--max-gpus", "1")).json()
    assert (job["project"], job["max_running"], job["max_gpus"]) == ("new", 5, 1)
    job = _ok(cli("submit", "--json", str(spec))).json()
    assert (job["project"], job["max_running"], job["max_gpus"]) == ("old", 5, None)
    # Layer settings as flags apply to a one-layer spec, and are refused (naming the flag)
    # for a spec of several layers: they would not say which.
    _ok(cli("admin", "limit", "set", "x", "1"))
    job = _ok(cli("submit", "--json", str(spec), "--limit", "x", "--retry-delay", "5s")).json()
    assert (job["layers"][0]["limits"], job["layers"][0]["retry_delay_s"]) == (["x"], 5.0)
    two = tmp_path / "two.yaml"
    two.write_text(SPEC + "  - name: b\n    command: [true]\n")
    for flags, word in ((["--limit", "x"], "--limit"), (["--retry-delay", "5s"], "--retry-delay")):
        line = _one_error(cli("submit", str(two), *flags))
        assert line.startswith(f"error: {word}: a layer setting, and the spec has 2 layers"), line
    assert _one_error(cli("submit", str(spec), "--max-running", "0")).startswith("error: --max-running:")
    assert len(cli("job", "list", "--json").json()["jobs"]) == 3  # the two above and the --limit one


def test_report_by_project(cli, db_path):
    ids = {
        name: int(_ok(cli("submit", "--name", name, "--range", "1-2", *flags, "--", "true")).stdout)
        for name, flags in (("a", ["--project", "show1"]), ("b", ["--project", "show1"]), ("c", []))
    }
    finish_all(db_path, ago=60)
    assert len(ids) == 3
    data = _ok(cli("admin", "report", "--by", "project", "--since", "1h", "--json")).json()
    assert data["by"] == "project"
    rows = {r["group"]: r for r in data["rows"]}
    assert set(rows) == {"show1", "-"}  # jobs without a project are the group "-"
    assert (rows["show1"]["frames"], rows["-"]["frames"]) == (4, 2)
    assert data["total"]["frames"] == 6
    csv = _ok(cli("admin", "report", "--by", "project", "--since", "1h", "--format", "csv")).stdout
    assert "show1" in csv
    prom = _ok(cli("admin", "report", "--by", "project", "--since", "1h", "--format", "prometheus")).stdout
    assert 'by="project",group="show1"' in prom and 'group="-"' in prom
    table = _ok(cli("admin", "report", "--by", "project", "--since", "1h")).stdout
    assert "show1" in table and "TOTAL" in table
