"""scripts/k8s-e2e.sh where no cluster can run: its argument handling (exit 2 with one
`error:` line, nothing contacted) and --dry-run, which renders the chart with the real helm
and prints the plan. The cluster run itself is for machines with one (docs/verified.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from deploylib import kubectl_or_skip
from helmlib import EXAMPLES, REPO, helm_or_skip

SCRIPT = REPO / "scripts" / "k8s-e2e.sh"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "KUBECONFIG": "/nonexistent/kubeconfig", **(env or {})},
    )


def test_help():
    proc = run("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: scripts/k8s-e2e.sh")
    for opt in ("--image", "--dry-run", "--values", "--set", "--db-url", "--keep", "--timeout", "--helm"):
        assert opt in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "--image is required"),
        (("--bogus",), "unknown argument: --bogus"),
        (("--image",), "--image needs a value"),
        (("--image", "cuectl"), "--image wants REPO:TAG"),
        (("--image=a/b:1",), "write --image VALUE"),
        (("--dry-run", "--timeout", "ten"), "--timeout wants a whole number"),
        (("--dry-run", "--namespace", "Cuectl_E2E"), "--namespace wants a DNS label"),
        (("--dry-run", "--values", "/nonexistent.yaml"), "--values: no such file"),
        (("--dry-run", "--set", "worker.gpu.count"), "--set wants KEY=VALUE"),
        (("--dry-run", "--db-url", "sqlite:///x.db"), "--db-url wants a postgresql:// URL"),
        (("--dry-run", "--helm", "/nonexistent/helm"), "--helm: not an executable"),
    ],
)
def test_bad_arguments_exit_2_with_one_error_line(args: tuple[str, ...], message: str):
    proc = run(*args)
    assert proc.returncode == 2, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], proc.stderr
    assert proc.stdout == ""


def test_dry_run_prints_the_plan_without_a_cluster():
    helm = helm_or_skip()
    proc = run(
        "--dry-run",
        "--helm",
        helm,
        "--image",
        "registry.example.com/render/cuectl:0.1.0",
        "--values",
        str(EXAMPLES / "pools.yaml"),
        "--namespace",
        "gpu-e2e",
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("plan (dry run: no cluster contacted)")
    assert "namespace gpu-e2e, labelled pod-security.kubernetes.io/enforce=privileged" in out
    (install,) = [ln for ln in out.splitlines() if " upgrade --install cuectl-e2e " in ln]
    assert "--set image.repository=registry.example.com/render/cuectl --set image.tag=0.1.0" in install
    assert f"--values {EXAMPLES / 'pools.yaml'}" in install and "--wait" in install
    # The objects the real helm renders for those values, with each worker pool's GPUs.
    assert "DaemonSet/cuectl-e2e-worker  gpus={'nvidia.com/gpu': 8}" in out
    assert "DaemonSet/cuectl-e2e-worker-h100-mig  gpus={'nvidia.com/mig-1g.10gb': 7}" in out
    assert "Deployment/cuectl-e2e-worker-cpu  gpus=none" in out
    # The two jobs it would submit, as the API takes them.
    bodies = [json.loads(m) for m in re.findall(r"POST /api/v1/jobs: (\{.*\})$", out, re.M)]
    assert [(b["name"], b["layers"][0]["gpus"]) for b in bodies] == [("e2e-gpu", 1), ("e2e-cpu", 0)]
    probe = bodies[0]["layers"][0]["command"][2]
    compile(probe, "probe", "exec")  # the frame's program is valid Python
    assert "helm uninstall cuectl-e2e; kubectl delete namespace gpu-e2e" in out


def test_dry_run_of_bad_values_fails_with_the_schemas_message():
    proc = run("--dry-run", "--helm", helm_or_skip(), "--set", "worker.tolerration=x")
    assert proc.returncode == 1
    assert "additional properties 'tolerration' not allowed" in proc.stderr


def test_without_a_cluster_a_real_run_stops_at_once(tmp_path: Path):
    kubectl_or_skip()
    proc = run("--image", "registry.example.com/render/cuectl:0.1.0", "--helm", helm_or_skip(), "--timeout", "5")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no cluster answers")
