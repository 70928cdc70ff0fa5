"""One GPU request, four doors: ``cuectl submit``, ``cuectl run`` and ``cuectl.lease()``
(plus YAML specs, which share ``cuectl submit``'s validator: tests/sched/test_spec.py)
accept and refuse exactly the same (gpus, vendor, model patterns, memory) inputs, with
the same message.

``submit`` and ``run`` go through the real CLI in-process (the root app, as a user's shell
would reach it) and must print the very same ``error:`` line. The Python API names the
fields by their keywords instead of their flags (``gpu_models[0]`` for ``--gpu-model``);
apart from that spelling its message is the same too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

import cuectl
from cuectl.errors import InvalidInput, NoMatchingDevice

# How each flag is spelled as a Python keyword, to compare messages across the two.
_KEYWORD_OF_FLAG = {
    "--gpus": "gpus",
    "--gpu-vendor": "gpu_vendor",
    "--gpu-model": "gpu_models",
    "--gpu-memory-min": "gpu_memory_min",
}


@dataclass(frozen=True)
class Ask:
    gpus: int
    vendor: str | None = None
    models: tuple[str, ...] = ()
    memory: str | None = None
    refusal: str | None = None  # the CLI's message; None: valid input

    def flags(self) -> list[str]:
        out = ["--gpus", str(self.gpus)]
        if self.vendor is not None:
            out += ["--gpu-vendor", self.vendor]
        for model in self.models:
            out += ["--gpu-model", model]
        if self.memory is not None:
            out += ["--gpu-memory-min", self.memory]
        return out

    def keywords(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "gpu_vendor": self.vendor, "gpu_models": self.models, "gpu_memory_min": self.memory}


# Four fake Tesla V100-SXM2-16GB (16160 MiB) cards: some valid requests match, some cannot.
VALID = [
    Ask(1),
    Ask(0),
    Ask(2, "nvidia", ("V100",), "16G"),
    Ask(1, "NVIDIA", ("tesla v100", "A100"), "8192"),
    Ask(1, None, (" *V100* ",), "15.5GiB"),
    Ask(1, "AMD"),  # valid, but no device here could ever match it
    Ask(1024, None, ("V100",), "1T"),
]
INVALID = [
    Ask(-1, refusal="--gpus: must be 0 or more"),
    Ask(1025, refusal="--gpus: must be at most 1024"),
    Ask(1, "Matrox", refusal="--gpu-vendor: unknown vendor 'Matrox' (expected one of NVIDIA, AMD, Apple, Intel)"),
    Ask(1, None, ("",), refusal="--gpu-model: invalid GPU model '' (1-200 printable characters)"),
    Ask(1, None, ("V100", "A\x01"), refusal="--gpu-model: invalid GPU model 'A\\x01' (1-200 printable characters)"),
    Ask(
        1,
        None,
        ("x" * 201,),
        refusal=f"--gpu-model: invalid GPU model {'x' * 60 + '...'!r} (1-200 printable characters)",
    ),
    Ask(
        1,
        None,
        (),
        "lots",
        refusal="--gpu-memory-min: invalid size 'lots' (use e.g. 512M, 8G, 24GiB; a bare number is MiB)",
    ),
    Ask(1, None, (), "2000000T", refusal="--gpu-memory-min: '2000000T' is too large"),
    Ask(0, "NVIDIA", refusal="--gpu-vendor: only applies to GPU requests; set --gpus to 1 or more"),
    Ask(0, None, ("V100",), refusal="--gpu-model: only applies to GPU requests; set --gpus to 1 or more"),
    Ask(0, None, (), "8G", refusal="--gpu-memory-min: only applies to GPU requests; set --gpus to 1 or more"),
]


def _error_line(stderr: str) -> str:
    return next(line[len("error: ") :] for line in stderr.splitlines() if line.startswith("error: "))


def _as_keywords(cli_message: str) -> str:
    return re.sub(r"--gpu[-a-z]*", lambda m: _KEYWORD_OF_FLAG.get(m.group(), m.group()), cli_message)


def _submit(cli: Any, ask: Ask) -> tuple[bool, str | None]:
    res = cli("submit", "--name", "n", *ask.flags(), "--", "true")
    if res.exit_code == 2:
        return False, _error_line(res.stderr)
    assert res.exit_code == 0, res
    return True, None


def _run(cli: Any, ask: Ask) -> tuple[bool, str | None]:
    res = cli("run", "--no-wait", *ask.flags(), "--", "true", db=False)
    if res.exit_code == 2:
        return False, _error_line(res.stderr)
    # Valid: it ran the command, or no device of this host could ever match (exit 1).
    assert res.exit_code == 0 or "can ever satisfy" in res.stderr, res
    return True, None


def _lease(ask: Ask) -> tuple[bool, str | None]:
    try:
        cuectl.lease(**ask.keywords()).release()
    except NoMatchingDevice:
        pass
    except InvalidInput as exc:
        # `gpu_models[1]`: a list item is named by its index; a repeated flag has none.
        return False, re.sub(r"(gpu_models)\[\d+\]", r"\1", exc.message)
    return True, None


@pytest.mark.parametrize("ask", VALID + INVALID, ids=lambda a: " ".join(a.flags())[:50])
def test_submit_run_and_lease_agree(gpus4, cli, ask: Ask) -> None:
    expected = (True, None) if ask.refusal is None else (False, ask.refusal)
    assert _submit(cli, ask) == expected
    assert _run(cli, ask) == expected
    assert _lease(ask) == (expected[0], expected[1] and _as_keywords(expected[1]))


@pytest.mark.parametrize("flag", ["--gpu-memory-free-min", "--min-free-memory"])  # the second: its old name
def test_run_names_the_free_memory_flag_as_lease_names_its_keyword(gpus4, cli, flag: str) -> None:
    res = cli("run", "--no-wait", flag, "lots", "--", "true", db=False)
    assert (res.exit_code, _error_line(res.stderr)) == (
        2,
        "--gpu-memory-free-min: invalid size 'lots' (use e.g. 512M, 8G, 24GiB; a bare number is MiB)",
    )
    with pytest.raises(InvalidInput, match=r"^gpu_memory_free_min: invalid size 'lots'"):
        cuectl.lease(gpu_memory_free_min="lots")
