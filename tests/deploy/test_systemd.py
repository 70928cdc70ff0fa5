"""deploy/systemd: the worker units parse as unit files with the settings the drain relies
on, their ExecStart uses real `cuectl worker` options, the API unit runs `cuectl serve`
with real options and the environment its example file describes, the OpenCue unit runs
`cuectl serve --opencue` with an address whatever its environment file sets, and
`systemd-analyze verify` accepts them all where it is installed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from deploylib import DEPLOY, options_used, resolve_command

SYSTEMD = DEPLOY / "systemd"
REPO = DEPLOY.parent
UNITS = {"single": SYSTEMD / "cuectl-worker.service", "template": SYSTEMD / "cuectl-worker@.service"}
SERVE = SYSTEMD / "cuectl-serve.service"
SERVE_ENV = SYSTEMD / "serve.env.example"
OPENCUE = SYSTEMD / "cuectl-opencue.service"
SHARED = SYSTEMD / "cuectl-shared.service"
OPENCUE_ENV = SYSTEMD / "opencue.env.example"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat, as Environment= does). Strict about
    what systemd would reject or ignore: text outside a section, lines without '='."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        m = re.fullmatch(r"\[([A-Za-z]+)\]", line)
        if m:
            current = sections.setdefault(m.group(1), {})
            continue
        assert current is not None, f"{path.name}:{number}: setting outside a section"
        assert "=" in line, f"{path.name}:{number}: not KEY=VALUE"
        assert not line.endswith("\\"), f"{path.name}:{number}: keep settings on one line"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def seconds(value: str) -> float:
    if value == "infinity":
        return float("inf")
    total = 0.0
    for number, unit in re.findall(r"(\d+)\s*(h|min|m|s)?", value):
        total += int(number) * {"h": 3600, "min": 60, "m": 60, "s": 1, "": 1}[unit]
    return total


@pytest.fixture(params=sorted(UNITS), ids=sorted(UNITS))
def unit(request) -> tuple[str, dict[str, dict[str, list[str]]]]:
    return request.param, parse_unit(UNITS[request.param])


def test_sections_and_keys(unit):
    _, u = unit
    assert set(u) == {"Unit", "Service", "Install"}
    assert u["Unit"]["Description"]
    assert "network-online.target" in u["Unit"]["After"][0].split()
    assert "network-online.target" in u["Unit"]["Wants"][0].split()
    assert u["Install"]["WantedBy"] == ["multi-user.target"]
    svc = u["Service"]
    assert svc["User"] and svc["User"][0] != "root"


def test_stop_drains_the_worker_instead_of_killing_frames(unit):
    _, u = unit
    svc = u["Service"]
    # SIGTERM to the worker only (frames are left to finish), SIGKILL for what is left.
    assert svc["KillMode"] == ["mixed"]
    assert svc["KillSignal"] == ["SIGTERM"]
    assert seconds(svc["TimeoutStopSec"][0]) >= 600
    assert svc["Restart"] == ["on-failure"]


def test_exec_start_runs_the_worker_with_real_options(unit):
    name, u = unit
    (exec_start,) = u["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == "/usr/local/bin/cuectl" and argv[1] == "worker"
    host = argv[argv.index("--name") + 1]
    assert "%H" in host
    if name == "template":
        assert "%i" in host  # one host name per instance
    words = [a for a in argv[1:] if not a.startswith("$")]
    resolved = resolve_command(words)
    assert resolved is not None and resolved[0] == ["worker"]
    for opt in options_used(words):
        assert opt in resolved[1], f"`cuectl worker` has no option {opt}"


def test_lock_dir_is_the_host_wide_one_made_by_tmpfiles(unit):
    _, u = unit
    env = dict(item.split("=", 1) for item in u["Service"]["Environment"])
    lock_dir = env["CUECTL_LOCK_DIR"]
    tmpfiles = (SYSTEMD / "cuectl-tmpfiles.conf").read_text().splitlines()
    entries = [ln.split() for ln in tmpfiles if ln.strip() and not ln.startswith("#")]
    assert ["d", lock_dir, "1777", "root", "root", "-"] in entries
    # Every parent is created too (tmpfiles does not create missing parents with mode).
    parent = str(Path(lock_dir).parent)
    assert any(e[:2] == ["d", parent] for e in entries)


def test_template_reads_per_instance_settings():
    u = parse_unit(UNITS["template"])
    files = u["Service"]["EnvironmentFile"]
    assert "-/etc/cuectl/worker.env" in files and "-/etc/cuectl/worker-%i.env" in files
    assert "$CUECTL_WORKER_ARGS" in u["Service"]["ExecStart"][0]
    assert "%i" in u["Unit"]["Description"][0]


def test_env_example_names_the_variables_the_units_use():
    text = (SYSTEMD / "worker.env.example").read_text()
    for var in ("CUECTL_DB", "PGPASSWORD", "CUECTL_WORKER_ARGS", "CUECTL_LOG_DIR"):
        assert re.search(rf"^#?{var}=", text, re.M), var
    assert "export " not in text  # EnvironmentFile= takes KEY=VALUE lines


# -- cuectl-serve.service ---------------------------------------------------------------------


def env_example_values(path: Path, key: str) -> list[str]:
    """The values an env example gives KEY, commented out or not."""
    return [m.group(1) for m in re.finditer(rf"^#?{key}=(.*)$", path.read_text(), re.M)]


def test_serve_unit_sections_and_restart():
    u = parse_unit(SERVE)
    assert set(u) == {"Unit", "Service", "Install"}
    assert u["Unit"]["Description"]
    assert "network-online.target" in u["Unit"]["After"][0].split()
    assert "network-online.target" in u["Unit"]["Wants"][0].split()
    assert u["Install"]["WantedBy"] == ["multi-user.target"]
    svc = u["Service"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["EnvironmentFile"] == ["-/etc/cuectl/serve.env"]
    # Root by default: on SQLite only root can hand a submit receipt to the token's user.
    # The unit says so, and how to run it as a dedicated user instead.
    assert "User" not in svc
    text = SERVE.read_text()
    for needle in ("receipt", "SET ROLE", "User=cuectl-api", "systemctl edit cuectl-serve"):
        assert needle in text, needle


def test_serve_unit_exec_start_runs_serve_with_real_options():
    (exec_start,) = parse_unit(SERVE)["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == "/usr/local/bin/cuectl" and argv[1] == "serve"
    assert "$CUECTL_SERVE_ARGS" in argv
    words = [a for a in argv[1:] if not a.startswith("$")]
    resolved = resolve_command(words)
    assert resolved is not None and resolved[0] == ["serve"]
    for opt in options_used(words):
        assert opt in resolved[1], f"`cuectl serve` has no option {opt}"


def test_serve_env_example_options_are_real_and_the_socket_is_in_the_runtime_dir():
    resolved = resolve_command(["serve"])
    assert resolved is not None
    values = env_example_values(SERVE_ENV, "CUECTL_SERVE_ARGS")
    assert len(values) >= 3
    for value in values:
        for opt in options_used(value.split()):
            assert opt in resolved[1], f"`cuectl serve` has no option {opt} ({value})"
    svc = parse_unit(SERVE)["Service"]
    (runtime,) = svc["RuntimeDirectory"]
    # Never /run/cuectl: systemd removes a RuntimeDirectory when the service stops, and
    # /run/cuectl/locks holds the host's device leases (cuectl-tmpfiles.conf).
    assert runtime != "cuectl" and not runtime.startswith("cuectl/")
    sockets = [v.split()[v.split().index("--socket") + 1] for v in values if "--socket" in v.split()]
    assert sockets and all(sock.startswith(f"/run/{runtime}/") for sock in sockets)
    for var in ("CUECTL_DB", "PGPASSWORD", "CUECTL_LOG_DIR"):
        assert env_example_values(SERVE_ENV, var), var
    assert "export " not in SERVE_ENV.read_text()


def test_serve_unit_hardening_matches_the_worker_and_keeps_what_root_needs():
    svc = parse_unit(SERVE)["Service"]
    worker = parse_unit(UNITS["single"])["Service"]
    assert svc["NoNewPrivileges"] == worker["NoNewPrivileges"] == ["yes"]
    assert svc["PrivateTmp"] == ["yes"]
    assert svc["ProtectSystem"] == ["full"]  # not "strict": stores and logs may be anywhere
    assert "ProtectHome" not in svc  # nor hidden homes: ~/.local/state/cuectl stores
    families = set(svc["RestrictAddressFamilies"][0].split())
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families
    caps = set(svc["CapabilityBoundingSet"][0].split())
    assert "CAP_CHOWN" in caps  # a root server gives receipts to their users
    assert "CAP_SYS_ADMIN" not in caps and "CAP_SETUID" not in caps


def test_root_makes_the_lock_files_before_the_service_account_starts_and_on_reload(unit):
    """The worker runs as User=, not root; in the shared lock directory only root makes
    lock files (docs/leases.md), so the unit has root make them first and again on reload
    (new devices), before the worker is told to look again."""
    _, u = unit
    svc = u["Service"]
    setup = "+/usr/local/bin/cuectl admin lease setup"
    assert svc["ExecStartPre"] == [setup]
    assert svc["ExecReload"] == [setup, "/bin/kill -HUP $MAINPID"]
    resolved = resolve_command(shlex.split(setup.lstrip("+"))[1:])
    assert resolved is not None and resolved[0] == ["admin", "lease", "setup"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a service account and root's lock directory need root")
def test_the_service_account_worker_starts_only_after_root_set_the_lock_files_up(os_users):
    """What the unit runs, for real: a root-made lock directory (as cuectl-tmpfiles.conf
    makes it), the worker as an unprivileged account. Without ExecStartPre it cannot lease
    (one error line naming the fix); after it, it drains a job on the fake GPUs."""
    (account,) = os_users("svc")
    top = Path(tempfile.mkdtemp(prefix="cuectl-unit-", dir="/tmp"))  # pytest's tmp_path is root's alone
    try:
        _start_as_the_account(account, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _start_as_the_account(account, tmp_path: Path) -> None:
    u = parse_unit(UNITS["single"])
    env = {**os.environ, **dict(item.split("=", 1) for item in u["Service"]["Environment"])}
    locks = tmp_path / "run-cuectl" / "locks"
    locks.mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(locks.parent, 0o755)
    os.chmod(locks, 0o1777)
    home = tmp_path / "svc"
    home.mkdir()
    os.chown(home, account.uid, account.gid)
    fake = tmp_path / "gpus.yaml"
    fake.write_text((REPO / "examples" / "fake-gpus.yaml").read_text())
    fake.chmod(0o644)
    env.update(
        CUECTL_LOCK_DIR=str(locks),
        CUECTL_FAKE_GPUS=str(fake),
        CUECTL_DB=str(home / "q.db"),
        CUECTL_LOCK_REGISTRY=str(tmp_path / "registry"),
        XDG_STATE_HOME=str(home / "state"),
    )
    env.pop("CUECTL_CREATE_LOCK_DIR", None)
    cuectl = str(Path(sys.executable).with_name("cuectl"))
    (exec_start,) = u["Service"]["ExecStart"]
    worker = [cuectl, *shlex.split(exec_start.replace("%H", "unit-host"))[1:], "--until-idle", "--poll", "0.05"]
    res = account.run([cuectl, "submit", "--name", "j", "--gpus", "1", "--", "true"], env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    res = account.run(worker, env=env, timeout=60)
    assert res.returncode == 1 and "sudo cuectl admin lease setup" in res.stderr, res.stderr
    (pre,) = u["Service"]["ExecStartPre"]
    res = subprocess.run(
        [cuectl, *shlex.split(pre.lstrip("+"))[1:]], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0 and "2 of 2 lock file(s) ready" in res.stdout, res.stderr
    assert sorted(p.stat().st_uid for p in locks.glob("*.lock")) == [0, 0]
    res = account.run(worker, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    res = account.run([cuectl, "job", "list", "--json"], env=env, timeout=60)
    assert [j["state"] for j in json.loads(res.stdout)["jobs"]] == ["FINISHED"], res.stdout


def test_systemd_analyze_verify(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze is not installed")
    exe = shutil.which("true")
    assert exe
    checked = []
    for path in [*UNITS.values(), SERVE, OPENCUE, SHARED]:
        # verify insists that ExecStart's program exists; a template needs an instance name.
        name = path.name.replace("@.", "@gpu.")
        text = path.read_text().replace("/usr/local/bin/cuectl", exe)
        (tmp_path / name).write_text(text)
        checked.append(tmp_path / name)
    proc = subprocess.run([analyze, "verify", *map(str, checked)], capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in (proc.stdout + proc.stderr).splitlines() if any(p.name in ln for p in checked)]
    assert proc.returncode == 0 and not complaints, proc.stdout + proc.stderr


# -- cuectl-opencue.service -------------------------------------------------------------------


def systemd_expand(exec_start: str, env: dict[str, str]) -> list[str]:
    """ExecStart's argv as systemd builds it: a word that is only $VAR becomes the value's
    whitespace-separated words (none when empty or unset); ${VAR} is replaced by the exact
    value, inside one word."""
    argv: list[str] = []
    for word in shlex.split(exec_start):
        m = re.fullmatch(r"\$(\w+)", word)
        if m:
            argv += env.get(m.group(1), "").split()
        else:
            argv.append(re.sub(r"\$\{(\w+)\}", lambda v: env.get(v.group(1), ""), word))
    return argv


def serve_params(argv: list[str], monkeypatch) -> dict:
    """What `cuectl serve` makes of argv (after the program and `serve`), the way entry.py
    hands it to click (serve_args first), without running it."""
    from deploylib import cli_tree

    from cuectl.cli.serve_cmd import serve_args

    monkeypatch.delenv("CUECTL_OPENCUE", raising=False)
    return cli_tree().commands["serve"].make_context("serve", serve_args(argv)).params


def unit_env(path: Path) -> dict[str, str]:
    return dict(item.split("=", 1) for item in parse_unit(path)["Service"].get("Environment", []))


def test_opencue_unit_sections_and_restart():
    u = parse_unit(OPENCUE)
    assert set(u) == {"Unit", "Service", "Install"}
    assert "--opencue" in u["Unit"]["Description"][0]
    assert "network-online.target" in u["Unit"]["After"][0].split()
    assert "network-online.target" in u["Unit"]["Wants"][0].split()
    assert u["Install"]["WantedBy"] == ["multi-user.target"]
    svc = u["Service"]
    assert svc["Restart"] == ["on-failure"]
    assert svc["EnvironmentFile"] == ["-/etc/cuectl/opencue.env"]
    # Root by default, for the REST API's reason: on SQLite only root can hand the receipt of
    # a LaunchSpec to the caller's uid. The unit says so, and how to run it as another user.
    assert "User" not in svc
    text = OPENCUE.read_text()
    for needle in (
        "receipt",
        "SET ROLE",
        "User=cuectl-api",
        "systemctl edit cuectl-opencue",
        "--opencue-trust-network",
        "cuectl[opencue]",
        "opencue.env.example",
    ):
        assert needle in text, needle


def test_opencue_unit_always_passes_the_address_and_defaults_to_cuebots_port_on_loopback(monkeypatch):
    from cuectl.cli.serve_cmd import OPENCUE_DEFAULT
    from cuectl.cuebot.server import parse_address

    (exec_start,) = parse_unit(OPENCUE)["Service"]["ExecStart"]
    argv = shlex.split(exec_start)
    # --opencue with its address as the next word, braced: one argument whatever it holds.
    assert argv[:4] == ["/usr/local/bin/cuectl", "serve", "--opencue", "${CUECTL_OPENCUE}"]
    assert "$CUECTL_OPENCUE_ARGS" in argv
    words = [a for a in argv[1:] if not a.startswith("$")]
    resolved = resolve_command(words)
    assert resolved is not None and resolved[0] == ["serve"]
    for opt in options_used(words):
        assert opt in resolved[1], f"`cuectl serve` has no option {opt}"
    env = unit_env(OPENCUE)
    assert env["CUECTL_OPENCUE"] == OPENCUE_DEFAULT
    assert parse_address(env["CUECTL_OPENCUE"]) == ("127.0.0.1", 8443)
    # As systemd runs it without an env file: the default address, nothing else.
    params = serve_params(systemd_expand(exec_start, env)[2:], monkeypatch)
    assert params["opencue"] == OPENCUE_DEFAULT and params["trust_network"] == ()


def test_opencue_unit_with_each_example_setting_serves_opencue(monkeypatch):
    from cuectl.cuebot.server import parse_address, parse_networks
    from cuectl.errors import InvalidInput

    (exec_start,) = parse_unit(OPENCUE)["Service"]["ExecStart"]
    addresses = env_example_values(OPENCUE_ENV, "CUECTL_OPENCUE")
    extra = env_example_values(OPENCUE_ENV, "CUECTL_OPENCUE_ARGS")
    assert addresses and len(extra) >= 2
    for address in [unit_env(OPENCUE)["CUECTL_OPENCUE"], *addresses]:
        parse_address(address)
        for args in ["", *extra]:
            env = {**unit_env(OPENCUE), "CUECTL_OPENCUE": address, "CUECTL_OPENCUE_ARGS": args}
            params = serve_params(systemd_expand(exec_start, env)[2:], monkeypatch)
            assert params["opencue"] == address
            assert list(params["trust_network"]) == args.split()[1::2]
            parse_networks(list(params["trust_network"]))
    # Set empty, the address is still one (empty) argument: the server refuses it, rather
    # than serving the REST API or the default.
    env = {**unit_env(OPENCUE), "CUECTL_OPENCUE": ""}
    params = serve_params(systemd_expand(exec_start, env)[2:], monkeypatch)
    assert params["opencue"] == ""
    with pytest.raises(InvalidInput, match="not HOST:PORT"):
        parse_address(params["opencue"])


def test_opencue_env_example_names_the_variables_the_unit_uses():
    resolved = resolve_command(["serve"])
    assert resolved is not None
    for var in ("CUECTL_DB", "PGPASSWORD", "CUECTL_LOG_DIR", "CUECTL_OPENCUE", "CUECTL_OPENCUE_ARGS"):
        assert env_example_values(OPENCUE_ENV, var), var
    for value in env_example_values(OPENCUE_ENV, "CUECTL_OPENCUE_ARGS"):
        used = options_used(value.split())
        assert used and set(used) == {"--opencue-trust-network"}, value
        for opt in used:
            assert opt in resolved[1], f"`cuectl serve` has no option {opt} ({value})"
    assert "export " not in OPENCUE_ENV.read_text()
    # The variable would turn the REST API service into this one (`cuectl serve` reads it).
    assert not env_example_values(SERVE_ENV, "CUECTL_OPENCUE")
    assert "CUECTL_OPENCUE" not in unit_env(SERVE)


def test_opencue_unit_hardening_matches_the_rest_api_and_keeps_the_socket_tables():
    svc = parse_unit(OPENCUE)["Service"]
    rest = parse_unit(SERVE)["Service"]
    for key in (
        "NoNewPrivileges",
        "PrivateTmp",
        "ProtectSystem",
        "ProtectKernelTunables",
        "ProtectKernelModules",
        "ProtectControlGroups",
        "CapabilityBoundingSet",
    ):
        assert svc[key] == rest[key], key
    assert "ProtectHome" not in svc
    # Who calls is read from the kernel's socket tables: netlink sock_diag, else /proc/net.
    families = set(svc["RestrictAddressFamilies"][0].split())
    assert {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"} <= families
    for hiding in ("PrivateNetwork", "ProcSubset", "PrivateUsers"):
        assert hiding not in svc, hiding
    assert "RuntimeDirectory" not in svc  # no socket of its own to keep


# -- cuectl-shared.service (issue 35: a machine several people use) ----------------------------


def test_shared_unit_serves_a_root_store_on_a_socket_with_real_options():
    u = parse_unit(SHARED)
    svc = u["Service"]
    assert u["Install"]["WantedBy"] == ["multi-user.target"] and svc["Restart"] == ["on-failure"]
    assert "User" not in svc  # root: it hands each submit receipt to its user
    env = dict(e.split("=", 1) for e in svc["Environment"])
    (state,) = svc["StateDirectory"]
    assert env["CUECTL_DB"] == f"/var/lib/{state}/cuectl.db" and svc["StateDirectoryMode"] == ["0755"]
    (runtime,) = svc["RuntimeDirectory"]
    assert runtime != "cuectl" and not runtime.startswith("cuectl/")  # /run/cuectl/locks must outlive it
    for line in [*svc["ExecStartPre"], *svc["ExecStart"]]:
        argv = shlex.split(line)
        assert argv[0] == "/usr/local/bin/cuectl"
        resolved = resolve_command(argv[1:])
        assert resolved is not None, line
        for opt in options_used(argv[1:]):
            assert opt in resolved[1], f"{line}: no option {opt}"
    (start,) = svc["ExecStart"]
    argv = shlex.split(start)
    sock = argv[argv.index("--socket") + 1]
    assert sock.startswith(f"/run/{runtime}/")
    # What users set is the same socket (the install lines of the unit, and docs/deploy.md).
    assert f"CUECTL_DB=unix:{sock}" in SHARED.read_text()
    assert f"CUECTL_DB=unix:{sock}" in (DEPLOY.parent / "docs" / "deploy.md").read_text()
    assert svc["RestrictAddressFamilies"] == ["AF_UNIX"]
