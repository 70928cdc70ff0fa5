"""Which backend found the GPUs, and what the worker says about it.

- ``auto`` falling back from NVML to nvidia-smi is warned about (slower sampling, less
  per-process data), and the worker's start-up line names the backend(s) that found devices.
- ``cuectl worker --backend NAME`` is strict: a named backend that finds no GPU is an error
  (exit 1, one line naming it and why); ``auto`` may find none and run a CPU-only worker.

NVML is made unavailable with a stand-in ``pynvml`` module on PYTHONPATH whose ``nvmlInit``
fails as it does without the driver library; nvidia-smi is a stub on PATH printing a real
capture from tests/fixtures/gpu.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_support import Out, StubTools, fixture_path
from nvml_double import FakeNvml, h100_box

from cuectl.errors import BackendUnavailable
from cuectl.gpu import discover
from cuectl.gpu.amd import AmdBackend
from cuectl.gpu.apple import AppleBackend
from cuectl.gpu.base import Backend
from cuectl.gpu.nvml import NvmlBackend
from cuectl.gpu.smi import SmiBackend

H100_CSV = fixture_path("nvidia-smi/query-gpu/h100-80gb-hbm3_590.48.01_load.csv")
L40S_CSV = fixture_path("nvidia-smi/query-gpu/l40s_595.80_load.csv")
LIBRARY_NOT_FOUND = 12

# What pynvml does on a machine without libnvidia-ml: the import works, nvmlInit fails.
NO_NVML = """\
class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

def nvmlInit():
    raise NVMLError(12)  # NVML_ERROR_LIBRARY_NOT_FOUND
"""


def factory(nvml: FakeNvml, tmp_path: Path):
    def make(name: str) -> Backend:
        return {
            "nvml": lambda: NvmlBackend(nvml=nvml),
            "smi": SmiBackend,
            "amd": lambda: AmdBackend(sysfs_root=tmp_path / "no-drm"),
            "apple": AppleBackend,
        }[name]()

    return make


# -- in-process: the Discovery says who found what ------------------------------------------------


def test_fallback_to_nvidia_smi_is_a_warning_naming_why(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", Out(file=H100_CSV))
    found = discover(fake_file="", make_backend=factory(FakeNvml([], init_error=LIBRARY_NOT_FOUND), tmp_path))
    assert found.found_by() == ["smi"]
    (warning,) = found.warnings()
    assert warning.startswith("NVML is not usable: NVML library (libnvidia-ml) not found")
    assert "using nvidia-smi instead" in warning and "per-process" in warning


def test_no_warning_when_nvml_works_or_smi_was_asked_for(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", Out(file=H100_CSV))
    found = discover(fake_file="", make_backend=factory(h100_box(2), tmp_path))
    assert (found.found_by(), found.warnings()) == (["nvml"], [])
    forced = discover("smi", fake_file="")
    assert (forced.found_by(), forced.warnings()) == (["smi"], [])


def test_problems_name_the_backends_that_failed(tools: StubTools, tmp_path: Path) -> None:
    found = discover(fake_file="", make_backend=factory(FakeNvml([], init_error=LIBRARY_NOT_FOUND), tmp_path))
    problems = found.problems()
    assert problems["nvml"] == "NVML library (libnvidia-ml) not found"
    assert problems["smi"] == "nvidia-smi not found on PATH"


# -- a real `cuectl worker` ---------------------------------------------------------------------


def worker(tmp_path: Path, *args: str, path: str, fake: Path | None = None) -> subprocess.CompletedProcess:
    """`cuectl worker --until-idle` on an empty store, with NVML made unavailable."""
    stub_mods = tmp_path / "no-nvml"
    stub_mods.mkdir(exist_ok=True)
    (stub_mods / "pynvml.py").write_text(NO_NVML)
    env = dict(os.environ, PATH=path, PYTHONPATH=str(stub_mods))
    env.pop("CUECTL_FAKE_GPUS", None)
    if fake is not None:
        env["CUECTL_FAKE_GPUS"] = str(fake)
    exe = Path(sys.executable).with_name("cuectl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]
    # --no-timestamps: the lines are matched from their start (a pipe would stamp them).
    return subprocess.run(
        [
            *cmd,
            "--db",
            str(tmp_path / "store.db"),
            "worker",
            "--until-idle",
            "--poll",
            "0.05",
            "--no-timestamps",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_worker_warns_about_the_fallback_and_names_the_backend(tools: StubTools, tmp_path: Path) -> None:
    tools.add("nvidia-smi", Out(file=L40S_CSV))
    res = worker(tmp_path, path=f"{tools.bin}:/usr/bin:/bin")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    warnings = [ln for ln in lines if ln.startswith("warning: NVML is not usable")]
    assert len(warnings) == 1 and "libnvidia-ml" in warnings[0] and "nvidia-smi" in warnings[0], res.stderr
    (start,) = [ln for ln in lines if ln.startswith("worker ")]
    assert "0:NVIDIA L40S" in start and "(found by smi)" in start, start


def test_worker_with_a_named_backend_that_finds_nothing_fails(tools: StubTools, tmp_path: Path) -> None:
    # nvidia-smi is not on PATH (only the empty stub directory is).
    res = worker(tmp_path, "--backend", "smi", path=str(tools.bin))
    assert res.returncode == 1, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: --backend smi: no GPU found: nvidia-smi not found on PATH"], res.stderr
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr
    assert not (tmp_path / "store.db").exists(), "refused before the store is opened"

    empty = tmp_path / "none.yaml"
    empty.write_text("host: empty-01\ndevices: []\n")
    res = worker(tmp_path, "--backend", "fake", path=str(tools.bin), fake=empty)
    assert res.returncode == 1
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("error:")] == [
        "error: --backend fake: no GPU found: it found no GPU"
    ]


def test_worker_auto_without_gpus_runs_cpu_only(tools: StubTools, tmp_path: Path) -> None:
    res = worker(tmp_path, path=str(tools.bin))
    assert res.returncode == 0, res.stderr
    (start,) = [ln for ln in res.stderr.splitlines() if ln.startswith("worker ")]
    assert ": no GPUs (tried nvml, smi, amd, apple);" in start or "(found by amd)" in start, start
    assert not [ln for ln in res.stderr.splitlines() if ln.startswith(("error:", "warning:"))]


def _nvml_works_here() -> bool:
    try:
        return bool(NvmlBackend().discover())
    except BackendUnavailable:
        return False


@pytest.mark.skipif(_nvml_works_here(), reason="this machine has NVML GPUs: --backend nvml finds them")
def test_worker_backend_nvml_on_a_machine_without_nvml_fails(tmp_path: Path) -> None:
    """This machine for real: the installed pynvml, no libnvidia-ml."""
    exe = Path(sys.executable).with_name("cuectl")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "cuectl"]
    env = {k: v for k, v in os.environ.items() if k != "CUECTL_FAKE_GPUS"}
    db = tmp_path / "store.db"
    res = subprocess.run(
        [*cmd, "--db", str(db), "worker", "--backend", "nvml", "--until-idle"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 1, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --backend nvml: no GPU found: "), res.stderr
    assert "hint:" in res.stderr and "--backend auto" in res.stderr
    assert "Traceback" not in res.stderr and not db.exists()
