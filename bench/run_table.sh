#!/usr/bin/env bash
# The table of issue 26's "Done when", in one run, each target marked met or not:
#   - fp32 products on the GPT-2-small projections (the four forward shapes and their dX
#     and dW products) as % of the FMA peak, 1 and 2 threads; bf16 over fp32;
#   - MultiheadAttention forward+backward as % of the peak, 1 thread;
#   - the GPT-2-size step (tiny_lm's model: 12 x 768, 12 heads, context 256, batch 4, no
#     dropout) in fp32 and bf16 against PyTorch 1.13 with kept memory on one thread, and
#     on two threads against one;
#   - generation: the default tiny_lm model's bytes/s, and a GPT-2-size model's decode as
#     % of the memory read bandwidth.
#
#   bash bench/run_table.sh [--rounds N] [--build DIR] [--wall]
#
# Every figure is a median over N rounds (default 3) in which the contenders take turns
# (attograd f32, bf16, PyTorch, ...), and every % is of a peak (bench/peak.h) measured in
# the same process as the figure, on as many threads. One-thread figures are timed by the
# thread's CPU time (each program's --cpu, PyTorch's process time), which a busy machine
# inflates much less than the wall clock; --wall times them by the wall clock, as on a
# quiet machine. Two-thread figures are always wall time. The load is printed at the
# start and the end: read the numbers with it.
set -euo pipefail
rounds=3 build=build cpu=--cpu
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --wall) cpu=; shift ;;
    *) echo "usage: bash bench/run_table.sh [--rounds N] [--build DIR] [--wall]"; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
