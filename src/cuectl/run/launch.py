"""Frame launch: command tokens, the frame environment, and one supervised frame process.

This is what the worker uses to turn a claimed frame into a running process (DESIGN §4,
§5 "Leases", "Failure", "Kill"):

* :func:`substitute_tokens` replaces ``#IFRAME#``-style tokens in a layer's command.
* :func:`frame_env` builds the environment: inherited < layer env < ``CUE_*`` < isolation
  (:func:`env_template`: all of it but the frame's own values, which a layer's frames share).
* :class:`FrameProcess` spawns the frame in its own session (so its process group is ours to
  kill as a whole), appends stdout+stderr to the frame log, enforces the timeout by TERMing
  the group and KILLing it after a grace period, and reports exit status, peak RSS and CPU
  time.

POSIX only (Linux and macOS); Windows is not supported by the worker.

Escapees (no cgroups here): a descendant that calls ``setsid()`` or moves itself to another
process group *and* leaves the frame's process tree (double fork) is re-parented to the
worker, which is a child subreaper on Linux (:func:`become_subreaper`). When the frame's
leader has exited, such processes are found among the worker's children — by the frame's
session or group, ``CUE_FRAME_ID`` in their environment, or a lease file of the frame held
open — and put down with the group, then reaped. Limit: one that also wiped its
environment and closed the lease fds is not recognised (it no longer holds the device);
without a subreaper (macOS) escapees are not found at all.
"""

from __future__ import annotations

import errno
import math
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from cuectl import config
from cuectl.errors import InvalidInput
from cuectl.run import spawn
from cuectl.run.subreaper import own_children, set_child_subreaper
from cuectl.units import iso

__all__ = [
    "CannotEnter",
    "DEFAULT_GRACE_S",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "EnvTemplate",
    "ExitInfo",
    "FrameContext",
    "RunAs",
    "FrameProcess",
    "env_template",
    "frame_env",
    "frame_name",
    "kill_process_group",
    "log_header",
    "process_group_alive",
    "substitute_tokens",
]

DEFAULT_GRACE_S = 5.0
DEFAULT_SAMPLE_INTERVAL_S = 1.0
# Shell conventions, so a frame that could not start reads like one that `sh` failed to run.
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXECUTE = 126
LOG_FILE_MODE = 0o640  # DESIGN §3: logs readable by owner and group, never the world
LOG_DIR_MODE = 0o750
ROOT_LOG_DIR_MODE = 0o711  # a root worker's top log directory: users pass through, never list
# After SIGKILL, a process in uninterruptible sleep (hung NFS, a wedged driver) can linger.
# Stop waiting for such stragglers eventually so one stuck process cannot hang the worker.
_STRAGGLER_GIVE_UP_S = 10.0
_WAIT_MIN_SLEEP_S = 0.01
_WAIT_MAX_SLEEP_S = 0.1


# --------------------------------------------------------------------------------------
# Frame context, tokens, environment
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FrameContext:
    """Everything about one frame attempt that ends up in its command line or environment."""

    job: str
    job_id: str
    layer: str
    layer_id: str
    frame_id: str
    frame_number: int  # first frame of the chunk
    frames: tuple[int, ...]  # the chunk's frames, in dispatch order
    layer_range: str
    chunk: int
    attempt: int  # 1-based
    cores: float
    memory_bytes: int
    # Per-device memory granted (each granted device's total, or the request): CUE_GPU_MEMORY.
    gpu_memory_bytes: int | None
    log_path: Path
    # The job's (proven) owner: CUE_USER. Empty only for a context built without a job.
    user: str = ""
    # The job's show and shot (CUE_SHOW, CUE_SHOT); empty when the job has none.
    show: str = ""
    shot: str = ""

    @property
    def chunk_frames(self) -> tuple[int, ...]:
        # A context built without ``frames`` still describes a one-frame chunk.
        return self.frames or (self.frame_number,)

    @property
    def name(self) -> str:
        return frame_name(self.frame_number, self.layer)


def frame_name(number: int, layer: str) -> str:
    """OpenCue's frame name, ``<number zero-padded to 4>-<layer>`` (``0001-render``)."""
    return f"{_zpad(number)}-{layer}"


def _zpad(number: int) -> str:
    # f"{n:04d}": 7 -> "0007", 12345 -> "12345", and -1 -> "-001" (the sign counts in the width,
    # as in Python/C printf; OpenCue's Java String.format("%04d") gives the same).
    return f"{number:04d}"


# Every token Cuebot's DispatchSupportService.prepareRqdRunFrame replaces, and no others
# (OpenCue has no #USER#, #SHOW#, #LOGDIR# or id tokens; the CUE_* variables carry those).
_TOKEN_RE = re.compile(r"#(IFRAME|FRAME|ZFRAME|FRAME_START|FRAME_END|FRAME_CHUNK|FRAMESPEC|LAYER|JOB)#")


def _token_values(ctx: FrameContext, needed: set[str]) -> dict[str, str]:
    frames = ctx.chunk_frames
    values = {
        "IFRAME": str(ctx.frame_number),
        "FRAME": ctx.name,  # the frame's name, 0001-render (as OpenCue)
        "ZFRAME": _zpad(ctx.frame_number),
        "FRAME_START": str(frames[0]),
        "FRAME_END": str(frames[-1]),
        "FRAME_CHUNK": str(ctx.chunk),
        "LAYER": ctx.layer,
        "JOB": ctx.job,
    }
    if "FRAMESPEC" in needed:
        # Lazy: only commands that use the token pay for (and depend on) the frameset module.
        from cuectl.sched.frameset import compact_range

        values["FRAMESPEC"] = compact_range(list(frames))
    return values


def substitute_tokens(command: Sequence[str] | str, ctx: FrameContext) -> list[str]:
    """Replace command tokens and return the argv to execute.

    * argv list: each element has its tokens replaced; no shell is involved, so values need
      no quoting and a hostile job name is just bytes in one argument.
    * shell string: the text runs as ``["/bin/sh", "-c", text]``. A value made only of
      characters no shell treats specially (``[A-Za-z0-9_@%+=:,./-]``: frame numbers, frame
      specs, layer names, most job names) is put in as is. Any other value — only ``#JOB#``
      (and ``#LAYER#``/``#FRAME#`` from a tampered store) can be one — never enters the
      text: the token becomes a reference to the frame variable holding it (``CUE_JOB``,
      ``CUE_LAYER``, ``CUE_FRAME``, set by :func:`frame_env`), quoted to suit where it stands: ``"${CUE_JOB}"`` outside
      quotes, ``${CUE_JOB}`` inside double quotes, ``'"${CUE_JOB}"'`` inside single quotes.
      Each expands to exactly the value, as one word, and the shell never parses a
      variable's value as code — so whatever the name contains, and even where the quoting
      of the user's string is misjudged (here-documents, ``eval``), it can never run code;
      it can at worst read as the reference text. The command must run with the frame's
      environment (the worker always does).

    Tokens (OpenCue's set, as Cuebot's ``prepareRqdRunFrame`` fills them): ``#IFRAME#`` frame
    number; ``#ZFRAME#`` the number zero-padded to 4 (``-1`` -> ``-001``); ``#FRAME#`` the
    frame's name (``0001-render``); ``#FRAME_START#``/``#FRAME_END#`` first/last frame of the
    chunk; ``#FRAME_CHUNK#`` the layer's chunk size; ``#FRAMESPEC#`` the chunk as a compact
    range; ``#LAYER#``; ``#JOB#``. Replacement is a
    single pass, so a name that itself contains ``#FRAME#`` is not expanded again. Unknown
    ``#WORDS#`` are left alone.
    """
    if isinstance(command, str):
        text = command
        if not text.strip():
            raise InvalidInput("command: empty shell command")
        return ["/bin/sh", "-c", _replace_shell(text, ctx)]
    argv = list(command)
    if not argv:
        raise InvalidInput("command: empty argv")
    if not all(isinstance(arg, str) for arg in argv):
        raise InvalidInput("command: every argv element must be a string")
    return [_replace(arg, ctx) for arg in argv]


def _replace(text: str, ctx: FrameContext) -> str:
    needed = set(_TOKEN_RE.findall(text))
    if not needed:
        return text
    values = _token_values(ctx, needed)
    return _TOKEN_RE.sub(lambda m: values[m.group(1)], text)


# Tokens whose value may need more than plain characters, and the frame variable carrying it.
_TOKEN_VARS = {"JOB": "CUE_JOB", "LAYER": "CUE_LAYER", "FRAME": "CUE_FRAME"}
_PLAIN_RE = re.compile(r"[A-Za-z0-9_@%+=:,./-]*", re.ASCII)
_UNQUOTED, _SINGLE, _DOUBLE = "unquoted", "single", "double"
_WORD_BREAKS = " \t\n;&|()<>"


def _replace_shell(text: str, ctx: FrameContext) -> str:
    matches = list(_TOKEN_RE.finditer(text))
    if not matches:
        return text
    values = _token_values(ctx, {m.group(1) for m in matches})
    contexts = _quoting_at(text, {m.start() for m in matches})
    out, last = [], 0
    for m in matches:
        token, value = m.group(1), values[m.group(1)]
        out.append(text[last:m.start()])
        if _PLAIN_RE.fullmatch(value):
            out.append(value)
        else:
            var = _TOKEN_VARS.get(token)
            if var is None:  # numbers and frame specs are always plain
                raise InvalidInput(f"command: token #{token}# has an unexpected value {value!r}")
            quoting = contexts.get(m.start(), _UNQUOTED)
            out.append({_UNQUOTED: f'"${{{var}}}"', _DOUBLE: f"${{{var}}}",
                        _SINGLE: f"'\"${{{var}}}\"'"}[quoting])
        last = m.end()
    out.append(text[last:])
    return "".join(out)


