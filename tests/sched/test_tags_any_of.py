"""Layer tags: every entry must be met (cuectl's all-of), and an entry `a | b` is met by
either alternative (OpenCue's any-of spelling, as in its job specs' `<tags>`)."""

from __future__ import annotations

import pytest

from cuectl.errors import InvalidInput
from cuectl.sched.match import tags_fit
from cuectl.sched.spec import spec_from_mapping


def layer_tags(tags):
    spec = spec_from_mapping({"name": "t", "layers": [{"name": "a", "command": ["true"], "tags": tags}]}, user="u")
    return spec.layers[0].tags


@pytest.mark.parametrize(
    "layer, host, fits",
    [
        (["desktop | render"], ["render"], True),
        (["desktop | render"], ["DESKTOP"], True),
        (["desktop | render"], ["farm"], False),
        (["desktop | render", "gpu"], ["render"], False),  # entries: all of them
        (["desktop | render", "gpu"], ["render", "gpu"], True),
        (["a", "b"], ["a"], False),  # the all-of form is unchanged
        ([], [], True),
    ],
)
def test_entries_are_all_of_and_alternatives_any_of(layer, host, fits):
    assert tags_fit(layer, host) is fits


def test_the_spec_normalises_alternatives_and_refuses_bad_ones():
    assert layer_tags(["desktop|render", "gpu"]) == ("desktop | render", "gpu")
    with pytest.raises(InvalidInput, match=r"^layers\[0\].tags\[0\]: invalid tag 'a \|\| b'"):
        layer_tags(["a || b"])
    with pytest.raises(InvalidInput, match="alternatives separated by"):
        layer_tags(["a | b c"])
