"""Job names that read as ids: refused at submit (one `error:` line naming the field, exit
2, nothing written), and stores that already hold such names still work — the job is
reachable by its id, and by its name where no job has that id."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from cuectl.sched.spec import spec_from_mapping
from cuectl.sched.store import open_store


def _jobs(db: Path) -> list[tuple[int, str]]:
    conn = sqlite3.connect(db)
    try:
        return [(int(i), str(n)) for i, n in conn.execute("SELECT id, name FROM jobs ORDER BY id")]
    finally:
        conn.close()


def test_submit_refuses_a_numeric_job_name(cli, db_path, tmp_path):
    assert cli("submit", "--name", "shot", "--", "true").exit_code == 0
    before = _jobs(db_path)
    res = cli("submit", "--name", "42", "--", "true")
    assert res.exit_code == 2, res
    [line, *rest] = res.stderr.splitlines()
    assert line.startswith("error: --name: ") and "'42'" in line and "only digits" in line, res.stderr
    assert all(r.startswith("hint:") for r in rest), res.stderr
    spec = tmp_path / "job.yaml"
    spec.write_text('name: "0042"\nlayers: [{name: a, command: ["true"]}]\n')
    res = cli("submit", str(spec))
    assert res.exit_code == 2 and f"error: {spec}: name: a job name must not be only digits" in res.stderr, res
    assert _jobs(db_path) == before, "a refused submit writes nothing"


def test_existing_numeric_names_stay_addressable(cli, db_path):
    store = open_store(str(db_path))
    try:
        for name in ("a", "b", "c"):
            store.submit(
                spec_from_mapping({"name": name, "layers": [{"name": "r", "command": ["true"]}]}, user="u"), now=1.0
            )
    finally:
        store.close()
    # As a store written before the rule could hold them (names are not validated on read).
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("UPDATE jobs SET name = '3' WHERE id = 1")  # shadowed: job 3 exists
        conn.execute("UPDATE jobs SET name = '42' WHERE id = 2")  # no job 42: the name is found
        conn.execute("UPDATE jobs SET name = '²' WHERE id = 3")  # a digit int() cannot read
    conn.close()
    assert cli("job", "show", "3", "--json").json()["name"] == "²"  # 3 is the id
    assert cli("job", "show", "1", "--json").json()["name"] == "3"  # the shadowed job, by its id
    assert cli("job", "show", "42", "--json").json()["id"] == 2
    assert cli("job", "show", "²", "--json").json()["id"] == 3
    assert cli("frame", "list", "--job", "42", "--json").json()["total"] == 1
    assert cli("job", "pause", "²", "--json").json()["paused"] is True
    huge = cli("job", "show", "9" * 30)  # no id is that large: a name, and no job has it
    assert huge.exit_code == 1 and huge.stderr.startswith("error: no job '999"), huge
    missing = cli("job", "show", "٤٢")  # Arabic-Indic 42: a name, and no job has it
    assert missing.exit_code == 1 and missing.stderr.startswith("error: no job '٤٢'"), missing
    listing = cli("job", "list", "--json").json()["jobs"]
    assert [(j["id"], j["name"]) for j in listing] == [(1, "3"), (2, "42"), (3, "²")]