def _quoting_at(text: str, positions: set[int]) -> dict[int, str]:
    """The POSIX shell quoting in force at each of ``positions`` of ``text``.

    A small lexer: backslash escapes, '…', "…", ``$( … )``, backticks and ``${ … }``
    (each nesting its own quoting), and ``#`` comments. Here-documents and ``case``
    patterns are not understood; a misjudgement there only changes how a token reads,
    never what runs (see :func:`substitute_tokens`).
    """
    found: dict[int, str] = {}
    # Stack of open constructs: "'" single, '"' double, "(" command substitution (with
    # its paren depth), "`" backticks, "{" parameter expansion (quoted like its parent).
    stack: list[list] = []
    i, n = 0, len(text)

    def quoting() -> str:
        for kind, _ in reversed(stack):
            if kind == "'":
                return _SINGLE
            if kind == '"':
                return _DOUBLE
            if kind in "(`":
                return _UNQUOTED
        return _UNQUOTED

    while i < n:
        if i in positions:
            found[i] = quoting()
            i += 1
            continue
        c = text[i]
        top = stack[-1][0] if stack else None
        if top == "'":
            if c == "'":
                stack.pop()
            i += 1
            continue
        in_double = quoting() == _DOUBLE
        if c == "\\":
            i += 2
            continue
        if c == "$" and text.startswith("$(", i):
            stack.append(["(", 0])
            i += 2
            continue
        if c == "$" and text.startswith("${", i):
            stack.append(["{", 0])
            i += 2
            continue
        if c == "`":
            if top == "`":
                stack.pop()
            else:
                stack.append(["`", 0])
            i += 1
            continue
        if top == "{" and c == "}":
            stack.pop()
            i += 1
            continue
        if in_double:
            if c == '"':
                while stack and stack[-1][0] != '"':  # an unclosed ${ inside "…" ends with it
                    stack.pop()
                if stack:
                    stack.pop()
            i += 1
            continue
        if c == "'":
            stack.append(["'", 0])
        elif c == '"':
            stack.append(['"', 0])
        elif top == "(" and c == "(":
            stack[-1][1] += 1
        elif top == "(" and c == ")":
            if stack[-1][1]:
                stack[-1][1] -= 1
            else:
                stack.pop()
        elif c == "#" and (i == 0 or text[i - 1] in _WORD_BREAKS):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        i += 1
    return found


