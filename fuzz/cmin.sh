#!/usr/bin/env bash
# Minimises the kept corpus of each fuzz target (fuzz/corpus/<target>, committed) to the inputs
# that add coverage, so that what a long run found can be committed without its bulk.
#
#   fuzz/cmin.sh [TARGET...]        # default: every target in fuzz/targets
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
  mapfile -t targets < <(grep -v '^#' "$fuzz_dir/targets" | awk 'NF { print $1 }')
fi

for target in "${targets[@]}"; do
  max_len=$(awk -v t="$target" '$1 == t { print $2 }' "$fuzz_dir/targets")
  echo "== $target: $(ls "fuzz/corpus/$target" | wc -l) inputs"
  cargo "${toolchain[@]}" fuzz cmin "$target" "fuzz/corpus/$target" -- -max_len="${max_len:-4096}"
  echo "== $target: $(ls "fuzz/corpus/$target" | wc -l) inputs kept"
done
