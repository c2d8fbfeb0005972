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
# New corpus entries go to fuzz/corpus/<target> (ignored by git); the committed seeds in
# fuzz/seeds/<target> are read-only inputs. Crashes land in fuzz/artifacts/<target>.
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

for target in frame_decoder header_block_decoder ws_reader relay_observer reverse_upstream frame_boundaries \
  exec_session tunnel_session; do
  # The session targets read event scripts: short ones reach every state and run faster.
  case "$target" in
    exec_session | tunnel_session) max_len=512 ;;
    *) max_len=4096 ;;
  esac
  mkdir -p "fuzz/corpus/$target"
  echo "== $target for ${seconds}s"
  cargo "${toolchain[@]}" fuzz run "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$seconds" -max_len="$max_len" -print_final_stats=1
done
