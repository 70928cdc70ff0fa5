"""The only module that reads the environment (DESIGN §2).

Everything else receives values as arguments; this keeps the library testable and makes
every knob discoverable in one place (documented in docs/environment.md).

Import-light: ``cuectl run``'s quick path (``cuectl.run.quick``) reads its settings here,
and ``pathlib`` (which loads ``re``: ~10 ms of a ~25 ms process) is imported only by the
functions that hand back a ``Path``.
"""

from __future__ import annotations

import os

from cuectl.errors import InvalidInput

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

DEFAULT_FRAME_LIMIT = 100_000


def env(name: str, default: str | None = None) -> str | None:
    """Read one environment variable (for the few library spots that need one)."""
    # ``os.environ.get`` of an unset name raises and catches a KeyError inside: ~3 µs, paid
    # by every ``cuectl.lease()`` for each of the variables it checks. On POSIX this reads
    # the dict ``os.environ`` itself reads and writes (``_data``: file-system-encoded
    # bytes, changed with ``os.environ`` by its every change), as ``os.environ`` would.
    store = getattr(os.environ, "_data", None) if _POSIX else None
    if type(store) is dict:
        raw = store.get(name.encode(_FS_ENCODING, "surrogateescape"))
        return raw.decode(_FS_ENCODING, "surrogateescape") if raw else default
    value = os.environ.get(name)
    return value if value not in (None, "") else default


_POSIX = os.name == "posix"
_FS_ENCODING = __import__("sys").getfilesystemencoding()


def completion_request(var: str = "_CUECTL_COMPLETE") -> str | None:
    """What a shell's completion script asks for (``bash_complete``, ``zsh_complete``,
    ``fish_complete``: click's protocol, docs/completion.md); None for every other run."""
    return env(var)


def state_home() -> Path:
    from pathlib import Path

    xdg = env("XDG_STATE_HOME")
    return Path(xdg) if xdg else Path.home() / ".local" / "state"


def default_db_url() -> str:
    """``CUECTL_DB`` or the per-user SQLite file of DESIGN §3."""
    return env("CUECTL_DB") or str(state_home() / "cuectl" / "cuectl.db")


def log_root(db_path: Path | None) -> Path:
    """Where frame logs go: ``CUECTL_LOG_DIR``, else ``<store file>-logs/`` beside a SQLite
    store (named after it, as SQLite names its ``-wal`` file: two stores in one directory
    would otherwise write into the same ``<job id>/`` files), else the state directory's."""
    from pathlib import Path

    explicit = env("CUECTL_LOG_DIR")
    if explicit:
        return Path(explicit)
    if db_path is not None:
        return db_path.parent / f"{db_path.name}-logs"
    return state_home() / "cuectl" / "logs"


def legacy_log_root(db_path: Path) -> Path | None:
    """``logs/`` beside a SQLite store, where logs went before each store had its own
    (shared by every store of the directory): still read, never written. None when
    ``CUECTL_LOG_DIR`` chooses the log directory."""
    return None if env("CUECTL_LOG_DIR") else db_path.parent / "logs"


def lock_dir() -> Path:
    """Host-local directory of device lease locks, shared by every user of the machine.

    ``/run/cuectl/locks`` when it exists (deploy/systemd/cuectl-tmpfiles.conf provisions
    it): it is local, cleared at boot, and — unlike ``/dev/shm`` — out of reach of
    systemd-logind's RemoveIPC, which deletes a user's files in /dev/shm when their last
    session ends, lock files of still-running work included. Otherwise ``/dev/shm`` (a
    tmpfs: always local, never NFS, cleared at boot), else the temp dir. Whether this user
    may write it does not matter: in a lock directory root made, users only open the lock
    files root makes (docs/leases.md), and falling back to another directory would mean
    locks nobody else sees.
    """
    from pathlib import Path

    found = lock_dir_name()
    return Path(found) if found is not None else default_lock_dirs()[2]


def lock_dir_name() -> str | None:
    """``lock_dir()`` as text, without loading ``pathlib``; None where it is the temp dir's
    (found by probing the filesystem: only ``lock_dir()`` does that)."""
    explicit = env("CUECTL_LOCK_DIR")
    if explicit:
        return explicit
    if os.path.isdir(_PROVISIONED_LOCK_DIR):
        return _PROVISIONED_LOCK_DIR
    if os.path.isdir(os.path.dirname(_SHM_LOCK_DIR)) and os.access(os.path.dirname(_SHM_LOCK_DIR), os.W_OK):
        return _SHM_LOCK_DIR
    return None


# What --help says of the default (keep in step with lock_dir and docs/environment.md).
LOCK_DIR_DEFAULT = "$CUECTL_LOCK_DIR, else /run/cuectl/locks if it exists, else /dev/shm/cuectl-locks"