py=/usr/bin/python3
kept="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
b=$build/bench
[ -x "$b/bench_gpt2_step" ] || { echo "run_table.sh: build $build first"; exit 2; }
"$py" -c "import torch" 2>/dev/null || { echo "run_table.sh: needs /usr/bin/python3 with torch"; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
range() { sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.0f-%.0f%%", lo, hi}'; }
least() { sort -g | head -n 1; }
verdict() { awk -v x="$1" -v t="$2" -v dir="${3:-ge}" 'BEGIN {
  ok = dir == "ge" ? x >= t : x <= t; print ok ? "met" : "NOT met" }'; }
clock=$([ -n "$cpu" ] && echo "thread CPU time" || echo "wall clock")
echo "issue 26 table: $(date -u '+%F %H:%M UTC'), $rounds rounds, one thread by $clock, two by wall clock"
echo "load at start: $(uptime | sed 's/.*load average: //')"

# ---- Products -------------------------------------------------------------------------
# bench_products: a median of 2 N + 1 rounds (the contenders in turn) for each shape, the
# peak measured in the process. Columns: M N K ta tb | f32 GF %pk | bf16 GF %pk ratio | ...
for t in 1 2; do
  flags=$([ $t = 1 ] && echo "$cpu" || echo "--threads 2")
  "$b/bench_products" $flags --rounds $((2 * rounds + 1)) > "$tmp/products_$t"
done
gpt2_rows() { grep -E "\| (qkv|out|fc|proj) (forward|dX|dW)$" "$1"; }
f32_pct() { awk -F'|' '{split($2, v, " "); sub("%", "", v[2]); print v[2]}'; }
bf16_ratio() { awk -F'|' '{split($3, v, " "); sub("x", "", v[3]); print v[3]}'; }
echo
echo "== products (bench_products), 1 thread then 2"
cat "$tmp/products_1" "$tmp/products_2"
echo
echo "== fp32 products, GPT-2-small projections (1024 rows), % of the f32 FMA peak"
printf "%-14s %10s %10s %12s\n" product "1 thread" "2 threads" "bf16/f32 (1)"
while IFS= read -r line; do
  name=${line##*| }
  p1=$(echo "$line" | f32_pct); r1=$(echo "$line" | bf16_ratio)
  p2=$(grep -F "| $name" "$tmp/products_2" | f32_pct)
  printf "%-14s %9s%% %9s%% %11sx\n" "$name" "$p1" "$p2" "$r1"
done < <(gpt2_rows "$tmp/products_1")
# A peak read low at a product run's start (bench_products warns) makes its % too high:
# such a run's products are not judged.
misread() { grep -q '^warning: the f32 FMA peak' "$1"; }
f1=$(gpt2_rows "$tmp/products_1" | f32_pct | least)
f2=$(gpt2_rows "$tmp/products_2" | f32_pct | least)
r1=$(gpt2_rows "$tmp/products_1" | bf16_ratio | least)
att2=$(grep -E "\| attention block" "$tmp/products_2" | f32_pct | least)

# ---- MultiheadAttention ---------------------------------------------------------------
shapes=("64 32 64 4" "32 64 128 4" "16 128 256 8" "8 512 512 8" "1 2048 512 8" "1 4096 256 4")
for round in $(seq "$rounds"); do
  for s in "${shapes[@]}"; do
    "$b/bench_mha" $cpu --path packed $s 1 | awk -F'|' '/ packed /{split($3, v, " "); sub("%", "", v[3]); print v[3]}' \
      >> "$tmp/mha_${s// /x}"
  done
done
echo
echo "== MultiheadAttention forward+backward, f32, packed self-attention, 1 thread, % of the peak"
for s in "${shapes[@]}"; do printf "%-14s %5.0f%%\n" "$s" "$(median < "$tmp/mha_${s// /x}")"; done
demo=$(median < "$tmp/mha_64x32x64x4")
wide=$(for s in "${shapes[@]:1}"; do median < "$tmp/mha_${s// /x}"; done | least)

# ---- The GPT-2-size step --------------------------------------------------------------
# bench_gpt2_step runs f32 and bf16 step by step in one process (its own medians over 3
# steps after 2 of warm-up); PyTorch (examples/tiny_lm/reference.py --bench, the same
# model) runs 3 steps after 3 of warm-up. Then 1 and 2 threads in turn (wall clock).
E=768 T=256 B=4 L=12
flop=$(awk -v E=$E -v L=$L -v T=$T -v B=$B 'BEGIN { printf "%.6e", 3 * B * T * (L * (24 * E * E + 4 * T * E) + 2 * E * 256) }')
for round in $(seq "$rounds"); do
  "$b/bench_gpt2_step" $cpu --steps 3 > "$tmp/g"
  awk '/^f32 /{print $(NF - 3)}' "$tmp/g" >> "$tmp/g_f32"
  awk '/^bf16 \(autocast\)/{print $(NF - 3)}' "$tmp/g" >> "$tmp/g_bf16"
  awk '/f32 peak/{for (i = 1; i <= NF; i++) if ($i == "peak") print $(i + 1)}' "$tmp/g" >> "$tmp/g_peak"
  env GLIBC_TUNABLES=$kept OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 "$py" examples/tiny_lm/reference.py --bench 3 $cpu --threads 1 \
    --d-model $E --heads 12 --layers $L --ctx $T --batch $B --dropout 0 |
    awk -v bt=$((B * T)) '/^tokens\/s/ { printf "%.4f\n", bt / $2 }' >> "$tmp/g_torch"
  for t in 1 2; do
    "$b/bench_gpt2_step" --threads $t --steps 3 | awk '/^f32 /{print $(NF - 3)}' >> "$tmp/g_wall_$t"
  done
done
g32=$(median < "$tmp/g_f32"); g16=$(median < "$tmp/g_bf16"); gpk=$(median < "$tmp/g_peak")
gt=$(median < "$tmp/g_torch"); w1=$(median < "$tmp/g_wall_1"); w2=$(median < "$tmp/g_wall_2")
echo
echo "== GPT-2-size step (tiny_lm --d-model $E --heads 12 --layers $L --ctx $T --batch $B --dropout 0; $flop flop)"
awk -v a="$g32" -v b="$g16" -v p="$gpk" -v f="$flop" -v t="$gt" -v w1="$w1" -v w2="$w2" 'BEGIN {
  printf "attograd f32, 1 thread     %6.2f s  %3.0f%% of the f32 peak (%.0f GFLOP/s)\n", a, 100 * f / a / p / 1e9, p
  printf "attograd bf16, 1 thread    %6.2f s  %.2fx f32\n", b, a / b
  printf "PyTorch f32 kept, 1 thread %6.2f s  attograd f32 %.2fx faster, bf16 %.2fx\n", t, t / a, t / b
  printf "attograd f32, wall clock   %6.2f s (1 thread), %.2f s (2): %.2fx\n", w1, w2, w1 / w2 }'

# ---- Generation -----------------------------------------------------------------------
for round in $(seq "$rounds"); do
  "$b/bench_generate" $cpu --tiny-lm | sed -n 's/.* \([0-9]*\) bytes\/s .*/\1/p' >> "$tmp/gen_small"
  # f32 and bf16 (autocast) in turn: each one's % of the read bandwidth, and the median
  # of the bf16 / f32 tokens/s ratios of the interleaved pairs.
  "$b/bench_generate" $cpu --bf16 12 768 12 3072 60 1 > "$tmp/gen"
  awk -F'|' '$2 ~ / f32 *$/ {gsub("%", "", $5); split($5, v, " "); print v[2]}' "$tmp/gen" >> "$tmp/gen_big"
  awk -F'|' '$2 ~ / bf16 *$/ {gsub("%", "", $5); split($5, v, " "); print v[2]}' "$tmp/gen" >> "$tmp/gen_big16"
  sed -n 's/.*over f32.s: \([0-9.]*\)x.*/\1/p' "$tmp/gen" >> "$tmp/gen_ratio"
done
gs=$(median < "$tmp/gen_small"); gb=$(median < "$tmp/gen_big")
gb16=$(median < "$tmp/gen_big16"); gr=$(median < "$tmp/gen_ratio")
echo
echo "== generation, 1 thread"
echo "default tiny_lm model (bench_generate --tiny-lm): $gs bytes/s"
echo "GPT-2-size model (12 x 768, 60 tokens): f32 ${gb}% of the memory read bandwidth, bf16 ${gb16}%; bf16 ${gr}x f32's tokens/s"

# ---- The targets ----------------------------------------------------------------------
echo
echo "== issue 26, Done when (load at the end: $(uptime | sed 's/.*load average: //'))"
row() { printf "%-58s %-22s %s\n" "$1" "$2" "$3"; }
judged() { if misread "$tmp/products_$1"; then echo "peak misread: rerun"; else verdict "$2" "$3"; fi; }
row "fp32 products >= 90% of the peak, 1 thread (12 shapes)" "lowest $f1%" "$(judged 1 "$f1" 90)"
row "fp32 products >= 85% of the peak, 2 threads (12 shapes)" "lowest $f2%" "$(judged 2 "$f2" 85)"
row "  attention blocks >= 85%, 2 threads" "lowest $att2%" "$(judged 2 "$att2" 85)"
row "bf16 products >= 1.8x fp32 (12 shapes, 1 thread)" "lowest ${r1}x" "$(verdict "$r1" 1.8)"
row "MHA fwd+bwd >= 80% of the peak, E >= 128, 1 thread" "lowest $wide%" "$(verdict "$wide" 80)"
row "MHA fwd+bwd >= 65% of the peak, demo shape, 1 thread" "$demo%" "$(verdict "$demo" 65)"
pct=$(awk -v a="$g32" -v p="$gpk" -v f="$flop" 'BEGIN { printf "%.0f", 100 * f / a / p / 1e9 }')
row "GPT-2-size step fp32 >= 80% of the peak, 1 thread" "$pct% ($g32 s)" "$(verdict "$pct" 80)"
row "GPT-2-size step bf16 <= 2.2 s, 1 thread" "$g16 s" "$(verdict "$g16" 2.2 le)"
vs=$(awk -v t="$gt" -v a="$g16" 'BEGIN { printf "%.2f", t / a }')
row "GPT-2-size step bf16 >= 3x PyTorch kept memory, 1 thread" "${vs}x ($gt s)" "$(verdict "$vs" 3)"
vs=$(awk -v t="$gt" -v a="$g32" 'BEGIN { printf "%.2f", t / a }')
row "  (fp32 against PyTorch kept memory, 1 thread)" "${vs}x" ""
sc=$(awk -v a="$w1" -v b="$w2" 'BEGIN { printf "%.2f", a / b }')
row "GPT-2-size step, 2 threads >= 1.9x one (f32)" "${sc}x" "$(verdict "$sc" 1.9)"
row "generation, default tiny_lm model >= 50k bytes/s" "$gs" "$(verdict "$gs" 50000)"
row "generation, GPT-2 size f32 >= 70% of read bandwidth" "$gb%" "$(verdict "$gb" 70)"
row "generation, GPT-2 size bf16 about 2x f32 (>= 1.8x)" "${gr}x" "$(verdict "$gr" 1.8)"
