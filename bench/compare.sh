#!/usr/bin/env bash
# attograd against the silicon and against PyTorch, in one table: the peak (bench_peak),
# the products beside oneDNN when the build found it (bench_products), MultiheadAttention
# and the copy-task step beside PyTorch (bench_mha, bench_step, pytorch_mha.py,
# pytorch_step.py), the GPT-2-size step (tiny_lm's flags below) in f32 and bf16 beside
# PyTorch, and generation of the default tiny_lm model. The README's speed tables come
# from its output.
#
#   bash bench/compare.sh [--rounds N] [--build DIR] [SECTION...]
#       SECTION: peak products mha step gpt2 generation (default: all of them)
#
# Contenders take turns round by round (attograd, PyTorch, attograd, ...), so that a
# shared machine's slow spells fall on all of them; each figure is the median of the
# rounds. Percentages are of the peak measured in the same round on as many threads
# (bench/peak.h). PyTorch runs with glibc told to keep freed memory ("kept": claims are
# made against it; see bench/pytorch_mha.py) and, for MultiheadAttention and the copy
# task, also as installed. Needs the Release build and Debian's python3-torch;
# OPENBLAS_CORETYPE is left as the environment sets it. Say the load (it is printed):
# numbers from a busy machine are not the README's.
set -euo pipefail
rounds=3 build=build sections=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    peak|products|mha|step|gpt2|generation) sections+=("$1"); shift ;;
    *) echo "usage: bash bench/compare.sh [--rounds N] [--build DIR] [peak|products|mha|step|gpt2|generation...]"; exit 2 ;;
  esac
