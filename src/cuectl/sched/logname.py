"""An attempt log's name: ``<log dir>/<job id>/<frame name>.<attempt>.log``, its one
definition — for the store's claim statement (:func:`log_path_sql`) and for the readers in
run/framelog (:func:`attempt_log_path`: where an earlier attempt's log is). It lives below
the store, which must not import run/."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from cuectl.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from cuectl.sched.dialect import Dialect

# An attempt's log is ``<log dir>/<job id>/<frame name>.<attempt>.log`` (frame name:
# ``0001-render``). These constants are its one definition: the store's claim statement
# writes the path from them (``lifecycle.log_path_sql``), the readers find an earlier
# attempt's log from them (:func:`attempt_log_path`).
FRAME_NAME_SEP = "-"  # between the zero-padded frame number and the layer
ATTEMPT_SEP = "."  # between the frame name and the attempt number
LOG_SUFFIX = ".log"
_ATTEMPT_NAME = re.compile(rf"^(?P<stem>.+){re.escape(ATTEMPT_SEP)}(?P<attempt>[0-9]+){re.escape(LOG_SUFFIX)}$")


def attempt_log_name(frame_name: str, attempt: int) -> str:
    """The file name of ``attempt`` of frame ``frame_name`` (``0001-render.2.log``)."""
    return f"{frame_name}{ATTEMPT_SEP}{attempt}{LOG_SUFFIX}"


def job_log_dir(log_dir: str | Path, job_id: int | str) -> Path:
    """A job's directory of attempt logs, ``<log dir>/<job id>`` (a frame's ``log_path``
    has it as its parent)."""
    return Path(log_dir) / str(job_id)


def log_path_sql(dialect: Dialect, alias: str = "") -> str:
    """The attempt's log path as the SQL expression a claim statement stores, from two ``?``
    parameters (the log dir, the layer name) and the claimed row's columns (``alias``: its
    table alias): the same name as :func:`attempt_log_name` of the next attempt."""
    col = f"{alias}." if alias else ""
    return (
        f"CAST(? AS TEXT) || '/' || {col}job_id || '/' || {dialect.pad4(col + 'number')} || "
        f"'{FRAME_NAME_SEP}' || CAST(? AS TEXT) || '{ATTEMPT_SEP}' || ({col}attempts + 1) || '{LOG_SUFFIX}'"
    )


def attempt_log_path(frame: Mapping[str, Any], attempt: int | None = None) -> str:
    """The log path of ``attempt`` of ``frame`` (``store.get_frame``; None: its latest).

    The store keeps the latest attempt's path; the others differ only in the attempt
    number (:func:`attempt_log_name`)."""
    latest = int(frame.get("attempts") or 0)
    path = frame.get("log_path")
    if attempt is None:
        if latest < 1:  # (not a bad --attempt: the user gave none)
            raise NotFound(
                f"frame {frame.get('id')} has not run yet ({frame.get('state')}): it has no log",
                hint="`cuectl frame log -f` waits for it to start",
            )
        attempt = latest
    if attempt < 1:
        raise InvalidInput(f"--attempt: attempts count from 1, got {attempt}")
    if not path or latest < 1:
        raise NotFound(f"frame {frame['id']} has no log yet (state {frame['state']})")
    if attempt > latest:
        raise NotFound(
            f"frame {frame['id']} has had {latest} attempt{'s' if latest != 1 else ''}, "
            f"not {attempt} (state {frame['state']})"
        )
    if attempt == latest:
        return str(path)
    parent, name = os.path.split(str(path))
    match = _ATTEMPT_NAME.match(name)
    if match is None or int(match["attempt"]) != latest:
        raise NotFound(
            f"the log path of frame {frame['id']} does not name its attempt; "
            f"cannot tell where attempt {attempt}'s log is"
        )
    return os.path.join(parent, attempt_log_name(match["stem"], attempt))