def default_lock_dirs() -> tuple[Path, Path, Path]:
    """The documented lock directories, in order of preference: the only ones cuectl
    creates by itself (a mistyped CUECTL_LOCK_DIR must not quietly mean separate locks)."""
    import tempfile  # here: importing it costs every command a few ms, and it is seldom needed
    from pathlib import Path

    return Path(_PROVISIONED_LOCK_DIR), Path(_SHM_LOCK_DIR), Path(tempfile.gettempdir()) / "cuectl-locks"


_PROVISIONED_LOCK_DIR = "/run/cuectl/locks"
_SHM_LOCK_DIR = "/dev/shm/cuectl-locks"


def create_lock_dir() -> bool:
    """``CUECTL_CREATE_LOCK_DIR=1``: create a lock directory outside the documented places."""
    return _flag("CUECTL_CREATE_LOCK_DIR")


def lock_dir_registry() -> Path:
    """Where each lock directory used on this machine is noted, so that two in use at once
    can be told apart (a host-local tmpfs, like the locks; ``CUECTL_LOCK_REGISTRY``)."""
    from pathlib import Path

    return Path(lock_dir_registry_name())


def lock_dir_registry_name() -> str:
    """``lock_dir_registry()`` as text, without loading ``pathlib`` (`cuectl run`'s quick path)."""
    explicit = env("CUECTL_LOCK_REGISTRY")
    if explicit:
        return explicit
    if os.path.isdir("/dev/shm"):
        return "/dev/shm/cuectl-lockdirs"
    import tempfile

    return os.path.join(tempfile.gettempdir(), "cuectl-lockdirs")


