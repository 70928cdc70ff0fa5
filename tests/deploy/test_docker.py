"""deploy/docker/Dockerfile, read statically (no Docker daemon is needed or used): the base
image, the install, the user, the entrypoint, and that it agrees with the manifests."""

from __future__ import annotations

import json
import re

import pytest
from deploylib import BASE, DEPLOY, REPO, container, env_of, kustomize, one, pod_spec

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
IGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "dangling line continuation"
    return out


def args_with_defaults() -> dict[str, str]:
    return {
        m.group(1): m.group(2)
        for kw, rest in instructions()
        if kw == "ARG"
        for m in [re.match(r"(\w+)=(\S+)", rest)]
        if m
    }


def expand(text: str) -> str:
    defaults = args_with_defaults()
    return re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m.group(1), m.group(0)), text)


def env_vars() -> dict[str, str]:
    env: dict[str, str] = {}
    for kw, rest in instructions():
        if kw == "ENV":
            for m in re.finditer(r"(\w+)=(\S+)", rest):
                env[m.group(1)] = expand(m.group(2))
    return env


def test_base_image_is_nvidia_cuda_on_ubuntu():
    (frm,) = [rest for kw, rest in instructions() if kw == "FROM"]
    image = expand(frm)
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(base|runtime)-ubuntu2[24]\.04", image), image


def test_installs_cuectl_from_the_checkout_with_the_postgres_and_opencue_extras():
    runs = [rest for kw, rest in instructions() if kw == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1
    (extras,) = re.findall(r"/tmp/cuectl-src\[([\w,]+)\]", installs[0])
    # postgres: a farm's store; opencue: `cuectl serve --opencue` (components/opencue-grpc).
    assert {"postgres", "opencue"} <= set(extras.split(","))
    pyproject = (REPO / "pyproject.toml").read_text()
    section = pyproject[pyproject.index("[project.optional-dependencies]") :]
    section = section[: section.index("\n[", 1)]
    declared = set(re.findall(r"^(\w[\w-]*) = \[", section, re.M))
    assert {"postgres", "opencue"} <= declared
    assert set(extras.split(",")) <= declared, "an extra pyproject.toml does not declare"
    copies = [rest for kw, rest in instructions() if kw == "COPY"]
    sources = [s for c in copies for s in c.split()[:-1] if not s.startswith("--")]
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: not in the repository"
    assert {"pyproject.toml", "README.md", "src"} <= set(sources)
    assert any("python3-venv" in r and "tini" in r for r in runs)


def test_dockerignore_keeps_what_the_copies_need():
    lines = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[0] == "*"  # everything out, then the few things in
    for keep in ("!pyproject.toml", "!README.md", "!src/"):
        assert keep in lines


def test_runs_as_a_fixed_non_root_user_matching_the_manifests():
    (user,) = [expand(rest) for kw, rest in instructions() if kw == "USER"]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric, so that runAsNonRoot can verify it"
    assert gid.isdigit()
    worker = container(pod_spec(one(kustomize(BASE), "DaemonSet")), "worker")
    assert worker["securityContext"]["runAsUser"] == int(uid)
    assert worker["securityContext"]["runAsGroup"] == int(gid)


def test_entrypoint_is_cuectl_under_tini_and_cmd_the_worker():
    (entry,) = [rest for kw, rest in instructions() if kw == "ENTRYPOINT"]
    (cmd,) = [rest for kw, rest in instructions() if kw == "CMD"]
    entry_argv, cmd_argv = json.loads(entry), json.loads(cmd)  # exec form: signals reach tini
    assert entry_argv == ["/usr/bin/tini", "--", "cuectl"]
    assert cmd_argv == ["worker"]


def test_environment_matches_the_kubernetes_worker():
    env = env_vars()
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    assert "/opt/cuectl/bin" in env["PATH"]
    worker_env = env_of(container(pod_spec(one(kustomize(BASE), "DaemonSet")), "worker"))
    for key in ("CUECTL_LOCK_DIR", "CUECTL_SERVICE_USER", "XDG_STATE_HOME", "CUECTL_LOG_DIR"):
        assert env[key] == worker_env[key]["value"], key
    # The image must not bake in a store: it comes from the Secret / docker run -e.
    assert "CUECTL_DB" not in env and "PGPASSWORD" not in env


@pytest.mark.parametrize("needle", ["docker build -f deploy/docker/Dockerfile", "--gpus"])
def test_header_says_how_to_build_and_run(needle: str):
    assert needle in DOCKERFILE.read_text()
