#!/usr/bin/env bash
# attograd against PyTorch, interleaved (attograd, PyTorch as installed, PyTorch with kept
# memory; again; ...) so that a shared machine's slow spells fall on all three alike, for
# the speed table's MultiheadAttention shapes and the copy-task training step, at 1 and
# 2 threads. Prints each run's median (of the runs' own medians) and the ratios; the
# README's performance table comes from this output.
#
#   bash bench/compare.sh [rounds] [build dir]      (default 3 rounds, build/)
#
# Needs the Release build (bench_mha, bench_step) and Debian's python3-torch. PyTorch
# "kept" runs with glibc told to keep freed memory (see bench/pytorch_mha.py): claims are
# made against it. Each bench_mha run measures the sgemm ceiling itself; "%sgemm" is the
# median of those. OPENBLAS_CORETYPE is left as the environment sets it.
set -euo pipefail
rounds=${1:-3}
build=${2:-build}
cd "$(dirname "$0")/.."
py=/usr/bin/python3
[ -x "$build/bench/bench_mha" ] || { echo "compare.sh: build $build first (cmake --build $build)"; exit 2; }
"$py" -c "import torch" 2>/dev/null || { echo "compare.sh: needs python3-torch (apt-get install python3-torch)"; exit 2; }

shapes=("64 32 64 4" "32 64 128 4" "16 128 256 8" "8 512 512 8" "1 2048 512 8" "1 4096 256 4")
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== MultiheadAttention forward+backward (f32, self-attention): $rounds rounds, $(date -u +%F), load $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$rounds"); do
  for s in "${shapes[@]}"; do
    key=${s// /x}
    for t in 1 2; do
      line=$("$build/bench/bench_mha" --path packed $s "$t" | awk -F'|' '/ packed /')
      echo "$line" | awk -F'|' '{split($3, v, " "); print v[1]}' >> "$tmp/ag_${key}_$t"
      echo "$line" | awk -F'|' '{split($3, v, " "); sub("%", "", v[3]); print v[3]}' >> "$tmp/pct_${key}_$t"
      for mem in installed kept; do
        "$py" bench/pytorch_mha.py --memory "$mem" $s "$t" | awk -F'|' '/pytorch/ {split($3, v, " "); print v[1]}' \
          >> "$tmp/pt${mem}_${key}_$t"
      done
    done
  done
done
printf "%-14s %3s | %9s %7s | %11s %11s | %9s %9s\n" "B T E h" "thr" "attograd" "%sgemm" \
  "torch kept" "installed" "vs kept" "vs inst."
for s in "${shapes[@]}"; do
  key=${s// /x}
  for t in 1 2; do
    ag=$(median < "$tmp/ag_${key}_$t"); pct=$(median < "$tmp/pct_${key}_$t")
    kept=$(median < "$tmp/ptkept_${key}_$t"); inst=$(median < "$tmp/ptinstalled_${key}_$t")
    awk -v s="$s" -v t="$t" -v ag="$ag" -v pct="$pct" -v kept="$kept" -v inst="$inst" 'BEGIN {
      printf "%-14s %3d | %7.2fms %6.0f%% | %9.2fms %9.2fms | %8.2fx %8.2fx\n", s, t, ag, pct, kept, inst, kept / ag, inst / ag }'
  done
  a1=$(median < "$tmp/ag_${key}_1"); a2=$(median < "$tmp/ag_${key}_2")
  awk -v s="$s" -v a1="$a1" -v a2="$a2" 'BEGIN { printf "%-14s     attograd 2 threads / 1 thread: %.2fx\n", s, a1 / a2 }'
done

echo
echo "== copy-task training step (bench_step / bench/pytorch_step.py): $rounds rounds"
for round in $(seq "$rounds"); do
  "$build/bench/bench_step" > "$tmp/step_$round"
  # "1 thread  fwd bwd opt step | GFLOP/s x-ceiling speedup"; "2 threads, ops ..." has one
  # field more before the times
  awk '/^1 thread/ {print $6}' "$tmp/step_$round" >> "$tmp/st_1"
  awk '/^2 threads, ops/ {print $7}' "$tmp/step_$round" >> "$tmp/st_ops"
  awk '/^2 threads, batch/ {print $7}' "$tmp/step_$round" >> "$tmp/st_batch"
  awk '/^1 thread/ {print $9}' "$tmp/step_$round" >> "$tmp/st_x"
  for mem in installed kept; do
    "$py" bench/pytorch_step.py --memory "$mem" > "$tmp/pstep"
    awk '/^step/ {print $2}' "$tmp/pstep" >> "$tmp/pst_${mem}_1"
    awk '/^step/ {print $3}' "$tmp/pstep" >> "$tmp/pst_${mem}_2"
  done
done
s1=$(median < "$tmp/st_1"); sops=$(median < "$tmp/st_ops"); sb=$(median < "$tmp/st_batch")
sx=$(median < "$tmp/st_x")
k1=$(median < "$tmp/pst_kept_1"); k2=$(median < "$tmp/pst_kept_2")
i1=$(median < "$tmp/pst_installed_1"); i2=$(median < "$tmp/pst_installed_2")
awk -v s1="$s1" -v sops="$sops" -v sb="$sb" -v sx="$sx" -v k1="$k1" -v k2="$k2" -v i1="$i1" -v i2="$i2" 'BEGIN {
  printf "attograd 1 thread         %7.3f ms  (%.2fx the time of its flops at the sgemm ceiling)\n", s1, sx
  printf "attograd 2 threads, ops   %7.3f ms  (%.2fx one thread)\n", sops, s1 / sops
  printf "attograd 2 threads, batch %7.3f ms  (%.2fx one thread)\n", sb, s1 / sb
  printf "PyTorch kept memory       %7.3f ms (1 thread), %7.3f ms (2): attograd %.2fx and %.2fx faster\n", k1, k2, k1 / s1, k2 / sb
  printf "PyTorch as installed      %7.3f ms (1 thread), %7.3f ms (2)\n", i1, i2 }'
