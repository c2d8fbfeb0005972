#!/usr/bin/env bash
# The one command that runs every test (README "Test it", docs/testing.md); CI runs exactly this.
# Installs prerequisites, checks formatting, builds once in release mode and runs all tests in
# parallel (unit, property, and the integration tests with real kubectl / Python / Go peers, all
# in one binary: tests/main.rs), the doc tests and smokes of the benchmark harness and the soak;
# lints every target and builds the fuzz targets while the tests run, then runs each fuzz target
# briefly. Ends with how long each step took (wall clock and CPU), also when one fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- Time per step: wall clock, and the CPU time (user + system) of everything it ran ----
scratch=$(mktemp -d)
started=$(date +%s)
: >"$scratch/steps"

# Seconds as m:ss.
mss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }

# Sets $cpu to the CPU seconds used so far by this shell's finished children. `times` runs in
# this shell (a command substitution would report the subshell's own, empty, account).
read_cpu() {
  local file="$scratch/times.$BASHPID"
  times >"$file"
  cpu=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); s += t[1] * 60 + t[2] }
                       printf "%d", s }' "$file")
}

# step NAME COMMAND...: runs COMMAND and records its times under NAME. A failure ends the run
# (set -e), after the summary.
step() {
  local name=$1 rc=0 t0 c0
  shift
  echo "==> $name"
  t0=$(date +%s)
  read_cpu
  c0=$cpu
  "$@" || rc=$?
  read_cpu
  printf '%7s %8s  %s%s\n' "$(mss $(($(date +%s) - t0)))" "$(mss $((cpu - c0)))" "$name" \
    "$([ "$rc" = 0 ] || echo "  FAILED (exit $rc)")" >>"$scratch/steps"
  return "$rc"
}

summary() {
  local rc=$? pid
  for pid in "${job_pid[@]}"; do
    kill -- "-$pid" 2>/dev/null || true
  done
  echo
  echo "== Time per step"
  printf '%7s %8s  %s\n' wall CPU step
  cat "$scratch/steps"
  printf '%7s %8s  %s\n' "$(mss $(($(date +%s) - started)))" "" \
    "total$([ "$rc" = 0 ] || echo ", failed (exit $rc)")"
  rm -rf "$scratch"
}
trap summary EXIT

# alongside NAME COMMAND...: starts step NAME in the background, in a process group of its own,
# its output kept until `finish NAME` prints it. A run that ends early ends it too.
declare -A job_pid=()
alongside() {
  local name=$1
  shift
  set -m
  (step "$name (in the background)" "$@") >"$scratch/$name.log" 2>&1 &
  job_pid[$name]=$!
  set +m
}
finish() {
  local rc=0
  wait "${job_pid[$1]}" || rc=$?
  unset "job_pid[$1]"
  cat "$scratch/$1.log"
  return "$rc"
}

# ---- The steps ----
# The installs (mostly downloads and unpacking) run while the release build compiles.
alongside "install test dependencies" scripts/install-test-deps.sh

step "cargo fmt --check" cargo fmt --all -- --check

# The web console's terminal and player, exactly as locked (build.rs bundles them into the
# binary; it would fetch them itself into the build's own folder without this).
step "console packages" npm ci --prefix console --no-audit --no-fund --loglevel=error

if cargo nextest --version >/dev/null 2>&1; then
  runner=(cargo nextest run --release)
else
  runner=(cargo test --release)
fi
# Everything the tests run: the library, the binary, the unit tests and the one integration-test
# binary, with the dev-dependencies' features; the doc tests and benches below reuse it.
step "build the tests (release)" "${runner[@]}" --no-run

finish "install test dependencies"

# The manifests in docker/ against the Kubernetes schemas (oldest and newest version we target).
# The kustomizations in deploy/ are rendered and validated by tests/deployment_files.rs.
validate_manifests() {
  for k in 1.27.0 1.33.0; do
    "${PYTHON:-python3}" -m kubernetes_validate -k "$k" --strict --quiet docker/*.yaml
  done
}
step "validate docker/*.yaml" validate_manifests

# While the tests run (they mostly wait on real clients, sockets and timers), at the lowest CPU
# priority so the tests keep theirs: clippy over every target, and the instrumented build of the
# fuzz targets. Neither can reuse the release build (clippy only checks; the fuzz build carries
# sanitizer instrumentation), and each has a target directory of its own because cargo locks one
# for the whole of a command.
target_dir=$(cd "${CARGO_TARGET_DIR:-target}" && pwd)
alongside clippy nice -n 19 \
  cargo clippy --release --all-targets --target-dir "$target_dir/clippy" -- -D warnings
alongside "fuzz build" nice -n 19 env CARGO_TARGET_DIR="$target_dir/fuzz" fuzz/run.sh --build-only

step "tests" "${runner[@]}" --no-fail-fast
step "doc tests" cargo test --release --doc
# A few seconds of the benchmark harness, so it keeps working (figures are not checked).
step "bench smoke: streaming" cargo bench --bench streaming -- --smoke
# Half a minute of the soak with a fault every 3 s: sessions untouched by a fault byte-exact,
# touched ones ended within their bound, victims cleaned up, nothing left behind.
step "soak smoke" cargo bench --bench soak -- --smoke
# The same with the audit log and recordings on: every session audited, every recording valid.
step "soak smoke, audited and recorded" cargo bench --bench soak -- --smoke --audit

finish clippy
finish "fuzz build"
step "fuzz" env CARGO_TARGET_DIR="$target_dir/fuzz" FUZZ_SECONDS="${FUZZ_SECONDS:-15}" fuzz/run.sh
