"""The console script's fast path for `cuectl run` (cuectl.cli.entry) behaves as the typer
command does: same output, exit codes, child environment and lease records, for what it
handles itself and for what it hands to the full CLI. Both are real processes; the full
path is forced with ``CUECTL_FULL_CLI=1``. Behaviour only, never timing.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from entryprobe import run_entry
from typer.testing import CliRunner

import cuectl
from cuectl.cli import entry

from .conftest import V100, make_fake_host

SHOW_ENV = (
    "import json, os, sys; print(json.dumps({k: v for k, v in sorted(os.environ.items()) "
    "if k.startswith(('CUE_', 'CUDA_', 'NVIDIA_', 'ROCR_', 'HIP_'))})); sys.exit(int(sys.argv[1]))"
)


def cuectl_run(tmp_path: Path, *args: str, full: bool, env: dict[str, str] | None = None) -> tuple[Any, str]:
    """``cuectl run ARGS`` as a real process; (the result, "fast" or "typer")."""
    return run_entry(tmp_path, ["run", *args], full=full, env=env)


def both(tmp_path: Path, *args: str, fast_expected: bool = True, env: dict[str, str] | None = None) -> Any:
    """Run ARGS both ways; assert the same exit code, stdout and stderr; return one result."""
    fast, fast_path = cuectl_run(tmp_path, *args, full=False, env=env)
    full, full_path = cuectl_run(tmp_path, *args, full=True, env=env)
    assert full_path == "typer"
    assert fast_path == ("fast" if fast_expected else "typer"), (args, fast.stderr)
    assert (fast.returncode, fast.stdout, fast.stderr) == (full.returncode, full.stdout, full.stderr), args
    return fast


@pytest.fixture
def gpus4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    host = make_fake_host(
        tmp_path,
        [dict(V100) for _ in range(3)] + [{"model": "NVIDIA A100-SXM4-80GB", "vendor": "NVIDIA", "memory": "81920MiB"}],
    )
    monkeypatch.setenv("CUECTL_FAKE_GPUS", str(host.yaml_path))
    return host


def test_one_gpu_on_fake_gpus_gives_the_same_environment(gpus4, tmp_path):
    out = both(tmp_path, "--gpus", "1", "--", sys.executable, "-c", SHOW_ENV, "0")
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["CUE_GPUS"] == "1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == gpus4.uuids[0]
    assert out.stderr.startswith("cuectl run: leased gpu 0 (")


@pytest.mark.parametrize(
    "args",
    [
        ("--gpus", "2", "--no-wait"),
        ("--gpus=3", "--wait", "--timeout", "30"),
        ("--gpu-model", "A100", "--gpu-memory-min", "40G"),
        ("--gpu-vendor", "nvidia", "--gpu-model", "V100", "--gpu-model", "A100", "--gpus", "2"),
        ("--device", "3", "--device", "uuid0"),
        (
            "--gpus",
            "0",
        ),
        ("--min-free-memory", "1G", "--label", "my job"),
        (),
    ],
)
def test_requests_give_the_same_devices_and_environment(gpus4, tmp_path, args):
    args = tuple(gpus4.uuids[0] if a == "uuid0" else a for a in args)
    out = both(tmp_path, *args, "--", sys.executable, "-c", SHOW_ENV, "0")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["CUE_GPUS"]


def test_the_commands_exit_status_and_own_options_pass_through(gpus4, tmp_path):
    assert both(tmp_path, "sh", "-c", "exit 7").returncode == 7
    out = both(tmp_path, sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "--gpus", "-x", "--")
    assert (out.returncode, out.stdout) == (3, "['--gpus', '-x', '--']\n")
    assert both(tmp_path, "--", "sh", "-c", "kill -TERM $$").returncode == 128 + 15


def test_a_command_that_cannot_start(gpus4, tmp_path):
    out = both(tmp_path, "--", str(tmp_path / "no-such-command"))
    assert out.returncode == 127 and out.stderr.splitlines()[-1].startswith("error: ")
    (tmp_path / "not-executable").write_text("")
    assert both(tmp_path, "--", str(tmp_path / "not-executable")).returncode == 126


@pytest.mark.parametrize(
    "args, code, fast",
    [
        (("--gpus", "-1", "--", "true"), 2, False),  # left to typer (a value starting with -)
        (("--gpus", "x", "--", "true"), 2, False),  # typer's int conversion refuses it
        (("--gpus", " 1", "--", "true"), None, False),  # typer's conversion accepts it: its call
        (("--bogus", "--", "true"), 2, False),
        (("--gpus",), 2, False),
        (("--gpus", "1", "--gpus", "2", "--", "true"), None, False),
        ((), 2, False),
        (("--",), 2, False),
        (("--no-wait=1", "--", "true"), 2, False),
        (("-h",), 0, False),
        (("--gpus", "9", "--", "true"), 1, True),  # no device here could ever fit: exit 1
        (("--gpu-vendor", "Matrox", "--", "true"), 2, True),
        (("--gpu-memory-min", "lots", "--", "true"), 2, True),
        (("--timeout", "soon", "--", "true"), 2, True),
        (("--timeout", "5", "--no-wait", "--", "true"), 2, True),
        (("--device", "7", "--", "true"), 2, True),
        (("--lock-dir", "/nonexistent/cuectl-locks", "--", "true"), 1, True),
    ],
)
def test_bad_input_is_refused_the_same_way(gpus4, tmp_path, monkeypatch, args, code, fast):
    if "--lock-dir" in args:
        monkeypatch.delenv("CUECTL_CREATE_LOCK_DIR")
    out = both(tmp_path, *args, fast_expected=fast)
    if code is not None:
        assert out.returncode == code, out.stderr
    if code == 2 and "-h" not in args:
        assert out.stderr.startswith("error: "), out.stderr


def test_busy_devices_name_their_holder_the_same_way(gpus4, tmp_path):
    with cuectl.lease(gpus=4, label="holder-x"):
        out = both(tmp_path, "--no-wait", "--", "true")
        assert out.returncode == 1 and "holder-x" in out.stderr
        out = both(tmp_path, "--timeout", "0.2", "--", "true")
        assert out.returncode == 1 and out.stderr.count("error: ") == 1


def test_the_lease_record_names_the_command(gpus4, tmp_path):
    show = "import subprocess, sys; print(subprocess.run(sys.argv[1:], capture_output=True, text=True).stdout)"
    leases = [sys.executable, "-m", "cuectl", "gpu", "leases", "--json"]
    records = []
    for full in (False, True):
        out, _ = cuectl_run(
            tmp_path, "--gpus", "2", "--label", "lbl", "--", sys.executable, "-c", show, *leases, full=full
        )
        assert out.returncode == 0, out.stderr
        held = [d["lease"] for d in json.loads(out.stdout)["devices"] if d["lease"]]
        records.append([{k: v for k, v in h.items() if k not in ("pid", "since")} for h in held])
    assert records[0] == records[1] and len(records[0]) == 2
    assert records[0][0]["kind"] == "run" and records[0][0]["holder"] == "lbl"


def test_no_gpu_on_this_host(tmp_path, monkeypatch):
    """No fake file: real discovery (no GPU on a CI machine: the refusal; with GPUs: a lease)."""
    monkeypatch.delenv("CUECTL_FAKE_GPUS", raising=False)
    both(tmp_path, "--", "true")
    assert both(tmp_path, "--gpus", "0", "--", sys.executable, "-c", SHOW_ENV, "0").returncode == 0


# -- the parser itself, against typer's --------------------------------------------------------

PARSED = [
    ["--", "true"],
    ["true", "--gpus", "2"],
    ["--gpus", "2", "python", "train.py", "--lr", "3e-4"],
    ["--gpus=02", "--no-wait", "--", "a", "--", "b"],
    ["--gpu-vendor", "AMD", "--gpu-model", "MI300X", "--gpu-model=MI250", "--", "x"],
    ["--gpu-memory-min", "24G", "--gpu-memory-free-min", "8G", "x"],
    ["--min-free-memory=8G", "--device", "0", "--device", "GPU-abc", "x", "-"],
    ["--wait", "--timeout", "15m", "--label", "a b", "--lock-dir", "/tmp//x/", "-", "y"],
]
FALLBACK = [
    [],
    ["--"],
    ["--help"],
    ["-h"],
    ["--gpus"],
    ["--gpus", "-1", "x"],
    ["--gpus", "1.5", "x"],
    ["--gpus", "+1", "x"],
    ["--gpus", "１", "x"],
    ["--gpu", "1", "x"],
    ["--label", "", "x"],
    ["--label", "-x", "x"],
    ["--label=", "x"],
    ["--wait", "--no-wait", "x"],
    ["--timeout", "1", "--timeout", "2", "x"],
    ["--gpu-memory-free-min", "1G", "--min-free-memory", "2G", "x"],
    ["--no-wait=yes", "x"],
    ["--debug", "x"],
    ["-g", "x"],
]


def typer_kwargs(args: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The keywords ``run_command`` gets from the typer command for ``cuectl run ARGS``."""
    import cuectl.run.adhoc as adhoc
    from cuectl.cli.main import app

    seen: dict[str, Any] = {}

    def capture(command: Any, **kw: Any) -> int:
        seen.update(kw, command=list(command))
        return 0

    monkeypatch.setattr(adhoc, "run_command", capture)
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    return seen


