"""The console script's fast path for `cuectl submit [FLAGS] -- COMMAND` (cuectl.cli.entry)
behaves as the typer command does: the same job in the store, the same output, errors and
exit codes, for what it answers itself and for what it hands to the full CLI. Both are real
processes (the full path forced with ``CUECTL_FULL_CLI=1``), each into a store of its own.
Behaviour only, never timing."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from entryprobe import run_entry

from cuectl.sched.store import open_store


def job_rows(db: Path) -> Any:
    """Everything the store says about its jobs and frames, less what differs between two
    submits of the same thing (timestamps, receipt file names)."""
    if not db.exists():
        return None
    store = open_store(str(db), create=False)
    try:
        jobs = []
        for row in store.list_jobs():
            data = store.get_job(row["id"])
            frames, _ = store.list_frames(job=row["id"])
            jobs.append({"job": data, "frames": frames})
    finally:
        store.close()
    text = json.dumps(jobs, sort_keys=True, default=str)
    return json.loads(
        text,
        object_hook=lambda d: {
            k: v for k, v in d.items() if not k.endswith("_at") and k not in ("receipt", "log_path")
        },
    )


def mask(text: str) -> str:
    """--json output less what differs between two submits (when, the receipt's name)."""
    return re.sub(r'"(created_at|receipt)": "[^"]*"', "", text)


def both(tmp_path: Path, args: list[str], *, fast_expected: bool = True) -> Any:
    """``cuectl --db <own store> ARGS`` both ways: the same exit code, output and stored
    jobs; the fast one's result."""
    results, stores = [], []
    for full in (False, True):
        db = tmp_path / f"{'full' if full else 'fast'}-{len(list(tmp_path.glob('*.db')))}.db"
        res, path = run_entry(
            tmp_path, ["--db", str(db), *args], full=full, env={"XDG_STATE_HOME": str(tmp_path / "state")}
        )
        assert path == ("typer" if full or not fast_expected else "fast"), (args, res.stderr)
        results.append(res)
        stores.append(job_rows(db))
    fast, full_res = results
    assert (fast.returncode, mask(fast.stdout), fast.stderr) == (
        full_res.returncode,
        mask(full_res.stdout),
        full_res.stderr,
    ), args
    assert stores[0] == stores[1], args
    return fast


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--name", "shot-010", "--range", "1-20x2", "--chunk", "3"],
        ["--name=n", "--range=1-4", "--layer", "comp", "--priority", "7", "--retries", "0", "--timeout", "30m"],
        [
            "--gpus",
            "2",
            "--gpu-vendor",
            "nvidia",
            "--gpu-model",
            "A100",
            "--gpu-model",
            "*V100*",
            "--gpu-memory-min",
            "24G",
        ],
        ["--cores", "0.5", "--memory", "2G", "--max-cores", "4", "--max-running", "3", "--max-gpus", "2"],
        ["--env", "A=1", "--env", "B=two words", "--tag", "gpu", "--tag", "fast", "--paused"],
        [
            "--project",
            "p",
            "--show",
            "s",
            "--shot",
            "sh010",
            "--log-limit",
            "10M",
            "--retry-delay",
            "0",
            "--export",
            "NONE",
            "-D",
            "/tmp",
        ],
        ["--chdir", "/tmp", "--export", "BASE,HOME"],
    ],
    ids=lambda f: " ".join(f) or "no flags",
)
def test_flag_submits_store_the_same_job(tmp_path, flags):
    res = both(tmp_path, ["submit", *flags, "--", "python3", "render.py", "--frame", "#IFRAME#"])
    assert res.returncode == 0 and res.stdout == "1\n" and res.stderr == ""


@pytest.mark.parametrize(
    "command",
    [
        ["true"],  # one word and --name: a command
        ["./job.yaml", "--x"],  # a spec's suffix with arguments: refused as the full CLI refuses it
        ["echo", "--", "-x"],  # a second -- belongs to the command
    ],
    ids=lambda c: " ".join(c),
)
def test_commands_named_or_refused_the_same(tmp_path, command):
    both(tmp_path, ["submit", "--name", "n", "--", *command])


@pytest.mark.parametrize("command", [["nvidia-smi"], ["job.yaml"]], ids=lambda c: " ".join(c))
def test_one_word_after_dashdash_is_a_command_both_ways(tmp_path, command):
    # After --, always a command (issue 41): even one word, even one named like a spec file.
    (tmp_path / "job.yaml").write_text('name: y\nlayers:\n  - name: l\n    command: ["true"]\n')
    res = both(tmp_path, ["submit", "--gpus", "1", "--", *command])
    assert res.returncode == 0 and res.stdout == "1\n", res


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "--range", "x-y", "--", "true", "a"],  # refused by the spec's validation
        ["submit", "--gpus", "99999", "--", "true", "a"],
        ["submit", "--cores", "0.01", "--", "true", "a"],
        ["submit", "--env", "NOEQUALS", "--", "true", "a"],
        ["submit", "--name", "12345", "--", "true", "a"],
        ["submit", "--chunk", "0", "--", "true", "a"],
        ["submit", "--limit", "license", "--", "true", "a"],  # refused by the store: no such limit
        ["submit", "--service", "nope", "--", "true", "a"],
    ],
    ids=lambda a: " ".join(a[1:3]),
)
def test_bad_flags_are_refused_the_same_and_store_nothing(tmp_path, args):
    res = both(tmp_path, args)
    assert res.returncode == 2 and res.stderr.startswith("error:") and res.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "--gpus", "x", "--", "true", "a"],  # typer converts (and refuses)
        ["submit", "--priority", "-5", "--", "true", "a"],  # a value that starts with -
        ["submit", "--cores", "1e0", "--", "true", "a"],
        ["submit", "--chunk", "2.0", "--", "true", "a"],
        ["submit", "--name", "a", "--name", "b", "--", "true", "a"],  # given twice
        ["submit", "--json", "--", "true", "a"],
        ["submit", "--dry-run", "--", "true", "a"],
        ["submit", "--notify-on", "failed", "--notify-command", "true", "--", "true", "a"],
        ["submit", "true", "a"],  # no --
        ["submit", "--"],  # no command
        ["submit", "-Dx", "--", "true", "a"],
        ["--debug", "submit", "--", "true", "a"],
        ["submit", "--help"],
    ],
    ids=lambda a: " ".join(a),
)
def test_what_the_fast_path_leaves_to_typer_still_works(tmp_path, args):
    # Answered by the full CLI both ways: whatever it says (a job, an error, help) is said once.
    if "job.yaml" in args:
        (tmp_path / "job.yaml").write_text('name: y\nlayers:\n  - name: l\n    command: ["true"]\n')
        args = [a.replace("job.yaml", str(tmp_path / "job.yaml")) for a in args]
    both(tmp_path, args, fast_expected=False)


def test_the_fast_path_knows_every_job_flag_of_the_typer_command():
    """The fast path's option tables are made from cuectl.sched.intake.SubmitFlags, and the
    typer command's job flags are exactly that dataclass's: a flag added to one and not the
    other would send every submit using it down a different road (or drop it)."""
    import typer.main

    from cuectl.cli.main import app
    from cuectl.sched import intake

    command = typer.main.get_command(app).commands["submit"]  # type: ignore[attr-defined]
    options = {opt for param in command.params for opt in param.opts if opt.startswith("-")}
    not_job_flags = {
        "--notify-command",
        "--notify-webhook",
        "--notify-email",
        "--notify-on",
        "--param",
        "--strict",
        "--dry-run",
        "--json",
    }
    assert options - not_job_flags == set(intake.FLAG_OPTIONS)
    assert set(intake.VALUE_OPTIONS) | set(intake.SWITCHES) == set(intake.FLAG_OPTIONS)
