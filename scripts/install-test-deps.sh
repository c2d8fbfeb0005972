#!/usr/bin/env bash
# Installs what the test suite needs on a fresh machine: the Go toolchain and spdystream (the
# foreign SPDY/3.1 peer), the Python Kubernetes client, headless Chromium (the browser test),
# the JavaScript Kubernetes client (tests/node), and umoci, podman and runc (the container
# image), asciinema (replays session recordings), Prometheus (promtool and the server, for the
# alerting rules and the dashboard). kubectl 1.27–1.33 and Node.js 20 come with the machine image. Also
# kubernetes-validate for the deployment manifests. Safe to run repeatedly.
set -euo pipefail

need_apt=()
command -v go >/dev/null 2>&1 || need_apt+=(golang-go)
[ -d /usr/share/gocode/src/github.com/docker/spdystream ] || [ -d /usr/share/gocode/src/github.com/moby/spdystream ] \
  || need_apt+=(golang-github-docker-spdystream-dev)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
# Replays session recordings (asciinema cat) in the recording tests.
command -v asciinema >/dev/null 2>&1 || need_apt+=(asciinema)
# Only if the image lacks it: the Node test needs Node.js >= 20.18 (undici 7).
command -v node >/dev/null 2>&1 || need_apt+=(nodejs npm)
# The container image (scripts/build-image.sh, tests/container_image.rs): umoci assembles it,
# podman runs it; runc too, because Debian 12's crun refuses hosts with cgroup v1 and v2 side
# by side.
command -v umoci >/dev/null 2>&1 || need_apt+=(umoci)
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
# deploy/prometheus and deploy/grafana (tests/monitoring_files.rs): promtool checks and unit-tests
# the alerting rules, and the server scrapes a real proxy to evaluate them and every panel's query.
{ command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; } || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import kubernetes' >/dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet 'kubernetes>=29'
fi
# Schema validation of the deployment manifests (schemas ship inside the package).
if ! "$PYTHON" -c 'import kubernetes_validate' >/dev/null 2>&1; then
  "$PYTHON" -m pip install --quiet 'kubernetes-validate>=1.33'
fi

# The S3-compatible store the upload tests start (moto's server mode, tests/common/s3.rs), in
# its own venv so that its pinned dependencies do not meet the kubernetes client's.
S3_VENV="${S3_VENV:-$HOME/.cache/kube-ws-proxy/moto}"
if [ ! -x "$S3_VENV/bin/moto_server" ]; then
  "$PYTHON" -m venv "$S3_VENV"
  "$S3_VENV/bin/pip" install --quiet 'moto[server]>=5.1,<6'
fi

# The JavaScript client and its dependencies, exactly as locked.
node_project="$(cd "$(dirname "$0")/.." && pwd)/tests/node"
if [ ! -d "$node_project/node_modules" ]; then
  (cd "$node_project" && npm ci --no-audit --no-fund --loglevel=error)
fi

# Playwright's driver for the web console's browser test (tests/console), as locked; it drives
# Debian's Chromium, it downloads no browser.
console_tests="$(cd "$(dirname "$0")/.." && pwd)/tests/console"
if [ ! -d "$console_tests/node_modules" ]; then
  (cd "$console_tests" && npm ci --no-audit --no-fund --loglevel=error)
fi
