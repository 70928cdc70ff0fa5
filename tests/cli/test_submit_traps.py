"""`cuectl submit` traps of a first job (issue 41, section 4): one word after `--` is a
command, never a spec file; a YAML spec whose command a comment cut is refused at submit,
with exit 2, one error line, and no store created."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import cuectl_cmd, subprocess_env


def test_one_word_after_dashdash_is_a_command(cli):
    res = cli("submit", "--json", "--gpus", "1", "--", "nvidia-smi")
    assert res.exit_code == 0, res
    job = res.json()
    assert job["name"] == "nvidia-smi" and job["layers"][0]["command"] == ["nvidia-smi"]
    assert job["layers"][0]["gpus"] == 1


@pytest.mark.parametrize("word", ["nvidia-smi", "render.yaml", "-"])
def test_one_word_after_dashdash_is_a_command_whatever_it_looks_like(cli, word):
    res = cli("submit", "--json", "--", word)
    assert res.exit_code == 0, res
    assert res.json()["layers"][0]["command"] == [word]


@pytest.mark.parametrize("full_cli", ["", "1"])  # the console script's fast path, and typer's
def test_a_spec_named_word_and_its_arguments_after_dashdash_are_a_command(tmp_path, full_cli):
    """`submit -- run.json arg` runs the program run.json; only without `--` are two
    words that start with a spec's name two spec files (refused: one job per submit)."""
    db = tmp_path / "real.db"
    env = subprocess_env(CUECTL_FULL_CLI=full_cli)
    proc = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "submit", "--", "run.json", "arg"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "job", "show", proc.stdout.strip(), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert json.loads(shown.stdout)["layers"][0]["command"] == ["run.json", "arg"], shown
    two = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "submit", "a.yaml", "b.yaml"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert two.returncode == 2 and "one job spec file" in two.stderr, two.stderr


def test_one_word_without_dashdash_is_still_a_spec_file_with_a_hint(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = cli("submit", "nvidia-smi")
    assert res.exit_code == 2, res
    assert "cannot read job spec 'nvidia-smi'" in res.stderr
    assert "put it after --: cuectl submit -- nvidia-smi" in res.stderr


@pytest.mark.parametrize("full_cli", ["", "1"])  # the console script's fast path, and typer's
def test_one_word_after_dashdash_through_the_real_executable(tmp_path, full_cli):
    db = tmp_path / "real.db"
    env = subprocess_env(CUECTL_FULL_CLI=full_cli)
    proc = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "submit", "--gpus", "1", "--", "nvidia-smi"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    shown = subprocess.run(
        [*cuectl_cmd(), "--db", str(db), "job", "show", proc.stdout.strip(), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert '"nvidia-smi"' in shown.stdout, shown


@pytest.mark.store_file  # asserts that the file was never created
def test_a_command_cut_by_a_yaml_comment_is_refused_at_submit(cli, db_path, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: sweep\nlayers:\n  - name: main\n    range: 1-3\n"
        "    command: sh -c 'echo #FRAME_START#-#FRAME_END#; sleep 1'\n"
    )
    res = cli("submit", str(spec))
    assert res.exit_code == 2, res
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f'error: {spec}: line 5, column 14: command: YAML read only "sh -c \'echo": an unquoted '
        "' #' starts a comment, which swallowed #FRAME_START# and the rest of the line"
    ], res
    assert "hint: quote the whole value: \"sh -c 'echo #FRAME_START#-#FRAME_END#; sleep 1'\"" in res.stderr
    assert "Traceback" not in res.stderr
    assert not db_path.exists()  # nothing changed


@pytest.mark.store_file  # asserts that the file was never created
def test_unbalanced_quotes_are_refused_at_submit(cli, db_path, tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: q\nlayers:\n  - name: main\n    command: 'echo \"unclosed'\n")
    res = cli("submit", str(spec))
    assert res.exit_code == 2, res
    assert f"error: {spec}: layers[0].command: the shell string's quotes do not close" in res.stderr, res
    assert not db_path.exists()
    # An argv command is not shell text: its words are passed as they are.
    argv = cli("submit", "--dry-run", "--", "echo", "it's")
    assert argv.exit_code == 0, argv
