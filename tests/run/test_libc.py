"""cuectl.run.libc: libc functions built on ctypes' core (``_ctypes``), as ctypes builds them,
without importing ctypes; called for real."""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from cuectl.run import libc


def test_a_function_takes_and_returns_its_types() -> None:
    assert libc.function("getpid", "", "i")() == os.getpid()
    # Unsigned arguments: close_range(fd beyond any open, UINT_MAX, 0) closes nothing, succeeds.
    assert libc.function("close_range", "IIi", "i")(0xFFFFFFFE, 0xFFFFFFFF, 0) == 0


def test_errno_is_kept_for_ctypes_get_errno() -> None:
    prctl = libc.function("prctl", "LLLLL", "i")
    assert prctl(0xFFFF, 0, 0, 0, 0) == -1  # no such option
    assert ctypes.get_errno() == errno.EINVAL


def test_a_function_libc_lacks_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_function"):
        libc.function("no_such_function_in_libc", "", "i")


def test_only_the_integer_type_codes_are_taken() -> None:
    with pytest.raises(ValueError):
        libc.function("getpid", "d", "i")


def test_the_public_way_gives_the_same_function() -> None:
    # Where ctypes' core is not what ctypes is built on (another Python), ctypes itself.
    assert libc._public("getpid", "", "i")() == os.getpid()
    with pytest.raises(AttributeError):
        libc._public("no_such_function_in_libc", "", "i")
