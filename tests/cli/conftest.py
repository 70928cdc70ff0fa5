"""The CLI's user-facing tests run both ways (issue 35): on the store's file (``--db PATH``)
and through ``cuectl serve --socket`` (``--db unix:...``), where a command's every store
call is made by the server: same flags, same output, same exit codes. A test about the
file itself (creating a missing store, its permissions, its log directory beside it) is
marked ``store_file`` and runs the first way only."""

from __future__ import annotations

import pytest


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "cli" not in metafunc.fixturenames:
        return
    ways = ["file"] if metafunc.definition.get_closest_marker("store_file") else ["file", "socket"]
    metafunc.parametrize("store_way", ways, indirect=True)