def run_cache_file() -> str | None:
    """Where ``cuectl run`` keeps what it found out about this host's devices for its next
    run (``cuectl.run.quick``): ``CUECTL_RUN_CACHE`` (``0`` turns the cache off), else
    ``$XDG_RUNTIME_DIR/cuectl-run.cache``, else ``$XDG_CACHE_HOME`` (``~/.cache``)
    ``/cuectl/run.cache``; None when off or there is no home to keep it in."""
    explicit = env("CUECTL_RUN_CACHE")
    if explicit is not None:
        return None if explicit.strip().lower() in ("0", "off", "false", "no") else explicit
    runtime = env("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "cuectl-run.cache")
    home = env("HOME")
    cache = env("XDG_CACHE_HOME") or (os.path.join(home, ".cache") if home else None)
    return os.path.join(cache, "cuectl", "run.cache") if cache else None


def fake_gpus_file() -> str | None:
    return env("CUECTL_FAKE_GPUS")


def _bad(name: str, raw: str, expected: str) -> InvalidInput:
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    return InvalidInput(
        f"{name}={shown!r} is not valid: expected {expected}", hint=f"fix or unset {name} (docs/environment.md)"
    )


def _env_number(name: str, default: float, *, minimum: float, maximum: float, integer: bool = False) -> float:
    """A numeric variable; a bad value is an error naming it, never silently the default."""
    raw = env(name)
    if raw is None:
        return default
    kind, fmt = ("a whole number", ",.0f") if integer else ("a number", "g")
    try:
        value = float(int(raw.strip())) if integer else float(raw.strip())
    except ValueError:
        raise _bad(name, raw, f"{kind} from {minimum:g} to {maximum:{fmt}}") from None
    import math  # here: the quick path of `cuectl run` never reads a number

    if not math.isfinite(value) or not minimum <= value <= maximum:
        raise _bad(name, raw, f"{kind} from {minimum:g} to {maximum:{fmt}}")
    return value


def frame_limit() -> int:
    """Most frames one job may have (``CUECTL_FRAME_LIMIT``, default 100,000)."""
    return int(_env_number("CUECTL_FRAME_LIMIT", DEFAULT_FRAME_LIMIT, minimum=1, maximum=100_000_000, integer=True))


def busy_timeout() -> float:
    """Seconds a SQLite command waits for another process's write lock (default 5)."""
    return _env_number("CUECTL_BUSY_TIMEOUT", 5.0, minimum=0, maximum=86_400)


def kill_grace() -> float:
    """Seconds between TERM and KILL when the worker stops a frame (``CUECTL_KILL_GRACE``, 5)."""
    return _env_number("CUECTL_KILL_GRACE", 5.0, minimum=0, maximum=86_400)


DEFAULT_LOG_LIMIT = 1 << 30
MIN_LOG_LIMIT = 4096


def log_limit() -> int:
    """Bytes each frame attempt's log may keep (``CUECTL_LOG_LIMIT``, a size such as 512M;
    default 1 GiB); ``cuectl worker --log-limit`` and a layer's ``log_limit`` override it."""
    raw = env("CUECTL_LOG_LIMIT")
    if raw is None:
        return DEFAULT_LOG_LIMIT
    from cuectl.units import parse_size

    try:
        value = parse_size(raw.strip(), field="CUECTL_LOG_LIMIT")
    except InvalidInput:
        raise _bad("CUECTL_LOG_LIMIT", raw, "a size such as 512M or 1G (at least 4K)") from None
    if not MIN_LOG_LIMIT <= value <= 2**60:
        raise _bad("CUECTL_LOG_LIMIT", raw, "a size such as 512M or 1G (at least 4K)")
    return value


def auto_migrate() -> bool:
    """Whether opening a PostgreSQL store brings an old schema up to date by itself.

    ``CUECTL_AUTO_MIGRATE=0`` (or false/no/off) turns it off for shared databases whose
    upgrades an admin schedules: an old schema is then an error until someone runs
    ``cuectl admin migrate``. SQLite stores always migrate when opened.
    """
    raw = env("CUECTL_AUTO_MIGRATE")
    if raw is None:
        return True
    word = raw.strip().lower()
    if word not in ("0", "false", "no", "off", "1", "true", "yes", "on"):
        raise _bad("CUECTL_AUTO_MIGRATE", raw, "1/true/yes/on or 0/false/no/off")
    return word in ("1", "true", "yes", "on")


def no_color() -> bool:
    return env("NO_COLOR") is not None


def service_user() -> str | None:
    """``CUECTL_SERVICE_USER``: the account (not root) that owns a shared store and runs its
    ``cuectl serve --socket``; a root worker believes the submit receipts it writes for
    other users (sched/identity.py). Unset: only each user's own receipts prove anything."""
    return env("CUECTL_SERVICE_USER") or None


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
    explicit = env("CUECTL_HOSTNAME")
    if explicit:
        return explicit
    if hasattr(os, "uname"):
        return os.uname().nodename  # what socket.gethostname() returns, without importing socket
    import socket

    return socket.gethostname()


def inherited_environ() -> dict[str, str]:
    """The environment a frame or ``cuectl run`` child starts from."""
    return dict(os.environ)


def submit_environ() -> dict[str, str]:
    """The submitter's environment, of which ``--export`` (spec ``export:``) picks what
    travels with a job."""
    return dict(os.environ)


def submit_cwd() -> str | None:
    """Where ``cuectl submit`` (or ``cuectl.submit``) runs: the frames' default directory,
    as sbatch's. None when it cannot be told (the directory was removed)."""
    try:
        return os.getcwd()
    except OSError:
        return None


def sendmail_path() -> str:
    """The local MTA's sendmail program for email notifications (``CUECTL_SENDMAIL``)."""
    return env("CUECTL_SENDMAIL") or "/usr/sbin/sendmail"


def test_hook() -> str | None:
    """Name of a worker crash point used by the chaos tests (never set by users)."""
    return env("CUECTL_TEST_CRASH_AT")


def take_pg_password() -> str | None:
    """``PGPASSWORD``, taken out of this process's environment for good.

    Deleting it from ``os.environ`` is not enough: ``/proc/PID/environ`` shows the
    environment the process was started with, and a frame running as the worker's user
    could read the password there (``tr '\\0' '\\n' </proc/$PPID/environ``). So the
    original string is overwritten in place before it is unset; the caller keeps the value
    in memory only (libpq gets it as a connection parameter), and this process is made
    undumpable (``cuectl.run.libc.set_undumpable``), so that memory cannot be read either."""
    value = os.environ.get("PGPASSWORD")
    if value is None:
        return None
    # The value stays in this process's memory: no other process of this user (a frame
    # of this worker, say) may read it through /proc/PID/mem or ptrace (issue 35).
    from cuectl.run.libc import set_undumpable

    set_undumpable()
    _wipe_initial_environ(b"PGPASSWORD=")
    del os.environ["PGPASSWORD"]
    return value


def _wipe_initial_environ(prefix: bytes) -> None:
    """Zero the value of every ``prefix…`` entry of the C environment (Linux/glibc, musl)."""
    import ctypes

    try:
        environ = ctypes.POINTER(ctypes.c_void_p).in_dll(ctypes.CDLL(None), "environ")
    except (OSError, ValueError):  # no C environ to reach (not a POSIX libc): nothing shown either
        return
    i = 0
    while environ[i]:
        address = environ[i]
        entry = ctypes.string_at(address)
        if entry.startswith(prefix):
            ctypes.memset(address + len(prefix), 0, len(entry) - len(prefix))
        i += 1


def _flag(name: str) -> bool:
    value = (env(name) or "0").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise InvalidInput(f"{name}={value!r}: expected 1 or 0")
