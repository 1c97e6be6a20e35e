#!/usr/bin/env bash
# The tiny_lm example end to end, on tiny sizes: its output, CSV and SVG, bit-for-bit
# reproducibility, --save/--resume and --generate without repeating flags, a NaN
# model that stops training without saving, and one-line errors.
# Usage: test_tiny_lm.sh TINY_LM_BINARY
set -euo pipefail
bin=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# Text enough for both splits, made here so the test needs no system files.
for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$work/text"
small=(--data "$work/text" --ctx 16 --d-model 16 --heads 2 --layers 2 --batch 4 --eval-every 3
       --eval-batches 2 --sample 40 --warmup 2)

# 1. A short run prints the baselines, progress, a sample; writes the CSV and the SVG.
out=$("$bin" "${small[@]}" --steps 6 --out "$work/a")
grep -q "^baselines, validation bits/byte: unigram [0-9.]*, bigram [0-9.]*$" <<<"$out" || fail "baselines: $out"
grep -q "^step 6/6 | train [0-9.]* nats | valid [0-9.]* bits/byte" <<<"$out" || fail "progress: $out"
grep -q "^--- 40 bytes at" <<<"$out" || fail "no sample: $out"
[ "$(wc -l < "$work/a.csv")" -eq 7 ] || fail "CSV rows"
head -n 1 "$work/a.csv" | grep -qx "step,train_loss,valid_bits,lr,tokens_per_s" || fail "CSV header"
grep -q "<polyline" "$work/a.svg" && grep -q "validation" "$work/a.svg" || fail "SVG"
echo "ok   short run, CSV, SVG, sample"

# 2. The same seed gives the same curve and sample, bit for bit, at 1 and 2 threads.
for t in 1 2; do
  s1=$("$bin" "${small[@]}" --steps 6 --threads $t --out "$work/r1" | sed -n '/^--- sample/,$p')
  s2=$("$bin" "${small[@]}" --steps 6 --threads $t --out "$work/r2" | sed -n '/^--- sample/,$p')
  cmp -s <(cut -d, -f1-4 "$work/r1.csv") <(cut -d, -f1-4 "$work/r2.csv") || fail "runs differ ($t threads)"
  [ "$(head -n -1 <<<"$s1")" = "$(head -n -1 <<<"$s2")" ] || fail "samples differ ($t threads)"
done
echo "ok   reproducible (1 and 2 threads)"

# 3. Stopped at step 3 and resumed with no flag repeated but --resume: the same
#    curve and sample as the run never stopped; --generate samples the same text.
"$bin" "${small[@]}" --steps 3 --out "$work/p1" --save "$work/ck" > /dev/null
resumed=$("$bin" --resume "$work/ck" --steps 6 --data "$work/text" --sample 40 --out "$work/p2" \
          --save "$work/ck6")
cmp -s <(cut -d, -f1-4 "$work/a.csv") <(cat <(cut -d, -f1-4 "$work/p1.csv") <(tail -n +2 "$work/p2.csv" | cut -d, -f1-4)) \
  || fail "resumed curve differs from the full run's"
full_sample=$(sed -n '/^--- sample/,$p' <<<"$out" | head -n -1)
[ "$(sed -n '/^--- sample/,$p' <<<"$resumed" | head -n -1)" = "$full_sample" ] || fail "resumed sample differs"
gen=$("$bin" --generate "$work/ck6" --sample 40)
[ "$(head -n -1 <<<"$gen")" = "$full_sample" ] || fail "--generate differs from the end of training"
echo "ok   save, resume, generate"

# 4. A NaN in the model stops training at once with one line, exit 1, and the
#    checkpoint on disk stays as it was.
cp "$work/ck" "$work/nan"
n=$(od -An -t u8 -N8 "$work/nan" | tr -d ' ')
printf '\x00\x00\xc0\x7f' | dd of="$work/nan" bs=1 seek=$((8 + n)) conv=notrunc status=none
cp "$work/nan" "$work/nan.before"
set +e
msg=$("$bin" --resume "$work/nan" --data "$work/text" --steps 6 --out "$work/n" --save "$work/nan" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -eq 1 ] && [[ $msg == *"non-finite loss at step 4: stopping, nothing saved"* ]] || fail "NaN: rc $rc, '$msg'"
cmp -s "$work/nan" "$work/nan.before" || fail "a NaN model was saved over the checkpoint"
echo "ok   NaN stops at its step, saves nothing"

# 5. Bad inputs: one line, exit 2.
check_error() {  # expected-substring, args...
  local want=$1; shift
  set +e; msg=$("$bin" "$@" 2>&1 >/dev/null); rc=$?; set -e
  [ $rc -eq 2 ] && [ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == *"$want"* ]] || fail "$* gave rc $rc: '$msg'"
}
: > "$work/empty"
check_error "No such file or directory" --data "$work/missing"
check_error "0 bytes is too little text" --data "$work/empty"
check_error "unknown option '--bogus'" --bogus
check_error "--ctx needs an integer" --ctx 0
check_error "header" --generate "$work/a.csv"
echo "ok   errors"
