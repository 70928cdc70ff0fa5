"""Spec fields added for issue 13: log_limit, the cores minimum, visible names."""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.spec import spec_from_flags, spec_from_mapping


def layer(**extra):
    return {"name": "j", "layers": [{"name": "a", "command": ["true"], **extra}]}


@pytest.mark.parametrize("value,expected", [("64K", 65536), ("1G", 1 << 30), (512, 512 << 20), ("4KiB", 4096)])
def test_log_limit_sizes(value, expected):
    assert spec_from_mapping(layer(log_limit=value), user="u").layers[0].log_limit_bytes == expected


@pytest.mark.parametrize(
    "value,needle",
    [
        ("1K", "at least 4K"),
        ("lots", "layers[0].log_limit"),
        (True, "layers[0].log_limit"),
        ("-5M", "layers[0].log_limit"),
    ],
)
def test_bad_log_limits(value, needle):
    with pytest.raises(InvalidInput, match=needle.replace("[", r"\[").replace("]", r"\]")):
        spec_from_mapping(layer(log_limit=value), user="u")


def test_no_log_limit_means_the_workers():
    assert spec_from_mapping(layer(), user="u").layers[0].log_limit_bytes is None
    assert spec_from_flags(name="x", command=["true"], user="u", log_limit="8K").layers[0].log_limit_bytes == 8192


@pytest.mark.parametrize("cores", [0.001, 1e-7, 0.09])
def test_cores_below_a_tenth_are_refused(cores):
    with pytest.raises(InvalidInput, match=r"layers\[0\].cores: must be at least 0.1"):
        spec_from_mapping(layer(cores=cores), user="u")
    assert spec_from_mapping(layer(cores=0.1), user="u").layers[0].cores == 0.1


def test_job_names_must_print_as_themselves():
    with pytest.raises(InvalidInput, match="U\\+202E RIGHT-TO-LEFT OVERRIDE"):
        spec_from_mapping({"name": "invoice\u202efdp.exe", "layers": [{"name": "a", "command": ["true"]}]}, user="u")
