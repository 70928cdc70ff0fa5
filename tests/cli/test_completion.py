"""Shell completion (issue 17, item 11): `cuectl completion SHELL` and click's protocol
(`_CUECTL_COMPLETE=<shell>_complete`, COMP_WORDS, COMP_CWORD) answered by the real
executable against a real SQLite store."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cuectl_cmd, subprocess_env

from cuectl.sched.store import HostInfo, open_store


def complete(shell: str, line: str, *, db: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """What the shell's script runs on <TAB> with the cursor at the end of ``line``."""
    if db is not None:
        line = line.replace("cuectl ", f"cuectl --db {db} ", 1)
    words = line.split()
    if shell == "fish":  # the line up to the cursor, and the word under it
        extra = {"COMP_WORDS": line, "COMP_CWORD": "" if line.endswith(" ") else words[-1]}
    else:
        cword = len(words) if line.endswith(" ") else len(words) - 1
        extra = {"COMP_WORDS": line, "COMP_CWORD": str(cword)}
    return subprocess.run(
        cuectl_cmd(),
        capture_output=True,
        text=True,
        timeout=60,
        env=subprocess_env(_CUECTL_COMPLETE=f"{shell}_complete", **extra, **env),
    )


def values(shell: str, out: str) -> list[str]:
    if shell == "zsh":  # type, value, help: three lines per item
        lines = out.splitlines()
        return [lines[i + 1].replace("\\:", ":") for i in range(0, len(lines) - 2, 3)]
    return [line.split("\t")[0].split(",", 1)[1] for line in out.splitlines()]


@pytest.fixture
def farm(cli, db_path: Path) -> dict[str, str]:
    ids = {}
    for name, rng in (("shots", "1-3"), ("comp", "1"), ("old", "1")):
        res = cli("submit", "--name", name, "--range", rng, "--", "true")
        assert res.exit_code == 0, res
        ids[name] = res.stdout.strip()
    assert cli("job", "kill", ids["old"]).exit_code == 0
    store = open_store(str(db_path))
    try:
        now = time.time()
        for host in ("render-01", "render-02"):
            store.register_host(HostInfo(name=host, cores=8, memory_bytes=1 << 34, gpus=[]), now=now)
    finally:
        store.close()
    return ids


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_job_ids_and_names_unfinished_first(shell, farm, db_path):
    res = complete(shell, "cuectl job show ", db=db_path)
    assert res.returncode == 0 and res.stderr == "", res
    got = values(shell, res.stdout)
    assert got[:3] == [farm["comp"], farm["shots"], farm["old"]]  # unfinished newest first, then finished
    assert {"shots", "comp", "old"} <= set(got)
    if shell == "fish":
        assert f"plain,{farm['shots']}\tshots (pending)" in res.stdout.splitlines()
    if shell == "zsh":
        assert "shots (pending)" in res.stdout.splitlines()


def test_job_prefix_and_job_option(farm, db_path):
    assert values("bash", complete("bash", "cuectl job pause sh", db=db_path).stdout) == ["shots"]
    got = values("fish", complete("fish", "cuectl frame list --job c", db=db_path).stdout)
    assert got == ["comp"]
    waited = values("bash", complete("bash", f"cuectl job wait {farm['shots']} ", db=db_path).stdout)
    assert farm["shots"] not in waited and farm["comp"] in waited
    assert values("bash", complete("bash", "cuectl job depend comp --on-job sh", db=db_path).stdout) == ["shots"]


def test_frame_ids_hosts_and_states(farm, db_path):
    frames = values("zsh", complete("zsh", "cuectl frame retry ", db=db_path).stdout)
    assert len(frames) == 4 and all(f.isdigit() for f in frames)  # shots 1-3 and comp; the killed job's is EATEN
    res = complete("fish", "cuectl frame log ", db=db_path)
    assert "shots 0001-main (waiting)" in res.stdout
    assert values("bash", complete("bash", "cuectl host lock ", db=db_path).stdout) == ["render-01", "render-02"]
    assert values("bash", complete("bash", "cuectl frame list --state w", db=db_path).stdout) == ["WAITING"]
    assert values("bash", complete("bash", "cuectl job list --state ", db=db_path).stdout)[:3] == [
        "PENDING",
        "RUNNING",
        "FINISHED",
    ]


