#!/usr/bin/env bash
# Runs each fuzz target (SPDY codec, WebSocket reader, relay observer, reverse translator, relay ping boundaries,
# the translated exec session and port-forward tunnel) for SECONDS (default: $FUZZ_SECONDS, else 20), one per
# core at a time (FUZZ_JOBS to change it), installing cargo-fuzz if missing.
#
#   fuzz/run.sh [SECONDS]
#   fuzz/run.sh --build-only   # build them only (scripts/test.sh does it while the tests run)
#
# All targets are built first, in one cargo invocation: they share the instrumented build of
# the crate and its dependencies, and link in parallel; each run then finds its target built.
# cargo-fuzz builds with sanitizer flags (-Zsanitizer=address) that only nightly compilers
# accept. RUSTC_BOOTSTRAP=1 lets the installed stable toolchain accept them too, so no nightly
# has to be fetched; set FUZZ_TOOLCHAIN=nightly to use a nightly toolchain instead.
# The targets and their input lengths are listed in fuzz/targets. The corpus each grows is kept
# in the repository, minimised (fuzz/corpus/<target>): new entries land there as untracked
# files; run fuzz/cmin.sh before committing them. The hand-written seeds in fuzz/seeds/<target>
# are read-only inputs. Crashes land in fuzz/artifacts/<target>.
set -euo pipefail

build_only=false
if [ "${1:-}" = --build-only ]; then
  build_only=true
  shift
fi
seconds=${1:-${FUZZ_SECONDS:-20}}
fuzz_dir=$(cd "$(dirname "$0")" && pwd)
cd "$fuzz_dir/.."

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi

toolchain=()
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
  toolchain=("+$FUZZ_TOOLCHAIN")
fi
export RUSTC_BOOTSTRAP=1

cargo "${toolchain[@]}" fuzz build
if $build_only; then
  exit 0
fi

# One target per core at a time, each for the full SECONDS; its output is printed when it ends.
jobs=${FUZZ_JOBS:-$(nproc)}
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
declare -A running=()
failed=0
reap() {
  local pid rc=0
  wait -n -p pid "${!running[@]}" || rc=$?
  cat "$logs/${running[$pid]}"
  if [ "$rc" != 0 ]; then
    echo "== ${running[$pid]} FAILED (exit $rc)"
    failed=1
  fi
  unset "running[$pid]"
}

while read -r target max_len <&3; do
  case "$target" in '' | '#'*) continue ;; esac
  mkdir -p "fuzz/corpus/$target"
  while [ ${#running[@]} -ge "$jobs" ]; do reap; done
  {
    echo "== $target for ${seconds}s"
    cargo "${toolchain[@]}" fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
      -max_total_time="$seconds" -max_len="$max_len" -print_final_stats=1
  } >"$logs/$target" 2>&1 &
  running[$!]=$target
done 3<"$fuzz_dir/targets"
while [ ${#running[@]} -gt 0 ]; do reap; done
exit "$failed"