def frame_env(
    ctx: FrameContext,
    *,
    layer_env: Mapping[str, str],
    isolation: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The frame's environment. Precedence, lowest first:

    1. ``base`` — the worker's environment (``config.inherited_environ()`` by default) with
       every inherited ``CUE_*`` variable removed, so a worker started from inside another
       frame does not leak that frame's identity or devices, and without the worker's own
       store credentials (``PGPASSWORD``, ``PGPASSFILE``): a job must not be able to read
       the farm database's password (a layer may still set them explicitly);
    2. ``layer_env`` — the layer's ``env``;
    3. the ``CUE_*`` frame variables below;
    4. ``isolation`` — the device variables from the lease (``CUDA_VISIBLE_DEVICES``,
       ``CUE_GPUS``, …). Last, so neither the layer env nor the inherited env can un-hide a
       device.

    Frame variables (all strings; OpenCue's set, compared in docs/opencue.md):

    ========================  ===============================================================
    ``CUE3``                  ``1``: running under the cue (as OpenCue)
    ``CUE_USER``              the job's owner (the proven submitter)
    ``CUE_SHOW``, ``CUE_SHOT``  the job's show and shot (empty when it has none)
    ``CUE_JOB`` …             job/layer names and ids, ``CUE_FRAME_ID`` the frame's id
    ``CUE_IFRAME``            frame number (first of the chunk)
    ``CUE_FRAME``             frame name ``0001-layer``
    ``CUE_RANGE``             the layer's frame range; ``CUE_CHUNK`` the chunk size
    ``CUE_ATTEMPT``           attempt number, 1-based
    ``CUE_THREADS``           reserved cores, rounded down, at least 1
    ``CUE_MEMORY``            reserved host memory in **bytes** (OpenCue gives KB; cuectl uses
                              bytes everywhere, DESIGN §6/§9)
    ``CUE_GPU_MEMORY``        per-device GPU memory granted, bytes; ``0`` when no GPU was
                              granted (or its size is unknown)
    ``CUE_LOG_PATH``          the frame's log file (OpenCue gives the job's log directory)
    ========================  ===============================================================
    """
    return env_template(ctx, layer_env=layer_env, isolation=isolation, base=base).env(ctx)


class EnvTemplate:
    """A frame's environment less the frame's own values (``CUE_FRAME_ID``, ``CUE_IFRAME``,
    ``CUE_FRAME``, ``CUE_ATTEMPT``, ``CUE_LOG_PATH``): the same for every frame of a layer
    on the same devices, so a worker makes it once per layer rather than once per frame
    (validating the layer's environment, formatting a dozen values). :meth:`env` puts the
    frame's values in, in :func:`frame_env`'s order of precedence."""

    __slots__ = ("head", "tail")

    def __init__(self, head: dict[str, str], tail: dict[str, str]) -> None:
        self.head = head  # inherited < layer env < the CUE_* variables every frame of the layer shares
        self.tail = tail  # the isolation variables, last

    def env(self, ctx: FrameContext) -> dict[str, str]:
        env = self.head.copy()
        env["CUE_FRAME_ID"] = str(ctx.frame_id)
        env["CUE_IFRAME"] = str(ctx.frame_number)
        env["CUE_FRAME"] = ctx.name
        env["CUE_ATTEMPT"] = str(ctx.attempt)
        env["CUE_LOG_PATH"] = str(ctx.log_path)
        env.update(self.tail)
        return env


def env_template(
    ctx: FrameContext,
    *,
    layer_env: Mapping[str, str],
    isolation: Mapping[str, str],
    base: Mapping[str, str] | None = None,
) -> EnvTemplate:
    """:func:`frame_env` less the frame's own values, from the values of ``ctx`` that every
    frame of its layer shares; raises as :func:`frame_env` does."""
    inherited = config.inherited_environ() if base is None else base
    head = dict(inherited) if isinstance(inherited, FrameBase) else frame_base(inherited)
    head.update(_checked_env(layer_env, "layer env"))
    head.update(_layer_vars(ctx))
    return EnvTemplate(head, _checked_env(isolation, "isolation env"))


# The worker's credentials for the store: never handed to the frames it runs.
_WORKER_SECRETS = frozenset({"PGPASSWORD", "PGPASSFILE"})


class FrameBase(dict[str, str]):
    """An environment already stripped as :func:`frame_env` strips its ``base``."""


def frame_base(inherited: Mapping[str, str]) -> FrameBase:
    """``inherited`` less inherited ``CUE_*`` variables and the worker's store credentials
    (see :func:`frame_env`); a worker makes it once, not once a frame."""
    return FrameBase((k, v) for k, v in inherited.items() if not k.startswith("CUE_") and k not in _WORKER_SECRETS)


def _layer_vars(ctx: FrameContext) -> dict[str, str]:
    # Cuebot's prepareRqdRunFrame set, less CUE_THREADABLE (no threadable flag); units differ
    # where noted in frame_env. These are the ones every frame of a layer shares;
    # EnvTemplate.env adds the frame's own (CUE_FRAME_ID, CUE_IFRAME, CUE_FRAME,
    # CUE_ATTEMPT, CUE_LOG_PATH).
    return {
        "CUE3": "1",
        "CUE_USER": ctx.user,
        "CUE_SHOW": ctx.show,
        "CUE_SHOT": ctx.shot,
        "CUE_JOB": ctx.job,
        "CUE_JOB_ID": str(ctx.job_id),
        "CUE_LAYER": ctx.layer,
        "CUE_LAYER_ID": str(ctx.layer_id),
        "CUE_RANGE": ctx.layer_range,
        "CUE_CHUNK": str(ctx.chunk),
        "CUE_THREADS": str(max(1, math.floor(ctx.cores))),
        "CUE_MEMORY": str(int(ctx.memory_bytes)),
        "CUE_GPU_MEMORY": str(int(ctx.gpu_memory_bytes or 0)),
    }


def _checked_env(values: Mapping[str, str], what: str) -> dict[str, str]:
    """Reject what ``execve`` cannot carry, with a message instead of a ValueError later."""
    out: dict[str, str] = {}
    for key, value in values.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise InvalidInput(f"{what}: invalid variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidInput(f"{what}: {key} must be a string without NUL bytes")
        out[key] = value
    return out


# --------------------------------------------------------------------------------------
# Process groups
# --------------------------------------------------------------------------------------


def _check_pgid(pgid: int) -> None:
    # killpg(0) is *our own* group and killpg(1)/negative values mean something else again:
    # a bad pgid from a corrupt store must never take the worker (or the machine) down.
    if pgid <= 1 or pgid == os.getpgrp():
        raise InvalidInput(f"refusing to signal process group {pgid}")


# pid -> (parent pid, process group, zombie), for every process we can see at one moment.
ProcessTable = Mapping[int, "tuple[int, int, bool]"]


def process_table() -> dict[int, tuple[int, int, bool]]:
    """One snapshot of the machine's processes. A frame's pids are its process group plus
    its leader's descendants; finding them costs a pass over every process on the machine,
    so the worker takes one snapshot per sampling tick and shares it between its frames
    (one pass per frame made sampling 8 frames cost ~16 ms of CPU a tick)."""
    proc = Path("/proc")
    if sys.platform.startswith("linux") and proc.is_dir():
        table: dict[int, tuple[int, int, bool]] = {}
        for entry in os.scandir(proc):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    stat = handle.read()
            except OSError:
                continue  # exited meanwhile, or hidden from us
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            fields = stat[stat.rfind(b")") + 2:].split(b" ", 3)
            table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0] == b"Z")
        return table
    return _process_table_psutil()


def _process_table_psutil() -> dict[int, tuple[int, int, bool]]:
    import psutil

    table: dict[int, tuple[int, int, bool]] = {}
    for p in psutil.process_iter(["ppid", "status"]):
        try:
            table[p.pid] = (p.info["ppid"] or 0, os.getpgid(p.pid), p.info["status"] == psutil.STATUS_ZOMBIE)
        except (ProcessLookupError, PermissionError):
            continue
    return table


def _group_pids(pgid: int, table: ProcessTable | None = None) -> set[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    table = process_table() if table is None else table
    return {pid for pid, (_, group, zombie) in table.items() if group == pgid and not zombie}


def _descendants(root: int, table: ProcessTable) -> set[int]:
    """Live descendants of ``root`` (children, grandchildren, …), not ``root`` itself."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found.add(pid)
        stack.extend(children.get(pid, ()))
    return {pid for pid in found if not table[pid][2]}


def process_group_alive(pgid: int) -> bool:
    """Whether any process (other than a zombie) is still in group ``pgid``.

    ``killpg(pgid, 0)`` answers cheaply when the group is gone; when it says "exists" we look
    closer, because zombies waiting for a reaper (containers without an init) still count for
    the kernel but no longer run anything.
    """
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's processes: alive, and not ours to judge
    return bool(_group_pids(pgid))


def _signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def kill_process_group(pgid: int, *, grace: float = DEFAULT_GRACE_S) -> None:
    """TERM group ``pgid``, wait up to ``grace`` s for it to vanish, then KILL it.

    For orphaned frames found after a worker restart (their pgid is in the store). Those
    processes are not our children, so init reaps them; we only wait until they are gone
    (bounded: a process stuck in uninterruptible sleep can outlive SIGKILL). Raises
    ``InvalidInput`` for pgids that would hit the worker itself or everything
    (``0``, ``1``, our own group) and ``PermissionError`` for another user's group.
    """
    _check_pgid(pgid)
    if not _signal_group(pgid, signal.SIGTERM):
        return
    if _wait_group_gone(pgid, grace):
        return
    if _signal_group(pgid, signal.SIGKILL):
        _wait_group_gone(pgid, 2.0)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + max(0.0, timeout)
    delay = _WAIT_MIN_SLEEP_S
    while process_group_alive(pgid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)
    return True


# --------------------------------------------------------------------------------------
# Escaped descendants (Linux: this process as a child subreaper)
# --------------------------------------------------------------------------------------

_subreaper = False
_reap_zombies = False
#: Leaders of this process's unfinished frames, by pid: never taken for strays.
_LEADERS: dict[int, "FrameProcess"] = {}


def hold_child(pid: int, owner: object) -> None:
    """Keep a child that is not a frame (a notification hook) out of the worker's zombie
    reaping: its owner waits for it and needs its exit status."""
    _LEADERS[pid] = owner  # type: ignore[assignment]


def release_child(pid: int, owner: object) -> None:
    if _LEADERS.get(pid) is owner:
        del _LEADERS[pid]


def become_subreaper(*, reap_zombies: bool = False) -> bool:
    """Make this process a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``).

    A descendant that leaves a frame's process group and tree (``setsid cmd &``, a double
    fork) is then re-parented to us instead of to init, so :class:`FrameProcess` finds it
    when the frame ends, kills it and reaps it. ``reap_zombies``: also reap any zombie
    child that is not a frame leader — only for a process whose children outside its own
    session are frames or what they left behind (the worker; never a test runner or an
    application that has children of its own). False where unsupported (then such
    escapees are not found)."""
    global _subreaper, _reap_zombies
    if reap_zombies:
        _reap_zombies = True
    if not _subreaper:
        _subreaper = set_child_subreaper()
    return _subreaper


def _stat_fields(pid: int) -> tuple[bool, int, int] | None:
    """(zombie, pgid, session id) of ``pid``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2:].split(b" ", 5)
    try:
        return fields[0] == b"Z", int(fields[2]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _env_value(pid: int, name: str) -> str | None:
    """``name`` from ``pid``'s initial environment (None: unset or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode("utf-8", "replace")
    return None


def file_ids(fds: Sequence[int]) -> frozenset[tuple[int, int]]:
    """(device, inode) of the files behind ``fds`` — to recognise their holders later."""
    ids = set()
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        ids.add((st.st_dev, st.st_ino))
    return frozenset(ids)


def holds_file(pid: int, ids: frozenset[tuple[int, int]]) -> bool:
    """Whether ``pid`` has one of the files ``ids`` open (``/proc/PID/fd``)."""
    if not ids:
        return False
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            return True
    return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def leftover_children(owns: Callable[[int, int, int], bool]) -> set[int]:
    """Live processes re-parented to us (a subreaper) that ``owns(pid, pgid, sid)`` claims,
    with all their live descendants. Zombie children that ``owns`` claims (or any that is
    not a frame leader, after ``become_subreaper(reap_zombies=True)``) are reaped on the
    way: something a frame left behind that died by itself."""
    kids = own_children() - set(_LEADERS)
    if not kids:
        return set()
    roots = []
    for pid in kids:
        fields = _stat_fields(pid)
        if fields is None:
            continue
        zombie, pgid, sid = fields
        if zombie:
            # Something left behind that died by itself: ours to reap if it is recognisably
            # this caller's (group, session) or, in the worker, whatever it is.
            if _reap_zombies or owns(pid, pgid, sid):
                _reap(pid)
        elif owns(pid, pgid, sid):
            roots.append(pid)
    if not roots:
        return set()
    table = process_table()
    found = set(roots)
    for pid in roots:
        found |= _descendants(pid, table)
    return found


def processes_with_env(match: Mapping[str, str]) -> set[int]:
    """Live pids (not ours) whose initial environment has every ``name=value`` of ``match``
    — a full scan of ``/proc``: for a restarted worker looking for what an orphaned frame
    left behind outside its process group (start-up only, tens of ms)."""
    if not match or not Path("/proc").is_dir():
        return set()
    needles = [f"{k}={v}".encode() for k, v in match.items()]
    found = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                items = set(fh.read().split(b"\0"))
        except OSError:
            continue
        if all(n in items for n in needles):
            found.add(int(entry.name))
    return found


def kill_by_env(match: Mapping[str, str], *, grace: float = DEFAULT_GRACE_S) -> int:
    """Put down an orphaned frame: TERM the processes :func:`processes_with_env` finds and
    the process groups of those among them that lead a session (the frame's leader started
    one: its group also holds members that replaced their environment), KILL what is left
    after ``grace`` s (looked up again, so a recycled pid is never hit), wait up to 2 s
    more for it to go; returns how many processes were found."""
    found = processes_with_env(match)
    if not found:
        return 0
    groups = set()
    for pid in found:
        fields = _stat_fields(pid)
        if fields is not None and fields[2] == pid and pid > 1 and pid != os.getpgrp():
            groups.add(pid)

    def signal_all(pids: set[int], sig: int) -> None:
        for group in groups:
            _signal_group(group, sig)
        _signal_pids(pids, sig)

    signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace)
    killed = False
    delay = _WAIT_MIN_SLEEP_S
    while True:
        groups = {g for g in groups if process_group_alive(g)}
        left = processes_with_env(match)
        if not left and not groups:
            return len(found)
        now = time.monotonic()
        if now >= deadline:
            if killed:
                if now - deadline > 2.0:
                    return len(found)  # stuck in the kernel: give up, as kill_process_group
            else:
                signal_all(left, signal.SIGKILL)
                killed = True
        time.sleep(delay)
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)


def kill_leftovers(owns: Callable[[int, int, int], bool], *, grace: float) -> int:
    """TERM what :func:`leftover_children` finds, KILL what is left after ``grace`` s, reap
    them; returns how many there were. For ``cuectl run`` once its command exited."""
    found = leftover_children(owns)
    if not found:
        return 0
    _signal_pids(found, signal.SIGTERM)
    deadline = time.monotonic() + max(0.0, grace)
    delay = _WAIT_MIN_SLEEP_S
    killed = False
    while True:
        left = leftover_children(owns)
        if not left:
            break
        now = time.monotonic()
        if now >= deadline:
            if killed and now - deadline > _STRAGGLER_GIVE_UP_S:
                break
            if not killed:
                _signal_pids(left, signal.SIGKILL)
                killed = True
        else:
            _signal_pids(left - found, signal.SIGTERM)  # newly re-parented ones
            found |= left
        time.sleep(delay)
        delay = min(delay * 2, _WAIT_MAX_SLEEP_S)
    for pid in found & own_children():
        _reap(pid)  # they are dead (or given up on): no zombie of theirs stays behind
    return len(found)


# --------------------------------------------------------------------------------------
# Logs
# --------------------------------------------------------------------------------------


def log_header(frame_id: str, attempt: int, host: str, at: float | None = None) -> str:
    """The line written to the log before each attempt starts."""
    when = iso(time.time() if at is None else at)
    return f"=== cuectl frame {frame_id} attempt {attempt} on {host} at {when} ==="


def log_footer(frame_id: str, attempt: int, info: "ExitInfo", *, timeout_s: float | None = None,
               grace: float | None = None, sigkilled: bool = False) -> str:
    """The line appended to the log when an attempt ends (after any cut of the log, so it
    is always there): how it ended — ``exit N``, ``killed by signal N (NAME)``, ``timed out
    after T s, stopped with SIGTERM`` / ``…, SIGKILL after the G s grace period``, ``killed
    by user request (ACTION), …`` or ``stopped by cuectl (REASON), …``."""
    return (f"=== cuectl frame {frame_id} attempt {attempt} ended {iso(info.ended_at)}: "
            f"{describe_end(info, timeout_s=timeout_s, grace=grace, sigkilled=sigkilled)} ===")


