"""The kustomize base and overlays, rendered by the real `kubectl kustomize` and checked
object by object: what a cluster would be given."""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

import pytest
from deploylib import (
    BASE,
    BUILDS,
    COMPONENTS,
    K8S,
    OVERLAYS,
    REPO,
    all_pod_objects,
    container,
    env_of,
    kustomize,
    kustomize_with,
    objects,
    one,
    options_used,
    pod_labels,
    pod_spec,
    resolve_command,
    volume_for_mount,
)

WORKER_UID = 10001
SECRET = "cuectl-db"
NAMESPACE = "cuectl"
API_TOKEN_SECRET = "cuectl-api-token"
API_PORT = 8448


@pytest.fixture(params=sorted(BUILDS), ids=sorted(BUILDS))
def build(request) -> tuple[str, list[dict[str, Any]]]:
    return request.param, kustomize(BUILDS[request.param])


def worker_ds(docs):
    return one(docs, "DaemonSet", "cuectl-worker")


def worker_parts(docs):
    ds = worker_ds(docs)
    spec = pod_spec(ds)
    return ds, spec, container(spec, "worker")


def api_parts(docs):
    deploy = one(docs, "Deployment", "cuectl-api")
    spec = pod_spec(deploy)
    return deploy, spec, container(spec, "api")


# -- every build ------------------------------------------------------------------------------


def test_renders_the_expected_objects(build):
    name, docs = build
    kinds = sorted(d["kind"] for d in docs)
    for kind, count in {
        "Namespace": 1,
        "ServiceAccount": 4,
        "DaemonSet": 1,
        "CronJob": 1,
        "Deployment": 2,
        "Service": 2,
        "PersistentVolumeClaim": 2,
    }.items():
        assert kinds.count(kind) == count, f"{name}: {kind} x{kinds.count(kind)}"
    # The database Secret and the API token are referenced, never shipped (no secret in git).
    assert not objects(docs, "Secret")
    if name == "openshift":
        assert {"SecurityContextConstraints", "Role", "RoleBinding"} <= set(kinds)
    else:
        assert not {"SecurityContextConstraints", "Role", "RoleBinding", "ClusterRole"} & set(kinds)


def test_everything_lives_in_the_cuectl_namespace(build):
    _, docs = build
    assert one(docs, "Namespace")["metadata"]["name"] == NAMESPACE
    for d in docs:
        if d["kind"] in ("Namespace", "SecurityContextConstraints"):
            assert "namespace" not in d["metadata"], f"{d['kind']} is cluster-scoped"
        else:
            assert d["metadata"].get("namespace") == NAMESPACE, f"{d['kind']} {d['metadata']['name']}"
        assert d["metadata"]["labels"].get("app.kubernetes.io/part-of") == "cuectl"


def test_namespace_admits_hostpath_volumes(build):
    _, docs = build
    labels = one(docs, "Namespace")["metadata"]["labels"]
    # baseline and restricted Pod Security forbid hostPath; the worker needs two.
    assert labels["pod-security.kubernetes.io/enforce"] == "privileged"


def test_selectors_match_their_pod_labels(build):
    _, docs = build
    for obj in objects(docs, "DaemonSet") + objects(docs, "Deployment"):
        selector = obj["spec"]["selector"]["matchLabels"]
        labels = pod_labels(obj)
        assert selector.items() <= labels.items(), obj["metadata"]["name"]
    exporter = one(docs, "Deployment", "cuectl-metrics")
    service = one(docs, "Service", "cuectl-metrics")
    assert service["spec"]["selector"].items() <= pod_labels(exporter).items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {
        p["name"] for p in container(pod_spec(exporter), "node-exporter")["ports"]
    }
    api, api_spec, api_container = api_parts(docs)
    api_service = one(docs, "Service", "cuectl-api")
    assert api_service["spec"]["selector"].items() <= pod_labels(api).items()
    assert {p["targetPort"] for p in api_service["spec"]["ports"]} <= {p["name"] for p in api_container["ports"]}
    # No other pod is picked up by the exporter's selector, the API's or the worker's.
    for obj in all_pod_objects(docs):
        if obj is not exporter:
            assert not service["spec"]["selector"].items() <= pod_labels(obj).items()
        if obj is not api:
            assert not api_service["spec"]["selector"].items() <= pod_labels(obj).items()
        if obj["kind"] != "DaemonSet":
            assert not worker_ds(docs)["spec"]["selector"]["matchLabels"].items() <= pod_labels(obj).items()


def test_volume_mounts_and_claims_resolve(build):
    _, docs = build
    claims = {d["metadata"]["name"]: d for d in objects(docs, "PersistentVolumeClaim")}
    for obj in all_pod_objects(docs):
        spec = pod_spec(obj)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            for m in c.get("volumeMounts", []):
                assert m["name"] in volumes, f"{obj['metadata']['name']}/{c['name']}: no volume {m['name']}"
        for v in volumes.values():
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims
        used = {
            m["name"] for c in spec.get("initContainers", []) + spec["containers"] for m in c.get("volumeMounts", [])
        }
        assert set(volumes) == used, f"{obj['metadata']['name']}: unused volumes {set(volumes) - used}"


def test_no_privileged_containers_and_no_api_tokens(build):
    _, docs = build
    for obj in all_pod_objects(docs):
        spec = pod_spec(obj)
        assert spec["automountServiceAccountToken"] is False
        sa = spec["serviceAccountName"]
        assert one(docs, "ServiceAccount", sa)["automountServiceAccountToken"] is False
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c["securityContext"]
            assert not sc.get("privileged", False)
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")


