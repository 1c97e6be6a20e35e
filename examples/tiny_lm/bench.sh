#!/usr/bin/env bash
# Training tokens/s of tiny_lm against the same model in PyTorch (reference.py
# --bench), at 1 and 2 threads, the runs interleaved round by round so that a
# busy machine slows every contender alike; the best of the rounds is kept; both
# sides time the steps after the first 3.
# PyTorch runs twice: as installed, and with glibc told to keep freed memory
# (GLIBC_TUNABLES below), which spares it returning and re-faulting its
# activations on every step.
# Usage (from the source tree, after building):
#   bash examples/tiny_lm/bench.sh [ROUNDS] [STEPS]
set -euo pipefail
rounds=${1:-3} steps=${2:-30}
bin=build/examples/tiny_lm
kept="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
configs=("--d-model 64 --ctx 64 --batch 16" "--d-model 128 --ctx 128 --batch 32")
# Ours after 3 warm-up steps too: the CSV's tokens_per_s at step k is k*B*T over the
# time since the first step began, so steps 4..N took B*T*(N/tps_N - 3/tps_3) s.
ours() {  # threads, config...
  local t=$1; shift
  "$bin" "$@" --layers 4 --heads 4 --steps "$steps" --warmup 2 --eval-every 1000000 \
    --eval-batches 1 --sample 0 --threads "$t" --out /tmp/tiny_lm_bench > /dev/null
  awk -F, -v n="$steps" 'NR > 1 { tps[$1] = $5 }
    END { printf "%.0f\n", (n - 3) / (n / tps[n] - 3 / tps[3]) }' /tmp/tiny_lm_bench.csv
}
theirs() {  # env, threads, config...
  local e=$1 t=$2; shift 2
  env $e /usr/bin/python3 examples/tiny_lm/reference.py --bench "$steps" --threads "$t" "$@" |
    sed -n 's/tokens\/s //p'
}
best() { sort -n | tail -n 1; }
for c in "${configs[@]}"; do
  declare -A r=()
  for ((i = 0; i < rounds; i++)); do
    for t in 1 2; do
      r[ours$t]+="$(ours $t $c) "
      r[torch$t]+="$(theirs "X=1" $t $c) "
      r[kept$t]+="$(theirs "GLIBC_TUNABLES=$kept" $t $c) "
    done
  done
  echo "config: $c, 4 layers, f32, dropout 0.1 ($rounds rounds of $steps steps, best)"
  printf "%-32s %12s %12s\n" "" "1 thread" "2 threads"
  for k in ours torch kept; do
    a=$(tr ' ' '\n' <<<"${r[${k}1]}" | best); b=$(tr ' ' '\n' <<<"${r[${k}2]}" | best)
    name=$([ $k = ours ] && echo attograd || ([ $k = torch ] && echo "PyTorch" || echo "PyTorch, kept memory"))
    printf "%-32s %12s %12s\n" "$name tokens/s" "$a" "$b"
    eval "v_${k}1=$a v_${k}2=$b"
  done
  awk -v a="$v_ours1" -v b="$v_ours2" -v k="$v_kept1" -v t="$v_torch1" 'BEGIN {
    printf "attograd / PyTorch-kept at 1 thread: %.2f; / PyTorch: %.2f; attograd 2 threads / 1: %.2f\n",
           a / k, a / t, b / a }'
  unset r
done
