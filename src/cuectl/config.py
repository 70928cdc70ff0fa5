"""The only module that reads the environment (DESIGN §2).

Everything else receives values as arguments; this keeps the library testable and makes
every knob discoverable in one place (documented in docs/environment.md).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DEFAULT_FRAME_LIMIT = 100_000


def env(name: str, default: str | None = None) -> str | None:
    """Read one environment variable (for the few library spots that need one)."""
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def state_home() -> Path:
    xdg = env("XDG_STATE_HOME")
    return Path(xdg) if xdg else Path.home() / ".local" / "state"


def default_db_url() -> str:
    """``CUECTL_DB`` or the per-user SQLite file of DESIGN §3."""
    return env("CUECTL_DB") or str(state_home() / "cuectl" / "cuectl.db")


def log_root(db_path: Path | None) -> Path:
    """Where frame logs go: ``CUECTL_LOG_DIR``, else ``logs/`` beside a SQLite store."""
    explicit = env("CUECTL_LOG_DIR")
    if explicit:
        return Path(explicit)
    if db_path is not None:
        return db_path.parent / "logs"
    return state_home() / "cuectl" / "logs"


def lock_dir() -> Path:
    """Host-local directory of device lease locks, shared by every user of the machine.

    ``/run/cuectl/locks`` when it exists (deploy/systemd/cuectl-tmpfiles.conf provisions
    it): it is local, cleared at boot, and — unlike ``/dev/shm`` — out of reach of
    systemd-logind's RemoveIPC, which deletes a user's files in /dev/shm when their last
    session ends, lock files of still-running work included. Otherwise ``/dev/shm`` (a
    tmpfs: always local, never NFS, cleared at boot), else the temp dir.
    """
    explicit = env("CUECTL_LOCK_DIR")
    if explicit:
        return Path(explicit)
    provisioned = Path("/run/cuectl/locks")
    if provisioned.is_dir() and os.access(provisioned, os.W_OK):
        return provisioned
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm / "cuectl-locks"
    return Path(tempfile.gettempdir()) / "cuectl-locks"


def fake_gpus_file() -> str | None:
    return env("CUECTL_FAKE_GPUS")


def frame_limit() -> int:
    raw = env("CUECTL_FRAME_LIMIT")
    try:
        return int(raw) if raw else DEFAULT_FRAME_LIMIT
    except ValueError:
        return DEFAULT_FRAME_LIMIT


def busy_timeout() -> float:
    """Seconds a SQLite command waits for another process's write lock (default 5)."""
    raw = env("CUECTL_BUSY_TIMEOUT")
    try:
        return max(0.0, float(raw)) if raw else 5.0
    except ValueError:
        return 5.0


def auto_migrate() -> bool:
    """Whether opening a PostgreSQL store brings an old schema up to date by itself.

    ``CUECTL_AUTO_MIGRATE=0`` (or false/no/off) turns it off for shared databases whose
    upgrades an admin schedules: an old schema is then an error until someone runs
    ``cuectl admin migrate``. SQLite stores always migrate when opened.
    """
    return (env("CUECTL_AUTO_MIGRATE") or "1").strip().lower() not in ("0", "false", "no", "off")


def no_color() -> bool:
    return env("NO_COLOR") is not None


def current_user() -> str:
    for name in ("CUECTL_USER", "USER", "LOGNAME"):
        value = env(name)
        if value:
            return value
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except Exception:  # no passwd entry (containers with arbitrary uids)
        return str(os.getuid())


def hostname() -> str:
    import socket

    return env("CUECTL_HOSTNAME") or socket.gethostname()


def inherited_environ() -> dict[str, str]:
    """The environment a frame or ``cuectl run`` child starts from."""
    return dict(os.environ)


def test_hook() -> str | None:
    """Name of a worker crash point used by the chaos tests (never set by users)."""
    return env("CUECTL_TEST_CRASH_AT")
