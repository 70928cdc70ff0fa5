"""deploy/docker/Dockerfile, read statically (no Docker daemon is needed or used): the base
image, the install, the user, the entrypoint, and that it agrees with the manifests and
with what pyproject.toml's build reads. test_image_podman.py builds and runs it."""

from __future__ import annotations

import fnmatch
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


def stages() -> list[tuple[str, str | None]]:
    """(image, stage name) of each FROM, in order."""
    out = []
    for kw, rest in instructions():
        if kw == "FROM":
            m = re.fullmatch(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\w+))?", rest, re.I)
            assert m, f"FROM {rest}"
            out.append((m.group(1), m.group(2)))
    return out


def test_base_image_is_nvidia_cuda_on_ubuntu():
    # Multi-stage: a runtime stage on the CUDA base, the build stage and the image on it.
    (first, name), *rest = stages()
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(base|runtime)-ubuntu2[24]\.04", expand(first)), first
    assert first == "${CUDA_IMAGE}", "the base is chosen with --build-arg CUDA_IMAGE"
    assert name and all(image == name for image, _ in rest), "every later stage builds on the runtime stage"


def pyproject_build_inputs() -> set[str]:
    """What `pip install .` reads beside pyproject.toml: the readme, the script-files and
    the package directories (top-level names)."""
    text = (REPO / "pyproject.toml").read_text()
    (readme,) = re.findall(r'^readme = "([^"]+)"', text, re.M)
    scripts = re.findall(r'"([^"]+)"', re.search(r"^script-files = \[([^\]]*)\]", text, re.M).group(1))
    where = re.findall(r'"([^"]+)"', re.search(r"^where = \[([^\]]*)\]", text, re.M).group(1))
    assert scripts == ["bin/cuectl"] and where == ["src"], "update this test with pyproject.toml"
    return {"pyproject.toml", readme, *(p.split("/")[0] for p in scripts + where)}


def admitted(path: str) -> bool:
    """Does Dockerfile.dockerignore send ``path`` to the build (the last matching pattern
    wins; a pattern that matches a directory matches what is below it)?"""
    lines = [ln.strip() for ln in IGNORE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    parts = path.split("/")
    keep = True
    for pattern in lines:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        if any(fnmatch.fnmatch("/".join(parts[: i + 1]), pat) for i in range(len(parts))):
            keep = negate
    return keep


def test_the_build_context_and_the_copies_hold_everything_pip_install_reads():
    # The worker image did not build when pyproject.toml gained script-files = ["bin/cuectl"]
    # and neither the ignore file nor the COPY lines followed (issue 40).
    needed = pyproject_build_inputs()
    copies = [rest for kw, rest in instructions() if kw == "COPY" and "--from=" not in rest]
    sources = {s.rstrip("/") for c in copies for s in c.split()[:-1] if not s.startswith("--")}
    for src in sources:
        assert (REPO / src).exists(), f"COPY {src}: not in the repository"
    assert needed <= sources, f"not copied into the build: {sorted(needed - sources)}"
    for path in sorted(needed):
        assert admitted(path), f"{IGNORE.name} leaves {path} out of the build context"
    for path in ("bin/cuectl", "src/cuectl/__init__.py"):
        assert admitted(path), path
    for path in (".git/config", ".venv/bin/python", "tests/conftest.py", "src/cuectl/__pycache__/x.pyc"):
        assert not admitted(path), f"{path} would be sent to the build"


def test_installs_cuectl_from_the_checkout_with_the_postgres_and_opencue_extras():
    runs = [rest for kw, rest in instructions() if kw == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    assert len(installs) == 1
    assert '"/tmp/cuectl-src${CUECTL_EXTRAS:+[${CUECTL_EXTRAS}]}"' in installs[0]
    extras = args_with_defaults()["CUECTL_EXTRAS"]
    # postgres: a farm's store; opencue: `cuectl serve --opencue` (components/opencue-grpc).
    assert {"postgres", "opencue"} <= set(extras.split(","))
    pyproject = (REPO / "pyproject.toml").read_text()
    section = pyproject[pyproject.index("[project.optional-dependencies]") :]
    section = section[: section.index("\n[", 1)]
    declared = set(re.findall(r"^(\w[\w-]*) = \[", section, re.M))
    assert set(extras.split(",")) <= declared, "an extra pyproject.toml does not declare"
    assert any("python3" in r and "tini" in r for r in runs)
    assert any("python3-venv" in r for r in runs)


def test_the_image_is_multi_stage_and_ships_only_the_virtual_environment():
    last_from = max(i for i, (kw, _) in enumerate(instructions()) if kw == "FROM")
    final = instructions()[last_from:]
    copies = [rest for kw, rest in final if kw in ("COPY", "ADD")]
    assert copies == ["--from=build /opt/cuectl /opt/cuectl"], "the image takes only /opt/cuectl from the build"
    assert not [rest for kw, rest in final if kw == "RUN"], "the image's own layers come from the runtime stage"


def test_the_ca_bundle_is_a_build_secret_never_an_argument_or_a_file_in_the_image():
    text = DOCKERFILE.read_text()
    for kw, rest in instructions():
        if kw == "RUN" and ("apt-get" in rest or "pip install" in rest):
            assert rest.startswith("--mount=type=secret,id=ca-bundle,required=false "), rest[:80]
    assert "PIP_CERT=/run/secrets/ca-bundle" in text and "Acquire::https::CAInfo=/run/secrets/ca-bundle" in text
    assert not [rest for kw, rest in instructions() if kw in ("ARG", "ENV") and re.search(r"CERT|CA_BUNDLE", rest)]
    assert "--secret id=ca-bundle" in text  # the header says how to give it


def test_labels_and_healthcheck():
    labels = " ".join(rest for kw, rest in instructions() if kw == "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    assert args_with_defaults()["CUECTL_VERSION"] == re.search(
        r'__version__ = "([^"]+)"', (REPO / "src" / "cuectl" / "__init__.py").read_text()
    ).group(1)
    (health,) = [rest for kw, rest in instructions() if kw == "HEALTHCHECK"]
    argv = json.loads(health[health.index("CMD ") + 4 :])
    assert argv[:3] == ["cuectl", "worker", "--probe"]


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


@pytest.mark.parametrize(
    "needle",
    ["docker build -f deploy/docker/Dockerfile", "podman build --format docker -f deploy/docker/Dockerfile", "--gpus"],
)
def test_header_says_how_to_build_and_run(needle: str):
    assert needle in DOCKERFILE.read_text()


def test_deploy_doc_covers_the_image_podman_and_gpu_access():
    text = (REPO / "docs" / "deploy.md").read_text()
    for arg in args_with_defaults():  # every build argument is documented
        assert f"`{arg}`" in text, arg
    for needle in [
        "podman build --format docker -f deploy/docker/Dockerfile",
        "--secret id=ca-bundle,src=",
        "nvidia-ctk cdi generate",
        "--device nvidia.com/gpu=all",
        "NVIDIA Container Toolkit",
        "uid/gid 10001",
        "cuectl worker --probe",
        '--hostname "$(hostname)"',
        "--no-healthcheck",
        "error setting rlimit type 7",
    ]:
        assert needle in text, needle
    assert re.search(r"\*\*\d+ MB\*\*", text), "the image's measured size"
    contributing = (REPO / "docs" / "contributing.md").read_text()
    for needle in ["The container image test", "cgroupfs", "CERTIFICATE_VERIFY_FAILED", "mmdebstrap"]:
        assert needle in contributing, needle