done
[ ${#sections[@]} -gt 0 ] || sections=(peak products mha step gpt2 generation)
cd "$(dirname "$0")/.."
py=/usr/bin/python3
kept="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
[ -x "$build/bench/bench_products" ] || { echo "compare.sh: build $build first (cmake --build $build)"; exit 2; }
"$py" -c "import torch" 2>/dev/null || { echo "compare.sh: needs python3-torch (apt-get install python3-torch)"; exit 2; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
want() { [[ " ${sections[*]} " == *" $1 "* ]]; }
echo "attograd compare.sh: $rounds rounds, $(date -u +%F), load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"

if want peak; then
  echo
  echo "== peak (bench/peak.h: 12 independent FMA chains; vdpbf16ps; reads of 512 MB)"
  "$build/bench/bench_peak"
fi

if want products; then
  for t in 1 2; do
    echo
    echo "== products, $t thread(s) (bench_products: median of $((2 * rounds + 1)) rounds)"
    "$build/bench/bench_products" --threads "$t" --rounds $((2 * rounds + 1))
  done
fi

if want mha; then
  shapes=("64 32 64 4" "32 64 128 4" "16 128 256 8" "8 512 512 8" "1 2048 512 8" "1 4096 256 4")
  echo
  echo "== MultiheadAttention forward+backward (f32, self-attention)"
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
  printf "%-14s %3s | %9s %7s | %11s %11s | %9s %9s\n" "B T E h" "thr" "attograd" "%peak" \
    "torch kept" "installed" "vs kept" "vs inst."
  for s in "${shapes[@]}"; do
    key=${s// /x}
    for t in 1 2; do
      ag=$(median < "$tmp/ag_${key}_$t"); pct=$(median < "$tmp/pct_${key}_$t")
      k=$(median < "$tmp/ptkept_${key}_$t"); i=$(median < "$tmp/ptinstalled_${key}_$t")
      awk -v s="$s" -v t="$t" -v ag="$ag" -v pct="$pct" -v k="$k" -v i="$i" 'BEGIN {
        printf "%-14s %3d | %7.2fms %6.0f%% | %9.2fms %9.2fms | %8.2fx %8.2fx\n", s, t, ag, pct, k, i, k / ag, i / ag }'
    done
    a1=$(median < "$tmp/ag_${key}_1"); a2=$(median < "$tmp/ag_${key}_2")
    awk -v s="$s" -v a1="$a1" -v a2="$a2" 'BEGIN { printf "%-14s     attograd 2 threads / 1 thread: %.2fx\n", s, a1 / a2 }'
  done
fi

if want step; then
  echo
  echo "== copy-task training step (bench_step / bench/pytorch_step.py)"
  for round in $(seq "$rounds"); do
    "$build/bench/bench_step" > "$tmp/step_$round"
    # "1 thread  fwd bwd opt step | GFLOP/s %peak speedup"; "2 threads, ops ..." has one
    # field more before the times
    awk '/^1 thread/ {print $6}' "$tmp/step_$round" >> "$tmp/st_1"
    awk '/^2 threads, ops/ {print $7}' "$tmp/step_$round" >> "$tmp/st_ops"
    awk '/^2 threads, batch/ {print $7}' "$tmp/step_$round" >> "$tmp/st_batch"
    awk '/^1 thread/ {sub("%", "", $9); print $9}' "$tmp/step_$round" >> "$tmp/st_pct"
    for mem in installed kept; do
      "$py" bench/pytorch_step.py --memory "$mem" > "$tmp/pstep"
      awk '/^step/ {print $2}' "$tmp/pstep" >> "$tmp/pst_${mem}_1"
      awk '/^step/ {print $3}' "$tmp/pstep" >> "$tmp/pst_${mem}_2"
    done
  done
  s1=$(median < "$tmp/st_1"); sops=$(median < "$tmp/st_ops"); sb=$(median < "$tmp/st_batch")
  sp=$(median < "$tmp/st_pct")
  k1=$(median < "$tmp/pst_kept_1"); k2=$(median < "$tmp/pst_kept_2")
  i1=$(median < "$tmp/pst_installed_1"); i2=$(median < "$tmp/pst_installed_2")
  awk -v s1="$s1" -v sops="$sops" -v sb="$sb" -v sp="$sp" -v k1="$k1" -v k2="$k2" -v i1="$i1" -v i2="$i2" 'BEGIN {
    printf "attograd 1 thread         %7.3f ms  (%.0f%% of the f32 peak)\n", s1, sp
    printf "attograd 2 threads, ops   %7.3f ms  (%.2fx one thread)\n", sops, s1 / sops
    printf "attograd 2 threads, batch %7.3f ms  (%.2fx one thread)\n", sb, s1 / sb
    printf "PyTorch kept memory       %7.3f ms (1 thread), %7.3f ms (2): attograd %.2fx and %.2fx faster\n", k1, k2, k1 / s1, k2 / sb
    printf "PyTorch as installed      %7.3f ms (1 thread), %7.3f ms (2)\n", i1, i2 }'
fi

if want gpt2; then
  # The GPT-2-size step: 12 layers of width 768, 12 heads, context 256, batch 4, bytes.
  # Its products, forward once and backward twice, per token: 24 E^2 per layer (q, k, v,
  # out, the two feed-forward layers) + 4 T E (the attention's two products, counted
  # whole although causal) and 2 E 256 for the tied head.
  E=768 H=12 L=12 T=256 B=4 steps=8
  flags="--d-model $E --heads $H --layers $L --ctx $T --batch $B --dropout 0"
  flop=$(awk -v E=$E -v L=$L -v T=$T -v B=$B 'BEGIN { printf "%.6e", 3 * B * T * (L * (24 * E * E + 4 * T * E) + 2 * E * 256) }')
  # Seconds a step over steps 4..N of a run (tiny_lm's CSV: tokens/s since the first step).
  ours() {  # threads, extra flags
    local t=$1; shift
    "$build/examples/tiny_lm" $flags "$@" --steps $steps --warmup 2 --eval-every 1000000 \
      --eval-batches 1 --sample 0 --threads "$t" --out "$tmp/gpt2" > /dev/null
    awk -F, -v n=$steps -v bt=$((B * T)) 'NR > 1 { tps[$1] = $5 }
      END { printf "%.4f\n", (n * bt / tps[n] - 3 * bt / tps[3]) / (n - 3) }' "$tmp/gpt2.csv"
  }
  theirs() {  # threads
    env GLIBC_TUNABLES=$kept "$py" examples/tiny_lm/reference.py --bench $((steps - 3)) \
      --threads "$1" --d-model $E --heads $H --layers $L --ctx $T --batch $B --dropout 0 |
      awk -v bt=$((B * T)) '/^tokens\/s/ { printf "%.4f\n", bt / $2 }'
  }
  bf16=$("$build/examples/tiny_lm" --help 2>&1 | grep -q -- --bf16 && echo yes || echo no)
  for round in $(seq "$rounds"); do
    for t in 1 2; do
      "$build/bench/bench_peak" f32 "$t" >> "$tmp/peak_$t"
      ours "$t" >> "$tmp/g_f32_$t"
      [ "$bf16" = no ] || ours "$t" --bf16 >> "$tmp/g_bf16_$t"
      theirs "$t" >> "$tmp/g_torch_$t"
    done
  done
  echo
  echo "== GPT-2-size step (tiny_lm $flags; $((steps - 3)) steps after 3, median of $rounds rounds; $flop flop a step)"
  printf "%-26s %12s %8s %12s %8s %10s\n" "" "1 thread" "%peak" "2 threads" "%peak" "2 / 1"
  for who in f32 bf16 torch; do
    [ -s "$tmp/g_${who}_1" ] || continue
    a=$(median < "$tmp/g_${who}_1"); b=$(median < "$tmp/g_${who}_2")
    p1=$(median < "$tmp/peak_1"); p2=$(median < "$tmp/peak_2")
    name=$([ $who = f32 ] && echo "attograd f32" || ([ $who = bf16 ] && echo "attograd bf16 (autocast)" || echo "PyTorch f32, kept memory"))
    awk -v n="$name" -v a="$a" -v b="$b" -v f="$flop" -v p1="$p1" -v p2="$p2" 'BEGIN {
      printf "%-26s %10.2f s %7.0f%% %10.2f s %7.0f%% %9.2fx\n", n, a, 100 * f / a / p1 / 1e9, b, 100 * f / b / p2 / 1e9, a / b }'
  done
  t1=$(median < "$tmp/g_torch_1"); t2=$(median < "$tmp/g_torch_2")
  for who in f32 bf16; do
    [ -s "$tmp/g_${who}_1" ] || continue
    a=$(median < "$tmp/g_${who}_1"); b=$(median < "$tmp/g_${who}_2")
    awk -v w="$who" -v a="$a" -v b="$b" -v t1="$t1" -v t2="$t2" 'BEGIN {
      printf "attograd %-4s against PyTorch kept: %.2fx (1 thread), %.2fx (2 threads)\n", w, t1 / a, t2 / b }'
  done
  [ "$bf16" = yes ] || echo "(this tiny_lm has no --bf16: the bf16 row is left out)"
fi

if want generation; then
  # The default tiny_lm model's decode speed: a model saved untrained (the speed does not
  # depend on the weights), then sampled.
  "$build/examples/tiny_lm" --steps 0 --sample 0 --save "$tmp/lm.safetensors" --out "$tmp/lm" > /dev/null
  for round in $(seq "$rounds"); do
    "$build/examples/tiny_lm" --generate "$tmp/lm.safetensors" --sample 4000 --threads 1 |
      sed -n 's/^--- [0-9]* bytes at \([0-9.]*\) bytes\/s ---$/\1/p' >> "$tmp/gen"
  done
  echo
  echo "== generation (the default tiny_lm model, 4000 bytes, 1 thread, median of $rounds)"
  echo "attograd: $(median < "$tmp/gen") bytes/s"
fi
