#!/usr/bin/env bash
# End-to-end check of the Helm chart on a real cluster with GPU nodes (docs/deploy-kubernetes.md):
#   1. installs deploy/helm/cuectl into a namespace of its own (with a throw-away PostgreSQL
#      from deploy/kubernetes/examples/postgres-dev.yaml unless --db-url names one),
#   2. submits a 1-GPU job and a CPU job through the REST API (a token, port-forward, curl),
#   3. checks that the GPU frame ran on a GPU node's worker with exactly one device visible
#      (its lease, CUDA_VISIBLE_DEVICES, and CUDA's own device count where libcuda is mounted)
#      and that the CPU frame ran with none,
#   4. uninstalls everything it created (unless --keep).
# Needs kubectl (a context with rights to create namespaces), helm (scripts/get-helm.sh, or
# --helm), curl and python3, and an image of cuectl the cluster can pull (--image). kind with
# the NVIDIA device plugin (or its fake/mock devices) or a real GPU node will do.
# --dry-run prints the plan (the helm command, the objects it renders, the jobs) without a
# cluster. Exit 0: every check passed; 1: a check or a step failed; 2: bad arguments.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
chart="$repo/deploy/helm/cuectl"

usage() {
  cat <<'USAGE'
usage: scripts/k8s-e2e.sh [options]

  --image REPO:TAG     the cuectl image the cluster pulls (required, except with --dry-run)
  --namespace NS       namespace to create and remove (default: cuectl-e2e)
  --release NAME       Helm release name (default: cuectl-e2e)
  --values FILE        more chart values (repeatable)
  --set KEY=VALUE      a chart value (repeatable)
  --db-url URL         an existing PostgreSQL for the store (default: a throw-away one)
  --gpu-resource NAME  the resource GPU nodes offer (default: nvidia.com/gpu)
  --timeout SECONDS    how long each wait may take (default: 600)
  --helm PATH          the helm binary (default: scripts/get-helm.sh's)
  --keep               leave the release and the namespace in place
  --dry-run            print the plan and exit: no cluster is contacted
  -h, --help           this help
USAGE
}

die2() { echo "error: $*" >&2; exit 2; }
die() { echo "error: $*" >&2; exit 1; }

image="" namespace=cuectl-e2e release=cuectl-e2e db_url="" gpu_resource=nvidia.com/gpu
timeout=600 helm_bin="" keep=0 dry_run=0
values=() sets=()
while [ $# -gt 0 ]; do
  opt="$1"
  case "$opt" in
    -h|--help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift; continue ;;
    --keep) keep=1; shift; continue ;;
    --image|--namespace|--release|--values|--set|--db-url|--gpu-resource|--timeout|--helm)
      [ $# -ge 2 ] && [ -n "$2" ] || die2 "$opt needs a value"
      val="$2"; shift 2 ;;
    --*=*) die2 "write ${opt%%=*} VALUE, not ${opt%%=*}=VALUE" ;;
    *) die2 "unknown argument: $opt (see --help)" ;;
  esac
  case "$opt" in
    --image) [[ "$val" =~ ^[a-z0-9][a-z0-9._/-]*(:[0-9]+)?[a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] \
               || die2 "--image wants REPO:TAG, got '$val'"; image="$val" ;;
    --namespace|--release) [[ "$val" =~ ^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$ ]] \
               || die2 "$opt wants a DNS label (lower-case letters, digits, dashes), got '$val'"
             if [ "$opt" = --namespace ]; then namespace="$val"; else release="$val"; fi ;;
    --values) [ -f "$val" ] || die2 "--values: no such file: $val"; values+=("$val") ;;
    --set) [[ "$val" == *=* ]] || die2 "--set wants KEY=VALUE, got '$val'"; sets+=("$val") ;;
    --db-url) [[ "$val" == postgresql://* || "$val" == postgres://* ]] || die2 "--db-url wants a postgresql:// URL"; db_url="$val" ;;
    --gpu-resource) [[ "$val" =~ ^[a-z0-9.-]+/[a-z0-9.-]+$ ]] || die2 "--gpu-resource wants DOMAIN/NAME, got '$val'"; gpu_resource="$val" ;;
    --timeout) [[ "$val" =~ ^[1-9][0-9]*$ ]] || die2 "--timeout wants a whole number of seconds, got '$val'"; timeout="$val" ;;
    --helm) [ -x "$val" ] || die2 "--helm: not an executable: $val"; helm_bin="$val" ;;
  esac
done
[ "$dry_run" = 1 ] || [ -n "$image" ] || die2 "--image is required (no cuectl image is published: build deploy/docker/Dockerfile and push it)"

if [ -z "$helm_bin" ]; then
  helm_bin="$(bash "$here/get-helm.sh")" || die "no helm (scripts/get-helm.sh failed; give --helm)"
fi

