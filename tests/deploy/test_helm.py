"""The Helm chart deploy/helm/cuectl, rendered by a real helm (scripts/get-helm.sh): it lints
strictly, renders objects that Kubernetes' own schemas accept for every documented values
file, refuses bad values with a message at install time, renders the same objects as the
kustomize tree for the same settings, and gives the GPU placement its values promise."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploylib import K8S, REPO, container, env_of, kubectl_or_skip, one, options_used, pod_spec, resolve_command
from helmlib import CHART, EXAMPLES, example_values, helm, render, render_error, template_args
from k8svalidate import Invalid, validate, validate_all

STRIP = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}
EXAMPLE_IDS = [p.name for p in example_values()]


def workers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] in ("DaemonSet", "Deployment")
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "worker"
    }


def worker_container(obj: dict[str, Any]) -> dict[str, Any]:
    return container(pod_spec(obj), "worker")


# -- helm lint, template and the schemas of Kubernetes ------------------------------------------


def test_lint_strict_default_values():
    proc = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("values", example_values(), ids=EXAMPLE_IDS)
def test_lint_strict_and_validate_each_example(values: Path):
    helm("lint", "--strict", str(CHART), "--values", str(values))
    docs = render((values,))
    assert validate_all(docs, values.name) >= 10


def test_default_render_validates_against_kubernetes_schemas():
    docs = render()
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["CronJob", "DaemonSet", "Deployment", "PersistentVolumeClaim", "Service", "ServiceAccount"]
    assert validate_all(docs, "default values") == len(docs)


def test_everything_enabled_validates():
    docs = render(
        (EXAMPLES / "pools.yaml", EXAMPLES / "api-ingress-monitoring.yaml"),
        (
            "openshift.enabled=true",
            "api.ingress.tls.certificate=PEM",
            "api.ingress.tls.key=PEM",
            "logs.persistence.enabled=false",
        ),
    )
    kinds = {d["kind"] for d in docs}
    assert {"Ingress", "Secret", "ServiceMonitor", "PrometheusRule", "SecurityContextConstraints", "Role"} <= kinds
    validate_all(docs, "everything enabled")


def test_a_misspelt_field_in_a_template_fails_validation(tmp_path: Path):
    """The checker reads what it is given: `tolerration` in a copy of the chart is caught."""
    chart = tmp_path / "cuectl"
    shutil.copytree(CHART, chart)
    template = chart / "templates" / "worker.yaml"
    text = template.read_text()
    assert "      tolerations:\n" in text
    template.write_text(text.replace("      tolerations:\n", "      tolerration:\n"))
    out = helm(*template_args(chart=chart)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    with pytest.raises(Invalid, match="tolerration"):
        validate_all(docs, "typo")


def test_a_misspelt_field_in_a_custom_resource_fails_validation():
    docs = render((EXAMPLES / "openshift.yaml",), ("metrics.serviceMonitor.enabled=true",))
    for kind, key in (("SecurityContextConstraints", "allowHostDirVolumePlugn"), ("ServiceMonitor", "endpointz")):
        obj = next(d for d in docs if d["kind"] == kind)
        validate(obj, "1.37")
        target = obj if kind == "SecurityContextConstraints" else obj["spec"]
        target[key] = True
        with pytest.raises(Invalid, match=key):
            validate(obj, "1.37")


# -- values.schema.json and the chart's own checks: refused at install time, with a message ------


@pytest.mark.parametrize(
    "sets, message",
    [
        (("worker.tolerration=x",), "additional properties 'tolerration' not allowed"),
        (("worker.pools[0].name=default", "worker.pools[0].tolerration=x"), "'tolerration' not allowed"),
        (("worker.gpu.migStrategy=mixd",), "/worker/gpu/migStrategy"),
        (("worker.gpu.migStrategy=mixed",), "migProfile"),
        (("worker.gpu.migStrategy=mixed", "worker.gpu.migProfile=big"), "/worker/gpu/migProfile"),
        (("worker.gpu.vendor=intel",), "/worker/gpu/vendor"),
        (("worker.gpu.vendor=amd", "worker.gpu.migStrategy=single"), "/worker/gpu/migStrategy"),
        (("worker.gpu.count=0",), "/worker/gpu/count"),
        (("worker.tolerations[0].effect=NoSchedul",), "/worker/tolerations/0/effect"),
        (("worker.resources.requests.cpu=lots",), "/worker/resources/requests/cpu"),
        (("worker.pools[0].name=A100s",), "/worker/pools/0/name"),
        (("worker.pools[0].name=x", "worker.pools[0].kind=StatefulSet"), "/worker/pools/0/kind"),
        (("worker.runtimeClassName=NVIDIA",), "/worker/runtimeClassName"),
        (("image.pullPolicy=always",), "/image/pullPolicy"),
        (("database.existingSecret=",), "/database/existingSecret"),
        (("api.port=0",), "/api/port"),
        (("opencue.trustNetworks[0]=everyone",), "/opencue/trustNetworks/0"),
        (("metrics.serviceMonitor.interval=often",), "/metrics/serviceMonitor/interval"),
    ],
)
def test_schema_refuses_bad_values(sets: tuple[str, ...], message: str):
    err = render_error(sets=sets)
    assert "values don't meet the specifications of the schema" in err
    assert message in err, err


@pytest.mark.parametrize(
    "values, sets, message",
    [
        (("nvidia.yaml",), ("worker.gpu.count=4",), "nodeSelector nvidia.com/gpu.count is 8 but gpu.count is 4"),
        ((), ("worker.resources.limits.nvidia\\.com/gpu=2",), "the GPU request comes from gpu.count"),
        (
            (),
            ("worker.pools[0].name=mig", "worker.pools[0].gpu.migStrategy=mixed"),
            'pool "mig": gpu.migStrategy mixed needs gpu.migProfile',
        ),
        ((), ("worker.pools[0].name=a", "worker.pools[1].name=a"), 'two pools are named "a"'),
        ((), ("worker.gpu.enabled=false", "worker.gpu.viaRuntime=true"), "gpu.viaRuntime needs gpu.enabled"),
        ((), ("api.ingress.enabled=true",), "api.ingress.host"),
        ((), ("api.ingress.enabled=true", "api.ingress.host=a.example.com"), "api.ingress.tls.secretName"),
        (
            (),
            (
                "api.ingress.enabled=true",
                "api.ingress.host=a.example.com",
                "api.ingress.tls.secretName=t",
                "api.ingress.tls.key=K",
            ),
            "give both certificate and key",
        ),
    ],
)
def test_chart_refuses_inconsistent_values(values: tuple[str, ...], sets: tuple[str, ...], message: str):
    err = render_error(values=tuple(EXAMPLES / v for v in values), sets=sets)
    assert message in err, err
    assert len([ln for ln in err.splitlines() if ln.startswith("Error:")]) == 1


# -- one source of truth: the chart renders what kustomize renders for the same settings --------


def _norm(o: Any) -> Any:
    """Helm's release labels out; env compared by name (kustomize's strategic merge moves a
    patched entry to the front; no variable here refers to another, checked below); an empty
    `limits: {}` left by a kustomize patch is no limit."""
    if isinstance(o, dict):
        out = {k: _norm(v) for k, v in o.items() if k not in STRIP and not (k == "limits" and v == {})}
        if isinstance(out.get("env"), list):
            assert not any("$(" in str(e.get("value", "")) for e in out["env"])
            out["env"] = sorted(out["env"], key=lambda e: e["name"])
        return out
    if isinstance(o, list):
        return [_norm(v) for v in o]
    return o


def _kustomize(
    tmp_path: Path, resource: Path, *, components: tuple[str, ...] = (), image: str | None = None, patches: Any = None
):
    import subprocess

    k: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(resource, tmp_path)],
    }
    if components:
        k["components"] = [os.path.relpath(K8S / "components" / c, tmp_path) for c in components]
    if image:
        name, tag = image.rsplit(":", 1)
        k["images"] = [{"name": "cuectl", "newName": name, "newTag": tag}]
    if patches:
        k["patches"] = patches
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    proc = subprocess.run([kubectl_or_skip(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _docs_api_secret_patch() -> Any:
    text = (REPO / "docs" / "deploy-kubernetes.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", text, re.S | re.M)
    (doc,) = [yaml.safe_load(b) for b in blocks if "cuectl-api-db" in b]
    return doc["patches"]


EQUIVALENT = {
    # kustomize build: (resource under deploy/kubernetes, components, extra kustomize image, chart values, chart --set)
    "base": ("base", (), "cuectl:0.1.0", (), ()),
    "overlays/nvidia": ("overlays/nvidia", (), None, ("nvidia.yaml",), ()),
    "overlays/openshift": ("overlays/openshift", (), None, ("openshift.yaml",), ()),
    "components/nvidia-runtime-class": (
        "base",
        ("nvidia-runtime-class",),
        "cuectl:0.1.0",
        (),
        ("worker.runtimeClassName=nvidia",),
    ),
    "components/gpus-via-runtime": ("base", ("gpus-via-runtime",), "cuectl:0.1.0", (), ("worker.gpu.viaRuntime=true",)),
    "components/node-local-logs": (
        "base",
        ("node-local-logs",),
        "cuectl:0.1.0",
        (),
        ("logs.persistence.enabled=false",),
    ),
    "components/opencue-grpc": ("base", ("opencue-grpc",), "cuectl:0.1.0", (), ("opencue.enabled=true",)),
    "docs: the API's own Secret": (
        "overlays/nvidia",
        (),
        None,
        ("nvidia.yaml",),
        ("api.existingSecret=cuectl-api-db",),
    ),
}


@pytest.mark.parametrize("build", sorted(EQUIVALENT))
def test_chart_renders_what_kustomize_renders(build: str, tmp_path: Path):
    resource, components, image, values, sets = EQUIVALENT[build]
    patches = _docs_api_secret_patch() if build.startswith("docs:") else None
    kust = _kustomize(tmp_path, K8S / resource, components=components, image=image, patches=patches)
    chart = render(tuple(EXAMPLES / v for v in values), sets)

    def by_key(docs):
        return {(d["kind"], d["metadata"]["name"]): _norm(d) for d in docs}

    # The chart does not create its namespace (helm install --create-namespace does; the
    # docs label it for hostPath volumes), kustomize does.
    k = by_key([d for d in kust if d["kind"] != "Namespace"])
    c = by_key(chart)
    assert sorted(k) == sorted(c)
    for key in k:
        assert k[key] == c[key], f"{build}: {key} differs"


def test_chart_pool_renders_what_the_kustomize_pool_example_renders(tmp_path: Path):
    kust = _kustomize(tmp_path, K8S / "examples" / "pool-l40s")
    (ds,) = kust
    chart = workers(render((EXAMPLES / "pools.yaml",)))
    assert _norm(chart[ds["metadata"]["name"]]) == _norm(ds)


def test_namespace_the_docs_label_is_the_kustomize_one():
    (ns,) = [d for d in yaml.safe_load_all((K8S / "base" / "namespace.yaml").read_text()) if d]
    text = (REPO / "docs" / "deploy-kubernetes.md").read_text()
    for key, value in ns["metadata"]["labels"].items():
        assert f"kubectl label namespace cuectl {key}={value}" in text


# -- what the values promise ---------------------------------------------------------------------


def test_worker_tolerates_the_gpu_taint_and_keeps_the_lease_setup():
    for docs in (render(), render((EXAMPLES / "pools.yaml",))):
        for name, obj in workers(docs).items():
            spec = pod_spec(obj)
            worker = worker_container(obj)
            env = env_of(worker)
            # The lock directory belongs to the worker's uid 10001, which every cuectl trusts.
            assert env["CUECTL_SERVICE_USER"]["value"] == "10001", name
            assert worker["securityContext"]["runAsUser"] == 10001
            init = container(spec, "prepare-host-dirs", init=True)
            assert "uid=10001" in init["args"][0] and "chmod 1777" in init["args"][0]
            if name != "cuectl-worker-cpu":
                assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


@pytest.mark.parametrize(
    "sets, resource",
    [
        ((), "nvidia.com/gpu"),
        (("worker.gpu.migStrategy=single",), "nvidia.com/gpu"),
        (("worker.gpu.migStrategy=mixed", "worker.gpu.migProfile=1g.10gb"), "nvidia.com/mig-1g.10gb"),
        (("worker.gpu.migStrategy=mixed", "worker.gpu.migProfile=3g.40gb"), "nvidia.com/mig-3g.40gb"),
        (("worker.gpu.vendor=amd",), "amd.com/gpu"),
    ],
)
def test_gpu_request_follows_the_device_plugins_resource_names(sets: tuple[str, ...], resource: str):
    (obj,) = workers(render((), ("worker.gpu.count=2", *sets))).values()
    worker = worker_container(obj)
    gpu_limits = {k: v for k, v in worker["resources"]["limits"].items() if k.endswith("/gpu") or "/mig-" in k}
    assert gpu_limits == {resource: 2}
    env = env_of(worker)
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin decides what the pod sees
    assert ("NVIDIA_DRIVER_CAPABILITIES" in env) == resource.startswith("nvidia.com/")


def test_gpu_disabled_gives_a_cpu_only_pool_with_gpus_hidden():
    (obj,) = workers(render((), ("worker.gpu.enabled=false",))).values()
    worker = worker_container(obj)
    assert not any("/gpu" in k or "/mig-" in k for k in worker["resources"].get("limits", {}))
    env = env_of(worker)
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert "NVIDIA_DRIVER_CAPABILITIES" not in env


def test_pools_are_each_their_own_daemonset_or_deployment():
    found = workers(render((EXAMPLES / "pools.yaml",)))
    assert {n: d["kind"] for n, d in found.items()} == {
        "cuectl-worker": "DaemonSet",
        "cuectl-worker-l40s": "DaemonSet",
        "cuectl-worker-h100-mig": "DaemonSet",
        "cuectl-worker-cpu": "Deployment",
    }
    selectors = [tuple(sorted(d["spec"]["selector"]["matchLabels"].items())) for d in found.values()]
    assert len(set(selectors)) == len(selectors)  # no pool's pods are another pool's
    for obj in found.values():
        assert obj["spec"]["selector"]["matchLabels"].items() <= obj["spec"]["template"]["metadata"]["labels"].items()
    mig = worker_container(found["cuectl-worker-h100-mig"])
    assert mig["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": 7}
    l40s = pod_spec(found["cuectl-worker-l40s"])
    assert l40s["nodeSelector"] == {
        "nvidia.com/gpu.present": "true",  # inherited from worker.nodeSelector
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.product": "NVIDIA-L40S",
    }
    cpu = found["cuectl-worker-cpu"]
    assert cpu["spec"]["replicas"] == 2
    cspec = pod_spec(cpu)
    assert "nodeSelector" not in cspec and "tolerations" not in cspec  # null removed the inherited key
    cw = worker_container(cpu)
    assert cw["args"][:3] == ["worker", "--name", "$(POD_NAME)"]
    assert env_of(cw)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert '"$POD_NAME"' in cw["livenessProbe"]["exec"]["command"][-1]
    for obj in found.values():
        args = worker_container(obj)["args"]
        resolved = resolve_command(args)
        assert resolved is not None and resolved[0] == ["worker"]
        for opt in options_used(args):
            assert opt in resolved[1], f"`cuectl worker` has no option {opt}"


def test_placement_values_pass_through():
    aff = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]}
                ]
            }
        }
    }
    sets = (
        "worker.runtimeClassName=nvidia",
        "worker.nodeSelector.pool=render",
        "worker.tolerations[0].key=dedicated",
        "worker.tolerations[0].operator=Equal",
        "worker.tolerations[0].value=render",
        "worker.tolerations[0].effect=NoExecute",
        "worker.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=nvidia.com/gpu.product",
        "worker.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=In",
        "worker.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]=NVIDIA-L4",
    )
    (obj,) = workers(render((), sets)).values()
    spec = pod_spec(obj)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "render"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "render", "effect": "NoExecute"}]
    assert spec["affinity"] == aff


def test_ingress_terminates_tls_for_the_api_service():
    docs = render(
        (EXAMPLES / "api-ingress-monitoring.yaml",), ("api.ingress.tls.certificate=CERT", "api.ingress.tls.key=KEY")
    )
    ingress = one(docs, "Ingress")
    service = one(docs, "Service", "cuectl-api")
    assert ingress["spec"]["tls"] == [{"hosts": ["gpu-farm.example.com"], "secretName": "gpu-farm-tls"}]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": "http"}}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    secret = one(docs, "Secret", "gpu-farm-tls")
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"tls.crt", "tls.key"}
    # Without a certificate the Secret is someone else's (cert-manager): not rendered.
    assert not [d for d in render((EXAMPLES / "api-ingress-monitoring.yaml",)) if d["kind"] == "Secret"]


def test_monitoring_objects_carry_the_documented_alerts():
    alerts = yaml.safe_load((REPO / "examples" / "prometheus-alerts.yaml").read_text())
    assert (CHART / "files" / "prometheus-alerts.yaml").read_text() == (
        REPO / "examples" / "prometheus-alerts.yaml"
    ).read_text()
    docs = render((EXAMPLES / "api-ingress-monitoring.yaml",))
    rule = one(docs, "PrometheusRule")
    groups = {g["name"]: g for g in rule["spec"]["groups"]}
    assert groups["cuectl"] == alerts["groups"][0]
    (stale,) = groups["cuectl-report"]["rules"]
    assert stale["expr"] == "time() - cuectl_generated_timestamp_seconds > 900"  # docs/deploy-kubernetes.md
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        selected = [
            s
            for s in services.values()
            if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert [s["metadata"]["name"] for s in selected] == [monitor["metadata"]["name"]]
        ports = {p["name"] for p in selected[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    api = one(docs, "ServiceMonitor", "cuectl-api")
    assert api["spec"]["endpoints"][0]["authorization"]["credentials"] == {"name": "cuectl-api-token", "key": "token"}
    assert not [d for d in render() if d["kind"] in ("ServiceMonitor", "PrometheusRule")]  # off by default


def test_notes_say_how_to_submit_a_first_gpu_job():
    proc = helm(
        "install",
        "cuectl",
        str(CHART),
        "--namespace",
        "cuectl",
        "--dry-run=client",
        "--values",
        str(EXAMPLES / "nvidia.yaml"),
    )
    notes = proc.stdout[proc.stdout.index("NOTES:") :]
    (submit,) = [ln.strip() for ln in notes.splitlines() if "cuectl submit" in ln]
    words = submit[submit.index("cuectl submit") :].split()[1:]
    resolved = resolve_command(words)
    assert resolved is not None and resolved[0] == ["submit"]
    for opt in options_used(words):
        assert opt in resolved[1], opt
    assert "--gpus 1" in submit
    assert "kubectl -n cuectl exec ds/cuectl-worker" in notes
    assert "WARNING: image.repository" not in notes  # a registry was named
    assert (
        "WARNING: image.repository" in helm("install", "cuectl", str(CHART), "-n", "cuectl", "--dry-run=client").stdout
    )


def test_chart_version_and_kube_version():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["kubeVersion"] == ">=1.27.0-0"
    proc = helm(*template_args(), "--kube-version", "1.26.0", check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr
