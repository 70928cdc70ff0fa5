"""Shared fixtures: isolated state per test (store, lock dir, logs), fake GPU files, and an
in-process CLI runner that goes through the same error mapping as the real executable."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the user's store, /dev/shm locks or real GPUs from a test."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("CUECTL_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("CUECTL_CREATE_LOCK_DIR", "1")  # a lock dir per test, outside the default places
    monkeypatch.setenv("CUECTL_LOCK_REGISTRY", str(tmp_path / "lock-registry"))
    # `cuectl run`'s device cache (cuectl.run.quick): per test, so the first run of a test
    # takes the full path and later ones the quick path, as on a user's machine.
    monkeypatch.setenv("CUECTL_RUN_CACHE", str(tmp_path / "run.cache"))
    monkeypatch.delenv("CUECTL_DB", raising=False)
    monkeypatch.delenv("CUECTL_FAKE_GPUS", raising=False)
    monkeypatch.delenv("CUECTL_LOG_DIR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


sys.path.insert(0, str(Path(__file__).resolve().parent))  # osusers.py, pgserver.py

# A suite started in the background by a script (`cmd &`) inherits SIGINT ignored, and so
# would every process it starts: a test that presses Ctrl-C on a child (`frame log --follow`)
# would wait for an exit that never comes. Ctrl-C as a terminal delivers it, then.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def os_users():
    """Real throwaway OS users (tests/osusers.py); root only: skip where not root."""
    import osusers

    if not osusers.ROOT:
        pytest.skip("creating real users and running as them needs root (CI runs as root)")
    users = osusers.Users()
    yield users
    users.cleanup()


# -- PostgreSQL: one real server per test session (tests/pgserver.py), a database per test --
@pytest.fixture(scope="session")
def pg_server():
    import pgserver

    try:
        return pgserver.shared_server()
    except pgserver.PgUnavailable as exc:
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


@pytest.fixture
def pg_url(pg_server):
    """A fresh, empty database on the session's server (isolation per test)."""
    name = pg_server.create_database()
    yield pg_server.url(name)
    pg_server.drop_database(name)


@pytest.fixture(scope="session")
def pg_pooler(pg_server):
    """PgBouncer in transaction mode in front of the session's server (tests/pgpooler.py)."""
    import pgpooler

    try:
        return pgpooler.shared_pooler(pg_server)
    except pgpooler.PoolerUnavailable as exc:
        pytest.skip(f"PgBouncer tests skipped: {exc}")


@pytest.fixture
def pooled_url(pg_server, pg_pooler):
    """A fresh database on the session's server, reached through PgBouncer (pgbouncer=true)."""
    name = pg_server.create_database()
    yield pg_pooler.url(name)
    pg_server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL for a new, empty store of each backend."""
    if request.param == "sqlite":
        return str(tmp_path / "s" / "cuectl.db")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store" / "cuectl.db"


def write_fake_gpus(
    path: Path, devices: list[dict[str, Any]], *, host: str | None = None, state_dir: Path | None = None
) -> Path:
    doc: dict[str, Any] = {"devices": devices}
    if host:
        doc["host"] = host
    if state_dir:
        state_dir.mkdir(parents=True, exist_ok=True)
        doc["state_dir"] = str(state_dir)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def fake_gpus(tmp_path: Path):
    """Factory: ``fake_gpus([{"model": …, "vendor": …, "memory": "16G"}], host="h1")``."""
    counter = {"n": 0}

    def make(devices: list[dict[str, Any]], *, host: str | None = None, state: bool = False) -> Path:
        counter["n"] += 1
        name = f"gpus-{host or counter['n']}.yaml"
        return write_fake_gpus(
            tmp_path / name,
            devices,
            host=host,
            state_dir=(tmp_path / f"gpu-state-{host or counter['n']}") if state else None,
        )

    return make


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.exit_code, self.stdout, self.stderr = code, out, err

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"CliResult(exit={self.exit_code}, out={self.stdout[-500:]!r}, err={self.stderr[-500:]!r})"


@pytest.fixture
def store_way(request: pytest.FixtureRequest) -> str:
    """How the ``cli`` fixture reaches its store: "file" (``--db PATH``), or "socket"
    (``--db unix:...``: the same store behind a real ``cuectl serve --socket``, as the users
    of a shared machine reach a store only its service may write). tests/cli/conftest.py
    runs its tests both ways."""
    return getattr(request, "param", "file")


@pytest.fixture
def cli_db(db_path: Path, store_way: str, tmp_path: Path):
    """The ``--db`` value of the ``cli`` fixture: the store's path, or its socket's URL."""
    if store_way == "file":
        yield str(db_path)
        return
    import storesocket

    with storesocket.new_served_store(db_path) as url:
        yield url


@pytest.fixture
def cli(cli_db: str, capsys: pytest.CaptureFixture[str]):
    """Run ``cuectl --db <tmp store> ARGS`` in-process; returns exit code, stdout, stderr."""
    from cuectl.cli.main import app

    def invoke(*args: str, db: bool = True) -> CliResult:
        argv = (["--db", cli_db] if db else []) + [str(a) for a in args]
        capsys.readouterr()
        try:
            code = app(args=argv, prog_name="cuectl", standalone_mode=False)
        except SystemExit as exc:  # pragma: no cover - typer exits on --help
            code = exc.code if isinstance(exc.code, int) else 0
        captured = capsys.readouterr()
        return CliResult(code or 0, captured.out, captured.err)

    return invoke


def cuectl_cmd() -> list[str]:
    """How tests start the real executable as a subprocess."""
    exe = Path(sys.executable).with_name("cuectl")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


# -- skips cannot hide --------------------------------------------------------------------------
# A test skipped because a tool is missing (PostgreSQL server binaries, root, kubectl,
# systemd-analyze, Chromium) would otherwise pass silently. Every run ends with one line
# counting the skips by reason, and under CI=true a skip fails the run, naming the reasons
# (scripts/test.sh installs what a fresh Debian machine lacks).
def _skip_reasons(config: pytest.Config) -> list[str]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reasons = []
    for report in reporter.stats.get("skipped", []) if reporter else []:
        longrepr = getattr(report, "longrepr", None)
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons.append(str(text).removeprefix("Skipped: "))
    return reasons


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from collections import Counter

    reasons = Counter(_skip_reasons(config))
    if not reasons:
        terminalreporter.write_line("skipped: none")
        return
    listed = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
    terminalreporter.write_line(f"skipped: {sum(reasons.values())} ({listed})")
    if os.environ.get("CI") == "true":
        terminalreporter.write_line(
            "CI=true: a skipped test fails the run: install what the reasons above name "
            "(scripts/test.sh installs chromium, postgresql and systemd with apt-get)"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("CI") == "true" and exitstatus == 0 and _skip_reasons(session.config):
        session.exitstatus = 1
