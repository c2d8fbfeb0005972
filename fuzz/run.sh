#!/usr/bin/env bash
# Runs each fuzz target (SPDY codec, WebSocket reader, relay observer, reverse translator, relay ping boundaries,
# the translated exec session and port-forward tunnel) for SECONDS (default: $FUZZ_SECONDS, else 20), installing
# cargo-fuzz if missing.
#
#   fuzz/run.sh [SECONDS]
#
# cargo-fuzz builds with sanitizer flags (-Zsanitizer=address) that only nightly compilers
# accept. RUSTC_BOOTSTRAP=1 lets the installed stable toolchain accept them too, so no nightly
# has to be fetched; set FUZZ_TOOLCHAIN=nightly to use a nightly toolchain instead.
# The targets and their input lengths are listed in fuzz/targets. The corpus each grows is kept
# in the repository, minimised (fuzz/corpus/<target>): new entries land there as untracked
# files; run fuzz/cmin.sh before committing them. The hand-written seeds in fuzz/seeds/<target>
# are read-only inputs. Crashes land in fuzz/artifacts/<target>.
set -euo pipefail

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

while read -r target max_len <&3; do
  case "$target" in '' | '#'*) continue ;; esac
  mkdir -p "fuzz/corpus/$target"
  echo "== $target for ${seconds}s"
  cargo "${toolchain[@]}" fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -max_len="$max_len" -print_final_stats=1
done 3<"$fuzz_dir/targets"
