"""docs/deploy.md, docs/deploy-kubernetes.md and docs/api.md: the paths they name exist,
their links (anchors included) resolve, the cuectl commands they show use sub-commands and
options that cuectl has, the YAML they quote agrees with the manifests, and docs/api.md
shows every route of `cuectl serve` with its real query parameters."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from deploylib import K8S, OVERLAYS, REPO, cli_tree, container, env_of, kustomize, one, pod_spec, resolve_command

DOCS = {
    "deploy": REPO / "docs" / "deploy.md",
    "kubernetes": REPO / "docs" / "deploy-kubernetes.md",
    "api": REPO / "docs" / "api.md",
}
CUECTL_TOKEN = re.compile(r"(^|.*/)cuectl(:[\w.-]+)?$")  # cuectl, /usr/local/bin/cuectl, an image
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
                for w in tokens[i + 1 :]:
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
    if doc == "kubernetes":  # short forms relative to deploy/kubernetes
        for p in set(re.findall(r"`((?:overlays|components|examples|base)/[\w./@-]*[\w/])`", text)):
            assert (K8S / p).exists(), p


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings: lower case, punctuation dropped,
    spaces turned into dashes (code blocks are not headings)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
        out.add(slug.replace(" ", "-"))
    return out


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_links_to_other_docs_resolve(doc: str):
    text = DOCS[doc].read_text()
    for target, anchor in re.findall(r"\]\(([\w./-]+\.md)(?:#([\w-]+))?\)", text):
        assert (DOCS[doc].parent / target).exists(), target
        if anchor:
            assert anchor in anchors(DOCS[doc].parent / target), f"{target}#{anchor}"
    for anchor in re.findall(r"\]\(#([\w-]+)\)", text):
        assert anchor in anchors(DOCS[doc]), f"#{anchor}"


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
        assert any(c[: len(cmd)] == cmd for c in covered), cmd
    submit = [w for w in cuectl_invocations(text) if w[0] == "submit"]
    assert any("--gpu-model" in w and "--gpus" in w for w in submit)
    for needle in [
        "kubectl apply -k deploy/kubernetes/overlays/nvidia",
        "nvidia.com/gpu.product",
        "Node Feature Discovery",
        "device plugin",
        "GPU Operator",
        "SecurityContextConstraints",
        "hostmount-anyuid",
        "runtimeClassName",
        "terminationGracePeriodSeconds",
        "NVIDIA_VISIBLE_DEVICES",
        "secretKeyRef",
        "ReadWriteMany",
        "kubectl -n cuectl create secret",
    ]:
        assert needle in text, needle


def test_deploy_doc_covers_systemd_and_docker():
    text = DOCS["deploy"].read_text()
    for needle in [
        "KillMode=mixed",
        "TimeoutStopSec",
        "cuectl-worker@.service",
        "docker build -f deploy/docker/Dockerfile",
        "--gpus all",
        "--runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0,1",
        "--stop-timeout",
        "/run/cuectl/locks",
        "PGPASSWORD",
        "sslmode=verify-full",
    ]:
        assert needle in text, needle


def test_deploy_doc_covers_the_api_service():
    text = DOCS["deploy"].read_text()
    for needle in [
        "deploy/systemd/cuectl-serve.service",
        "deploy/systemd/serve.env.example",
        "CUECTL_SERVE_ARGS",
        "User=cuectl-api",
        "receipt",
        "SET ROLE",
        "/healthz",
        "/readyz",
        "--socket /run/cuectl-api/",
    ]:
        assert needle in text, needle
    # The CUECTL_SERVE_ARGS lines it quotes are real `cuectl serve` options.
    resolved = resolve_command(["serve"])
    assert resolved is not None
    quoted = re.findall(r"^CUECTL_SERVE_ARGS=(.*)$", text, re.M)
    assert quoted
    for value in quoted:
        for word in value.split():
            if word.startswith("--"):
                assert word in resolved[1], word


def test_kubernetes_doc_covers_the_api():
    text = DOCS["kubernetes"].read_text()
    for needle in [
        "cuectl-api-token",
        "deploy/kubernetes/examples/cuectl-api-token.example.yaml",
        "/readyz",
        "/healthz",
        "proxy-buffering",
        "SET ROLE",
        "GRANT cuectl_admin",
        "port-forward svc/cuectl-api",
        "prometheus.io/scrape",
        "oc -n cuectl create route edge",
    ]:
        assert needle in text, needle


def test_deploy_doc_covers_the_opencue_service():
    from cuectl.cuebot.server import parse_address

    text = DOCS["deploy"].read_text()
    section = text[text.index("## OpenCue's gRPC protocol") :]
    for needle in [
        "deploy/systemd/cuectl-opencue.service",
        "deploy/systemd/opencue.env.example",
        "opencue-grpc.md",
        "CUECTL_OPENCUE",
        "CUECTL_OPENCUE_ARGS",
        "cuectl[opencue]",
        "--opencue-trust-network",
        "receipt",
        "SET ROLE",
        "User=cuectl-api",
        "systemctl edit cuectl-opencue",
        "AF_NETLINK",
        "deploy/kubernetes/components/opencue-grpc",
        "serve.env",
    ]:
        assert needle in section, needle
    # What it quotes of the unit is the unit.
    unit = (REPO / "deploy" / "systemd" / "cuectl-opencue.service").read_text()
    (exec_start,) = re.findall(r"`(ExecStart=[^`]+)`", section)
    assert re.search(rf"^{re.escape(exec_start)}$", unit, re.M)
    (default,) = re.findall(r"`(Environment=CUECTL_OPENCUE=[^`]+)`", section)
    assert re.search(rf"^{re.escape(default)}$", unit, re.M)
    # The settings it quotes are real.
    resolved = resolve_command(["serve"])
    assert resolved is not None
    addresses = re.findall(r"^CUECTL_OPENCUE=(.*)$", section, re.M)
    assert addresses
    for value in addresses:
        parse_address(value)
    quoted = re.findall(r"^CUECTL_OPENCUE_ARGS=(.*)$", section, re.M)
    assert quoted
    for value in quoted:
        for word in value.split():
            if word.startswith("--"):
                assert word in resolved[1], word


def test_kubernetes_doc_covers_the_opencue_component():
    text = DOCS["kubernetes"].read_text()
    section = text[text.index("### OpenCue's tools") : text.index("## 10. Operations")]
    for needle in [
        "components/opencue-grpc",
        "cuectl-opencue",
        "8443",
        "opencue-grpc.md",
        "--opencue-trust-network",
        "every pod in every namespace",
        "port-forward",
        "tcpSocket",
        "restricted-v2",
        "SET ROLE",
        "CUEBOT_HOSTS=cuectl-opencue.cuectl.svc:8443",
    ]:
        assert needle in section, needle
    # The command it names is the component's.
    manifest = yaml.safe_load_all((K8S / "components" / "opencue-grpc" / "opencue.yaml").read_text())
    deployment = next(d for d in manifest if d["kind"] == "Deployment")
    command = " ".join(["cuectl", *container(pod_spec(deployment), "opencue")["args"]])
    assert f"`{command}`" in section
    (components,) = [yaml.safe_load(body) for lang, body in code_blocks(section) if lang == "yaml"]
    assert components == {"components": ["../../components/opencue-grpc"]}
    for overlay in OVERLAYS.values():  # the path as an overlay writes it
        assert (overlay / components["components"][0]).resolve() == (K8S / "components" / "opencue-grpc").resolve()


def test_quoted_api_db_secret_patch_applies(tmp_path: Path):
    import os
    import subprocess

    from deploylib import kubectl_or_skip

    (doc,) = [
        yaml.safe_load(body)
        for lang, body in code_blocks(DOCS["kubernetes"].read_text())
        if lang == "yaml" and "cuectl-api-db" in body
    ]
    k = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(OVERLAYS["nvidia"], tmp_path)],
        "patches": doc["patches"],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k))
    proc = subprocess.run([kubectl_or_skip(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    api = env_of(container(pod_spec(one(docs, "Deployment", "cuectl-api")), "api"))
    assert api["CUECTL_DB"]["valueFrom"]["secretKeyRef"]["name"] == "cuectl-api-db"
    assert api["PGPASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "cuectl-api-db"
    worker = env_of(container(pod_spec(one(docs, "DaemonSet", "cuectl-worker")), "worker"))
    assert worker["CUECTL_DB"]["valueFrom"]["secretKeyRef"]["name"] == "cuectl-db"


def test_quoted_ingress_points_at_the_api_service():
    (ingress,) = [
        yaml.safe_load(body)
        for lang, body in code_blocks(DOCS["kubernetes"].read_text())
        if lang == "yaml" and "kind: Ingress" in body
    ]
    service = one(kustomize(OVERLAYS["nvidia"]), "Service", "cuectl-api")
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    assert ingress["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert ingress["spec"]["tls"]


def test_quoted_gpu_pool_matches_the_overlay():
    quoted = [
        yaml.safe_load(body)
        for lang, body in code_blocks(DOCS["kubernetes"].read_text())
        if lang == "yaml" and "nvidia.com/gpu.product" in body
    ]
    assert len(quoted) == 1
    real = yaml.safe_load((OVERLAYS["nvidia"] / "gpu-pool.yaml").read_text())
    q, r = quoted[0]["spec"]["template"]["spec"], real["spec"]["template"]["spec"]
    assert q["nodeSelector"] == r["nodeSelector"]
    assert q["affinity"] == r["affinity"]
    assert q["containers"][0]["resources"] == r["containers"][0]["resources"]


def test_quoted_servicemonitors_select_their_services():
    monitors = [
        yaml.safe_load(body)
        for lang, body in code_blocks(DOCS["kubernetes"].read_text())
        if lang == "yaml" and "kind: ServiceMonitor" in body
    ]
    assert sorted(m["metadata"]["name"] for m in monitors) == ["cuectl-api", "cuectl-metrics"]
    services = [d for d in kustomize(OVERLAYS["nvidia"]) if d["kind"] == "Service"]
    token_secret = yaml.safe_load((K8S / "examples" / "cuectl-api-token.example.yaml").read_text())
    for monitor in monitors:
        selected = [
            s for s in services if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
        ]
        assert [s["metadata"]["name"] for s in selected] == [monitor["metadata"]["name"]]
        service = selected[0]
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
        assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
        if monitor["metadata"]["name"] == "cuectl-api":  # /metrics needs a token
            (endpoint,) = monitor["spec"]["endpoints"]
            auth = endpoint["authorization"]
            assert auth["type"] == "Bearer"
            assert auth["credentials"]["name"] == token_secret["metadata"]["name"]
            assert auth["credentials"]["key"] in token_secret["stringData"]


# -- docs/api.md against the routes of the app --------------------------------------------------


def _app_routes() -> list[tuple[str, str, set[str]]]:
    """(METHOD, path template, query parameter names) of every route of `cuectl serve`."""
    from cuectl.serve.app import Settings, create_app

    app = create_app(Settings(db_url=str(REPO / "no-such-store.db")))  # opens no store
    spec = app.openapi()
    out = []
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            query = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
            out.append((method.upper(), path, query))
    out.append(("GET", app.openapi_url, set()))
    return out


def _expanded_routes() -> list[tuple[str, str, set[str]]]:
    """Routes with their {action} placeholder replaced by each action the app accepts."""
    from cuectl.serve.app import FRAME_ACTIONS, HOST_ACTIONS, JOB_ACTIONS

    out = []
    for method, path, query in _app_routes():
        if path.endswith("/{action}"):
            actions = JOB_ACTIONS if "/jobs/" in path else HOST_ACTIONS if "/hosts/" in path else FRAME_ACTIONS
            out += [(method, path[: -len("{action}")] + a, query) for a in actions]
        else:
            out.append((method, path, query))
    return out


def _route_regex(path: str) -> re.Pattern[str]:
    parts = [("[^/?]+" if re.fullmatch(r"\{\w+\}", seg) else re.escape(seg)) for seg in path.split("/")]
    return re.compile("/".join(parts) + "$")


def _api_curls() -> list[tuple[str, str, dict[str, str], list[str]]]:
    """(METHOD, path, query, argv) of every curl command in docs/api.md."""
    out = []
    for line in shell_lines(DOCS["api"].read_text()):
        if "curl " not in line:
            continue
        argv = shlex.split(line[line.index("curl ") :], comments=True)
        urls = [a for a in argv if a.startswith(("$API", "http://", "https://"))]
        assert len(urls) == 1, line
        url = re.sub(r"^(\$API|https?://[^/]+)", "", urls[0])
        path, _, qs = url.partition("?")
        query = dict(kv.partition("=")[::2] for kv in qs.split("&") if kv)
        body = any(a in ("-d", "--data", "--data-binary") for a in argv)
        method = argv[argv.index("-X") + 1] if "-X" in argv else ("POST" if body else "GET")
        out.append((method, path, query, argv))
    return out


def _route_of(method: str, path: str) -> tuple[str, str, set[str]] | None:
    routes = [r for r in _expanded_routes() if r[0] == method and _route_regex(r[1]).match(path)]
    # /jobs/{job}/priority is both its own route and {job}/{action}: the literal one wins.
    routes.sort(key=lambda r: r[1].count("{"))
    return routes[0] if routes else None


def test_api_doc_shows_a_curl_for_every_route_and_action():
    curls = _api_curls()
    for method, template, _ in _expanded_routes():
        regex = _route_regex(template)
        assert any(m == method and regex.match(p) for m, p, _, _ in curls), f"no curl example for {method} {template}"


def test_api_doc_curls_use_real_routes_and_query_parameters():
    used: dict[tuple[str, str], set[str]] = {}
    for method, path, query, argv in _api_curls():
        if method not in ("GET", "POST"):
            continue  # a 405 example, if any
        route = _route_of(method, path)
        assert route is not None, f"curl {method} {path}: no such route"
        unknown = set(query) - route[2]
        assert not unknown, f"{method} {path}: {sorted(unknown)} are not parameters of {route[1]}"
        used.setdefault(route[:2], set()).update(query)
        # POST bodies need a content type the route takes (415 otherwise): JSON, and for a
        # job also the YAML and XML spec formats the one front door reads (sched/intake.py).
        if any(a in ("-d", "--data", "--data-binary") for a in argv):
            from cuectl.sched.intake import FORMATS

            takes = set(FORMATS) if route[1] == "/api/v1/jobs" else {"application/json"}
            assert any(a.startswith("Content-Type: ") and a.split(": ", 1)[1] in takes for a in argv), " ".join(argv)
        # Everything but the health checks and the OpenAPI document needs a token (or a socket).
        public = path in ("/healthz", "/readyz", "/api/v1/openapi.json")
        if not public and "--unix-socket" not in argv:
            assert any(a.startswith("Authorization: Bearer ") for a in argv), " ".join(argv)
    # Every query parameter of every route is shown at least once.
    for method, template, query in _expanded_routes():
        shown = used.get((method, template), set())
        assert query <= shown, f"{method} {template}: no example uses {sorted(query - shown)}"


def test_readme_mentions_serve_and_the_api_docs():
    text = (REPO / "README.md").read_text()
    everyday = text[text.index("## Everyday use") : text.index("## Documentation")]
    assert re.search(r"^cuectl serve\b", everyday, re.M)
    documentation = text[text.index("## Documentation") :]
    for doc in ("docs/api.md", "docs/monitoring.md"):
        assert doc in documentation, doc
        assert (REPO / doc).exists(), doc