# -- the worker DaemonSet ---------------------------------------------------------------------


def test_worker_runs_on_gpu_nodes_only(build):
    _, docs = build
    _, spec, _ = worker_parts(docs)
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_worker_asks_the_device_plugin_for_the_nodes_gpus(build):
    name, docs = build
    _, spec, worker = worker_parts(docs)
    gpus = worker["resources"]["limits"]["nvidia.com/gpu"]
    assert isinstance(gpus, int) and gpus >= 1
    count = spec["nodeSelector"].get("nvidia.com/gpu.count")
    if count is not None:  # a pool: the pod takes every GPU of its nodes
        assert int(count) == gpus
    assert gpus == {"base": 1, "nvidia": 8, "openshift": 1}[name]
    # Which devices the pod sees is the device plugin's business, not an env var's.
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(worker)
    assert set(env_of(worker)["NVIDIA_DRIVER_CAPABILITIES"]["value"].split(",")) >= {"compute", "utility"}


def test_worker_env_comes_from_the_secret_and_the_downward_api(build):
    _, docs = build
    _, _, worker = worker_parts(docs)
    env = env_of(worker)
    assert env["CUECTL_DB"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "url"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "password", "optional": True}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    for item in env.values():
        assert "value" in item or "valueFrom" in item
        assert "postgresql://" not in str(item.get("value", "")), "the store URL belongs in the Secret"


def test_worker_args_register_the_node_name(build):
    _, docs = build
    _, _, worker = worker_parts(docs)
    args = worker["args"]
    assert "command" not in worker, "keep the image's ENTRYPOINT (tini -- cuectl)"
    assert args[0] == "worker"
    assert args[args.index("--name") + 1] == "$(NODE_NAME)"
    # $(NODE_NAME) is only expanded when NODE_NAME is defined in the container's env.
    assert "NODE_NAME" in env_of(worker)
    resolved = resolve_command(args)
    assert resolved is not None and resolved[0] == ["worker"]
    for opt in options_used(args):
        assert opt in resolved[1], f"`cuectl worker` has no option {opt}"


def test_worker_lock_dir_is_a_node_local_hostpath(build):
    _, docs = build
    _, spec, worker = worker_parts(docs)
    lock_dir = env_of(worker)["CUECTL_LOCK_DIR"]["value"]
    vol = volume_for_mount(spec, worker, lock_dir)
    assert vol["hostPath"] == {"path": "/run/cuectl/locks", "type": "DirectoryOrCreate"}
    assert "--lock-dir" not in worker["args"], "one place sets the lock dir: CUECTL_LOCK_DIR"


def test_worker_state_survives_container_restarts(build):
    _, docs = build
    _, spec, worker = worker_parts(docs)
    state = env_of(worker)["XDG_STATE_HOME"]["value"]
    vol = volume_for_mount(spec, worker, state)
    assert vol["hostPath"]["type"] == "DirectoryOrCreate"
    assert vol["hostPath"]["path"] == "/var/lib/cuectl"


