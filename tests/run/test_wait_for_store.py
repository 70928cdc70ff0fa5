"""``wait_for_store``: a worker service waits for an unreachable store with back-off and
gives up at once on errors that waiting cannot fix."""

from __future__ import annotations

import pytest

from cuectl.errors import SchemaTooNew, StoreError, StoreUnreachable
from cuectl.run.service import wait_for_store


def test_backs_off_until_the_store_opens():
    failures = iter([StoreUnreachable("cannot connect to PostgreSQL at x: refused")] * 7)
    slept: list[float] = []
    warnings: list[str] = []

    def open_store():
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return "store"

    assert wait_for_store(open_store, warn=warnings.append, sleep=slept.append) == "store"
    assert slept == [1, 2, 4, 8, 16, 30, 30]
    assert warnings[0] == "cannot connect to PostgreSQL at x: refused; trying again in 1 s" and len(warnings) == 7


@pytest.mark.parametrize(
    "error",
    [StoreError("cannot log in to x: password authentication failed"), SchemaTooNew("store x has schema version 9")],
)
def test_errors_that_waiting_cannot_fix_are_raised_at_once(error):
    slept: list[float] = []

    def open_store():
        raise error

    with pytest.raises(type(error)):
        wait_for_store(open_store, warn=lambda _: None, sleep=slept.append)
    assert slept == []
