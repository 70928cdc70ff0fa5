"""The worker image, built and run for real with podman (issue 40).

deploy/docker/Dockerfile is built on a Debian bookworm base made here with mmdebstrap and
imported with `podman import` (no registry is reachable from the test machines; the CUDA
base stays the Dockerfile's default through its CUDA_IMAGE argument). Then the image says
its version, and a containerised worker — no network, the store and the lock directory
mounted, fake GPUs — drains a GPU job submitted from the host: each frame reports its uid
and its CUDA_VISIBLE_DEVICES/NVIDIA_VISIBLE_DEVICES into a mounted directory, the image's
healthcheck (`cuectl worker --probe`) passes while the worker runs, and `podman stop`
drains it through tini.

Podman runs with a configuration of the test's own (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF):
runc with the cgroupfs manager and ulimits no higher than this process's own (the test
machines refuse podman's defaults: docs/contributing.md, "The container image test"),
its storage under ~/.cache/cuectl-tests/image and its runtime state under
/run/cuectl-tests, both kept between runs and keyed by the Dockerfile, so that a second
run rebuilds only what changed (a clean machine: about a minute; nothing changed: seconds).
Builds use the host's network (no bridge or firewall rules made on the host) and get the
host's CA bundle as a build secret, for package mirrors behind a TLS-inspecting proxy;
containers run with --network none.

Root only: rootless podman needs subordinate uid ranges and a store owned through them;
CI runs as root and scripts/test.sh installs podman, runc and mmdebstrap there."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from deploylib import REPO

DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
IGNORE = REPO / "deploy" / "docker" / "Dockerfile.dockerignore"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cuectl-tests" / "image"
RUNTIME = Path("/run/cuectl-tests")
MIRROR = os.environ.get("CUECTL_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# The base: minbase (Essential packages and apt) plus what the CUDA base images have that
# the Dockerfile uses (useradd), merged /usr without usrmerge's perl, no docs or locales.
MMDEBSTRAP = [
    "mmdebstrap",
    "--variant=minbase",
    "--include=passwd",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    *(f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "locale")),
    "--dpkgopt=path-include=/usr/share/doc/*/copyright",
    "bookworm",
]
UID = 10001
IMAGE = "localhost/cuectl-test:latest"
BUILD_STAGE = "localhost/cuectl-test-build:latest"
BASE_IMAGE = "localhost/cuectl-test-base:bookworm"
CA_BUNDLE = next(
    (p for p in (os.environ.get("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt") if p and Path(p).is_file()),
    None,
)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


def _run(argv: list[str], *, env: dict[str, str] | None = None, timeout: float = 120, check: bool = True, **kw):
    proc = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, **kw
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def _ulimits() -> list[str]:
    """nofile and nproc at most what this process may have: podman's defaults (1048576
    files, no process limit) are refused by runc on the test machines ("error setting
    rlimit type 7/6: operation not permitted"); nproc also at most kernel.pid_max."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    nofile = 65536 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = pid_max if nproc == resource.RLIM_INFINITY else min(nproc, pid_max)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


class Podman:
    """podman with this test's configuration: storage kept in ``store``, runtime state
    in ``run``."""

    def __init__(self, store: Path, run: Path) -> None:
        self.dir = run
        conf, storage = run / "containers.conf", run / "storage.conf"
        ulimits = ", ".join(json.dumps(u) for u in _ulimits())
        conf.write_text(
            "[containers]\n"
            f"default_ulimits = [{ulimits}]\n"
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'events_logfile_path = "{run}/events.log"\n'
            f'tmp_dir = "{run}/libpod"\n'
        )
        storage.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{store}"\nrunroot = "{run}/runroot"\n')
        (run / "tmp").mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(conf),
            "CONTAINERS_STORAGE_CONF": str(storage),
            "TMPDIR": str(run / "tmp"),  # buildah's copies of the context
        }

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        return _run(["podman", *args], env=self.env, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    missing = [t for t in ("podman", "runc", "mmdebstrap") if not shutil.which(t)]
    if missing:
        pytest.skip(
            f"{', '.join(missing)} not installed: the worker image is not built "
            "(apt-get install podman runc mmdebstrap; scripts/test.sh does as root)"
        )
    if os.geteuid() != 0:
        pytest.skip("the image test runs podman as root (rootless needs subuid ranges and a store owned through them)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one image test per machine at a time
        key = _digest(DOCKERFILE.read_bytes(), IGNORE.read_bytes(), " ".join(MMDEBSTRAP).encode())
        for old in CACHE.glob("podman-*"):  # storage of another Dockerfile: its layers would not be used again
            if old.name != f"podman-{key}":
                shutil.rmtree(old, ignore_errors=True)
        # Runtime state in /run (a tmpfs: gone at boot, as podman's own), short for conmon's
        # socket paths; kept between runs like the storage, since podman's clean-up of a
        # container goes on for a moment after `podman run --rm` returns.
        for old in RUNTIME.glob("podman-*"):
            if old.name != f"podman-{key}":
                shutil.rmtree(old, ignore_errors=True)
        run = RUNTIME / f"podman-{key}"
        run.mkdir(parents=True, exist_ok=True)
        yield Podman(CACHE / f"podman-{key}", run)


def base_image(podman: Podman) -> str:
    """The bookworm base made with mmdebstrap, its tarball cached, imported into podman."""
    if podman("image", "exists", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    tarball = CACHE / f"base-{_digest(' '.join(MMDEBSTRAP).encode(), MIRROR.encode())}.tar"
    if not tarball.exists():
        for old in CACHE.glob("base-*.tar"):
            old.unlink()
        partial = tarball.with_suffix(".partial.tar")
        _run([*MMDEBSTRAP, str(partial), MIRROR], timeout=600, env={**os.environ, "TMPDIR": str(podman.dir / "tmp")})
        partial.rename(tarball)
    podman("import", "--change", "CMD /bin/bash", str(tarball), BASE_IMAGE, timeout=300)
    return BASE_IMAGE


def build(podman: Podman, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    secret = ["--secret", f"id=ca-bundle,src={CA_BUNDLE}"] if CA_BUNDLE else []
    return podman(
        "build",
        "--format",
        "docker",  # the HEALTHCHECK (no OCI field for it)
        "--network",
        "host",  # no bridge and no firewall rules on the host; apt and pip reach the mirrors
        "--build-arg",
        f"CUDA_IMAGE={base_image(podman)}",
        *secret,
        "-f",
        str(DOCKERFILE),
        *args,
        str(REPO),
        timeout=600,
        check=check,
    )


CUECTL = [str(Path(sys.executable).with_name("cuectl"))]


def host_cuectl(*args: str) -> str:
    return _run([*CUECTL, *args], timeout=60).stdout


def test_the_worker_image_builds_and_a_containerised_worker_drains_a_gpu_job(podman: Podman, tmp_path: Path):
    # A bad extras list is refused by the build itself, before pip sees it (pip would only
    # warn about an extra cuectl does not have).
    for extras, error in [
        ("postgres;rm -rf /", "error: --build-arg CUECTL_EXTRAS='postgres;rm -rf /': not a comma list"),
        (
            "postgres,cuda",
            "error: --build-arg CUECTL_EXTRAS: cuectl has no extra 'cuda' (pyproject.toml has: postgres ",
        ),
    ]:
        bad = build(podman, "--build-arg", f"CUECTL_EXTRAS={extras}", check=False)
        assert bad.returncode != 0 and error in bad.stderr + bad.stdout, bad.stderr[-2000:]

    # The build stage tagged too, so that pruning the images of earlier builds (of another
    # src/) keeps its layers for the next run.
    build(podman, "--target", "build", "-t", BUILD_STAGE)
    build(podman, "-t", IMAGE)
    podman("image", "prune", "-f")
    (info,) = json.loads(podman("image", "inspect", IMAGE).stdout)
    config = info["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "cuectl"] and config["Cmd"] == ["worker"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "cuectl worker"
    assert labels["org.opencontainers.image.version"] == host_cuectl("--version").split()[-1]
    assert info["Healthcheck"]["Test"][:4] == ["CMD", "cuectl", "worker", "--probe"]
    history = podman("history", "--no-trunc", "--format", "{{.CreatedBy}}", IMAGE).stdout
    assert "BEGIN CERTIFICATE" not in history  # the CA bundle was a secret, not an argument

    # The image runs: the entrypoint is cuectl, no network needed.
    version = podman("run", "--rm", "--network", "none", IMAGE, "--version").stdout
    assert version.strip() == host_cuectl("--version").strip()
    # Multi-stage: no pip, no python3-venv, no CA secret, no apt lists in the shipped image.
    sealed = podman(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", IMAGE, "-c",
        "test ! -e /opt/cuectl/bin/pip && test ! -e /run/secrets/ca-bundle && ! python3 -c 'import ensurepip' "
        "2>/dev/null && test -z \"$(ls /var/lib/apt/lists | grep -v '^lock$\\|^partial$')\" && echo sealed",
        check=False,
    )  # fmt: skip
    assert sealed.stdout.strip() == "sealed", sealed.stderr

    # The host's store and lock directory, handed to the image's account as docs/deploy.md
    # says; everything mounted at the same path inside, so the paths the store records
    # (the job's cwd) are the same for both.
    store, locks, out, logs, state, gpus = (tmp_path / d for d in ("store", "locks", "out", "logs", "state", "gpus"))
    for d in (store, out, logs, state, gpus):
        d.mkdir()
    locks.mkdir()
    locks.chmod(0o1777)  # as `install -d -m 1777 -o 10001 -g 10001 /run/cuectl/locks` makes it
    fake = gpus / "gpus.yaml"
    fake.write_text(
        yaml.safe_dump(
            {
                "host": "box-01",
                "devices": [
                    {"model": "NVIDIA A100-SXM4-80GB", "memory": "81920MiB", "pci_bus_id": "0000:17:00.0"},
                    {"model": "NVIDIA A100-SXM4-80GB", "memory": "81920MiB", "pci_bus_id": "0000:65:00.0"},
                ],
            }
        )
    )
    spec = tmp_path / "job.yaml"
    report = 'printf "%s %s %s %s\\n" "$(id -u)" "$(id -g)" "$CUDA_VISIBLE_DEVICES" "$NVIDIA_VISIBLE_DEVICES"'
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "in-a-container",
                "cwd": str(out),
                "layers": [
                    {"name": "gpu", "range": "1-4", "gpus": 1, "command": ["sh", "-c", f"{report} > frame-$CUE_IFRAME"]}
                ],
            }
        )
    )
    db = store / "farm.db"
    job = host_cuectl("--db", str(db), "submit", str(spec)).strip()
    for d in (store, out, logs, state, locks):  # a non-root worker writes them: they are its
        for path in [d, *d.rglob("*")]:
            os.chown(path, UID, UID)

    name = f"cuectl-test-worker-{os.getpid()}"
    mounts = [f"--volume={p}:{p}" for p in (store, out)] + [
        f"--volume={gpus}:{gpus}:ro",
        f"--volume={locks}:/run/cuectl/locks",
        f"--volume={logs}:/srv/cuectl/logs",
        f"--volume={state}:/var/lib/cuectl",
    ]
    podman(
        "run", "--detach", "--name", name, "--network", "none",
        # hardened as an operator would run it: nothing needs a capability or a writable image
        "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        *mounts, "--env", f"CUECTL_FAKE_GPUS={fake}",
        IMAGE, "--db", str(db), "worker", "--poll", "0.1", "--sample-interval", "0.5",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(out.glob("frame-*"))) < 4:
            state_now = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state_now == "running", podman("logs", name).stderr
            assert time.monotonic() < deadline, f"frames not done: {podman('logs', name).stderr}"
            time.sleep(0.2)
        health = podman("healthcheck", "run", name, check=False)
        assert health.returncode == 0, (health.stdout, health.stderr)
        podman("stop", "--time", "60", name)  # SIGTERM through tini: the worker drains and exits
        (ctr,) = json.loads(podman("inspect", name).stdout)
        logged = podman("logs", name).stderr
        assert ctr["State"]["ExitCode"] == 0, logged
        assert "draining (SIGTERM)" in logged
    finally:
        podman("rm", "--force", "--time", "0", name, check=False)

    fake_env = {**os.environ, "CUECTL_FAKE_GPUS": str(fake)}
    devices = json.loads(_run([*CUECTL, "gpu", "list", "--json"], env=fake_env).stdout)["devices"]
    index = {d["uuid"]: str(d["index"]) for d in devices}
    frames = json.loads(host_cuectl("--db", str(db), "frame", "list", "--job", job, "--json"))["frames"]
    assert len(frames) == 4
    for frame in frames:
        assert frame["state"] == "SUCCEEDED" and frame["host"] == "box-01", frame
        (uuid,) = frame["gpu_uuids"]
        uid, gid, cuda, nvidia = (out / f"frame-{frame['number']}").read_text().split()
        assert (uid, gid) == (str(UID), str(UID)), "the frame ran as the image's non-root user"
        assert (cuda, nvidia) == (index[uuid], uuid)
        # its log, written by the worker in the container, is in the mounted log directory
        assert (logs / str(frame["job_id"]) / f"{frame['name']}.1.log").is_file()
    assert {f["gpu_uuids"][0] for f in frames} == set(index), "both GPUs were leased"
    assert {p.name for p in locks.iterdir()} >= {f"{u}.lock" for u in index}, "the worker made the lock files"
