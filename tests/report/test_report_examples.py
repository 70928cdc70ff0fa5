"""The cron and systemd examples run as written (paths redirected into a tmp dir) and
produce a textfile that parses as Prometheus exposition with the known figures."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from promtext import parse_prometheus

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"


def cron_commands() -> list[list[str]]:
    commands = []
    for line in (EXAMPLES / "cron" / "cuectl-report").read_text().splitlines():
        fields = line.split()
        if not fields or line.startswith("#") or "=" in fields[0]:
            continue
        assert len(fields) > 7, line
        commands.append(shlex.split(line)[6:])  # m h dom mon dow user COMMAND...
    return commands


def systemd_command() -> list[str]:
    text = (EXAMPLES / "systemd" / "cuectl-report.service").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_timer_fires_every_five_minutes():
    timer = (EXAMPLES / "systemd" / "cuectl-report.timer").read_text()
    assert "OnCalendar=*:0/5\n" in timer and "WantedBy=timers.target" in timer
    assert all(cmd for cmd in cron_commands())
    assert (EXAMPLES / "cron" / "cuectl-report").read_text().count("\n*/5 ") == 1


@pytest.mark.parametrize("source", ["cron", "systemd"])
def test_example_command_writes_the_textfile(cli, known_store, tmp_path, source):
    argv = cron_commands()[0] if source == "cron" else systemd_command()
    assert Path(argv[0]).name == "cuectl" and argv[1:3] == ["admin", "report"]
    out_dir = tmp_path / "textfile"
    out_dir.mkdir()
    args = [a.replace(TEXTFILE_DIR, str(out_dir)) for a in argv[3:]]
    assert "--output" in args and "--format" in args
    # The examples report the last 7 days; the known store is from 2024, so pin the window.
    args[args.index("--since") + 1] = "2024-03-01T00:00:00Z"
    res = cli("admin", "report", *args, "--until", "2024-03-01T01:00:00Z")
    assert res.exit_code == 0 and res.stdout == "" and res.stderr == "", res
    (written,) = list(out_dir.iterdir())
    assert written.name == "cuectl.prom"
    samples, _ = parse_prometheus(written.read_text())
    key = ("cuectl_report_gpu_seconds_wasted", frozenset({("by", "user"), ("group", "alice")}))
    assert samples[key] == 130.0