def test_fixed_choices_and_subcommands(tmp_path):
    assert values("bash", complete("bash", "cuectl submit --gpu-vendor ").stdout) == ["NVIDIA", "AMD", "Apple", "Intel"]
    assert values("bash", complete("bash", "cuectl worker --backend ").stdout) == [
        "auto",
        "nvml",
        "smi",
        "apple",
        "amd",
        "fake",
    ]
    assert "gpu-model" in values("bash", complete("bash", "cuectl admin report --by ").stdout)
    assert values("bash", complete("bash", "cuectl job depend 1 --type p").stdout) == ["previous-frame"]
    assert values("fish", complete("fish", "cuectl completion ").stdout) == ["bash", "zsh", "fish"]
    top = values("bash", complete("bash", "cuectl ").stdout)
    assert {"job", "frame", "host", "admin", "submit", "completion"} <= set(top)
    assert values("zsh", complete("zsh", "cuectl job s").stdout) == ["show"]
    assert "--state" in values("bash", complete("bash", "cuectl job list --s").stdout)


def test_missing_store_means_no_suggestions_and_no_store(tmp_path):
    missing = tmp_path / "nowhere" / "cuectl.db"
    for line in ("cuectl job show ", "cuectl frame retry ", "cuectl host show "):
        res = complete("bash", line, db=missing)
        assert (res.returncode, res.stdout, res.stderr) == (0, "", ""), res
    res = complete("bash", "cuectl job show ")  # the default store (under the test's XDG_STATE_HOME)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", ""), res
    assert not missing.parent.exists()
    assert not (tmp_path / "xdg-state").exists()


def test_a_broken_store_means_no_suggestions(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database at all" * 100)
    res = complete("bash", "cuectl job show ", db=bad)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", ""), res


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_command_prints_a_script_using_the_protocol(shell):
    res = subprocess.run(
        [*cuectl_cmd(), "completion", shell], capture_output=True, text=True, timeout=60, env=subprocess_env()
    )
    assert res.returncode == 0 and res.stderr == "", res
    assert f"_CUECTL_COMPLETE={shell}_complete" in res.stdout
    assert "_cuectl_completion" in res.stdout
    if shell == "bash":
        bash = shutil.which("bash")
        assert bash, "bash is needed to check the script's syntax"
        check = subprocess.run([bash, "-n"], input=res.stdout, capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stderr
        # Sourcing it registers the function for cuectl.
        shown = subprocess.run(
            [bash, "--norc", "-c", res.stdout + "\ncomplete -p cuectl"], capture_output=True, text=True, timeout=60
        )
        assert "-F _cuectl_completion" in shown.stdout, shown
    elif shell == "zsh":
        assert res.stdout.startswith("#compdef cuectl") and "compdef _cuectl_completion cuectl" in res.stdout
    else:
        assert 'complete --no-files --command cuectl --arguments "(_cuectl_completion)"' in " ".join(
            res.stdout.replace("\\\n", " ").split()
        )
    # The same script through click's source instruction.
    sourced = subprocess.run(
        cuectl_cmd(), capture_output=True, text=True, timeout=60, env=subprocess_env(_CUECTL_COMPLETE=f"{shell}_source")
    )
    assert sourced.returncode == 0 and sourced.stdout == res.stdout


def test_bad_shell_is_exit_2_with_one_error_line():
    res = subprocess.run(
        [*cuectl_cmd(), "completion", "tcsh"], capture_output=True, text=True, timeout=60, env=subprocess_env()
    )
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and "tcsh" in res.stderr, res.stderr


def test_bad_instruction_is_refused_quietly():
    res = subprocess.run(
        cuectl_cmd(), capture_output=True, text=True, timeout=60, env=subprocess_env(_CUECTL_COMPLETE="tcsh_complete")
    )
    assert res.returncode == 1 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1


def test_start_up_loads_no_completion_or_store_code():
    code = (
        "import sys, cuectl.cli.main\n"
        "print(sorted(m for m in ('cuectl.cli.complete', 'cuectl.sched.store', 'sqlite3') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert res.returncode == 0 and res.stdout.strip() == "[]", res
