"""Frame launch: command tokens, the frame environment, and one supervised frame process.

A face: the code lives in the rooms named below, and every name the worker, ``cuectl run``
and the tests use is importable from here as it always was.

This is what the worker uses to turn a claimed frame into a running process (DESIGN §4,
§5 "Leases", "Failure", "Kill"):

* :func:`substitute_tokens` replaces ``#IFRAME#``-style tokens in a layer's command.
* :func:`frame_env` builds the environment: inherited < layer env < ``CUE_*`` < isolation
  (:func:`env_template`: all of it but the frame's own values, which a layer's frames share).
* :class:`FrameProcess` spawns the frame in its own session (so its process group is ours to
  kill as a whole), appends stdout+stderr to the frame log, enforces the timeout by TERMing
  the group and KILLing it after a grace period, and reports exit status, peak RSS and CPU
  time.

The rooms: ``run/frame/env.py`` (:class:`FrameContext`, :func:`frame_env`),
``run/frame/tokens.py`` (:func:`substitute_tokens`), ``run/frame/start.py`` (:class:`RunAs`,
starting the command), ``run/frame/process.py`` (:class:`FrameProcess`, :class:`ExitInfo`),
``run/procs.py`` (process groups, the subreaper, escaped descendants) and ``run/framelog/``
(the attempt's log file).

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

import subprocess  # noqa: F401  (tests patch ``launch.subprocess.Popen``)

from cuectl.run.frame.env import EnvTemplate, FrameBase, FrameContext, env_template, frame_base, frame_env, frame_name
from cuectl.run.frame.process import (
    DEFAULT_SAMPLE_INTERVAL_S,
    EXIT_CANNOT_EXECUTE,
    EXIT_NOT_FOUND,
    ExitInfo,
    FrameProcess,
)
from cuectl.run.frame.start import CWD_LOCK, CannotEnter, RunAs, Spawned, _start_child
from cuectl.run.frame.tokens import substitute_tokens
from cuectl.run.framelog.write import (
    _FULL_DISK_LOG,
    DEFAULT_LOG_LIMIT,
    LOG_DIR_MODE,
    LOG_FILE_MODE,
    MIN_LOG_LIMIT,
    ROOT_LOG_DIR_MODE,
    RqlogLink,
    UnsafeLogPath,
    _LogCap,
    append_log_note,
    describe_end,
    log_footer,
    log_header,
    open_frame_log,
    signal_name,
)
from cuectl.run.procs import (
    DEFAULT_GRACE_S,
    _process_table_psutil,
    become_subreaper,
    file_ids,
    hold_child,
    holds_file,
    kill_by_env,
    kill_leftovers,
    kill_process_group,
    leftover_children,
    process_group_alive,
    process_table,
    processes_with_env,
    release_child,
)

__all__ = [
    "CWD_LOCK",
    "CannotEnter",
    "DEFAULT_GRACE_S",
    "DEFAULT_LOG_LIMIT",
    "DEFAULT_SAMPLE_INTERVAL_S",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_NOT_FOUND",
    "EnvTemplate",
    "ExitInfo",
    "FrameBase",
    "FrameContext",
    "FrameProcess",
    "LOG_DIR_MODE",
    "LOG_FILE_MODE",
    "MIN_LOG_LIMIT",
    "ROOT_LOG_DIR_MODE",
    "RqlogLink",
    "RunAs",
    "Spawned",
    "UnsafeLogPath",
    "_FULL_DISK_LOG",
    "_LogCap",
    "_process_table_psutil",
    "_start_child",
    "append_log_note",
    "become_subreaper",
    "describe_end",
    "env_template",
    "file_ids",
    "frame_base",
    "frame_env",
    "frame_name",
    "hold_child",
    "holds_file",
    "kill_by_env",
    "kill_leftovers",
    "kill_process_group",
    "leftover_children",
    "log_footer",
    "log_header",
    "open_frame_log",
    "process_group_alive",
    "process_table",
    "processes_with_env",
    "release_child",
    "signal_name",
    "substitute_tokens",
]
