#!/usr/bin/env bash
# The copy-task example end to end: the result line, the accuracy target, the
# ablation, bit-for-bit reproducibility, and its errors.
# Usage: test_copy_task.sh COPY_TASK_BINARY SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$src"  # the example finds datasets/ from the source tree
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }

# 1. Default config: the last stdout line has the documented form, and the
#    held-out token accuracy reaches 99.9%.
out=$("$bin" --out "$work/a")
last=$(tail -n 1 <<<"$out")
[[ $last =~ ^test:\ token_acc=[0-9]\.[0-9]{4}\ seq_acc=[0-9]\.[0-9]{4}\ steps=[0-9]+\ seconds=[0-9]+\.[0-9]{2}$ ]] \
  || fail "last line has the wrong form: '$last'"
awk -v a="$(field token_acc "$last")" 'BEGIN { exit !(a >= 0.999) }' \
  || fail "default config reached only $last"
[ -s "$work/a/copy.csv" ] && [ -s "$work/a/copy_attention.svg" ] || fail "CSV or SVG missing"
head -n 1 "$work/a/copy.csv" | grep -qx "step,loss,accuracy,valid_accuracy" || fail "CSV header"
grep -q "<svg" "$work/a/copy_attention.svg" && grep -q "layer 1, head 4" "$work/a/copy_attention.svg" \
  || fail "SVG does not show every head"
echo "ok   default config: $last"

# 2. The ablation stays near chance (10 symbols): below 20%.
last=$("$bin" --no-attention --steps 100 --target-acc 0 --out "$work/b" | tail -n 1)
awk -v a="$(field token_acc "$last")" 'BEGIN { exit !(a < 0.2) }' || fail "ablation reached $last"
echo "ok   ablation: $last"

# 3. Same seed and thread count: the same loss curve, bit for bit.
for threads in 1 2; do
  "$bin" --steps 15 --target-acc 0 --threads $threads --dropout 0.1 --out "$work/r1" > /dev/null
  "$bin" --steps 15 --target-acc 0 --threads $threads --dropout 0.1 --out "$work/r2" > /dev/null
  cmp -s "$work/r1/copy.csv" "$work/r2/copy.csv" || fail "two runs with $threads thread(s) differ"
done
"$bin" --steps 15 --target-acc 0 --seed 2 --dropout 0.1 --out "$work/r3" > /dev/null
cmp -s "$work/r1/copy.csv" "$work/r3/copy.csv" && fail "a different seed gave the same curve"
echo "ok   reproducible bit for bit (1 and 2 threads)"

