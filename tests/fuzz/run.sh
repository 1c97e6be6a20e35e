#!/usr/bin/env bash
# Runs every libFuzzer target for a bounded time, each from a fresh corpus
# seeded with committed files, and fails on the first crash, leak, timeout
# or sanitizer report (the reproducer is kept in FUZZ_BUILD/crashes/).
# Usage: tests/fuzz/run.sh FUZZ_BUILD [SECONDS_EACH] [COPY_TASK]
# COPY_TASK (a built copy_task) writes a small training checkpoint to seed
# fuzz_checkpoint with; without it that target starts from the reference files.
set -euo pipefail
build=$1 seconds=${2:-45} copy_task=${3:-}
src=$(cd "$(dirname "$0")/../.." && pwd)
bin=$build/tests/fuzz
rm -rf "$build/corpus" "$build/crashes"
mkdir -p "$build/crashes"

seed() {  # seed TARGET FILES...: a fresh corpus for TARGET
  local dir=$build/corpus/$1
  mkdir -p "$dir"
  shift
  cp "$@" "$dir/"
}
mha=("$src"/tests/reference/mha/*.safetensors)
seed fuzz_safetensors "${mha[@]}"
seed fuzz_safetensors_file "${mha[@]}"
# PyTorch's optimizers before their first step, as checkpoints without buffers.
seed fuzz_checkpoint "${mha[@]}" "$src"/tests/reference/optim_*_step0.safetensors
seed fuzz_mha_tool "$src"/tests/reference/mha/*.in.safetensors
for task in copy reverse recall; do
  mkdir -p "$build/corpus/fuzz_seqdata"
  cp "$src/datasets/$task/valid.txt" "$build/corpus/fuzz_seqdata/$task.valid.txt"
done
if [ -n "$copy_task" ]; then
  work=$(mktemp -d)
  "$copy_task" --data "$src/datasets" --d-model 8 --heads 2 --steps 2 --target-acc 0 \
    --out "$work" --save "$build/corpus/fuzz_checkpoint/copy_task.safetensors" > /dev/null
  rm -rf "$work"
fi

# Inputs that once failed a target (tests/fuzz/regressions/TARGET/) are run again first.
for dir in "$src"/tests/fuzz/regressions/*/; do
  target=$(basename "$dir")
  mkdir -p "$build/corpus/$target"
  cp "$dir"* "$build/corpus/$target/"
done

declare -A max_len=([fuzz_seqdata]=40000)
failed=0
for target in fuzz_safetensors fuzz_safetensors_file fuzz_checkpoint fuzz_seqdata fuzz_mha_tool; do
  log=$build/$target.log
  if "$bin/$target" "$build/corpus/$target" -max_total_time="$seconds" \
       -max_len="${max_len[$target]:-20000}" -timeout=30 -rss_limit_mb=2560 \
       -artifact_prefix="$build/crashes/$target-" -close_fd_mask=1 > "$log" 2>&1; then
    echo "ok   $target: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -n 1)"
  else
    echo "FAIL $target (log: $log; reproducers in $build/crashes):"
    grep -v '^#[0-9]' "$log" | tail -n 40
    failed=1
  fi
done
exit $failed