# What each frame prints: its lease, what CUDA is told, and CUDA's own count of visible
# devices where the NVIDIA runtime mounted libcuda ("unavailable" elsewhere).
probe='import ctypes, os
n = "unavailable"
try:
    cuda = ctypes.CDLL("libcuda.so.1")
    if cuda.cuInit(0) == 0:
        k = ctypes.c_int()
        cuda.cuDeviceGetCount(ctypes.byref(k))
        n = k.value
    else:
        n = 0
except OSError:
    pass
print("e2e: uuids=%s cuda_visible=%s cuda_count=%s" % (os.environ.get("CUE_GPU_UUIDS", ""), os.environ.get("CUDA_VISIBLE_DEVICES", ""), n))'
job_json() {  # NAME GPUS
  PROBE="$probe" python3 -c 'import json, os, sys
print(json.dumps({"name": sys.argv[1], "layers": [{"name": "main", "command": ["python3", "-c", os.environ["PROBE"]], "gpus": int(sys.argv[2])}]}))' "$1" "$2"
}

# Node-local logs (a test cluster may have no ReadWriteMany storage), no report CronJob.
chart_args=("$chart" --namespace "$namespace" --set logs.persistence.enabled=false --set report.enabled=false)
if [ -n "$image" ]; then
  chart_args+=(--set "image.repository=${image%:*}" --set "image.tag=${image##*:}")
fi
for v in "${values[@]}"; do chart_args+=(--values "$v"); done
for s in "${sets[@]}"; do chart_args+=(--set "$s"); done
helm_args=(upgrade --install "$release" "${chart_args[@]}" --wait --timeout "${timeout}s")

if [ "$dry_run" = 1 ]; then
  echo "plan (dry run: no cluster contacted)"
  echo "1. namespace $namespace, labelled pod-security.kubernetes.io/enforce=privileged"
  if [ -n "$db_url" ]; then echo "2. Secret cuectl-db with the given --db-url"
  else echo "2. Secret cuectl-db and a throw-away PostgreSQL (deploy/kubernetes/examples/postgres-dev.yaml)"; fi
  printf '3. %q' "$helm_bin"; printf ' %q' "${helm_args[@]}"; echo
  rendered="$("$helm_bin" template "$release" "${chart_args[@]}" 2>&1)" || { echo "$rendered" >&2; die "helm template failed"; }
  echo "   renders:"
  RENDERED="$rendered" python3 - <<'PY'
import os, yaml
for d in yaml.safe_load_all(os.environ["RENDERED"]):
    if not d:
        continue
    line = f"     {d['kind']}/{d['metadata']['name']}"
    if d["kind"] in ("DaemonSet", "Deployment") and d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker":
        spec = d["spec"]["template"]["spec"]
        limits = spec["containers"][0].get("resources", {}).get("limits", {})
        gpus = {k: v for k, v in limits.items() if k.endswith("/gpu") or "/mig-" in k}
        line += f"  gpus={gpus or 'none'}  nodeSelector={spec.get('nodeSelector', {})}"
    print(line)
PY
  echo "4. a token for the API (cuectl admin token create in deploy/$release-api), port-forward svc/$release-api"
  echo "5. POST /api/v1/jobs: $(job_json e2e-gpu 1)"
  echo "   POST /api/v1/jobs: $(job_json e2e-cpu 0)"
  echo "6. checks: e2e-gpu's frame SUCCEEDED on a node offering $gpu_resource, with 1 leased GPU, 1 entry in"
  echo "   CUDA_VISIBLE_DEVICES and CUDA counting 1 device (where libcuda is mounted); e2e-cpu's frame"
  echo "   SUCCEEDED with no GPU leased, CUDA_VISIBLE_DEVICES hiding all (-1) and CUDA counting 0"
  if [ "$keep" = 1 ]; then echo "7. --keep: the release and the namespace stay"
  else echo "7. helm uninstall $release; kubectl delete namespace $namespace"; fi
  exit 0
fi

for tool in kubectl curl python3; do command -v "$tool" >/dev/null || die "$tool is not installed"; done
kubectl version --request-timeout=10s >/dev/null 2>&1 || die "no cluster answers (kubectl version): check your kubeconfig context"

gpu_nodes="$(kubectl get nodes -o json | RES="$gpu_resource" python3 -c 'import json, os, sys
for n in json.load(sys.stdin)["items"]:
    if int(n["status"].get("allocatable", {}).get(os.environ["RES"], "0") or 0) > 0:
        print(n["metadata"]["name"])')"
[ -n "$gpu_nodes" ] || die "no node offers $gpu_resource (install the NVIDIA device plugin or the GPU Operator)"
echo "GPU nodes: $(echo "$gpu_nodes" | tr '\n' ' ')"