def describe_end(info: "ExitInfo", *, timeout_s: float | None = None, grace: float | None = None,
                 sigkilled: bool = False) -> str:
    """How an attempt ended, in the words of :func:`log_footer`."""
    if info.killed:
        stop = (f"SIGKILL after the {grace:g} s grace period" if sigkilled and grace is not None
                else "SIGKILL" if sigkilled else "stopped with SIGTERM")
        reason = info.kill_reason or "killed"
        if info.timed_out or reason == "timeout":
            return f"timed out after {timeout_s:g} s, {stop}" if timeout_s is not None else f"timed out, {stop}"
        if reason.startswith(_USER_KILL):
            return f"killed by user request ({reason[len(_USER_KILL):]}), {stop}"
        return f"stopped by cuectl ({reason}), {stop}"
    if info.exit_signal is not None:
        return f"killed by signal {info.exit_signal} ({signal_name(info.exit_signal)})"
    if info.exit_code is not None:
        return f"exit {info.exit_code}"
    return "exit status unknown (the process was reaped elsewhere)"


_USER_KILL = "user asked to "


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


class UnsafeLogPath(OSError):
    """The frame log cannot be opened without following a link or touching someone else's
    file (docs/security.md, "Frame logs"). Nothing was created or written."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EPERM, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC


def open_frame_log(log_path: Path, *, log_root: str | Path | None = None, owner: "RunAs | None" = None,
                   rqlog: "RqlogLink | None" = None) -> int:
    """Open (append; create ``0640``) an attempt's log ``<log root>/<job id>/<file>`` and
    return the fd (close-on-exec), without ever following a link planted by someone else.

    A root worker opens logs in directories other users can write to (the job directory
    belongs to the job's user), so every step is relative to a directory handle:

    * the log root (``log_root``; default ``log_path.parent.parent``) is the worker's own
      configuration and is opened normally — unless it is a symbolic link owned by
      somebody other than root or the worker's user, which is refused;
    * the job directory is created (``0750``) and opened with ``O_NOFOLLOW`` from the
      root's handle, and must be owned by the worker's user or the frame's user;
    * the file is created or opened with ``O_NOFOLLOW`` from the job directory's handle
      (``O_NONBLOCK``, so a planted FIFO cannot hang the worker) and must be a regular
      file with one link, owned by the worker's user or the frame's user.

    When ``owner`` (the account the frame runs as) differs from the worker's user and the
    worker is root, what is created here is handed to that user (``fchown`` on the handle),
    so a frame never writes into a root-owned file. Raises :class:`UnsafeLogPath` for
    anything refused and ``OSError`` for other failures (disk full, permissions).

    ``rqlog``: once the file is open, the job's OpenCue-named link is pointed at it
    (:func:`_link_rqlog`); that never raises.
    """
    log_path = Path(log_path)
    root = Path(log_root) if log_root is not None else log_path.parent.parent
    job_dir, name = log_path.parent.name, log_path.name
    if log_path.parent.parent != root or job_dir in ("", ".", "..") or name in ("", ".", ".."):
        raise UnsafeLogPath(f"log path {log_path} is not a file of a job directory under {root}")
    return _open_log_fds(log_path, root, owner, rw=False, rqlog=rqlog)[0]


@dataclass(frozen=True)
class RqlogLink:
    """The OpenCue-named link to make for an attempt's log (``logs.rqlog_name``), and whom to
    tell when it cannot be made (the worker says so once per job): a missing link costs
    CueGUI its view of the log, never the frame its run."""

    name: str
    on_error: Callable[[str], None] | None = None


def _open_log_fds(log_path: Path, root: Path, owner: "RunAs | None", *, rw: bool,
                  create: bool = True, rqlog: RqlogLink | None = None) -> tuple[int, int | None]:
    """(append fd, and with ``rw`` a second, non-append read-write fd of the same file).

    The second descriptor is what the worker keeps to cap the log: ``pwrite`` on an
    ``O_APPEND`` descriptor appends on Linux whatever the offset, and the append one's file
    description is shared with the frame, so its flags must not change.

    ``create=False`` (notes on a running frame): nothing is created, and the file is
    accepted when it belongs to the worker's user or to the owner of its job directory —
    a note then lands only in a file that user could write anyway.

    ``rqlog`` (with ``create``): the link is made from the job directory's handle once the
    file is open, with the job directory's rules (:func:`_link_rqlog`)."""
    euid = os.geteuid()
    chown_to = None
    root_fd = _open_log_root(root, euid)
    try:
        if create and owner is not None and euid == 0 and owner.uid != euid:
            setgid = bool(os.fstat(root_fd).st_mode & stat.S_ISGID)
            chown_to = (owner.uid, -1 if setgid else owner.gid)  # a setgid root's group is inherited
        dir_owners = ({euid} | ({owner.uid} if owner is not None else set())) if create else None
        dir_fd = _open_job_dir(root_fd, log_path.parent.name, log_path.parent, dir_owners, chown_to)
    finally:
        os.close(root_fd)
    try:
        file_owners = {euid, os.fstat(dir_fd).st_uid}
        fd = _open_log_file(dir_fd, log_path.name, log_path, file_owners, chown_to, create=create)
        if rqlog is not None and create and dir_owners is not None:
            _link_rqlog(dir_fd, log_path, rqlog, dir_owners, chown_to)
        if not rw:
            return fd, None
        try:
            rw_fd = os.open(log_path.name, os.O_RDWR | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
            a, b = os.fstat(fd), os.fstat(rw_fd)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                os.close(rw_fd)
                raise UnsafeLogPath(f"log file {log_path} was replaced while it was opened; refusing it")
        except BaseException:
            os.close(fd)
            raise
        return fd, rw_fd
    finally:
        os.close(dir_fd)


def _open_log_root(root: Path, euid: int) -> int:
    try:
        return os.open(root, _DIR_FLAGS | _NOFOLLOW)
    except FileNotFoundError:
        # Root's log directory serves every user of a shared store (docs/deploy.md): each
        # may pass through to her own job's directory (0750, hers), none may list the others.
        root.mkdir(mode=ROOT_LOG_DIR_MODE if euid == 0 else LOG_DIR_MODE, parents=True, exist_ok=True)
        return os.open(root, _DIR_FLAGS | _NOFOLLOW)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    # A symbolic link: an admin's (logs on a bigger disk) is followed, anyone else's is not.
    try:
        link_owner = os.lstat(root).st_uid
    except OSError:
        link_owner = -1
    if link_owner not in (0, euid):
        raise UnsafeLogPath(f"log directory {root} is a symbolic link owned by uid {link_owner}; refusing to follow it")
    return os.open(root, _DIR_FLAGS)


def _open_job_dir(root_fd: int, name: str, shown: Path, allowed: set[int] | None,
                  chown_to: tuple[int, int] | None) -> int:
    created = False
    try:
        try:  # opened first: a job's directory exists for all but its first frame here
            fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=root_fd)
        except FileNotFoundError:
            if allowed is None:  # a note never creates the directory
                raise
            try:
                os.mkdir(name, LOG_DIR_MODE, dir_fd=root_fd)
                created = True
            except FileExistsError:
                pass  # made meanwhile by another worker: judged like any other below
            fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=root_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UnsafeLogPath(f"log directory {shown} is a symbolic link or not a directory; refusing it") from None
        raise
    try:
        st = os.fstat(fd)
        if allowed is not None and st.st_uid not in allowed:
            raise UnsafeLogPath(f"log directory {shown} belongs to uid {st.st_uid}, not to the frame's user; "
                                "refusing it")
        if created and chown_to is not None:
            os.fchown(fd, *chown_to)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_rqlog(job_fd: int, log_path: Path, link: RqlogLink, allowed: set[int],
                chown_to: tuple[int, int] | None) -> None:
    """Point ``<job dir>/rqlog/<link.name>`` at ``../<attempt log>`` (relative, so it resolves
    wherever the log share is mounted); never raises: problems go to ``link.on_error``.

    The job directory may belong to the frame's user, so ``rqlog/`` is judged exactly like
    the job directory itself (:func:`_open_job_dir`: opened with ``O_NOFOLLOW`` from the
    job directory's handle, created ``0750`` and handed to the frame's user, refused unless
    a real directory of the worker's or the frame's user): a link planted in its place is
    never followed. The link is made under a temporary name in that directory and renamed
    over the old one (``rename`` replaces a link, it never follows it), so a reader sees the
    previous attempt's log or this one's, never nothing."""
    shown = log_path.parent / "rqlog"
    tmp = f".tmp.{os.getpid()}.{os.urandom(4).hex()}"  # short: link.name may be near NAME_MAX
    try:
        rq_fd = _open_job_dir(job_fd, "rqlog", shown, allowed, chown_to)
        try:
            os.symlink(f"../{log_path.name}", tmp, dir_fd=rq_fd)
            try:
                if chown_to is not None:  # like the log itself: what a root worker makes is the user's
                    os.chown(tmp, *chown_to, dir_fd=rq_fd, follow_symlinks=False)
                os.replace(tmp, link.name, src_dir_fd=rq_fd, dst_dir_fd=rq_fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=rq_fd)
                except OSError:
                    pass  # what the rename refused is reported; a stray temp link harms nobody
                raise
        finally:
            os.close(rq_fd)
    except (OSError, ValueError) as exc:
        if link.on_error is not None:
            why = exc.message if isinstance(exc, UnsafeLogPath) else str(getattr(exc, "strerror", None) or exc)
            link.on_error(f"no OpenCue log link {shown / link.name} for {log_path.name}: {why}")


def _open_log_file(dir_fd: int, name: str, shown: Path, allowed: set[int],
                   chown_to: tuple[int, int] | None, *, create: bool = True) -> int:
    flags = os.O_WRONLY | os.O_APPEND | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
    created = create
    try:
        if not create:
            fd = os.open(name, flags, dir_fd=dir_fd)
        else:
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, LOG_FILE_MODE, dir_fd=dir_fd)
            except FileExistsError:
                created = False
                fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR):
            raise UnsafeLogPath(f"log file {shown} is a symbolic link, a FIFO or a directory; refusing it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid not in allowed:
            raise UnsafeLogPath(f"log file {shown} is not a regular file of the frame's user with one link; "
                                "refusing it")
        if created and chown_to is not None:
            os.fchown(fd, *chown_to)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_log(log_path: Path) -> int:
    """An existing frame log, for a note on a running frame (never creates, never follows links)."""
    log_path = Path(log_path)
    return _open_log_fds(log_path, log_path.parent.parent, None, rw=False, create=False)[0]


_DEV_NULL = -1


def _dev_null() -> int:
    """A read-only /dev/null for frames' stdin, opened once (close-on-exec: the child gets
    it as fd 0 only), instead of an open and close per frame."""
    global _DEV_NULL
    if _DEV_NULL < 0:
        _DEV_NULL = os.open(os.devnull, os.O_RDONLY | _CLOEXEC)
    return _DEV_NULL


class Spawned:
    """A frame started by ``cuectl.run.spawn``: what FrameProcess reads of a ``Popen``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None


# The worker changes its own directory for the instant a frame is spawned in another one
# (posix_spawn cannot change the child's): whatever else starts processes that inherit
# the directory, or uses relative paths, in another thread holds this lock (notify.py).
CWD_LOCK = threading.Lock()


def _start_child(argv: list[str], env: Mapping[str, str], log_fd: int, cwd: str | None, pass_fds: tuple[int, ...],
                 identity: dict) -> "subprocess.Popen[bytes] | Spawned":
    """Start a frame's command: stdin /dev/null, stdout and stderr ``log_fd``, a session of
    its own, only ``pass_fds`` inherited. ``posix_spawn`` (``cuectl.run.spawn``: ~0.25 ms
    less of the worker's CPU a frame) unless the frame runs as another user, which needs
    the setuid that only ``subprocess`` offers; that user enters ``cwd`` (``_start_entering``)."""
    if not identity and spawn.usable():
        try:
            return Spawned(spawn.spawn(argv, env, keep=pass_fds, stdio=(_dev_null(), log_fd, log_fd), cwd=cwd,
                                       setsid=True, cwd_lock=CWD_LOCK))
        except spawn.NoWayBack:
            pass  # the worker's own directory is gone: Popen changes only the child's
    if identity and cwd is not None:
        return _start_entering(argv, env, log_fd, cwd, pass_fds, identity)
    return subprocess.Popen(argv, stdin=_dev_null(), stdout=log_fd, stderr=log_fd, env=dict(env), cwd=cwd,
                            pass_fds=pass_fds, close_fds=True, start_new_session=True, **identity)


class CannotEnter(InvalidInput):
    """The frame's user may not enter (or there is no) working directory: not started."""


# The step that enters a frame's directory as its user (issue 35): ``subprocess`` changes
# directory in the child *before* it drops to the user, as root, so that any directory on
# the host could be a frame's. The child runs this instead, already as the user: it enters
# the directory with the user's own permissions, says so on fd 0 (a pipe to the worker)
# when it cannot, then gives the command /dev/null as stdin, puts back PWD and OLDPWD as the
# frame's environment had them (``cd`` sets both) and execs it, as subprocess would have.
# $1 the directory, $2 PWD, $3 OLDPWD; one text for each of the four ways the two are set.
_ENTER = ('cd -P -- "$1" 2>/dev/null || {{ echo >&0; exit 125; }}; exec </dev/null; {}; {}; shift 3; exec "$@"')
_ENTER_SCRIPTS = {(pwd, old): _ENTER.format("PWD=$2" if pwd else "unset PWD", "OLDPWD=$3" if old else "unset OLDPWD")
                  for pwd in (False, True) for old in (False, True)}


def _start_entering(argv: list[str], env: Mapping[str, str], log_fd: int, cwd: str, pass_fds: tuple[int, ...],
                    identity: dict) -> "subprocess.Popen[bytes]":
    """Start a frame as another user in ``cwd``, entered by that user (``_ENTER``): the
    worker waits until it is in (~1 ms of /bin/sh) and raises ``CannotEnter`` when it could
    not get in. No directory of the worker's changes, so ``CWD_LOCK`` is not needed."""
    script = _ENTER_SCRIPTS["PWD" in env, "OLDPWD" in env]
    where = cwd if cwd.startswith("/") else "./" + cwd  # never searched on a CDPATH
    wrapped = ["/bin/sh", "-c", script, "cuectl", where, env.get("PWD", ""), env.get("OLDPWD", ""), *argv]
    report, told = os.pipe()
    try:
        try:
            popen = subprocess.Popen(wrapped, stdin=told, stdout=log_fd, stderr=log_fd, env=dict(env),
                                     pass_fds=pass_fds, close_fds=True, start_new_session=True, **identity)
        finally:
            os.close(told)
        refused = os.read(report, 1)  # end of file once it is in the directory (or gone)
    finally:
        os.close(report)
    if not refused:
        return popen
    popen.wait()
    user = identity.get("user")
    try:
        import pwd

        user = pwd.getpwuid(int(user)).pw_name if user is not None else user
    except (KeyError, ValueError, TypeError):
        pass
    if os.path.isdir(cwd):  # it is there, as root sees it: the user may not get in
        raise CannotEnter(f"user {user} may not enter working directory {cwd} (permission denied)")
    raise CannotEnter(f"working directory {cwd} does not exist")


def _line_bytes(line: str) -> bytes:
    # One line, whatever a hostile name contains: a newline must not forge a second header.
    text = line.replace("\r", " ").replace("\n", " ") + "\n"
    return text.encode("utf-8", "replace")


def _write_line(fd: int, line: str) -> None:
    os.write(fd, _line_bytes(line))


def _append_log(log_path: Path, line: str) -> None:
    """Add a cuectl note (timeout, kill) to a log the frame may still be writing."""
    try:
        fd = _open_log(log_path)
    except OSError:
        return  # a note is not worth failing the frame over
    try:
        _write_line(fd, line)
    except OSError:
        pass  # disk full: the note is lost, the frame's fate is decided elsewhere
    finally:
        os.close(fd)


def append_log_note(log_path: Path, line: str, *, log_root: str | Path | None = None,
                    owner: "RunAs | None" = None, rqlog: RqlogLink | None = None) -> None:
    """Best effort, never raises: say in a frame's log why it never started (the worker's
    ``_log_failure``). Opened exactly like the frame's own log, so a planted link is not
    followed here either."""
    try:
        fd = open_frame_log(log_path, log_root=log_root, owner=owner, rqlog=rqlog)
    except OSError:
        return
    try:
        _write_line(fd, line)
    except OSError:
        pass
    finally:
        os.close(fd)


DEFAULT_LOG_LIMIT = config.DEFAULT_LOG_LIMIT  # 1 GiB per attempt (docs/reliability.md, "Frame logs")
MIN_LOG_LIMIT = config.MIN_LOG_LIMIT
# A running frame's log is cut back to the limit only once it is this share of the limit
# over it, so the next cut is due only after the frame wrote another quarter of the limit:
# each byte written past the limit is copied about twice, not once per poll.
_RUNNING_SLACK_SHARE = 4
_COPY_CHUNK = 1 << 20
_SPACE_CHECK_S = 1.0
# On a full filesystem, the log of a frame that keeps writing is cut to this before cuectl
# notes why the frame is stopped: room for the note, and for the store beside it.
_FULL_DISK_LOG = 64 * 1024


def _free_space_floor(st: os.statvfs_result) -> int:
    """Bytes below which the log's filesystem counts as full: 1% of it, at most 64 MiB."""
    return min(64 << 20, st.f_blocks * st.f_frsize // 100)


class _LogCap:
    """Keeps one attempt's log within ``limit`` bytes: the first half, a marker line, and
    the most recent output (docs/reliability.md, "Frame logs").

    Checked by :meth:`FrameProcess.poll` with one ``fstat`` per poll (no pipe: the frame
    writes straight into the file). While the frame runs the file is cut back to the limit
    once it is a quarter over it; when the attempt ends, to the limit. The frame's
    descriptor is ``O_APPEND``, so after a cut its next write lands at the new end. Output
    written in the instant between the last size check and the ``ftruncate`` of a cut is
    lost; nothing else is.
    """

    def __init__(self, fd: int, limit: int) -> None:
        self.fd = fd
        self.limit = max(MIN_LOG_LIMIT, int(limit))
        self.head = self.limit // 2
        self.marker = (f"\n=== cuectl: this attempt's log reached its limit of {self.limit} bytes: "
                       "output was cut here; the most recent output follows ===\n").encode()
        self.cut = False
        self.dropped = 0
        self.last_size = 0
        self.next_space_check = time.monotonic() + _SPACE_CHECK_S
        # The frame was found filling a full disk: from then on (while it is being stopped,
        # and when it is gone) its log is kept at _FULL_DISK_LOG, not at its limit.
        self.full = False

    def started(self) -> None:
        """The header is written: only what the frame writes after it counts as growth (a
        frame that writes nothing is neither stopped nor its log called lost for a disk
        that something else filled)."""
        self.last_size = os.fstat(self.fd).st_size

    def check(self, now: float) -> str | None:
        """Cut the log back if it is over the limit; a reason to stop the frame when the
        filesystem is full and this log is still growing, else None."""
        size = os.fstat(self.fd).st_size
        if self.full:
            # Being stopped for a full disk: it refills what a cut frees in an instant, so
            # every poll until it is gone cuts it back again.
            if size > min(self.limit, _FULL_DISK_LOG):
                self.shrink(min(self.limit, _FULL_DISK_LOG))
            return None
        if size > self.limit + self.limit // _RUNNING_SLACK_SHARE:
            size = self.shrink(self.limit)
        if now < self.next_space_check:
            return None
        self.next_space_check = now + _SPACE_CHECK_S
        grew, self.last_size = size > self.last_size, size
        if not grew:
            return None
        st = os.fstatvfs(self.fd)
        if st.f_bavail * st.f_frsize >= _free_space_floor(st):
            return None
        self.full = True
        keep = min(self.limit, _FULL_DISK_LOG)
        # The kill's note is appended at the end, where the next cut may drop it: the marker
        # after the head, which every cut keeps, says it too.
        self.marker = (f"\n=== cuectl: the log's filesystem is full: the frame is being stopped and its log "
                       f"kept to {keep} bytes: output was cut here; the most recent output follows ===\n").encode()
        self.cut = False
        self.last_size = self.shrink(keep)
        return "the log's filesystem is full"

    def shrink(self, limit: int) -> int:
        """Cut the file to at most ``limit`` bytes (head, marker, the most recent output); the size."""
        size = os.fstat(self.fd).st_size
        if size <= limit:
            return size
        head = min(self.head, limit // 2)
        if self.cut and head < self.head:  # a smaller limit than before (disk full): new marker
            self.cut = False
        keep_from = head + len(self.marker)
        tail = max(0, limit - keep_from)
        if not self.cut:
            os.pwrite(self.fd, self.marker, head)
            self.cut = True
        self.head = head
        read = size
        self._move(size - tail, keep_from, tail)
        write = keep_from + tail
        for _ in range(4):  # the frame may have written more meanwhile: keep that too
            now_size = os.fstat(self.fd).st_size
            if now_size <= read:
                break
            self._move(read, write, now_size - read)
            write += now_size - read
            read = now_size
        os.ftruncate(self.fd, write)
        self.dropped += read - write
        return write

    def _move(self, src: int, dst: int, length: int) -> None:
        # Forward copy to a lower offset: safe even where the two ranges overlap.
        done = 0
        while done < length:
            chunk = os.pread(self.fd, min(_COPY_CHUNK, length - done), src + done)
            if not chunk:
                break
            os.pwrite(self.fd, chunk, dst + done)
            done += len(chunk)

    def space_lost(self) -> bool:
        """Did output of this attempt probably never reach the log? Its filesystem is full
        (under the floor that stops a running frame) and the log grew since the last check:
        a frame can flood a small disk between two once-a-second checks, its writes then
        failing (ENOSPC) while it exits 0."""
        try:
            size = os.fstat(self.fd).st_size
            st = os.fstatvfs(self.fd)
        except OSError:
            return False
        return size > self.last_size and st.f_bavail * st.f_frsize < _free_space_floor(st)

    def finish(self, footer: str | None = None, *, lost: bool = False) -> None:
        """The frame is gone: cut to the limit with as much tail as fits, note what was cut,
        then add ``footer`` (one line, see :func:`log_footer`): the limit counts the frame's
        output, so the notes after the cut are always there. ``lost`` (``space_lost``): cut
        to what a full disk gets, freeing the rest, and say that output was lost; so is the
        log of a frame stopped for filling the disk (``full``): what it wrote in its last
        instants must not keep the disk full once it is gone."""
        try:
            try:
                self.shrink(min(self.limit, _FULL_DISK_LOG) if lost or self.full else self.limit)
            except OSError:
                pass  # disk full: the footer may still fit
            if lost:
                note = ("\n=== cuectl: the log's filesystem was full when this attempt ended: some of its "
                        f"output never reached this log, and the log was cut to {os.fstat(self.fd).st_size} "
                        "bytes to free the disk; the attempt is not counted a success (log-lost) ===\n").encode()
                os.pwrite(self.fd, note, os.fstat(self.fd).st_size)
            if self.dropped:
                note = (f"=== cuectl: {self.dropped} bytes of output were cut from the middle of this log "
                        f"(limit {self.limit} bytes) ===\n").encode()
                os.pwrite(self.fd, note, os.fstat(self.fd).st_size)
            if footer is not None:
                os.pwrite(self.fd, _line_bytes(footer), os.fstat(self.fd).st_size)
        except OSError:
            pass  # disk full or gone: the log is what it is
        finally:
            os.close(self.fd)


# --------------------------------------------------------------------------------------
# The frame process
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunAs:
    """The account a frame runs as when the worker is root (OpenCue's RQD does the same):
    the submitting user's uid, primary gid and supplementary groups."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def lookup(cls, user: str) -> "RunAs":
        import pwd

        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            raise InvalidInput(f"user {user!r} does not exist on this host; the frame is not run as root instead",
                               hint="create the account, or run the worker as an unprivileged user") from None
        return cls(user, entry.pw_uid, entry.pw_gid, tuple(os.getgrouplist(user, entry.pw_gid)), entry.pw_dir)

    def popen_kwargs(self) -> dict:
        # Already that account (a root user's own jobs): switching would cost a full fork
        # instead of vfork (~3 ms a frame) for nothing.
        if self.uid == os.geteuid() and self.gid == os.getegid():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self) -> dict[str, str]:
        return {"USER": self.user, "LOGNAME": self.user, "HOME": self.home}


@dataclass(frozen=True)
class ExitInfo:
    """How a frame attempt ended.

    ``exit_code`` for a normal exit, else ``exit_signal`` (and ``exit_code`` None) when the
    leader died of a signal. ``killed``: cuectl signalled the frame before it exited (a user
    kill or a timeout); ``timed_out`` implies ``killed``. Times are epoch seconds.
    ``max_rss_bytes``: the largest of (a) the peak of sampled whole-tree RSS (a sum over
    processes, so shared pages count once per process), (b) the largest per-process peak
    (Linux ``VmHWM``) seen in those samples, and (c) the kernel's ``ru_maxrss`` of the leader
    and the descendants it waited for — (c) only when it exceeds the worker's own peak at
    spawn time, because a child's ru_maxrss starts from its parent's size. A spike between
    samples in a frame smaller than the worker can therefore be missed; None when nothing
    was measured. ``cpu_seconds``: user+system from the leader's rusage (on Linux this
    includes the descendants it waited for), or the last sample if larger (orphans that were
    reparented to init are only seen while sampled).
    """

    exit_code: int | None
    exit_signal: int | None
    timed_out: bool
    killed: bool
    started_at: float
    ended_at: float
    max_rss_bytes: int | None
    cpu_seconds: float | None
    kill_reason: str | None = None
    # The log's filesystem was full when the attempt ended: some of its output never
    # reached the log (``_LogCap.space_lost``), whatever the exit status says.
    log_lost: bool = False

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and not self.killed


class FrameProcess:
    """One frame attempt running in its own session and process group.

    Drive it with :meth:`poll` (non-blocking) or :meth:`wait`: timeouts, kill escalation and
    RSS sampling happen inside those calls, so a worker loop polling several frames needs no
    extra threads. We reap the leader ourselves with ``os.wait4`` (for its rusage); nothing
    else in the worker may ``waitpid(-1)``. Methods are serialised by a lock, so a signal
    handler thread may call :meth:`kill` while the main loop polls.

    When the leader exits, any processes left in its group (``cmd &`` in a script) are
    TERMed and, after the grace period, KILLed before the frame counts as finished — they
    may hold the inherited device lease, and a finished frame must not keep using a GPU.
    """

    pid: int
    pgid: int

    def __init__(
        self,
        *,
        popen: subprocess.Popen[bytes] | Spawned | None,
        log_path: Path,
        timeout_s: float | None,
        grace: float,
        sample_interval: float,
        started_at: float,
        spawner_maxrss: int = 0,
        immediate: ExitInfo | None = None,
        log_cap: _LogCap | None = None,
        footer: tuple[str, int] | None = None,
    ) -> None:
        self._popen = popen
        self.pid = popen.pid if popen is not None else 0
        # start_new_session=True: the child called setsid() before exec, so pgid == pid.
        self.pgid = self.pid
        self.log_path = _as_path(log_path)
        self._timeout_s = timeout_s
        self._grace = grace
        self._sample_interval = sample_interval
        self._started_at = started_at
        self._spawner_maxrss = spawner_maxrss
        self._t0 = time.monotonic()
        self._lock = threading.RLock()
        self._result = immediate
        # Leader status once reaped: (raw wait status or None if lost, rusage or None, time).
        self._reaped: tuple[int | None, object | None, float] | None = None
        # When another thread saw the leader exit (``note_exit``) before the owner reaped
        # it: a worker held up in a store call reaps late, and the frame's end is this.
        self.exit_seen_at: float | None = None
        self._killed = False
        self._timed_out = False
        self._kill_reason: str | None = None
        self._term_sent_at: float | None = None  # monotonic
        self._kill_deadline: float | None = None  # monotonic: SIGKILL due
        self._kill_sent_at: float | None = None
        # The first sample is taken once the frame is 0.1 s old (see _maybe_sample): a tree
        # walk scans /proc (milliseconds on a busy host), which would dominate frames that
        # finish in a few milliseconds; their peak RSS comes from the kernel's rusage.
        self._last_sample: float = self._t0
        self._sampled = False
        self._peak_rss = 0  # largest sampled sum of the tree's RSS
        self._peak_hwm = 0  # largest per-process high-water mark seen (Linux VmHWM)
        self._last_cpu = 0.0
        self._log_cap = log_cap  # owns a read-write fd of the log while the frame runs
        self._footer = footer  # (frame id, attempt): the log's last line says how it ended
        # Escapees (see track_strays): the frame's CUE_FRAME_ID, its lease files, and the
        # strays already sent SIGTERM.
        self._marker: str | None = None
        self._lock_ids: frozenset[tuple[int, int]] = frozenset()
        self._termed_strays: set[int] = set()
        if popen is not None and immediate is None:
            _LEADERS[self.pid] = self

    def track_strays(self, *, marker: str | None, lock_fds: Sequence[int] = ()) -> None:
        """How to recognise this frame's processes once they left its session and tree
        (re-parented to this subreaper): ``CUE_FRAME_ID=marker`` in their environment, or
        one of the lease files behind ``lock_fds`` open. Members of the frame's session or
        process group are recognised anyway."""
        self._marker = marker
        self._lock_ids = file_ids(lock_fds)

    # -- start -------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_path: Path,
        cwd: str | Path | None = None,
        pass_fds: Sequence[int] = (),
        timeout_s: float | None = None,
        header: str | None = None,
        grace: float = DEFAULT_GRACE_S,
        sample_interval: float = DEFAULT_SAMPLE_INTERVAL_S,
        run_as: "RunAs | None" = None,
        log_root: str | Path | None = None,
        log_limit: int | None = DEFAULT_LOG_LIMIT,
        footer: tuple[str, int] | None = None,
        rqlog: RqlogLink | None = None,
    ) -> "FrameProcess":
        """Spawn ``argv`` with stdin from /dev/null and stdout+stderr appended to ``log_path``.

        ``header`` (see :func:`log_header`) is written before the child starts, so the log
        always says which attempt the following lines belong to. ``pass_fds`` stay open in
        the child — the device lease locks, so a device stays leased until the frame exits
        even if the worker dies. ``timeout_s`` counts from now; on expiry the group is TERMed
        and KILLed ``grace`` s later.

        A command that cannot be executed does not raise: the error goes to the log and the
        returned process has already finished with 127 (command or ``cwd`` not found) or 126
        (anything else: permission denied, not an executable, fork failure), as a shell
        would report it. Failing to open the log itself raises ``OSError``: there would be
        nowhere to say why. ``CannotEnter``: ``run_as`` may not enter ``cwd`` (in the log too).

        The log is opened by :func:`open_frame_log` (``log_root``: the worker's log
        directory; links are never followed) and handed to ``run_as``. ``log_limit``: bytes
        this attempt's log may keep (head and tail, see ``_LogCap``); None: no cap.
        ``footer`` (frame id, attempt): when the attempt ends, :func:`log_footer` is appended
        to the log, after any cut, saying how it ended. ``rqlog``: the OpenCue-named link
        pointed at this log once it is open (CueGUI's view of it; never fails the start).
        """
        argv = list(argv)
        if not argv:
            raise InvalidInput("command: empty argv")
        log_path = _as_path(log_path)
        root = _as_path(log_root) if log_root is not None else log_path.parent.parent
        fd, rw_fd = _open_log_fds(log_path, root, run_as, rw=log_limit is not None, rqlog=rqlog)
        log_cap = _LogCap(rw_fd, log_limit) if rw_fd is not None and log_limit is not None else None
        try:
            if header is not None:
                _write_line(fd, header)
            if log_cap is not None:
                log_cap.started()
            started_at = time.time()
            try:
                popen = _start_child(argv, env, fd, None if cwd is None else str(cwd), tuple(pass_fds),
                                     run_as.popen_kwargs() if run_as else {})
                spawner_maxrss = _self_maxrss_bytes()
            except CannotEnter as exc:
                # Raised to the worker ("frame not started"), whose own note could not open
                # a log that already belongs to the frame's user: said here, once.
                _write_line(fd, f"cuectl: frame not started: {exc}")
                raise
            except (OSError, ValueError) as exc:
                code = _exec_failure_code(exc)
                _write_line(fd, f"cuectl: cannot run {argv[0]!r}: {_describe(exc)}")
                ended = time.time()
                info = ExitInfo(code, None, False, False, started_at, ended, None, None)
                line = log_footer(footer[0], footer[1], info) if footer is not None else None
                if log_cap is not None:
                    log_cap.finish(line)
                elif line is not None:
                    _write_line(fd, line)
                return cls(popen=None, log_path=log_path, timeout_s=None, grace=grace,
                           sample_interval=sample_interval, started_at=started_at, immediate=info)
        except BaseException:
            if log_cap is not None:
                os.close(log_cap.fd)
            raise
        finally:
            os.close(fd)  # the child has its own copy (the worker keeps only the cap's)
        proc = cls(popen=popen, log_path=log_path, timeout_s=timeout_s, grace=grace,
                   sample_interval=sample_interval, started_at=started_at,
                   spawner_maxrss=spawner_maxrss, log_cap=log_cap, footer=footer)
        if _subreaper:
            proc.track_strays(marker=env.get("CUE_FRAME_ID"), lock_fds=pass_fds)
        return proc

    # -- public state machine ----------------------------------------------------------

    def poll(self) -> ExitInfo | None:
        """Non-blocking: the result once the frame (leader and group) is gone, else None.

        Side effects: reaps the leader, samples RSS/CPU at most every ``sample_interval``,
        starts the kill on timeout, escalates TERM -> KILL when the grace period is over.
        """
        with self._lock:
            if self._result is not None:
                return self._result
            now = time.monotonic()
            if self._reaped is None:
                self._check_log(now)
                self._maybe_sample(now)
                self._try_reap()
            if self._reaped is None:
                if self._timeout_s is not None and now - self._t0 >= self._timeout_s and not self._killed:
                    self._timed_out = True
                    self._begin_kill(self._grace, "timeout", note=f"timeout after {self._timeout_s:g}s")
                self._escalate(now)
                return None
            if self._group_remains(now):
                return None
            self._result = self._build_result()
            self._close_log()
            return self._result

    def note_exit(self) -> None:
        """From another thread, while the owner is busy elsewhere: if the leader has exited
        (a zombie, not reaped: ``WNOWAIT``), note the time, which ``poll`` then records as
        the frame's end instead of the later time it reaps it. Never blocks on the owner."""
        if self.exit_seen_at is not None or self._reaped is not None or self._popen is None:
            return
        if not self._lock.acquire(blocking=False):
            return  # the owner is polling right now: it reaps at once
        try:
            if self._reaped is None and self.exit_seen_at is None:
                seen = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if seen is not None:
                    self.exit_seen_at = time.time()
        except (ChildProcessError, OSError):
            pass
        finally:
            self._lock.release()

    def wait(self, timeout: float | None = None) -> ExitInfo | None:
        """Poll until finished (the result) or ``timeout`` s passed (None)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _WAIT_MIN_SLEEP_S
        while True:
            info = self.poll()
            if info is not None:
                return info
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            nap = delay if deadline is None else min(delay, deadline - now)
            time.sleep(max(0.0, nap))
            delay = min(delay * 2, _WAIT_MAX_SLEEP_S)

    def kill(self, *, grace: float = DEFAULT_GRACE_S, reason: str = "killed") -> None:
        """TERM the group now; :meth:`poll` sends KILL once ``grace`` s have passed.

        Idempotent; a second call can only shorten the grace period (``grace=0``: KILL now).
        """
        with self._lock:
            if self._result is not None or self._popen is None:
                return
            if self._reaped is None and not self._killed:
                self._begin_kill(grace, reason, note=reason)
            elif self._term_sent_at is not None:
                self._shorten_grace(grace)
            else:
                # The leader already exited; poll() is about to put down what it left behind.
                self._grace = min(self._grace, grace)
            self._escalate(time.monotonic())

    def kill_and_wait(self, *, grace: float = DEFAULT_GRACE_S, reason: str = "killed") -> ExitInfo:
        """Blocking :meth:`kill`: returns once the whole group is gone."""
        self.kill(grace=grace, reason=reason)
        info = self.wait()
        assert info is not None  # wait() without a timeout only returns a result
        return info

    @property
    def finished(self) -> bool:
        return self._result is not None

    def pids(self, table: ProcessTable | None = None) -> set[int]:
        """Live pids of the frame: its process group plus descendants that left the group.

        For per-process GPU accounting (NVML lists pids) and for signalling. ``table``: a
        ``process_table()`` snapshot shared by several frames (one is taken if not given).
        """
        if self._popen is None or self._result is not None:
            return set()
        table = process_table() if table is None else table
        members = _group_pids(self.pgid, table)
        if self._reaped is None:
            members |= self._tree_pids(table)
        return members

    def sample_tree(self) -> tuple[int, float]:
        """(RSS bytes of all live processes now, their CPU seconds incl. reaped children).

        CPU adds each live process's user+system and its reaped children's: a dead process's
        time is counted in exactly the one live ancestor that reaped it, so nothing twice.
        """
        rss, cpu, _ = self._measure()
        return rss, cpu

    def _measure(self) -> tuple[int, float, int]:
        """(sum of RSS, CPU seconds, largest per-process peak RSS) over :meth:`pids`."""
        import psutil

        rss, cpu, hwm = 0, 0.0, 0
        for pid in self.pids():
            try:
                proc = psutil.Process(pid)
                with proc.oneshot():
                    rss += proc.memory_info().rss
                    t = proc.cpu_times()
                    cpu += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            hwm = max(hwm, _high_water_rss(pid))
        return rss, cpu, hwm

    # -- internals ---------------------------------------------------------------------

    def _tree_pids(self, table: ProcessTable | None = None) -> set[int]:
        """The unreaped leader and its live descendants (empty if the leader is gone)."""
        table = process_table() if table is None else table
        if self.pid not in table:
            return set()
        return {self.pid} | _descendants(self.pid, table)

    def _check_log(self, now: float) -> None:
        """Keep the log under its cap; stop a frame that keeps writing into a full disk."""
        if self._log_cap is None:
            return
        try:
            full = self._log_cap.check(now)
        except OSError:
            return  # the file vanished or cannot be read back: nothing to cut
        if full and not self._killed:
            self._begin_kill(self._grace, "disk full",
                             note=f"{full}: stopping the frame before it fills the disk further")

    def _close_log(self) -> None:
        """The attempt is over: finish the log's cap, and end the log with the footer."""
        lost = self._log_cap is not None and self._result is not None and self._log_cap.space_lost()
        if lost and self._result is not None:
            self._result = replace(self._result, log_lost=True)
        footer = None
        if self._footer is not None and self._result is not None:
            grace = self._grace
            if self._term_sent_at is not None and self._kill_deadline is not None:
                grace = max(0.0, self._kill_deadline - self._term_sent_at)  # as shortened by kill()
            footer = log_footer(self._footer[0], self._footer[1], self._result, timeout_s=self._timeout_s,
                                grace=grace, sigkilled=self._kill_sent_at is not None)
        if self._log_cap is not None:
            cap, self._log_cap = self._log_cap, None
            cap.finish(footer, lost=lost)
        elif footer is not None:
            _append_log(self.log_path, footer)

    def __del__(self) -> None:
        cap = getattr(self, "_log_cap", None)
        if cap is not None:
            try:
                os.close(cap.fd)
            except OSError:
                pass

    def _maybe_sample(self, now: float) -> None:
        # Sample densely while the frame is young (a quarter of its age, at least 0.1 s), so
        # short frames get measured too, settling at ``sample_interval`` (~1 s) for long ones.
        interval = min(self._sample_interval, max(0.1, (now - self._t0) / 4))
        if now - self._last_sample < interval:
            return
        self._last_sample = now
        self._sampled = True
        rss, cpu, hwm = self._measure()
        self._peak_rss = max(self._peak_rss, rss)
        self._peak_hwm = max(self._peak_hwm, hwm)
        self._last_cpu = max(self._last_cpu, cpu)

    def _try_reap(self) -> None:
        assert self._popen is not None
        try:
            pid, status, rusage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:
            # Someone reaped it behind our back (SIGCHLD=SIG_IGN, a stray waitpid(-1)):
            # the frame is over but its status is lost.
            self._reaped = (None, None, time.time())
            self._popen.returncode = -1
            if _LEADERS.get(self.pid) is self:
                del _LEADERS[self.pid]
            return
        if pid == 0:
            return
        self._reaped = (status, rusage, self.exit_seen_at or time.time())
        if _LEADERS.get(self.pid) is self:
            del _LEADERS[self.pid]
        # Tell Popen the child is reaped, so it never waits on a pid that may be reused.
        self._popen.returncode = os.waitstatus_to_exitcode(status)

    def _begin_kill(self, grace: float, reason: str, *, note: str) -> None:
        self._killed = True
        self._kill_reason = reason
        _append_log(self.log_path, f"=== cuectl: {note}: terminating the process group (grace {grace:g}s) ===")
        self._terminate(grace)

    def _terminate(self, grace: float) -> None:
        now = time.monotonic()
        if self._term_sent_at is None:
            self._term_sent_at = now
            self._signal_all(signal.SIGTERM)
        self._kill_deadline = now + max(0.0, grace)

    def _shorten_grace(self, grace: float) -> None:
        deadline = time.monotonic() + max(0.0, grace)
        if self._kill_deadline is None or deadline < self._kill_deadline:
            self._kill_deadline = deadline

    def _escalate(self, now: float) -> None:
        if self._kill_deadline is not None and self._kill_sent_at is None and now >= self._kill_deadline:
            self._kill_sent_at = now
            self._signal_all(signal.SIGKILL)

    def _signal_all(self, sig: int) -> None:
        """Signal the group, and descendants that moved to another group, while we can.

        Only pids that are descendants *right now* are signalled individually (never a pid
        remembered from earlier, which could have been reused by an unrelated process).
        Before the leader is reaped its pid pins the pgid; afterwards the group's remaining
        members do, so ``killpg`` cannot hit a stranger while anything of ours is left.

        The descendants are found *before* the group is signalled: once the leader dies its
        children are re-parented to init at once (reaped or not), and one that had left the
        group would no longer look like ours.

        After the leader exited, processes the frame left that were re-parented to us (we
        are a subreaper: see :meth:`_strays`) are signalled as well.
        """
        if self._reaped is not None:
            strays = self._strays()
            _signal_group(self.pgid, sig)
            _signal_pids(strays, sig)
            if sig == signal.SIGTERM:
                self._termed_strays |= strays
            return
        table = process_table()
        escaped = {pid for pid in self._tree_pids(table) - {self.pid} if table[pid][1] != self.pgid}
        _signal_group(self.pgid, sig)
        for pid in escaped:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                continue

    def _strays(self) -> set[int]:
        """Live processes of this frame re-parented to us (a subreaper) once their parent
        died — ``setsid cmd &``, double forks — with their descendants. Recognised by the
        frame's session or group, ``CUE_FRAME_ID`` in their environment, or a lease file
        of the frame open (:meth:`track_strays`). Empty unless we are a subreaper."""
        if not _subreaper or self._popen is None:
            return set()
        return leftover_children(self._owns)

    def _owns(self, pid: int, pgid: int, sid: int) -> bool:
        if sid == self.pgid or pgid == self.pgid:
            return True
        if self._marker is not None and _env_value(pid, "CUE_FRAME_ID") == self._marker:
            return True
        return holds_file(pid, self._lock_ids)

    def _group_remains(self, now: float) -> bool:
        """After the leader exited: True while leftovers of its group, or processes of the
        frame that escaped it (:meth:`_strays`), are being put down."""
        strays = self._strays()
        if not strays and not process_group_alive(self.pgid):
            return False
        if self._term_sent_at is None:
            _append_log(self.log_path, "=== cuectl: frame exited, terminating processes it left running ===")
            self._terminate(self._grace)
        elif strays - self._termed_strays:
            new = strays - self._termed_strays  # re-parented since the TERM went out
            _signal_pids(new, signal.SIGKILL if self._kill_sent_at is not None else signal.SIGTERM)
            self._termed_strays |= new
        self._escalate(now)
        if self._kill_sent_at is not None and now - self._kill_sent_at > _STRAGGLER_GIVE_UP_S:
            _append_log(self.log_path, "=== cuectl: processes survived SIGKILL; giving up on them ===")
            return False
        return True

    def _build_result(self) -> ExitInfo:
        assert self._reaped is not None
        status, rusage, ended_at = self._reaped
        exit_code: int | None = None
        exit_signal: int | None = None
        if status is not None:
            if os.WIFSIGNALED(status):
                exit_signal = os.WTERMSIG(status)
            else:
                exit_code = os.waitstatus_to_exitcode(status)
        max_rss = max(self._peak_rss, self._peak_hwm) or None
        cpu = self._last_cpu if self._sampled else None
        if rusage is not None:
            # The leader's ru_maxrss starts at the *worker's* peak RSS: exec records the
            # high-water mark of the forked copy of our address space before replacing it.
            # So it only says something about the frame when it exceeds what the worker had
            # ever reached at spawn time; otherwise rely on the samples.
            kernel_rss = _maxrss_bytes(rusage.ru_maxrss)  # type: ignore[attr-defined]
            if kernel_rss > self._spawner_maxrss:
                max_rss = max(max_rss or 0, kernel_rss)
            rusage_cpu = rusage.ru_utime + rusage.ru_stime  # type: ignore[attr-defined]
            cpu = max(cpu or 0.0, rusage_cpu)
        return ExitInfo(
            exit_code=exit_code,
            exit_signal=exit_signal,
            timed_out=self._timed_out,
            killed=self._killed,
            started_at=self._started_at,
            ended_at=ended_at,
            max_rss_bytes=max_rss,
            cpu_seconds=cpu,
            kill_reason=self._kill_reason,
        )

    def __repr__(self) -> str:
        state = "finished" if self._result is not None else ("killing" if self._killed else "running")
        return f"<FrameProcess pid={self.pid} {state} log={str(self.log_path)!r}>"


def _maxrss_bytes(ru_maxrss: int) -> int:
    # Linux reports KiB, macOS bytes.
    return int(ru_maxrss) if sys.platform == "darwin" else int(ru_maxrss) * 1024


def _as_path(path: str | Path) -> Path:
    """``path`` as a Path, without the parse of ``Path(p)`` when it is one already (the
    frame start path makes several a frame)."""
    return path if isinstance(path, Path) else Path(path)


def _self_maxrss_bytes() -> int:
    """The worker's own peak RSS: what a freshly exec'd child's ru_maxrss starts from."""
    import resource

    return _maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _high_water_rss(pid: int) -> int:
    """Peak RSS of one process since its last exec (Linux ``VmHWM``); 0 where unknown.

    Unlike ru_maxrss it is per address space, so it does not inherit the worker's size, and
    unlike a point sample it remembers a spike between two samples.
    """
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # "VmHWM:   51234 kB"
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _exec_failure_code(exc: BaseException) -> int:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return EXIT_NOT_FOUND
    return EXIT_CANNOT_EXECUTE


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        text = exc.strerror or str(exc)
        if exc.filename is not None:
            text += f": {exc.filename!s}"
        return text
    return str(exc)
