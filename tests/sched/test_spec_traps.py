"""The traps a first job spec falls into (issue 41, section 4): a YAML comment that
swallows a ``#TOKEN#`` of an unquoted command, and a shell string whose quotes do not
close. Both are refused at submit with the value to write instead."""

from __future__ import annotations

import textwrap

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.spec import load_spec_text, spec_from_mapping


def load(text: str):
    return load_spec_text(textwrap.dedent(text), source="job.yaml", user="alice")


def refusal(text: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        load(text)
    return info.value


def test_a_comment_that_swallowed_a_token_is_refused_with_the_quoted_value() -> None:
    exc = refusal("""\
        name: t
        layers:
          - name: a
            command: sh -c 'echo #FRAME_START#-#FRAME_END#; sleep 1'
            range: 1-3
        """)
    assert exc.message.startswith('job.yaml: line 4, column 14: command: YAML read only "sh -c \'echo"')
    assert "#FRAME_START#" in exc.message
    assert exc.hint == "quote the whole value: \"sh -c 'echo #FRAME_START#-#FRAME_END#; sleep 1'\""


def test_the_hint_quotes_a_value_with_double_quotes_in_single_ones() -> None:
    exc = refusal("""\
        name: t
        layers:
          - {name: a, range: 1}
          - name: b
            command: echo "x" #IFRAME# it's
        """)
    assert "line 5" in exc.message and "#IFRAME#" in exc.message
    assert exc.hint == "quote the whole value: 'echo \"x\" #IFRAME# it''s'"


def test_a_swallowed_token_in_a_list_item_is_refused() -> None:
    exc = refusal("""\
        name: t
        layers:
          - name: a
            command:
              - render.sh
              - --frame #IFRAME#
        """)
    assert "line 6" in exc.message and "YAML read only '--frame'" in exc.message


@pytest.mark.parametrize(
    "command",
    [
        "\"sh -c 'echo #FRAME_START#-#FRAME_END#'\"",  # quoted: the token is part of the value
        "[echo, '#IFRAME#']",
        "echo hi  # a comment of the author's, not a token",
        "echo hi #not-a-token",
        "|\n              echo #IFRAME#",  # a block scalar keeps '#'
        "echo 'it''s' \"#JOB#\"",  # YAML plain scalars keep ' and \" as text
    ],
)
def test_quoted_values_and_ordinary_comments_pass(command: str) -> None:
    spec = load(f"""\
        name: t
        layers:
          - name: a
            command: {command}
        """)
    assert spec.layers[0].command


@pytest.mark.parametrize(
    "command",
    [
        "sh -c 'echo",
        'echo "unclosed',
        "echo it's",
        "echo ok \\",
    ],
)
def test_a_shell_string_whose_quotes_do_not_close_is_refused(command: str) -> None:
    with pytest.raises(InvalidInput) as info:
        spec_from_mapping({"name": "t", "layers": [{"name": "a", "command": command}]}, user="alice")
    assert info.value.message.startswith("layers[0].command: the shell string's quotes do not close")
    assert "/bin/sh -c" in (info.value.hint or "")


@pytest.mark.parametrize(
    "command",
    [
        "echo 'a b' \"c d\" e\\'f",
        "echo hi # it's a comment to the shell",
        "echo #IFRAME# 'x'",  # a token is a word, not a comment
        'echo "$(printf \'%s\' "x y")"',  # quotes nested in a command substitution
        "cat <<EOF\nit's\nEOF",  # here-documents are left to the shell
        "printf $'it\\'s\\n'",  # as is bash's $'...'
        "echo 'multi\nline'",
        'n=${F#0}; echo "frame\n$n"',  # a `#` inside a word is no comment to the shell
        'x=$((16#ff)); echo "v\n$x"',
        "echo a#b 'c'",
    ],
)
def test_balanced_shell_strings_pass(command: str) -> None:
    spec = spec_from_mapping({"name": "t", "layers": [{"name": "a", "command": command}]}, user="alice")
    assert spec.layers[0].command == command


def test_an_argv_command_is_not_judged_as_shell() -> None:
    spec = spec_from_mapping({"name": "t", "layers": [{"name": "a", "command": ["echo", "it's"]}]}, user="alice")
    assert spec.layers[0].command == ("echo", "it's")