def test_worker_logs_go_to_a_shared_volume(build):
    _, docs = build
    _, spec, worker = worker_parts(docs)
    logs = env_of(worker)["CUECTL_LOG_DIR"]["value"]
    vol = volume_for_mount(spec, worker, logs)
    pvc = one(docs, "PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_worker_gets_time_to_drain(build):
    _, docs = build
    ds, spec, _ = worker_parts(docs)
    assert spec["terminationGracePeriodSeconds"] == 3600
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"


def test_worker_runs_as_the_image_user_and_its_init_prepares_the_host_dirs(build):
    _, docs = build
    _, spec, worker = worker_parts(docs)
    sc = worker["securityContext"]
    assert sc["runAsUser"] == WORKER_UID and sc["runAsNonRoot"] is True
    assert spec["securityContext"]["fsGroup"] == WORKER_UID
    init = container(spec, "prepare-host-dirs", init=True)
    assert init["image"] == worker["image"]
    assert init["securityContext"]["runAsUser"] == 0
    assert sorted(init["securityContext"]["capabilities"]["add"]) == ["CHOWN", "FOWNER"]
    script = init["args"][0]
    assert f"uid={WORKER_UID}" in script
    for path in ("/run/cuectl/locks", "/var/lib/cuectl"):
        assert path in script
        assert volume_for_mount(spec, init, path)["hostPath"]["path"] == path


def test_worker_has_a_big_dev_shm(build):
    _, docs = build
    _, spec, worker = worker_parts(docs)
    vol = volume_for_mount(spec, worker, "/dev/shm")
    assert vol["emptyDir"]["medium"] == "Memory"


def test_images(build):
    name, docs = build
    images = {
        c["image"]
        for obj in all_pod_objects(docs)
        for c in pod_spec(obj).get("initContainers", []) + pod_spec(obj)["containers"]
    }
    exporter = {i for i in images if "node-exporter" in i}
    assert len(exporter) == 1 and not next(iter(exporter)).endswith(":latest")
    cuectl = images - exporter
    assert len(cuectl) == 1, cuectl  # worker, init and report: one image
    image = next(iter(cuectl))
    if name == "base":
        assert image == "cuectl"  # the overlays name the registry
    else:
        repo, _, tag = image.rpartition(":")
        assert "/" in repo and tag and tag != "latest"


# -- the REST API (cuectl serve) ------------------------------------------------------------


def test_api_serves_on_all_pod_interfaces_with_real_serve_options(build):
    _, docs = build
    _, _, api = api_parts(docs)
    args = api["args"]
    assert "command" not in api, "keep the image's ENTRYPOINT (tini -- cuectl)"
    assert args[0] == "serve"
    assert args[args.index("--host") + 1] == "0.0.0.0"  # the default 127.0.0.1 is unreachable in a pod
    assert int(args[args.index("--port") + 1]) == API_PORT
    assert "--allow-anonymous-read" not in args  # /metrics and reads need a token
    resolved = resolve_command(args)
    assert resolved is not None and resolved[0] == ["serve"]
    for opt in options_used(args):
        assert opt in resolved[1], f"`cuectl serve` has no option {opt}"
    (port,) = api["ports"]
    assert port["containerPort"] == API_PORT and port["name"] == "http"


def test_api_probes_use_the_health_endpoints(build):
    _, docs = build
    _, _, api = api_parts(docs)
    ready, live = api["readinessProbe"]["httpGet"], api["livenessProbe"]["httpGet"]
    assert ready["path"] == "/readyz" and live["path"] == "/healthz"
    assert ready["port"] == live["port"] == "http"
    # A database outage makes /readyz fail; it must not get the server restarted.
    assert api["livenessProbe"]["failureThreshold"] * api["livenessProbe"]["periodSeconds"] >= 60


def test_api_store_comes_from_the_same_secret_as_the_workers(build):
    _, docs = build
    _, _, api = api_parts(docs)
    env = env_of(api)
    assert env["CUECTL_DB"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "url"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "password", "optional": True}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"  # no GPU for the API
    assert "nvidia.com/gpu" not in api["resources"].get("limits", {})
    for item in env.values():
        assert "postgresql://" not in str(item.get("value", "")), "the store URL belongs in the Secret"
    # The docs' patch that points the API at a Secret of its own replaces env/0 and env/1.
    assert [e["name"] for e in api["env"][:2]] == ["CUECTL_DB", "PGPASSWORD"]


def test_api_reads_the_workers_logs_read_only(build):
    _, docs = build
    _, spec, api = api_parts(docs)
    _, wspec, worker = worker_parts(docs)
    logs = env_of(api)["CUECTL_LOG_DIR"]["value"]
    assert logs == env_of(worker)["CUECTL_LOG_DIR"]["value"]  # the paths the store records
    vol = volume_for_mount(spec, api, logs)
    assert (
        vol["persistentVolumeClaim"]["claimName"]
        == volume_for_mount(wspec, worker, logs)["persistentVolumeClaim"]["claimName"]
    )
    assert vol["persistentVolumeClaim"]["readOnly"] is True
    assert [m for m in api["volumeMounts"] if m["mountPath"] == logs][0]["readOnly"] is True
    # Logs are 0640 and group 10001 (the worker's): the API reads them as a member.
    assert WORKER_UID in spec["securityContext"]["supplementalGroups"]


def test_api_runs_unprivileged_without_gpus_or_host_paths(build):
    name, docs = build
    _, spec, api = api_parts(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    if name != "openshift":
        assert spec["securityContext"]["runAsUser"] == WORKER_UID
    assert api["securityContext"]["readOnlyRootFilesystem"] is True
    assert not any("hostPath" in v for v in spec["volumes"])
    assert "tolerations" not in spec and "nvidia.com/gpu.present" not in spec.get("nodeSelector", {})
    assert spec["serviceAccountName"] == "cuectl-api"


def test_api_service_is_internal_and_not_annotated_for_anonymous_scrapes(build):
    _, docs = build
    service = one(docs, "Service", "cuectl-api")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert port["port"] == API_PORT and port["name"] == "http" and port["targetPort"] == "http"
    # /metrics needs a token: an annotation-discovered scrape would send none.
    assert "prometheus.io/scrape" not in service["metadata"].get("annotations", {})


# -- the report CronJob and its exporter ------------------------------------------------------


def test_report_cronjob_writes_prometheus_text_every_five_minutes(build):
    _, docs = build
    cron = one(docs, "CronJob", "cuectl-report")
    assert cron["spec"]["schedule"] == "*/5 * * * *"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    spec = pod_spec(cron)
    report = container(spec, "report")
    args = report["args"]
    assert args[:2] == ["admin", "report"]
    assert args[args.index("--format") + 1] == "prometheus"
    assert args[args.index("--by") + 1] == "user"
    output = args[args.index("--output") + 1]
    assert output.endswith(".prom")
    env = env_of(report)
    assert env["CUECTL_DB"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "url"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == SECRET
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"  # no GPU for a report
    assert "nvidia.com/gpu" not in report["resources"].get("limits", {})
    # The output directory is the exporter's textfile directory, on the same volume.
    out_vol = volume_for_mount(spec, report, posixpath.dirname(output))
    exporter = one(docs, "Deployment", "cuectl-metrics")
    ex_spec = pod_spec(exporter)
    node_exporter = container(ex_spec, "node-exporter")
    textdir = [a.split("=", 1)[1] for a in node_exporter["args"] if a.startswith("--collector.textfile.directory=")]
    assert textdir == [posixpath.dirname(output)]
    ex_vol = volume_for_mount(ex_spec, node_exporter, textdir[0])
    claim = out_vol["persistentVolumeClaim"]["claimName"]
    assert claim == ex_vol["persistentVolumeClaim"]["claimName"]
    # ReadWriteOnce is fine because the report runs on the exporter's node.
    if one(docs, "PersistentVolumeClaim", claim)["spec"]["accessModes"] == ["ReadWriteOnce"]:
        term = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= pod_labels(exporter).items()
        assert exporter["spec"]["strategy"]["type"] == "Recreate"


def test_report_args_are_options_of_admin_report(build):
    _, docs = build
    args = container(pod_spec(one(docs, "CronJob", "cuectl-report")), "report")["args"]
    resolved = resolve_command(args)
    if resolved is None:
        pytest.skip("`cuectl admin report` is not registered in this checkout")
    assert resolved[0] == ["admin", "report"]
    for opt in options_used(args):
        assert opt in resolved[1], f"`cuectl admin report` has no option {opt}"


def test_exporter_runs_only_the_textfile_collector(build):
    _, docs = build
    args = container(pod_spec(one(docs, "Deployment", "cuectl-metrics")), "node-exporter")["args"]
    assert "--collector.disable-defaults" in args and "--collector.textfile" in args


# -- overlay specifics ------------------------------------------------------------------------


def test_nvidia_overlay_picks_gpu_models_by_gfd_product_label():
    docs = kustomize(OVERLAYS["nvidia"])
    _, spec, _ = worker_parts(docs)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert len(terms) == 1
    (expr,) = [e for e in terms[0]["matchExpressions"] if e["key"] == "nvidia.com/gpu.product"]
    assert expr["operator"] == "In" and expr["values"]
    for product in expr["values"]:
        assert " " not in product, "GPU Feature Discovery writes spaces as dashes"
    # The base's selection is kept, not replaced.
    assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"


def test_openshift_overlay_grants_its_own_scc_to_the_worker_only():
    docs = kustomize(OVERLAYS["openshift"])
    scc = one(docs, "SecurityContextConstraints")
    name = scc["metadata"]["name"]
    assert scc["apiVersion"] == "security.openshift.io/v1"
    assert scc["allowHostDirVolumePlugin"] is True
    assert scc["allowPrivilegedContainer"] is False
    assert scc["allowPrivilegeEscalation"] is False
    assert not (scc["allowHostNetwork"] or scc["allowHostPID"] or scc["allowHostIPC"] or scc["allowHostPorts"])
    assert scc["users"] == [] and scc["groups"] == []  # granted through RBAC only

    role = one(docs, "Role")
    assert role["rules"] == [
        {
            "apiGroups": ["security.openshift.io"],
            "resources": ["securitycontextconstraints"],
            "resourceNames": [name],
            "verbs": ["use"],
        }
    ]
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    ds, spec, worker = worker_parts(docs)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
    ]
    others = {pod_spec(o)["serviceAccountName"] for o in all_pod_objects(docs) if o is not ds}
    assert spec["serviceAccountName"] not in others


def test_openshift_scc_admits_the_worker_pod():
    """What SCC admission would check for the worker pod, for the fields it uses."""
    docs = kustomize(OVERLAYS["openshift"])
    scc = one(docs, "SecurityContextConstraints")
    _, spec, _ = worker_parts(docs)
    volume_kinds = {k for v in spec["volumes"] for k in v if k != "name"}
    assert volume_kinds <= set(scc["volumes"]), volume_kinds - set(scc["volumes"])
    for c in spec["initContainers"] + spec["containers"]:
        added = set(c["securityContext"]["capabilities"].get("add", []))
        assert added <= set(scc["allowedCapabilities"])
        assert not added & set(scc["requiredDropCapabilities"])
    # Fixed uids and SELinux options need RunAsAny strategies.
    assert scc["runAsUser"]["type"] == "RunAsAny"
    assert scc["seLinuxContext"]["type"] == "RunAsAny"
    assert scc["fsGroup"]["type"] == "RunAsAny"
    assert "runtime/default" in scc["seccompProfiles"]


def test_openshift_overlay_relabels_host_dirs_for_selinux():
    docs = kustomize(OVERLAYS["openshift"])
    _, spec, worker = worker_parts(docs)
    init = container(spec, "prepare-host-dirs", init=True)
    assert env_of(init)["CUECTL_RELABEL_SELINUX"]["value"] == "1"
    assert init["securityContext"]["seLinuxOptions"]["type"] == "spc_t"
    assert "chcon" in init["args"][0] and "container_file_t" in init["args"][0]
    assert spec["securityContext"]["seLinuxOptions"] == {"level": "s0"}
    assert "seLinuxOptions" not in worker["securityContext"]  # the worker stays container_t
    # Elsewhere nothing is relabelled.
    base_init = container(pod_spec(worker_ds(kustomize(BASE))), "prepare-host-dirs", init=True)
    assert "CUECTL_RELABEL_SELINUX" not in env_of(base_init)


def test_openshift_report_exporter_and_api_fit_restricted_v2():
    docs = kustomize(OVERLAYS["openshift"])
    for obj in (one(docs, "CronJob"), one(docs, "Deployment", "cuectl-metrics"), one(docs, "Deployment", "cuectl-api")):
        sc = pod_spec(obj)["securityContext"]
        assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(sc), obj["metadata"]["name"]
        assert sc["runAsNonRoot"] is True
        for c in pod_spec(obj)["containers"]:
            assert "runAsUser" not in c["securityContext"]


# -- components and examples ------------------------------------------------------------------


def test_component_gpus_via_runtime(tmp_path: Path):
    docs = kustomize_with(tmp_path, resources=[BASE], components=[COMPONENTS / "gpus-via-runtime"])
    _, _, worker = worker_parts(docs)
    assert "nvidia.com/gpu" not in worker["resources"].get("limits", {})
    assert env_of(worker)["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert "CUECTL_DB" in env_of(worker)  # the rest of env is kept


def test_component_nvidia_runtime_class(tmp_path: Path):
    docs = kustomize_with(tmp_path, resources=[OVERLAYS["nvidia"]], components=[COMPONENTS / "nvidia-runtime-class"])
    _, spec, worker = worker_parts(docs)
    assert spec["runtimeClassName"] == "nvidia"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "runtimeClassName" not in pod_spec(one(docs, "CronJob"))


def test_component_node_local_logs(tmp_path: Path):
    docs = kustomize_with(tmp_path, resources=[BASE], components=[COMPONENTS / "node-local-logs"])
    assert [p["metadata"]["name"] for p in objects(docs, "PersistentVolumeClaim")] == ["cuectl-metrics"]
    _, spec, worker = worker_parts(docs)
    logs = env_of(worker)["CUECTL_LOG_DIR"]["value"]
    state = env_of(worker)["XDG_STATE_HOME"]["value"]
    assert logs.startswith(state + "/")  # on the node's state hostPath
    assert "logs" not in {v["name"] for v in spec["volumes"]}
    assert {m["mountPath"] for m in worker["volumeMounts"]} == {"/run/cuectl/locks", state, "/dev/shm"}
    # The API server loses its view of the (deleted) logs volume too, and nothing dangles.
    _, api_spec, api = api_parts(docs)
    assert "logs" not in {v["name"] for v in api_spec["volumes"]}
    assert {m["name"] for m in api["volumeMounts"]} == {v["name"] for v in api_spec["volumes"]}
    claims = {p["metadata"]["name"] for p in objects(docs, "PersistentVolumeClaim")}
    for obj in all_pod_objects(docs):
        for v in pod_spec(obj).get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, obj["metadata"]["name"]


def test_example_second_pool_is_a_separate_non_overlapping_daemonset():
    docs = kustomize(K8S / "examples" / "pool-l40s")
    assert [d["kind"] for d in docs] == ["DaemonSet"]
    pool = docs[0]
    main = worker_ds(kustomize(OVERLAYS["nvidia"]))
    assert pool["metadata"]["name"] != main["metadata"]["name"]
    assert pool["metadata"]["namespace"] == NAMESPACE
    sel_pool, sel_main = pool["spec"]["selector"]["matchLabels"], main["spec"]["selector"]["matchLabels"]
    assert not sel_pool.items() <= pod_labels(main).items()
    assert not sel_main.items() <= pod_labels(pool).items()
    spec = pod_spec(pool)
    gpus = container(spec, "worker")["resources"]["limits"]["nvidia.com/gpu"]
    assert int(spec["nodeSelector"]["nvidia.com/gpu.count"]) == gpus
    assert spec["nodeSelector"]["nvidia.com/gpu.count"] != pod_spec(main)["nodeSelector"]["nvidia.com/gpu.count"]
    args = container(spec, "worker")["args"]
    resolved = resolve_command(args)
    assert resolved is not None
    assert set(options_used(args)) <= resolved[1]


def test_example_api_token_secret_is_a_viewer_token_for_the_scrape():
    import yaml

    path = K8S / "examples" / "cuectl-api-token.example.yaml"
    (secret,) = list(yaml.safe_load_all(path.read_text()))
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == API_TOKEN_SECRET
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert set(secret["stringData"]) == {"token"}
    assert secret["stringData"]["token"].startswith("cuectl_")  # the shape of a real secret
    text = path.read_text()
    assert "--role viewer" in text and "admin token create" in text
    # The command it shows is a real one.
    create = text[text.index("cuectl admin token create") :].splitlines()[0]
    words = create.rstrip(')"').split()[1:]
    resolved = resolve_command(words)
    assert resolved is not None and resolved[0] == ["admin", "token", "create"]
    assert set(options_used(words)) <= resolved[1]
    for kustomization in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(kustomization.read_text())
        listed = [str(x) for key in ("resources", "components", "patches") for x in k.get(key, [])]
        assert not any(path.name in x for x in listed), kustomization


def test_example_secret_has_the_keys_the_pods_reference():
    import yaml

    path = K8S / "examples" / "cuectl-db-secret.example.yaml"
    (secret,) = list(yaml.safe_load_all(path.read_text()))
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == SECRET
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert set(secret["stringData"]) == {"url", "password"}
    assert secret["stringData"]["url"].startswith("postgresql://")
    # Not part of anything that `kubectl apply -k` would install.
    for kustomization in K8S.rglob("kustomization.yaml"):
        k = yaml.safe_load(kustomization.read_text())
        listed = [str(x) for key in ("resources", "components", "patches") for x in k.get(key, [])]
        assert not any(path.name in x for x in listed), kustomization


def test_example_dev_postgres_uses_the_same_secret():
    import yaml

    docs = [d for d in yaml.safe_load_all((K8S / "examples" / "postgres-dev.yaml").read_text()) if d]
    sts = one(docs, "StatefulSet")
    pg = pod_spec(sts)["containers"][0]
    assert env_of(pg)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "password"}
    svc = one(docs, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels(sts).items()
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in docs)


def test_init_script_really_prepares_the_host_dirs(tmp_path: Path):
    """Run the init container's script (with its paths moved into tmp_path) the way the
    kubelet leaves a fresh node: both directories root-owned, mode 0755."""
    import os
    import shutil
    import stat
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("the script chowns: needs root")
    sh = shutil.which("sh")
    assert sh
    init = container(pod_spec(worker_ds(kustomize(BASE))), "prepare-host-dirs", init=True)
    locks, state = tmp_path / "run-locks", tmp_path / "var-lib-cuectl"
    script = init["args"][0].replace("/run/cuectl/locks", str(locks)).replace("/var/lib/cuectl", str(state))
    for d in (locks, state):
        d.mkdir(mode=0o755)
        os.chmod(d, 0o755)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    for _ in range(2):  # idempotent: a restart runs it again
        proc = subprocess.run([sh, "-c", script], env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert stat.S_IMODE(locks.stat().st_mode) == 0o1777 and locks.stat().st_uid == WORKER_UID
        assert state.stat().st_uid == WORKER_UID and state.stat().st_gid == WORKER_UID


def test_the_worker_uid_leases_in_the_lock_dir_the_init_script_prepared():
    """The pod's worker (uid 10001, not root) makes the lock files of the GPUs it sees in
    the node's lock directory, because the init script gave it the directory and the pod
    names it CUECTL_SERVICE_USER; root on the node trusts it with the same setting, and
    another user, who cannot make lock files there, leases through the worker's. Before,
    the directory was root's and the worker's first lease failed: only root makes lock
    files in root's shared lock directory (docs/leases.md)."""
    import os
    import shutil
    import subprocess
    import sys
    import tempfile

    import yaml

    if os.geteuid() != 0:
        pytest.skip("switching to uid 10001 needs root")
    sys.path.insert(0, str(REPO / "tests"))
    import osusers

    spec = pod_spec(worker_ds(kustomize(BASE)))
    init, worker = container(spec, "prepare-host-dirs", init=True), container(spec, "worker")
    service = env_of(worker)["CUECTL_SERVICE_USER"]["value"]
    assert service == str(WORKER_UID)
    top = Path(tempfile.mkdtemp(prefix="cuectl-node-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        locks, state = top / "run-locks", top / "var-lib-cuectl"
        for d in (locks, state):
            d.mkdir(mode=0o755)  # as kubelet leaves them
        script = init["args"][0].replace("/run/cuectl/locks", str(locks)).replace("/var/lib/cuectl", str(state))
        proc = subprocess.run([shutil.which("sh") or "sh", "-c", script], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        fake = top / "gpus.yaml"
        fake.write_text(yaml.safe_dump({"host": "node", "devices": [{"model": "NVIDIA L40S", "memory": "46068MiB"}]}))
        fake.chmod(0o644)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUECTL_LOCK_DIR": str(locks),
            "CUECTL_FAKE_GPUS": str(fake),
            "CUECTL_SERVICE_USER": service,
            "CUECTL_RUN_CACHE": "0",
            "CUECTL_LOCK_REGISTRY": str(top / "registry"),
            "HOME": str(state),
        }
        exe = str(Path(sys.executable).with_name("cuectl"))
        lease = [exe, "run", "--gpus", "1", "--no-wait", "--", "true"]

        def run_as(uid: int, environ: dict[str, str]) -> subprocess.CompletedProcess:
            argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *osusers.runnable(lease)]
            return subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=60)

        res = run_as(WORKER_UID, env)
        assert res.returncode == 0, res.stderr
        (lock,) = locks.glob("*.lock")
        assert lock.stat().st_uid == WORKER_UID, "the worker's account made it: nobody else can delete it"
        res = run_as(WORKER_UID + 1, env)  # another user: opens the worker's lock file
        assert res.returncode == 0, res.stderr
        res = subprocess.run(lease, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr  # root on the node, with the same setting
        res = subprocess.run(
            lease,
            env={k: v for k, v in env.items() if k != "CUECTL_SERVICE_USER"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 1 and "not safe for a root cuectl" in res.stderr, res.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


# -- the worker's probes and node maintenance (issue 20) --------------------------------------


def _probe_words(probe: dict[str, Any]) -> list[str]:
    """The cuectl arguments of an exec probe run through a shell: sh -c 'exec cuectl ...'."""
    import shlex

    command = probe["exec"]["command"]
    assert command[:2] == ["/bin/sh", "-c"], command
    words = shlex.split(command[2])
    assert words[:2] == ["exec", "cuectl"], words
    return words[2:]


def test_worker_probes_check_its_heartbeat(build):
    _, docs = build
    _, _, worker = worker_parts(docs)
    live, ready = worker["livenessProbe"], worker["readinessProbe"]
    for probe, readiness in ((live, False), (ready, True)):
        words = _probe_words(probe)
        resolved = resolve_command(words)
        assert resolved is not None and resolved[0] == ["worker"]
        for opt in options_used(words):
            assert opt in resolved[1], f"`cuectl worker` has no option {opt}"
        assert "--probe" in words and ("--ready" in words) == readiness
        # The worker's own name: $(NODE_NAME) is not expanded in probes (downward API value).
        assert words[words.index("--name") + 1] == "$NODE_NAME"
        assert worker["args"][worker["args"].index("--name") + 1] == "$(NODE_NAME)"
        assert "NODE_NAME" in env_of(worker)
        # Well above the worker's --poll (1 s) and its store heartbeat (--lease-timeout/4).
        assert float(words[words.index("--max-age") + 1]) >= 60
        assert probe["timeoutSeconds"] >= 10  # Python start-up on a busy node
    # A database outage must not get the worker restarted (it waits for the server, up to
    # 30 s between tries, refreshing its heartbeat): liveness does not need the store.
    assert "--ready" not in _probe_words(live)
    assert float(_probe_words(live)[_probe_words(live).index("--max-age") + 1]) >= 60
    assert live["failureThreshold"] * live["periodSeconds"] >= 60


def test_worker_probe_commands_run_against_a_real_worker(tmp_path: Path):
    """The DaemonSet's probe commands, run as the kubelet runs them (sh -c, the container's
    environment), against a real worker on fake GPUs: they fail before it runs and after it
    stops, and pass while it works."""
    import json
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    _, _, worker = worker_parts(kustomize(BASE))
    bindir = Path(sys.executable).parent
    if not (bindir / "cuectl").exists():
        pytest.skip("the cuectl executable is not installed beside this Python")
    fake = tmp_path / "gpus.yaml"
    fake.write_text(json.dumps({"devices": [{"model": "Tesla T4", "memory": "15360MiB"}]}))
    env = dict(
        os.environ,
        NODE_NAME="node-a",
        PATH=f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        CUECTL_FAKE_GPUS=str(fake),
    )
    sh = shutil.which("sh")
    assert sh

    def run(probe: dict[str, Any]) -> int:
        command = [sh, *probe["exec"]["command"][1:]]
        return subprocess.run(command, env=env, capture_output=True, timeout=60).returncode

    assert run(worker["livenessProbe"]) == 1 and run(worker["readinessProbe"]) == 1
    proc = subprocess.Popen(
        [str(bindir / "cuectl"), "--db", str(tmp_path / "store.db"), "worker", "--name", "node-a", "--poll", "0.1"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while run(worker["readinessProbe"]) != 0:
            assert time.monotonic() < deadline, "the readiness probe never passed"
            time.sleep(0.2)
        assert run(worker["livenessProbe"]) == 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert run(worker["livenessProbe"]) == 1


def test_docs_give_the_real_node_maintenance_procedure():
    """`kubectl drain` never evicts DaemonSet pods: the way to empty a node of frames is to
    lock its host, wait for its frames, then drain, and unlock afterwards."""
    from deploylib import REPO

    doc = (REPO / "docs" / "deploy-kubernetes.md").read_text()
    comment = (BASE / "worker" / "daemonset.yaml").read_text()
    for text in (doc, comment):
        assert "cuectl host lock" in text and "cuectl host unlock" in text
        assert "--ignore-daemonsets" in text
    assert "node drains wait for frames" not in doc.lower()
    assert "rollout or `kubectl drain`" not in comment
    assert "cuectl worker --probe" in doc


# -- components/opencue-grpc: OpenCue's gRPC protocol (cuectl serve --opencue) ------------------

OPENCUE_PORT = 8443


@pytest.fixture(params=sorted(BUILDS), ids=sorted(BUILDS))
def opencue_build(request, tmp_path: Path) -> tuple[str, list[dict[str, Any]]]:
    """Each build with the component added as its header says: in the overlay's (or the
    base's) own kustomization.yaml, so that its images, namespace and labels apply."""
    import shutil

    import yaml

    tree = tmp_path / "kubernetes"
    shutil.copytree(K8S, tree)
    directory = tree / BUILDS[request.param].relative_to(K8S)
    path = directory / "kustomization.yaml"
    k = yaml.safe_load(path.read_text())
    k["components"] = [*k.get("components", []), posixpath.relpath(tree / "components" / "opencue-grpc", directory)]
    path.write_text(yaml.safe_dump(k))
    return request.param, kustomize(directory)


def opencue_parts(docs):
    deploy = one(docs, "Deployment", "cuectl-opencue")
    spec = pod_spec(deploy)
    return deploy, spec, container(spec, "opencue")


def _names(docs) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def test_opencue_component_adds_only_its_own_objects(opencue_build):
    name, docs = opencue_build
    plain = kustomize(BUILDS[name])
    assert _names(docs) - _names(plain) == {
        ("ServiceAccount", "cuectl-opencue"),
        ("Deployment", "cuectl-opencue"),
        ("Service", "cuectl-opencue"),
    }
    # Nothing else is changed.
    added = [d for d in docs if d["metadata"]["name"] == "cuectl-opencue"]
    assert sorted((d for d in docs if d not in added), key=str) == sorted(plain, key=str)


def test_opencue_component_keeps_every_build_rule(opencue_build):
    """The rules every build keeps, with the component in it."""
    for rule in (
        test_everything_lives_in_the_cuectl_namespace,
        test_selectors_match_their_pod_labels,
        test_volume_mounts_and_claims_resolve,
        test_no_privileged_containers_and_no_api_tokens,
        test_images,
    ):
        rule(opencue_build)


def test_opencue_serves_on_the_pods_ip_with_real_serve_options(opencue_build, monkeypatch):
    from deploylib import cli_tree

    from cuectl.cli.serve_cmd import serve_args
    from cuectl.cuebot.server import parse_address

    _, docs = opencue_build
    _, _, opencue = opencue_parts(docs)
    args = opencue["args"]
    assert "command" not in opencue, "keep the image's ENTRYPOINT (tini -- cuectl)"
    assert args[:2] == ["serve", "--opencue"]
    resolved = resolve_command(args)
    assert resolved is not None and resolved[0] == ["serve"]
    for opt in options_used(args):
        assert opt in resolved[1], f"`cuectl serve` has no option {opt}"
    # The pod's own IP (downward API), never 0.0.0.0: a caller on the pod's loopback would be
    # proven by its socket's uid, and `kubectl port-forward` connects there as the runtime's
    # root. Other pods only read: no network is trusted by default.
    address = args[2]
    assert address == f"$(POD_IP):{OPENCUE_PORT}"
    assert env_of(opencue)["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "--opencue-trust-network" not in args
    for pod_ip in ("10.244.1.7", "fd00:10:244::7"):  # IPv4 and IPv6 clusters
        expanded = [a.replace("$(POD_IP)", pod_ip) for a in args]
        assert parse_address(expanded[2]) == (pod_ip, OPENCUE_PORT)
        monkeypatch.delenv("CUECTL_OPENCUE", raising=False)
        params = cli_tree().commands["serve"].make_context("serve", serve_args(expanded[1:])).params
        assert params["opencue"] == expanded[2]
    (port,) = opencue["ports"]
    assert port == {"name": "grpc", "containerPort": OPENCUE_PORT}


def test_opencue_component_says_what_trusting_the_pod_network_gives_away():
    text = (COMPONENTS / "opencue-grpc" / "opencue.yaml").read_text()
    for needle in (
        "--opencue-trust-network",
        "pod network",
        "EVERY pod in EVERY namespace",
        "never taken",
        "read",
        "port-forward",
        "ClusterIP",
    ):
        assert needle in text, needle


def test_opencue_probes_are_tcp_the_server_has_no_health_service(opencue_build):
    _, docs = opencue_build
    _, _, opencue = opencue_parts(docs)
    ready, live = opencue["readinessProbe"], opencue["livenessProbe"]
    for probe in (ready, live):
        # No grpc.health.v1 in the server: neither httpGet nor Kubernetes' grpc probe.
        assert set(probe) & {"httpGet", "grpc", "exec", "tcpSocket"} == {"tcpSocket"}
        assert probe["tcpSocket"]["port"] == "grpc"
    assert live["failureThreshold"] * live["periodSeconds"] >= 60


def test_opencue_server_has_no_health_service(tmp_path: Path):
    """What the probes rely on: a real server answers grpc.health.v1's Check UNIMPLEMENTED
    (if it ever implements it, the probes may become Kubernetes' grpc ones)."""
    import grpc

    from cuectl.cuebot.server import Settings, build_server

    server, dispatcher, port = build_server(Settings(db_url=str(tmp_path / "store.db")), "127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary("/grpc.health.v1.Health/Check")
            with pytest.raises(grpc.RpcError) as failed:
                check(b"", timeout=10)
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        server.stop(0).wait()
        dispatcher.close()


def test_opencue_store_env_and_no_gpu(opencue_build):
    _, docs = opencue_build
    _, spec, opencue = opencue_parts(docs)
    _, _, worker = worker_parts(docs)
    env = env_of(opencue)
    assert env["CUECTL_DB"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "url"}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "password", "optional": True}
    # The log paths it hands CueGUI are the workers'; it reads none, so mounts none.
    assert env["CUECTL_LOG_DIR"]["value"] == env_of(worker)["CUECTL_LOG_DIR"]["value"]
    assert {m["mountPath"] for m in opencue["volumeMounts"]} == {"/tmp"}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert "nvidia.com/gpu" not in opencue["resources"].get("limits", {})
    assert opencue["resources"]["requests"] and opencue["resources"]["limits"]["memory"]
    for item in env.values():
        assert "postgresql://" not in str(item.get("value", "")), "the store URL belongs in the Secret"


def test_opencue_runs_unprivileged_and_fits_restricted_v2_everywhere(opencue_build):
    _, docs = opencue_build
    _, spec, opencue = opencue_parts(docs)
    sc = spec["securityContext"]
    assert sc["runAsNonRoot"] is True
    # The image's numeric USER, not a fixed uid: OpenShift's restricted-v2 assigns one, and
    # the component is the same on every build.
    assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(sc)
    assert "runAsUser" not in opencue["securityContext"]
    assert opencue["securityContext"]["readOnlyRootFilesystem"] is True
    assert not any("hostPath" in v for v in spec["volumes"])
    assert "tolerations" not in spec and "nvidia.com/gpu.present" not in spec.get("nodeSelector", {})
    assert spec["serviceAccountName"] == "cuectl-opencue"


def test_opencue_service_is_internal_and_selects_only_its_pod(opencue_build):
    _, docs = opencue_build
    deploy, _, opencue = opencue_parts(docs)
    service = one(docs, "Service", "cuectl-opencue")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    (port,) = service["spec"]["ports"]
    assert port["port"] == OPENCUE_PORT and port["name"] == "grpc" and port["targetPort"] == "grpc"
    assert port["targetPort"] in {p["name"] for p in opencue["ports"]}
    for obj in all_pod_objects(docs):
        selected = service["spec"]["selector"].items() <= pod_labels(obj).items()
        assert selected == (obj is deploy), obj["metadata"]["name"]
    assert not one(docs, "Service", "cuectl-api")["spec"]["selector"].items() <= pod_labels(deploy).items()


def test_opencue_commented_trust_network_args_are_real_when_uncommented():
    import re

    import yaml

    from cuectl.cuebot.server import parse_networks

    text = (COMPONENTS / "opencue-grpc" / "opencue.yaml").read_text()
    uncommented = re.sub(r"^(\s*)# (- (?:--opencue-trust-network|[0-9a-f.:]+/\d+))$", r"\1\2", text, flags=re.M)
    assert uncommented != text
    deployment = next(d for d in yaml.safe_load_all(uncommented) if d["kind"] == "Deployment")
    args = container(pod_spec(deployment), "opencue")["args"]
    resolved = resolve_command(args)
    assert resolved is not None and "--opencue-trust-network" in resolved[1]
    cidr = args[args.index("--opencue-trust-network") + 1]
    assert parse_networks([cidr])[0].is_private
