"""`cuectl submit` forms (issue 17 item 3): a spec file, `-` for a spec on standard input,
and a command after `--`, named after the command when `--name` is not given."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from conftest import cuectl_cmd, subprocess_env

SPEC_YAML = "name: piped\nlayers:\n  - name: a\n    command: [echo, '#IFRAME#']\n    range: 1-3\n"
SPEC_JSON = json.dumps({"name": "piped-json", "layers": [{"name": "a", "command": ["echo", "x"], "range": "1-2"}]})


def _stdin(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode("utf-8")), encoding="utf-8"))


def _job(cli, *args: str) -> dict:
    res = cli("submit", "--json", *args)
    assert res.exit_code == 0, res
    return res.json()


def test_spec_file_form_unchanged(cli, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC_YAML)
    job = _job(cli, str(spec))
    assert job["name"] == "piped" and job["frame_counts"] == {"WAITING": 3}


def test_flag_form_with_name_unchanged(cli):
    job = _job(cli, "--name", "sweep", "--range", "1-4", "--", "python3", "train.py")
    assert job["name"] == "sweep" and job["layers"][0]["name"] == "main"


@pytest.mark.parametrize(
    "command,name",
    [
        (["python", "train.py", "--lr", "3"], "train.py"),
        (["python3", "/src/exp/train.py"], "train.py"),
        (["python3.12", "-m", "pkg.train"], "python3.12"),  # an option after the interpreter: its own name
        (["bash", "-c", "echo hi"], "bash"),
        (["sh", "run.sh", "1"], "run.sh"),
        (["/opt/bin/render.sh", "#IFRAME#"], "render.sh"),
        (["nvidia-smi", "-L"], "nvidia-smi"),
        (["./42", "x"], "job-42"),  # digits alone would read as a job id
        (["python", "7", "x"], "job-7"),
        (["bin/tab\there", "x"], "tab_here"),  # invisible characters become _
        (["python", "--version"], "python"),
    ],
)
def test_command_form_named_after_the_command(cli, command, name):
    job = _job(cli, "--range", "1-2", "--", *command)
    assert job["name"] == name
    assert job["layers"][0]["name"] == "main"
    assert job["frame_counts"] == {"WAITING": 2}


def test_name_is_found_by_name_afterwards(cli):
    _job(cli, "--", "python", "train.py", "--lr", "3")
    shown = cli("job", "show", "train.py", "--json")
    assert shown.exit_code == 0 and shown.json()["name"] == "train.py", shown


def test_long_command_name_is_cut_to_the_limit(cli):
    job = _job(cli, "--", "x" * 300, "arg")
    assert job["name"] == "x" * 200


@pytest.mark.parametrize("text,name,frames", [(SPEC_YAML, "piped", 3), (SPEC_JSON, "piped-json", 2)])
def test_spec_on_stdin(cli, monkeypatch, text, name, frames):
    _stdin(monkeypatch, text)
    job = _job(cli, "-")
    assert job["name"] == name and job["frame_counts"] == {"WAITING": frames}


def test_stdin_with_log_limit(cli, monkeypatch):
    _stdin(monkeypatch, SPEC_YAML)
    assert _job(cli, "-", "--log-limit", "1M")["name"] == "piped"


@pytest.mark.parametrize(
    "text,needle",
    [
        ("", "<stdin>: empty"),
        ("name: x\nlayers: [\n", "<stdin>"),
        ("name: x\nlayers: []\nbogus: 1\n", "<stdin>"),
    ],
)
def test_bad_stdin_is_an_error_naming_stdin(cli, db_path, monkeypatch, text, needle):
    _stdin(monkeypatch, text)
    res = cli("submit", "-")
    assert res.exit_code == 2 and needle in res.stderr, res


def test_stdin_through_the_real_executable(tmp_path):
    db = tmp_path / "real" / "cuectl.db"
    for text, name in ((SPEC_YAML, "piped"), (SPEC_JSON, "piped-json")):
        proc = subprocess.run(
            [*cuectl_cmd(), "--db", str(db), "submit", "-", "--json"],
            input=text,
            capture_output=True,
            text=True,
            env=subprocess_env(),
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["name"] == name
    proc = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "submit", "--json", "--", "python3", "train.py"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["name"] == "train.py"


@pytest.mark.parametrize("arg", ["jb.yaml", "nvidia-smi", "missing/spec.yml"])
def test_one_missing_argument_is_a_missing_spec_not_a_command(cli, tmp_path, monkeypatch, arg):
    monkeypatch.chdir(tmp_path)
    res = cli("submit", arg)
    assert res.exit_code == 2, res
    assert f"cannot read job spec {arg!r}" in res.stderr and "No such file" in res.stderr, res
    # the hint, for what could be a command: how to run a one-word command
    assert ("cuectl submit -- nvidia-smi" in res.stderr) == (arg == "nvidia-smi"), res


def test_one_word_command_with_name(cli):
    assert _job(cli, "--name", "smi", "--", "nvidia-smi")["name"] == "smi"


def test_several_spec_files_refused(cli):
    res = cli("submit", "a.yaml", "b.yaml")
    assert res.exit_code == 2 and "one job spec" in res.stderr, res


def test_nothing_to_submit(cli):
    res = cli("submit")
    assert res.exit_code == 2 and "- for standard input" in res.stderr, res


def test_help_tells_the_default_layer_name_and_forms(cli):
    res = cli("submit", "--help")
    text = " ".join(res.stdout.split())
    assert "default: main" in text, res
    assert "first word" not in text
    assert "standard input" in text and "-- COMMAND" in text