created_ns=0 pf_pid=""
cleanup() {
  [ -n "$pf_pid" ] && kill "$pf_pid" 2>/dev/null || true
  if [ "$keep" = 1 ]; then echo "kept: helm -n $namespace uninstall $release; kubectl delete namespace $namespace"; return; fi
  "$helm_bin" uninstall "$release" --namespace "$namespace" --wait >/dev/null 2>&1 || true
  if [ "$created_ns" = 1 ]; then kubectl delete namespace "$namespace" --wait=false >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

if ! kubectl get namespace "$namespace" >/dev/null 2>&1; then
  kubectl create namespace "$namespace" >/dev/null; created_ns=1
fi
kubectl label namespace "$namespace" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null
if [ -n "$db_url" ]; then
  kubectl -n "$namespace" create secret generic cuectl-db --from-literal=url="$db_url" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
else
  password="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
  kubectl -n "$namespace" create secret generic cuectl-db \
    --from-literal=url="postgresql://cuectl@cuectl-postgres.$namespace.svc:5432/cuectl" \
    --from-literal=password="$password" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  sed "s/namespace: cuectl$/namespace: $namespace/" "$repo/deploy/kubernetes/examples/postgres-dev.yaml" | kubectl apply -f - >/dev/null
  kubectl -n "$namespace" rollout status statefulset/cuectl-postgres --timeout "${timeout}s"
fi

"$helm_bin" "${helm_args[@]}"
api="deploy/$release-api"
kubectl -n "$namespace" rollout status "$api" --timeout "${timeout}s"
token="$(kubectl -n "$namespace" exec "$api" -- cuectl admin token create cuectl --role user --label k8s-e2e | tail -n1)"
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
kubectl -n "$namespace" port-forward "svc/$release-api" "$port:8448" >/dev/null 2>&1 &
pf_pid=$!
for _ in $(seq 1 30); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && break; sleep 1; done

submit() {  # NAME GPUS -> job id
  curl -sf -X POST -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
    --data "$(job_json "$1" "$2")" "http://127.0.0.1:$port/api/v1/jobs" | python3 -c 'import json, sys; print(json.load(sys.stdin)["id"])'
}
gpu_job="$(submit e2e-gpu 1)" || die "POST /api/v1/jobs (the GPU job) failed"
cpu_job="$(submit e2e-cpu 0)" || die "POST /api/v1/jobs (the CPU job) failed"
echo "submitted jobs $gpu_job (1 GPU) and $cpu_job (CPU)"

frame_of() {  # JOB -> the frame's JSON once it has ended
  local deadline=$((SECONDS + timeout)) out
  while [ "$SECONDS" -lt "$deadline" ]; do
    out="$(curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/v1/jobs/$1/frames?attempts=false")" || true
    if [ -n "$out" ] && echo "$out" | python3 -c 'import json, sys
f = json.load(sys.stdin)["frames"][0]
sys.exit(0 if f["state"] in ("SUCCEEDED", "DEAD", "EATEN") else 1)'; then
      echo "$out"; return 0
    fi
    sleep 3
  done
  return 1
}
failed=0
check() {  # NAME JOB GPUS
  local frame log
  frame="$(frame_of "$2")" || { echo "FAIL $1: the frame did not end within ${timeout}s"; failed=1; return; }
  local id; id="$(echo "$frame" | python3 -c 'import json, sys; print(json.load(sys.stdin)["frames"][0]["id"])')"
  log="$(curl -sf -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/v1/frames/$id/log")" || log=""
  if FRAME="$frame" LOG="$log" NODES="$gpu_nodes" WANT="$3" python3 - <<'PY'
import json, os, re, sys
f = json.loads(os.environ["FRAME"])["frames"][0]
want = int(os.environ["WANT"])
m = re.search(r"^e2e: uuids=(\S*) cuda_visible=(\S*) cuda_count=(\S+)$", os.environ["LOG"], re.M)
problems = []
if f["state"] != "SUCCEEDED":
    problems.append(f"state {f['state']}")
if want and f["host"] not in os.environ["NODES"].split():
    problems.append(f"ran on {f['host']}, not a GPU node's worker")
if len(f["gpu_uuids"]) != want:
    problems.append(f"{len(f['gpu_uuids'])} GPUs leased")
if not m:
    problems.append("no e2e: line in its log")
else:
    uuids, visible, count = m.groups()
    if len([u for u in uuids.split(",") if u]) != want:
        problems.append(f"CUE_GPU_UUIDS={uuids}")
    # cuectl hides every device from a CPU frame with CUDA_VISIBLE_DEVICES=-1.
    if len([v for v in visible.split(",") if v and v != "-1"]) != want:
        problems.append(f"CUDA_VISIBLE_DEVICES={visible}")
    if count != "unavailable" and int(count) != want:
        problems.append(f"CUDA counts {count} devices")
print(("PASS" if not problems else "FAIL"), f"host={f['host']} gpus={f['gpu_uuids']}", "; ".join(problems))
sys.exit(1 if problems else 0)
PY
  then echo "  ^ $1"; else echo "  ^ $1"; failed=1; fi
}
check "GPU frame on a GPU node's worker, one device visible" "$gpu_job" 1
check "CPU frame with no device visible" "$cpu_job" 0
[ "$failed" = 0 ] && echo "k8s-e2e: all checks passed" || echo "k8s-e2e: some checks failed"
exit "$failed"
