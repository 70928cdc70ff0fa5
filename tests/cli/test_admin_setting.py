"""`cuectl admin setting list|set` (store settings in the meta table; docs/opencue.md), end
to end through the CLI on a real SQLite store (the test's user owns the file: an admin)."""

from __future__ import annotations

import pytest

from cuectl.sched.store import open_store


@pytest.fixture(autouse=True)
def _store(db_path):
    db_path.parent.mkdir(parents=True, exist_ok=True)
    open_store(str(db_path)).close()


def test_setting_list_and_set(cli):
    res = cli("admin", "setting", "list", "--json")
    assert res.exit_code == 0, res
    rows = res.json()["settings"]
    assert [(r["name"], r["value"], r["default"]) for r in rows] == [("depend.satisfy_on_eaten", False, False)]
    res = cli("admin", "setting", "set", "depend.satisfy_on_eaten", "true")
    assert res.exit_code == 0, res
    assert res.stdout.splitlines()[0].split("\t")[:3] == ["NAME", "VALUE", "DEFAULT"]
    assert res.stdout.splitlines()[-1].split("\t")[:3] == ["depend.satisfy_on_eaten", "true", "false"]
    assert cli("admin", "setting", "list", "--json").json()["settings"][0]["value"] is True
    res = cli("admin", "setting", "set", "depend.nope", "true")
    assert res.exit_code == 2 and "not a store setting" in res.stderr, res
    res = cli("admin", "setting", "set", "depend.satisfy_on_eaten", "perhaps")
    assert res.exit_code == 2 and "not true or false" in res.stderr, res


def test_non_admins_are_refused(cli, monkeypatch):
    from cuectl.sched.store import Actor
    from cuectl.sched.store.sqlite import SQLiteStore

    monkeypatch.setattr(SQLiteStore, "actor", lambda self: Actor("bob", False))
    res = cli("admin", "setting", "set", "depend.satisfy_on_eaten", "true")
    assert res.exit_code == 1 and "only an admin" in res.stderr, res
    assert cli("admin", "setting", "list", "--json").json()["settings"][0]["value"] is False  # reading is open
