"""Tokens in shell-string commands (docs/job-spec.md, "Tokens in shell strings"): a hostile
job name is text, never code, whether the token stands unquoted, inside '…' or inside "…",
and it reads as exactly the name wherever the quoting can be told."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cuectl.run.launch import FrameContext, frame_env, substitute_tokens

# Each closes a quote of some kind and then runs `touch pwned`, in a different way.
HOSTILE = [
    "x'; touch pwned #",
    'x"; touch pwned #',
    "x'\"; touch pwned; echo \"'",
    "$(touch pwned)",
    "`touch pwned`",
    'x\\"; touch pwned #',
    "a b  c * ? [x] ~ ${HOME} $HOME \\n",
    "}; touch pwned; x=${y",
    ")'\"; touch pwned #",
]

# (shell string, what it prints for a name N): the token unquoted, in single quotes, in
# double quotes, and nested in command substitutions and parameter expansions.
POSITIONS = [
    ("printf '[%s]' #JOB#", "[{}]"),
    ("printf '[%s]' '#JOB#'", "[{}]"),
    ("printf '[%s]' \"#JOB#\"", "[{}]"),
    ("printf '[%s]' \"job=#JOB#!\"", "[job={}!]"),
    ("printf '[%s]' 'job=#JOB#!'", "[job={}!]"),
    ("printf '[%s]' job=#JOB#", "[job={}]"),
    ("printf '[%s]' \"$(printf %s '#JOB#')\"", "[{}]"),
    ('printf \'[%s]\' "$(printf %s "#JOB#")"', "[{}]"),
    ("x=${UNSET_VAR:-#JOB#}; printf '[%s]' \"$x\"", "[{}]"),
    ("printf '[%s]' \"${UNSET_VAR:-#JOB#}\"", "[{}]"),
    ("# it's a comment\nprintf '[%s]' \"#JOB#\"", "[{}]"),
    ("printf '[%s]' #JOB# # don't", "[{}]"),
]


def ctx_for(tmp_path: Path, job: str) -> FrameContext:
    return FrameContext(
        job=job,
        job_id="1",
        layer="render",
        layer_id="1",
        frame_id="1",
        frame_number=7,
        frames=(7,),
        layer_range="1-10",
        chunk=1,
        attempt=1,
        cores=1.0,
        memory_bytes=0,
        gpu_memory_bytes=None,
        log_path=tmp_path / "logs" / "1" / "0007-render.1.log",
    )


def run_shell(command: str, tmp_path: Path, job: str) -> subprocess.CompletedProcess:
    ctx = ctx_for(tmp_path, job)
    argv = substitute_tokens(command, ctx)
    assert argv[:2] == ["/bin/sh", "-c"]
    env = frame_env(ctx, layer_env={}, isolation={}, base={"PATH": "/usr/bin:/bin"})
    return subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=10)


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("command,expected", POSITIONS)
def test_hostile_names_are_text_in_every_quoting_position(
    tmp_path: Path, name: str, command: str, expected: str
) -> None:
    res = run_shell(command, tmp_path, name)
    assert not (tmp_path / "pwned").exists(), f"{command!r} with {name!r} ran code: {res}"
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected.format(name), (command, name, res)


def test_issue_repro_echo_in_double_quotes(tmp_path: Path) -> None:
    """The reported case: `command: "echo \\"#JOB#\\""` and a job named like this."""
    res = run_shell('echo "#JOB#"', tmp_path, "x'; touch pwned #")
    assert not (tmp_path / "pwned").exists()
    assert res.stdout == "x'; touch pwned #\n"


def test_plain_values_are_put_in_as_they_are(tmp_path: Path) -> None:
    """Frame numbers, layer names and ordinary job names stay readable in `ps` and logs."""
    argv = substitute_tokens(
        "render --job #JOB# --layer '#LAYER#' -f \"#IFRAME#\" #FRAMESPEC#", ctx_for(tmp_path, "shot_010.v2")
    )
    assert argv[2] == "render --job shot_010.v2 --layer 'render' -f \"7\" 7"


def test_a_misjudged_quoting_is_still_never_code(tmp_path: Path) -> None:
    """Here-documents are not understood by the quoting lexer: the token may read as the
    variable reference there, but the name still cannot run."""
    for name in HOSTILE:
        res = run_shell("cat <<EOF\nname: #JOB#\nEOF\ncat <<'EOF'\n#JOB#\nEOF", tmp_path, name)
        assert not (tmp_path / "pwned").exists(), (name, res)
        assert res.returncode == 0