# 4. --save then --resume reaches the same numbers as a run never stopped:
#    the same CSV, bit for bit, and the same result (early stopping included).
full=$("$bin" --dropout 0.1 --out "$work/full" | tail -n 1)
"$bin" --dropout 0.1 --steps 8 --out "$work/part" --save "$work/ck.safetensors" > /dev/null
resumed=$("$bin" --dropout 0.1 --out "$work/part" --resume "$work/ck.safetensors" | tail -n 1)
cmp -s "$work/full/copy.csv" "$work/part/copy.csv" || fail "resumed CSV differs from the full run's"
[ "${full% seconds=*}" = "${resumed% seconds=*}" ] || fail "resumed '$resumed' vs full '$full'"
set +e
msg=$("$bin" --seed 9 --resume "$work/ck.safetensors" --out "$work/part" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -ne 0 ] && [[ $msg == *"saved by a run with other settings"* ]] || fail "resume with other settings: $msg"
# A step count in the checkpoint that is not a whole number is refused
# with one line (it was read with atoi: "x" restarted at step 0).
LC_ALL=C sed 's/"copy_task.step":"8"/"copy_task.step":"x"/' "$work/ck.safetensors" > "$work/bad_step.safetensors"
cmp -s "$work/ck.safetensors" "$work/bad_step.safetensors" && fail "test setup: copy_task.step not found"
set +e
msg=$("$bin" --dropout 0.1 --resume "$work/bad_step.safetensors" --out "$work/part2" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(wc -l <<<"$msg")" -eq 1 ] &&
  [[ $msg == *"copy_task.step 'x'"*"must be integers"* ]] ||
  fail "resume with a bad step count ($rc): $msg"
echo "ok   save and resume: $resumed"

# 4b. The learning rate of a resumed run is the checkpoint's, unless --lr is given: then
#     --lr's from the resumed step on, said on the line that reports the resume. (--lr
#     was ignored unsaid, and the banner showed the flag's value or the default, 0.01,
#     whatever rate the run trained with.)
out=$("$bin" --dropout 0.1 --steps 10 --target-acc 0 --lr 0.003 --out "$work/lr" \
      --resume "$work/ck.safetensors")
[[ $(sed -n 1p <<<"$out") == *"Adam lr 0.003,"* ]] || fail "banner with --lr: $(sed -n 1p <<<"$out")"
[[ $(sed -n 2p <<<"$out") == *"at step 8, Adam lr 0.003 from here (the checkpoint's was 0.01)" ]] ||
  fail "resume with --lr: $(sed -n 2p <<<"$out")"
[ "$(sed -n 10p "$work/lr/copy.csv")" != "$(sed -n 10p "$work/full/copy.csv")" ] ||
  fail "--lr 0.003 on --resume trained step 9 as the checkpoint's lr 0.01 does"
"$bin" --steps 2 --target-acc 0 --lr 0.005 --out "$work/lr5" --save "$work/lr5.ck" > /dev/null
out=$("$bin" --steps 3 --target-acc 0 --out "$work/lr5" --resume "$work/lr5.ck")
[[ $(sed -n 1p <<<"$out") == *"Adam lr 0.005,"* ]] &&
  [ "$(sed -n 2p <<<"$out")" = "resumed $work/lr5.ck at step 2" ] ||
  fail "resume of an --lr 0.005 run without --lr: $(sed -n 1,2p <<<"$out")"
echo "ok   a resumed run's learning rate: the checkpoint's, or --lr's when given"

# 5. Encoder-decoder with cross-attention learns the copy too.
last=$("$bin" --cross --out "$work/c" | tail -n 1)
awk -v a="$(field token_acc "$last")" 'BEGIN { exit !(a >= 0.999) }' || fail "cross reached $last"
echo "ok   cross-attention: $last"

# 6. Bad flags: exit status 2 and one line naming the problem.
for args in "--heads 0" "--task sort" "--d-model 30 --heads 4" "--lr abc" "--bogus" "--steps"; do
  set +e
  msg=$("$bin" $args 2>&1 >/dev/null)
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "'$args' exited $rc, expected 2"
  [ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == copy_task:* ]] || fail "'$args' said: $msg"
done
"$bin" --help | grep -q -- "--no-attention" || fail "--help"
echo "ok   flag errors"

# 7. A split file of another task (a recall file as copy/valid.txt) is one
#    line naming the file, not an abort deep in the model.
mkdir -p "$work/mixed/copy"
cp datasets/copy/train.txt datasets/copy/test.txt "$work/mixed/copy/"
cp datasets/recall/valid.txt "$work/mixed/copy/valid.txt"
set +e
msg=$("$bin" --data "$work/mixed" --out "$work/m" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "mixed datasets exited $rc"
[ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == *"copy/valid.txt: a recall dataset, where a copy dataset was expected"* ]] ||
  fail "mixed datasets said: $msg"
echo "ok   a split of another task is refused"

# 8. --bf16 (autocast: the products on bf16 operands) learns the copy too, on a loss
#    curve of its own, and two runs at a thread count give the same bits.
last=$("$bin" --bf16 --out "$work/h" | tail -n 1)
awk -v a="$(field token_acc "$last")" 'BEGIN { exit !(a >= 0.999) }' || fail "--bf16 reached $last"
cmp -s "$work/a/copy.csv" "$work/h/copy.csv" && fail "--bf16 gave float32's curve"
for threads in 1 2; do
  "$bin" --bf16 --steps 15 --target-acc 0 --threads $threads --dropout 0.1 --out "$work/h1" > /dev/null
  "$bin" --bf16 --steps 15 --target-acc 0 --threads $threads --dropout 0.1 --out "$work/h2" > /dev/null
  cmp -s "$work/h1/copy.csv" "$work/h2/copy.csv" || fail "two --bf16 runs with $threads thread(s) differ"
done
echo "ok   --bf16: $last"
