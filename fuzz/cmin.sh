#!/usr/bin/env bash
# Minimises the kept corpus of each fuzz target (fuzz/corpus/<target>, committed) to the inputs
# that add coverage, so that what a long run found can be committed without its bulk.
#
#   fuzz/cmin.sh [TARGET...]        # default: every target fuzz/run.sh runs
#
# Run it after a long fuzzing run and before committing fuzz/corpus. Like run.sh it uses the
# installed stable toolchain with RUSTC_BOOTSTRAP=1 (FUZZ_TOOLCHAIN=nightly for a nightly).
set -euo pipefail

fuzz_dir=$(cd "$(dirname "$0")" && pwd)
cd "$fuzz_dir/.."

toolchain=()
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
  toolchain=("+$FUZZ_TOOLCHAIN")
fi
export RUSTC_BOOTSTRAP=1

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^for target in \(.*\); do$/\1/p' "$fuzz_dir/run.sh" | tr ' ' '\n')
fi

for target in "${targets[@]}"; do
  echo "== $target: $(ls "fuzz/corpus/$target" | wc -l) inputs"
  cargo "${toolchain[@]}" fuzz cmin "$target" "fuzz/corpus/$target" -- -max_len=4096
  echo "== $target: $(ls "fuzz/corpus/$target" | wc -l) inputs kept"
done