def fast_kwargs(args: list[str]) -> dict[str, Any] | None:
    """What the fast path passes, with ``run_command``'s defaults and the typer command's
    normalisation (``gpu_model or ()``, ``device or None``) filled in."""
    import cuectl.run.adhoc as adhoc

    parsed = entry._parse_run(args)
    if parsed is None:
        return None
    defaults = {
        name: p.default
        for name, p in inspect.signature(adhoc.run_command).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    kw = {**defaults, **parsed}
    kw["gpu_models"] = list(kw["gpu_models"] or ())
    kw["devices"] = list(kw["devices"]) if kw["devices"] else None
    return kw


@pytest.mark.parametrize("args", PARSED, ids=lambda a: " ".join(a))
def test_the_fast_parser_reads_what_typer_reads(args, monkeypatch):
    fast = fast_kwargs(args)
    assert fast is not None, "the fast path must take this ordinary command line"
    typed = typer_kwargs(args, monkeypatch)
    typed["gpu_models"] = list(typed["gpu_models"] or ())
    typed["devices"] = list(typed["devices"]) if typed["devices"] else None
    typed.pop("say")
    assert fast == typed


@pytest.mark.parametrize("args", FALLBACK, ids=lambda a: " ".join(a) or "(none)")
def test_the_fast_parser_leaves_the_unusual_to_typer(args):
    assert entry._parse_run(args) is None


def test_a_completion_request_is_left_to_the_full_cli(gpus4, tmp_path):
    out, path = cuectl_run(tmp_path, "--", "true", full=False, env={"_CUECTL_COMPLETE": ""})
    assert (path, out.returncode) == ("typer", 0)


# -- signals and the terminal, on the fast path ------------------------------------------------


def fast_argv(*args: str) -> list[str]:
    """The console script's code without the probe: the fast path (checked above)."""
    return [sys.executable, "-c", "import sys; from cuectl.cli.entry import run; sys.exit(run())", "run", *args]


def test_sigterm_to_cuectl_run_reaches_the_command(gpus4, spawn, monkeypatch):
    monkeypatch.delenv("CUECTL_FULL_CLI", raising=False)
    trap = (
        "import signal, sys, time\n"
        "def bye(*_):\n    print('got TERM', flush=True); sys.exit(5)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    runner = spawn.argv(fast_argv("--", sys.executable, "-c", trap))
    assert runner.line() == "ready"
    os.kill(runner.pid, signal.SIGTERM)  # to `cuectl run`, not to the command
    assert runner.line() == "got TERM"
    assert runner.wait() == 5


def test_interactive_command_gets_the_terminal_and_ctrl_c(gpus4, monkeypatch):
    from .test_lease_cli import TERMINAL_COMMAND, ctrl_c_at_a_terminal

    monkeypatch.delenv("CUECTL_FULL_CLI", raising=False)
    assert ctrl_c_at_a_terminal(fast_argv("--", *TERMINAL_COMMAND)) == 128 + signal.SIGINT
