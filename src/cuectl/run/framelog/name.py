"""An attempt log's name, as the log's readers and writers see it: the one definition lives
in ``cuectl.sched.logname``, below the store, whose claim statement writes the same path."""

from cuectl.sched.logname import (
    ATTEMPT_SEP,
    FRAME_NAME_SEP,
    LOG_SUFFIX,
    attempt_log_name,
    attempt_log_path,
    job_log_dir,
    log_path_sql,
)

__all__ = [
    "ATTEMPT_SEP",
    "FRAME_NAME_SEP",
    "LOG_SUFFIX",
    "attempt_log_name",
    "attempt_log_path",
    "job_log_dir",
    "log_path_sql",
]
