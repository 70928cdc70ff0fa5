"""deploy/systemd: the worker units parse as unit files with the settings the drain relies
on, their ExecStart uses real `cuectl worker` options, and `systemd-analyze verify`
accepts them where it is installed."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from deploylib import DEPLOY, options_used, resolve_command

SYSTEMD = DEPLOY / "systemd"
UNITS = {"single": SYSTEMD / "cuectl-worker.service", "template": SYSTEMD / "cuectl-worker@.service"}


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat, as Environment= does). Strict about
    what systemd would reject or ignore: text outside a section, lines without '='."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        m = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if m:
            current = sections.setdefault(m.group(1), {})
            continue
        assert current is not None, f"{path.name}:{number}: setting outside a section"
        assert "=" in line, f"{path.name}:{number}: not KEY=VALUE"
        assert not line.endswith("\\"), f"{path.name}:{number}: keep settings on one line"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    if value == "infinity":
        return float("inf")
    total = 0.0
    for number, unit in re.findall(r"(\d+)\s*(h|min|m|s)?", value):
        total += int(number) * {"h": 3600, "min": 60, "m": 60, "s": 1, "": 1}[unit]
    return total


@pytest.fixture(params=sorted(UNITS), ids=sorted(UNITS))
def unit(request) -> tuple[str, dict[str, dict[str, list[str]]]]:
    return request.param, parse_unit(UNITS[request.param])


def test_sections_and_keys(unit):
    _, u = unit
    assert set(u) == {"Unit", "Service", "Install"}
    assert u["Unit"]["Description"]
    assert "network-online.target" in u["Unit"]["After"][0].split()
    assert "network-online.target" in u["Unit"]["Wants"][0].split()
    assert u["Install"]["WantedBy"] == ["multi-user.target"]
    svc = u["Service"]
    assert svc["User"] and svc["User"][0] != "root"


def test_stop_drains_the_worker_instead_of_killing_frames(unit):
    _, u = unit
    svc = u["Service"]
    # SIGTERM to the worker only (frames are left to finish), SIGKILL for what is left.
    assert svc["KillMode"] == ["mixed"]
    assert svc["KillSignal"] == ["SIGTERM"]
    assert seconds(svc["TimeoutStopSec"][0]) >= 600
    assert svc["Restart"] == ["on-failure"]


def test_exec_start_runs_the_worker_with_real_options(unit):
    name, u = unit
    (exec_start,) = u["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == "/usr/local/bin/cuectl" and argv[1] == "worker"
    host = argv[argv.index("--name") + 1]
    assert "%H" in host
    if name == "template":
        assert "%i" in host                   # one host name per instance
    words = [a for a in argv[1:] if not a.startswith("$")]
    resolved = resolve_command(words)
    assert resolved is not None and resolved[0] == ["worker"]
    for opt in options_used(words):
        assert opt in resolved[1], f"`cuectl worker` has no option {opt}"


def test_lock_dir_is_the_host_wide_one_made_by_tmpfiles(unit):
    _, u = unit
    env = dict(item.split("=", 1) for item in u["Service"]["Environment"])
    lock_dir = env["CUECTL_LOCK_DIR"]
    tmpfiles = (SYSTEMD / "cuectl-tmpfiles.conf").read_text().splitlines()
    entries = [ln.split() for ln in tmpfiles if ln.strip() and not ln.startswith("#")]
    assert ["d", lock_dir, "1777", "root", "root", "-"] in entries
    # Every parent is created too (tmpfiles does not create missing parents with mode).
    parent = str(Path(lock_dir).parent)
    assert any(e[:2] == ["d", parent] for e in entries)


def test_template_reads_per_instance_settings():
    u = parse_unit(UNITS["template"])
    files = u["Service"]["EnvironmentFile"]
    assert "-/etc/cuectl/worker.env" in files and "-/etc/cuectl/worker-%i.env" in files
    assert "$CUECTL_WORKER_ARGS" in u["Service"]["ExecStart"][0]
    assert "%i" in u["Unit"]["Description"][0]


def test_env_example_names_the_variables_the_units_use():
    text = (SYSTEMD / "worker.env.example").read_text()
    for var in ("CUECTL_DB", "PGPASSWORD", "CUECTL_WORKER_ARGS", "CUECTL_LOG_DIR"):
        assert re.search(rf"^#?{var}=", text, re.M), var
    assert "export " not in text                   # EnvironmentFile= takes KEY=VALUE lines


def test_systemd_analyze_verify(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze is not installed")
    exe = shutil.which("true")
    assert exe
    checked = []
    for path in UNITS.values():
        # verify insists that ExecStart's program exists; a template needs an instance name.
        name = path.name.replace("@.", "@gpu.")
        text = path.read_text().replace("/usr/local/bin/cuectl", exe)
        (tmp_path / name).write_text(text)
        checked.append(tmp_path / name)
    proc = subprocess.run([analyze, "verify", *map(str, checked)], capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in (proc.stdout + proc.stderr).splitlines()
                  if any(p.name in ln for p in checked)]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr
