"""Claims the docs make that the suite can hold them to.

- Windows (docs/gpu-setup.md): discovery works there; the worker, leases, isolation and the
  store do not. Checked on Linux by making the POSIX-only modules unimportable, as they are
  on Windows — and no page may claim Windows isolation or leases.
- docs/benchmarks.md: every section with figures names the `bench/` command that
  reproduces them and the date they were measured.
- docs/verified.md: the tests it cites exist, and it claims no undated hardware run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
#: Standard-library modules that exist on POSIX systems only (absent on Windows).
POSIX_ONLY = ("fcntl", "pwd", "grp", "termios", "resource")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


def section(text: str, heading: str) -> str:
    """The body of the first ``## heading…`` section, up to the next level-2 heading."""
    start = text.index("\n" + heading) + 1
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


# -- Windows ----------------------------------------------------------------------------------------
def as_on_windows(code: str, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter in which the POSIX-only modules cannot be imported."""
    block = f"import sys\nfor _m in {POSIX_ONLY!r}:\n    sys.modules[_m] = None\n"
    return subprocess.run(
        [sys.executable, "-c", block + code, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_gpu_setup_claims_no_isolation_or_leases_on_windows():
    windows = section((DOCS / "gpu-setup.md").read_text(), "## Windows")
    assert "works as on linux" not in windows.lower()
    lacking = windows[windows.index("**Not on Windows:**") :]
    lacking = lacking[: lacking.index("\n\n")]
    for what in ("`cuectl worker`", "`cuectl run`", "`cuectl.lease()`", "isolation"):
        assert what in lacking, what


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")) + ["README.md"])
def test_no_page_says_leases_or_isolation_work_on_windows(page):
    text = (REPO / page if page == "README.md" else DOCS / page).read_text()
    for sentence in re.split(r"(?<=[.!?])\s+|\n\n", text):
        if not re.search(r"\bwindows\b", sentence, re.I) or not re.search(r"\b(isolat\w*|leases?)\b", sentence, re.I):
            continue
        positive = re.search(r"\b(works?|supported|isolates?)\b", sentence, re.I)
        negated = re.search(r"\b(not|never|no|nor|lacks?|fails?|without)\b", sentence, re.I)
        assert not positive or negated, f"{page}: {sentence!r}"


def test_discovery_runs_without_the_posix_only_modules(tmp_path):
    """What docs/gpu-setup.md says works on Windows: `cuectl gpu list`, every backend."""
    fake = tmp_path / "gpus.yaml"
    fake.write_text('devices:\n  - {model: "NVIDIA GeForce RTX 2080 SUPER", memory: 8192MiB}\n')
    code = (
        "import json, sys\nfrom cuectl.cli.entry import run\nsys.argv = ['cuectl'] + json.loads(sys.argv[1])\nrun()\n"
    )
    for args, devices in (
        (["gpu", "list", "--json"], 1),
        (["gpu", "list", "--backend", "smi", "--json"], 0),
        (["gpu", "list", "--backend", "nvml", "--json"], 0),
    ):
        # PATH: no nvidia-smi to find, whatever this machine has.
        res = as_on_windows(code, json.dumps(args), CUECTL_FAKE_GPUS=str(fake), PATH=str(tmp_path))
        assert res.returncode == 0, (args, res.stderr)
        assert len(json.loads(res.stdout)["devices"]) == devices, (args, res.stdout)


@pytest.mark.parametrize(
    "module, what",
    [
        ("cuectl.run.lease", "device leases: cuectl run, cuectl.lease(), gpu leases"),
        ("cuectl.run.worker", "the worker"),
        ("cuectl.run.adhoc", "cuectl run"),
        ("cuectl.sched.store.sqlite", "the store"),
        ("cuectl.sched.identity", "the store (PostgreSQL too: who submitted a job)"),
    ],
)
def test_what_the_docs_say_windows_lacks_needs_posix_modules(module, what):
    """If one of these ever imports on Windows, docs/gpu-setup.md's Windows section (and
    docs/verified.md) must say what now works there."""
    res = as_on_windows(f"import {module}")
    assert res.returncode != 0 and "ModuleNotFoundError" in res.stderr, (what, res.stderr[-2000:])


# -- benchmarks -----------------------------------------------------------------------------------
#: A measured figure: a number with a unit of time, a rate or a ratio.
FIGURE = re.compile(r"\d(?:[\d,.]*\d)?\s?(?:µs|ms|s|%|x|k|frames/s|jobs/s|claims/s)(?![\w-])")
BENCH_COMMAND = re.compile(r"bench/bench_\w+\.py")


def benchmark_sections() -> list[tuple[str, str]]:
    """(heading, body) of docs/benchmarks.md: the text before the first ``## `` is "(top)"."""
    text = (DOCS / "benchmarks.md").read_text()
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return [("(top)", parts[0])] + list(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("heading", [h for h, _ in benchmark_sections()])
def test_every_benchmark_section_names_its_command_and_date(heading):
    body = heading + "\n" + dict(benchmark_sections())[heading]  # a date in the heading counts
    if not FIGURE.search(body):
        return
    assert BENCH_COMMAND.search(body), f"docs/benchmarks.md {heading}: figures without the bench/ command"
    assert DATE.search(body), f"docs/benchmarks.md {heading}: figures without the date they were measured"


def test_every_row_of_the_figures_table_names_its_command_and_date():
    """Tables with a `measured` column: each row carries its own command and date."""
    text = (DOCS / "benchmarks.md").read_text()
    tables = re.findall(r"(?:^\|.*\|\n)+", text, flags=re.M)
    dated = [t for t in tables if "measured" in t.splitlines()[0].lower()]
    assert dated, "docs/benchmarks.md has no table with a `measured` column"
    for table in dated:
        for row in table.splitlines()[2:]:
            assert BENCH_COMMAND.search(row) and DATE.search(row), row


# -- verified.md ----------------------------------------------------------------------------------
def test_verified_page_cites_tests_that_exist_and_dates_every_hardware_run():
    text = (DOCS / "verified.md").read_text()
    cited = set(re.findall(r"\btests/[\w/]*(?:\.py|/)", text))
    assert cited
    for path in cited:
        assert (REPO / path).exists(), path
    table = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    for cell in re.findall(r"real hardware on ([^|;,)]*)", table):
        assert DATE.match(cell.strip()), f"a hardware run without its date: {cell!r}"
    header = next(line for line in text.splitlines() if line.startswith("| capability"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["capability", "Linux", "macOS", "Windows"]
    for capability in (
        "NVML",
        "nvidia-smi",
        "AMD",
        "Apple",
        "fake",
        "leases",
        "isolation",
        "sampling",
        "worker",
        "PostgreSQL farm",
        "REST API",
        "web monitor",
    ):
        assert re.search(rf"^\| [^|]*{re.escape(capability)}", text, re.M), capability
