"""The one version comparison (units.version_at_least): numeric, dotted, part by part."""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.fields import version
from cuectl.units import version_at_least, version_key


@pytest.mark.parametrize(
    "have,want,ok",
    [
        ("8.10", "8.9", True),
        ("8.9", "8.10", False),
        ("535.104.05", "550", False),
        ("550", "535.104.05", True),
        ("535.104.05", "535.104.5", True),  # leading zeros are the same number
        ("12", "12.0", True),
        ("12.0", "12", True),
        ("12.0.1", "12", True),
        (" 9.0 ", "9", True),
        ("gfx90a", "7", False),  # not a version: never meets a minimum
        (None, "1", False),
        ("", "1", False),
    ],
)
def test_version_at_least(have, want, ok):
    assert version_at_least(have, want) is ok


def test_version_field_refuses_what_is_not_a_version():
    assert version("8.10", "x") == "8.10" and version(12.2, "x") == "12.2" and version(550, "x") == "550"
    assert version_key("535.104.05") == (535, 104, 5)
    for bad in ("8.x", "v12", "535..104", ".5", "5.", "", "1.2.3.4.5.6.7", "-1", "1e3"):
        with pytest.raises(InvalidInput, match=r"^--gpu-cuda-min: invalid version"):
            version(bad, "--gpu-cuda-min")
    for bad in (True, None, [8, 9]):
        with pytest.raises(InvalidInput, match=r"^--gpu-cuda-min: expected a version like 8\.9"):
            version(bad, "--gpu-cuda-min")
