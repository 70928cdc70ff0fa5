"""Helpers for the deployment tests: render kustomizations with the real `kubectl
kustomize`, look objects up, and read the CLI's own option lists so that manifests, unit
files and docs can only use options that `cuectl` really has.

Imported by the tests through sys.path (tests/deploy/conftest.py adds this directory;
pytest runs with --import-mode=importlib)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "kubernetes"

BASE = K8S / "base"
OVERLAYS = {"nvidia": K8S / "overlays" / "nvidia", "openshift": K8S / "overlays" / "openshift"}
BUILDS = {"base": BASE, **OVERLAYS}
COMPONENTS = K8S / "components"

_cache: dict[str, list[dict[str, Any]]] = {}


def kubectl_or_skip() -> str:
    path = shutil.which("kubectl")
    if not path:
        pytest.skip("kubectl is not installed: cannot render the kustomizations (kubectl kustomize)")
    return path


def kustomize(directory: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize DIR`, parsed; cached per directory for the session."""
    key = str(directory.resolve())
    if key not in _cache:
        kubectl = kubectl_or_skip()
        proc = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"kubectl kustomize {directory} failed:\n{proc.stderr}"
        _cache[key] = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return _cache[key]


def kustomize_with(tmp_path: Path, *, resources: list[Path], components: list[Path] = ()) -> list[dict[str, Any]]:
    """Render a throw-away kustomization in tmp_path that combines resources and components
    of the repository (kustomize wants relative paths)."""

    def rel(p: Path) -> str:
        return os.path.relpath(p, tmp_path)

    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [rel(p) for p in resources],
    }
    if components:
        doc["components"] = [rel(p) for p in components]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(doc))
    kubectl = kubectl_or_skip()
    proc = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in objects(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["labels"]
    return obj["spec"]["template"]["metadata"]["labels"]


def container(spec: dict[str, Any], name: str, *, init: bool = False) -> dict[str, Any]:
    items = spec.get("initContainers" if init else "containers", [])
    found = [c for c in items if c["name"] == name]
    assert len(found) == 1, f"container {name} not found in {[c['name'] for c in items]}"
    return found[0]


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in c.get("env", []):
        assert item["name"] not in out, f"env {item['name']} set twice in {c['name']}"
        out[item["name"]] = item
    return out


def volume_for_mount(spec: dict[str, Any], c: dict[str, Any], mount_path: str) -> dict[str, Any]:
    mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == mount_path]
    assert len(mounts) == 1, f"{c['name']}: nothing (or several things) mounted at {mount_path}"
    vols = [v for v in spec.get("volumes", []) if v["name"] == mounts[0]["name"]]
    assert len(vols) == 1, f"volume {mounts[0]['name']} is not declared"
    return vols[0]


def all_pod_objects(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for d in docs:
        if d.get("kind") in ("DaemonSet", "Deployment", "StatefulSet", "CronJob", "Job"):
            yield d


# -- the CLI, for checking options ------------------------------------------------------------


def cli_tree() -> Any:
    import typer

    from cuectl.cli.main import app

    return typer.main.get_command(app)


def resolve_command(words: list[str]) -> tuple[list[str], set[str], list[str]] | None:
    """Walk `cuectl WORDS...`: the sub-command path, the options valid along it (global
    ones included), and the words left after the sub-commands. None if a sub-command word
    is unknown (a command not registered yet)."""
    cmd = cli_tree()
    path: list[str] = []
    options: set[str] = set()
    rest = list(words)

    def opts_of(c: Any) -> set[str]:
        return {o for p in c.params for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}

    options |= opts_of(cmd)
    while rest and getattr(cmd, "commands", None) is not None:
        word = rest[0]
        if word.startswith("-"):
            rest.pop(0)  # a global option (its value, if any, is skipped below)
            if word in ("--db",) and rest:
                rest.pop(0)
            continue
        if word not in cmd.commands:
            return None
        cmd = cmd.commands[word]
        path.append(word)
        options |= opts_of(cmd)
        rest.pop(0)
    return path, options, rest


def options_used(args: list[str]) -> list[str]:
    """The --options in an argument list, up to a bare `--` (the frame command after it)."""
    used = []
    for a in args:
        if a == "--":
            break
        if a.startswith("-") and not a.startswith("$"):
            used.append(a.split("=", 1)[0])
    return used
