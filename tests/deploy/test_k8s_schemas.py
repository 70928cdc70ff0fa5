"""Every Kubernetes object this repository ships or shows, validated strictly against the
schemas of the oldest and the newest Kubernetes the docs claim (tests/deploy/k8svalidate.py):
each kustomization as `kubectl kustomize` renders it, each component on the base, the
example manifests under deploy/, and every manifest quoted in docs/. (The chart's renders are
validated in test_helm.py.) A misspelt field in a copy of any of them is caught."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploylib import K8S, REPO, kustomize, kustomize_with
from k8svalidate import NEWEST, OLDEST, Invalid, validate, validate_all

KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
BUILDS = [
    p for p in KUSTOMIZATIONS if yaml.safe_load((p / "kustomization.yaml").read_text())["kind"] == "Kustomization"
]
COMPONENTS = [p for p in KUSTOMIZATIONS if p not in BUILDS]
# Standalone manifests: YAML files under deploy/ that no kustomization lists (patches are
# checked through the builds that apply them).
_LISTED = {
    (k / r).resolve()
    for k in KUSTOMIZATIONS
    for key in ("resources", "patches")
    for r in [
        x if isinstance(x, str) else x.get("path", "")
        for x in (yaml.safe_load((k / "kustomization.yaml").read_text()).get(key) or [])
    ]
    if r
}
MANIFESTS = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml" and p.resolve() not in _LISTED)
DOCS = sorted((REPO / "docs").glob("*.md"))


def rel(p: Path) -> str:
    return str(p.relative_to(REPO))


def doc_manifests(path: Path) -> list[dict[str, Any]]:
    """The YAML blocks of a doc that are whole Kubernetes objects (apiVersion and kind)."""
    out = []
    for body in re.findall(r"^```ya?ml\n(.*?)^```", path.read_text(), re.S | re.M):
        for d in yaml.safe_load_all(body):
            if (
                isinstance(d, dict)
                and "apiVersion" in d
                and "kind" in d
                and not d["apiVersion"].startswith("kustomize.")
            ):
                out.append(d)
    return out


def test_versions_are_bundled():
    from kubernetes_validate.utils import all_versions, major_minor

    bundled = {major_minor(v) for v in all_versions()}
    assert {OLDEST, NEWEST} <= bundled
    text = (REPO / "docs" / "deploy-kubernetes.md").read_text()
    assert f"Kubernetes {OLDEST}" in text and f"{NEWEST}" in text


@pytest.mark.parametrize("build", BUILDS, ids=rel)
def test_every_kustomization_validates(build: Path):
    assert validate_all(kustomize(build), rel(build)) >= 1


@pytest.mark.parametrize("component", COMPONENTS, ids=rel)
def test_every_component_on_the_base_validates(component: Path, tmp_path: Path):
    docs = kustomize_with(tmp_path, resources=[K8S / "base"], components=[component])
    validate_all(docs, f"base + {rel(component)}")


@pytest.mark.parametrize("manifest", MANIFESTS, ids=rel)
def test_every_example_manifest_validates(manifest: Path):
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    assert docs
    validate_all(docs, rel(manifest))


def test_every_manifest_in_the_docs_validates():
    found = {rel(p): doc_manifests(p) for p in DOCS}
    assert sum(len(v) for v in found.values()) >= 3  # the Ingress and two ServiceMonitors at least
    for where, docs in found.items():
        validate_all(docs, where)


def test_a_misspelt_field_in_a_kustomization_copy_fails(tmp_path: Path):
    tree = tmp_path / "kubernetes"
    shutil.copytree(K8S, tree)
    ds = tree / "base" / "worker" / "daemonset.yaml"
    text = ds.read_text()
    assert "      tolerations:\n" in text
    ds.write_text(text.replace("      tolerations:\n", "      tolerration:\n"))
    docs = kustomize(tree / "overlays" / "nvidia")
    with pytest.raises(Invalid, match="tolerration"):
        validate_all(docs, "typo")
    # and in the OpenShift SCC, which only its CRD's schema knows
    scc = tree / "overlays" / "openshift" / "scc.yaml"
    scc.write_text(scc.read_text().replace("allowHostDirVolumePlugin:", "allowHostDirVolumePlugn:"))
    with pytest.raises(Invalid, match="allowHostDirVolumePlugn"):
        validate_all(
            [d for d in kustomize(tree / "overlays" / "openshift") if d["kind"] == "SecurityContextConstraints"], "typo"
        )


def test_a_misspelt_field_in_a_doc_manifest_fails(tmp_path: Path):
    doc = tmp_path / "doc.md"
    text = (REPO / "docs" / "deploy-kubernetes.md").read_text()
    assert "  ingressClassName: nginx\n" in text
    doc.write_text(text.replace("  ingressClassName: nginx\n", "  ingresClassName: nginx\n"))
    with pytest.raises(Invalid, match="ingresClassName"):
        validate_all(doc_manifests(doc), "typo")


def test_a_wrong_type_fails():
    docs = kustomize(K8S / "base")
    ds = copy.deepcopy(next(d for d in docs if d["kind"] == "DaemonSet"))  # the render is cached
    ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "an hour"
    with pytest.raises(Invalid, match="terminationGracePeriodSeconds"):
        validate(ds, OLDEST)
