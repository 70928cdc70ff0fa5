"""docs/deploy.md and docs/deploy-kubernetes.md: the paths they name exist, the cuectl
commands they show use sub-commands and options that cuectl has, and the YAML they quote
agrees with the manifests."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from deploylib import K8S, OVERLAYS, REPO, cli_tree, kustomize, one, resolve_command

DOCS = {"deploy": REPO / "docs" / "deploy.md", "kubernetes": REPO / "docs" / "deploy-kubernetes.md"}
CUECTL_TOKEN = re.compile(r"(^|.*/)cuectl(:[\w.-]+)?$")      # cuectl, /usr/local/bin/cuectl, an image
SHELL_STOP = {"|", "||", "&&", ";", "&"}


def code_blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def shell_lines(text: str) -> list[str]:
    """Command lines of bash/console blocks, continuation lines joined."""
    out: list[str] = []
    for lang, body in code_blocks(text):
        if lang not in ("bash", "console", "sh"):
            continue
        lines = body.splitlines()
        if lang == "console":
            lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
        joined = ""
        for ln in lines:
            if ln.rstrip().endswith("\\"):
                joined += ln.rstrip()[:-1] + " "
                continue
            out.append(joined + ln)
            joined = ""
    return out


def cuectl_invocations(text: str) -> list[list[str]]:
    top = set(cli_tree().commands) | {"--db", "--debug"}
    found = []
    for line in shell_lines(text):
        tokens = shlex.split(line, comments=True)
        for i, tok in enumerate(tokens):
            if CUECTL_TOKEN.match(tok) and i + 1 < len(tokens) and tokens[i + 1] in top:
                words = []
                for w in tokens[i + 1:]:
                    if w in SHELL_STOP or w.startswith(">"):
                        break
                    words.append(w)
                found.append(words)
    return found


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_named_repository_paths_exist(doc: str):
    text = DOCS[doc].read_text()
    paths = set(re.findall(r"(?<![\w/.-])((?:deploy|examples|docs)/[\w./@-]*[\w@/])", text))
    assert paths
    for p in sorted(paths):
        # The Kubernetes page also says examples/... for deploy/kubernetes/examples/...
        bases = (REPO, K8S) if doc == "kubernetes" else (REPO,)
        assert any((b / p).exists() for b in bases), f"{DOCS[doc].name} names {p}, which does not exist"
    if doc == "kubernetes":                    # short forms relative to deploy/kubernetes
        for p in set(re.findall(r"`((?:overlays|components|examples|base)/[\w./@-]*[\w/])`", text)):
            assert (K8S / p).exists(), p


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_links_to_other_docs_resolve(doc: str):
    text = DOCS[doc].read_text()
    for target in re.findall(r"\]\(([\w./-]+\.md)(?:#[\w-]+)?\)", text):
        assert (DOCS[doc].parent / target).exists(), target


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_cuectl_commands_use_real_subcommands_and_options(doc: str):
    invocations = cuectl_invocations(DOCS[doc].read_text())
    assert len(invocations) >= 5
    for words in invocations:
        resolved = resolve_command(words)
        assert resolved is not None, f"unknown cuectl sub-command in: cuectl {' '.join(words)}"
        path, options, rest = resolved
        assert not hasattr(_command(path), "commands"), f"`cuectl {' '.join(words)}` stops at a group"
        for w in rest:
            if w == "--":
                break
            if w.startswith("--"):
                assert w.split("=", 1)[0] in options, f"`cuectl {' '.join(path)}` has no option {w}"


def _command(path: list[str]):
    cmd = cli_tree()
    for word in path:
        cmd = cmd.commands[word]
    return cmd


def test_kubernetes_walkthrough_covers_the_way_to_a_gpu_frame():
    text = DOCS["kubernetes"].read_text()
    covered = {tuple(w[:2]) for w in cuectl_invocations(text)}
    for cmd in [("submit",), ("job", "show"), ("frame", "log"), ("gpu", "list"), ("host", "list")]:
        assert any(c[:len(cmd)] == cmd for c in covered), cmd
    submit = [w for w in cuectl_invocations(text) if w[0] == "submit"]
    assert any("--gpu-model" in w and "--gpus" in w for w in submit)
    for needle in ["kubectl apply -k deploy/kubernetes/overlays/nvidia", "nvidia.com/gpu.product",
                   "Node Feature Discovery", "device plugin", "GPU Operator", "SecurityContextConstraints",
                   "hostmount-anyuid", "runtimeClassName", "terminationGracePeriodSeconds",
                   "NVIDIA_VISIBLE_DEVICES", "secretKeyRef", "ReadWriteMany", "kubectl -n cuectl create secret"]:
        assert needle in text, needle


def test_deploy_doc_covers_systemd_and_docker():
    text = DOCS["deploy"].read_text()
    for needle in ["KillMode=mixed", "TimeoutStopSec", "cuectl-worker@.service", "docker build -f deploy/docker/Dockerfile",
                   "--gpus all", "--runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0,1", "--stop-timeout",
                   "/run/cuectl/locks", "PGPASSWORD", "sslmode=verify-full"]:
        assert needle in text, needle


def test_quoted_gpu_pool_matches_the_overlay():
    quoted = [yaml.safe_load(body) for lang, body in code_blocks(DOCS["kubernetes"].read_text())
              if lang == "yaml" and "nvidia.com/gpu.product" in body]
    assert len(quoted) == 1
    real = yaml.safe_load((OVERLAYS["nvidia"] / "gpu-pool.yaml").read_text())
    q, r = quoted[0]["spec"]["template"]["spec"], real["spec"]["template"]["spec"]
    assert q["nodeSelector"] == r["nodeSelector"]
    assert q["affinity"] == r["affinity"]
    assert q["containers"][0]["resources"] == r["containers"][0]["resources"]


def test_quoted_servicemonitor_selects_the_metrics_service():
    (monitor,) = [yaml.safe_load(body) for lang, body in code_blocks(DOCS["kubernetes"].read_text())
                  if lang == "yaml" and "ServiceMonitor" in body]
    service = one(kustomize(OVERLAYS["nvidia"]), "Service", "cuectl-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
