"""Everything about one attempt's log file, in one home. Every name is importable from
here; the modules split the work:

- ``name``: where an attempt's log is, ``<log dir>/<job id>/<frame name>.<attempt>.log``
  (one definition, for the store's claim statement and the readers);
- ``write``: opening it for the frame without following a planted link, the root log
  directory's rules, header, footer and notes, the size cap (``_LogCap``);
- ``read``: opening it for a reader inside the log directory only, its tail, and the one
  follower that ``cuectl frame log -f`` and the API's ``follow=true`` both run (a
  generator of data and wait steps, driven by ``time.sleep`` or ``asyncio.sleep``).
"""

from cuectl.run.framelog.name import (
    ATTEMPT_SEP,
    FRAME_NAME_SEP,
    LOG_SUFFIX,
    attempt_log_name,
    attempt_log_path,
    job_log_dir,
    log_path_sql,
)
from cuectl.run.framelog.read import (
    DEFAULT_TAIL_BYTES,
    REFRESH,
    Note,
    Refresh,
    Step,
    Wait,
    attempt_over,
    drive,
    drive_async,
    follow,
    open_log,
    read_log,
    read_log_tail,
    tail_bytes,
)
from cuectl.run.framelog.write import (
    DEFAULT_LOG_LIMIT,
    LOG_DIR_MODE,
    LOG_FILE_MODE,
    MIN_LOG_LIMIT,
    ROOT_LOG_DIR_MODE,
    RqlogLink,
    UnsafeLogPath,
    append_log_note,
    describe_end,
    log_footer,
    log_header,
    open_frame_log,
    signal_name,
)

__all__ = [
    "ATTEMPT_SEP",
    "DEFAULT_LOG_LIMIT",
    "DEFAULT_TAIL_BYTES",
    "FRAME_NAME_SEP",
    "LOG_DIR_MODE",
    "LOG_FILE_MODE",
    "LOG_SUFFIX",
    "MIN_LOG_LIMIT",
    "REFRESH",
    "ROOT_LOG_DIR_MODE",
    "Note",
    "Refresh",
    "RqlogLink",
    "Step",
    "UnsafeLogPath",
    "Wait",
    "append_log_note",
    "attempt_log_name",
    "attempt_log_path",
    "attempt_over",
    "describe_end",
    "drive",
    "drive_async",
    "follow",
    "job_log_dir",
    "log_footer",
    "log_header",
    "log_path_sql",
    "open_frame_log",
    "open_log",
    "read_log",
    "read_log_tail",
    "signal_name",
    "tail_bytes",
]
