"""``config.env`` reads the environment exactly as ``os.environ`` does (it reads the
store behind it, to skip the KeyError a missing name costs ``os.environ.get``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuectl import config

NAME = "CUECTL_TEST_CONFIG_ENV"


def _settable(text: str) -> bool:
    try:
        os.fsencode(text)
    except UnicodeError:
        return False
    return "\0" not in text


@settings(max_examples=200, deadline=None)
@given(st.text().filter(_settable))
def test_a_value_reads_back_as_os_environ_has_it(value: str) -> None:
    os.environ[NAME] = value
    try:
        assert config.env(NAME, "fallback") == (os.environ[NAME] or "fallback")
    finally:
        del os.environ[NAME]


def test_undecodable_bytes_read_back_as_os_environ_spells_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, os.fsdecode(b"caf\xe9-\xff"))
    assert config.env(NAME) == os.environ[NAME] == "caf\udce9-\udcff"


def test_unset_and_empty_give_the_default_and_changes_show_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert config.env(NAME) is None and config.env(NAME, "d") == "d"
    monkeypatch.setenv(NAME, "")
    assert config.env(NAME, "d") == "d"
    monkeypatch.setenv(NAME, "one")
    assert config.env(NAME) == "one"
    os.environ.update({NAME: "two"})
    assert config.env(NAME) == "two"
    monkeypatch.delenv(NAME)
    assert config.env(NAME) is None


def test_an_environ_replaced_by_a_plain_mapping_is_read_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NAME, "in the real environ")
    monkeypatch.setattr(os, "environ", {NAME: "in the replacement"})
    assert config.env(NAME) == "in the replacement"
