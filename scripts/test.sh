#!/usr/bin/env bash
# The one command that runs every test (README "Test it", docs/testing.md); CI runs exactly this.
# Installs prerequisites, checks formatting and lints, builds once in release mode and runs all
# tests in parallel (unit, property, integration with real kubectl / Python / Go peers), then
# runs each fuzz target briefly.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh

cargo fmt --all -- --check
# The manifests in docker/ against the Kubernetes schemas (oldest and newest version we target).
# The kustomizations in deploy/ are rendered and validated by tests/deployment_files.rs.
for k in 1.27.0 1.33.0; do
  "${PYTHON:-python3}" -m kubernetes_validate -k "$k" --strict --quiet docker/*.yaml
done
cargo clippy --release --all-targets -- -D warnings

if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --release --no-fail-fast
else
  cargo test --release --no-fail-fast
fi
cargo test --release --doc
# A few seconds of the benchmark harness, so it keeps working (figures are not checked).
cargo bench --bench streaming -- --smoke
# Half a minute of the soak with a fault every 3 s: sessions untouched by a fault byte-exact,
# touched ones ended within their bound, victims cleaned up, nothing left behind.
cargo bench --bench soak -- --smoke
# The same with the audit log and recordings on: every session audited, every recording valid.
cargo bench --bench soak -- --smoke --audit

FUZZ_SECONDS="${FUZZ_SECONDS:-15}" fuzz/run.sh
