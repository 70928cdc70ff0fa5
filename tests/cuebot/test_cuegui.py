"""CueGUI and CueSubmit, OpenCue's own GUI clients, against `cuectl serve --opencue` (issue 34):
scripts/cuegui-check.sh run as a person runs it. Under Xvfb, in its own venv (.venv-cuegui,
which scripts/test.sh's setup installs: PySide6 and the clients never enter .venv), it drives
Cuetopia's job, frame and log views and CueCommander's host view on a GPU job running on a
real worker on fake GPUs, submits with CueSubmit's submission function, and fails naming the
check, including any call a view made that the server answered UNIMPLEMENTED or INTERNAL.
About 30 s; the screenshots go to the test's directory, not docs/images."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHOTS = ("cuegui-cuetopia.png", "cuegui-frames.png", "cuegui-hosts.png")


def test_cuegui_and_cuesubmit_drive_a_running_gpu_job(tmp_path: Path) -> None:
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "cuegui-check.sh"), "--screenshots", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    output = res.stdout + res.stderr
    assert res.returncode == 0, output
    for check in (
        "Monitor Jobs lists",
        "frame monitor: frame 1 Status RUNNING",
        "LogView: ",
        "Monitor Cue lists",
        "Idle GPUs '1'",
        "procs of demo-workstation",
        "submitJob returned",
        "frames SUCCEEDED on demo-workstation",
    ):
        assert check in output, f"{check!r} not reported:\n{output}"
    assert "cuegui-check: passed" in output
    for name in SHOTS:
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and 10_000 < len(data) < 200 * 1024, (name, len(data))
