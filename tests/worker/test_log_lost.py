"""A frame that floods its log onto a small filesystem faster than the worker's
once-a-second free-space check, then exits 0 (issue 41 §7): the cut is noted in the log and
on the attempt (failure_kind `log-lost`), the frame is not a clean success, the log is cut
back so the disk is not left full, and the footer is still written."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FLOOD = (
    "import os\n"
    "for _ in range(64):  # 4 MiB at once onto a 2 MiB filesystem; failed writes are ignored\n"
    "    try: os.write(1, b'x' * 65536)\n"
    "    except OSError: pass\n"
)


def test_a_log_lost_to_a_full_disk_is_not_a_clean_success(farm, small_log_fs: Path) -> None:
    flood = farm.submit(
        {"name": "flood", "layers": [{"name": "w", "command": [sys.executable, "-c", FLOOD], "retries": 0}]}
    )
    res = farm.run_worker(None, env={"CUECTL_LOG_DIR": str(small_log_fs)}, timeout=60)
    assert res.returncode == 0, res.stderr
    (frame,) = farm.frames(flood)
    shown = json.loads(farm.cuectl("frame", "show", str(frame["id"]), "--json").stdout)
    assert shown["state"] == "DEAD", shown
    (attempt,) = shown["attempt_history"]
    assert (attempt["exit_code"], attempt["failure_kind"]) == (0, "log-lost"), attempt
    assert "output was lost" in attempt["failure"]
    log = Path(shown["log_path"]).read_text(errors="replace")
    assert "the log's filesystem was full when this attempt ended" in log
    assert "=== cuectl frame" in log.splitlines()[-1]  # the footer made it too
    st = os.statvfs(small_log_fs)
    assert st.f_bavail * st.f_frsize > 1 << 20, "the disk was left full"
    # A frame that writes a little on that filesystem afterwards succeeds as ever.
    quiet = farm.submit({"name": "quiet", "layers": [{"name": "w", "command": ["echo", "hello"]}]})
    assert farm.run_worker(None, env={"CUECTL_LOG_DIR": str(small_log_fs)}, timeout=60).returncode == 0
    assert [f["state"] for f in farm.frames(quiet)] == ["SUCCEEDED"]
