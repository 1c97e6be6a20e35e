#!/usr/bin/env bash
# The copy-task example refuses what it cannot do, with one line (issue 9):
# integer flags parsed in full, flags checked against the task and the model
# before training, unknown options named, an empty --save rejected before any
# file is written and a --save that cannot work before training, a
# checkpoint's step count validated, a NaN parameter in a checkpoint refused,
# and training and fine-tuning stopped at the first non-finite loss or
# gradient without saving over a good checkpoint.
# Usage: test_copy_task_checks.sh COPY_TASK_BINARY SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d)
. "$(dirname "${BASH_SOURCE[0]}")/safetensors_edit.sh"  # edit_meta, poke
trap 'rm -rf "$work"' EXIT
mkdir "$work/cwd"
cd "$work/cwd"  # anything written by mistake lands here, where it is seen
data=(--data "$src/datasets")
fail() { echo "FAIL: $*" >&2; exit 1; }

# run EXPECTED_RC ARGS...: runs the example, checks its exit status, and
# leaves its stderr in $msg.
run() {
  local want=$1 rc
  shift
  set +e
  msg=$("$bin" "${data[@]}" "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want; said: $msg"
}
one_line() {
  [ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == copy_task:* ]] || fail "not one line: $msg"
  [[ $msg == *"$1"* ]] || fail "expected '$1' in: $msg"
}

# 1. Integer flags: the whole text, in range, no sign tricks.
for v in -5 abc 99999999999 " 5" +5 5x 0x10 ""; do
  run 2 --steps "$v" --out "$work/o"
  one_line "--steps"
done
for flag in --length --d-model --heads --batch --threads --eval-every --seed --layers; do
  run 2 $flag -1 --out "$work/o"
  one_line "$flag"
done
echo "ok   integer flags parsed in full"

# 2. Flags checked against the task before anything runs (recall: 16 pairs).
run 2 --task recall --length 17 --out "$work/o"
one_line "--length 17 is too long for task recall"
run 2 --length 17 --task recall --out "$work/o"
one_line "task recall"
run 2 --task recall --test-length 17 --out "$work/o"  # was an abort (134) after training
one_line "--test-length 17 is too long for task recall"
echo "ok   --length and --test-length checked against the task"

# 2a. --pos takes every scheme the library has (ag_pos_kind_name), in the order of
#     ag_pos_kind: a list of copy_task's own had lost sinusoidal.
grep -q -- "(none|relative|t5|alibi|rope|sinusoidal; default none)" <("$bin" --help) \
  || fail "--help's --pos choices: $("$bin" --help | grep -A2 -- --pos)"
run 0 --pos sinusoidal --steps 2 --target-acc 0 --out "$work/o_sin"
grep -q "^2," "$work/o_sin/copy.csv" || fail "--pos sinusoidal did not train"
run 2 --pos xpos
one_line "--pos needs one of none|relative|t5|alibi|rope|sinusoidal, got 'xpos'"
echo "ok   --pos: the library's schemes"

# 2b. Model flags that cannot work are refused before training (they were an
#     abort, exit 134, or an error after the whole training run).
run 2 --pos rope --d-model 12 --heads 4 --out "$work/o"
one_line "--pos rope rotates pairs of dimensions: a head's --d-model 12 / --heads 4 = 3 must \
be even"
run 2 --prune 5 --out "$work/o"
one_line "--prune 5 would leave a layer with no head: 1 layer of 4 heads can lose at most 3"
run 2 --prune 7 --layers 2 --out "$work/o"
one_line "--prune 7 would leave a layer with no head: 2 layers of 4 heads can lose at most 6"
# A scheme whose terms follow from the head count cannot lose heads: --prune with it
# trained, then aborted (exit 134). The reason is the library's.
run 2 --prune 1 --pos alibi --out "$work/o"
one_line "--prune cannot work with --pos alibi: mha_prune_heads: ALiBi's slopes depend on the \
head count"
run 2 --prune 1 --pos sinusoidal --out "$work/o"
one_line "--prune cannot work with --pos sinusoidal: mha_prune_heads: the sinusoidal bias's \
scales depend on the head count"
run 0 --prune 1 --pos rope --steps 2 --target-acc 0 --finetune-steps 1 --out "$work/o_rope"
run 2 --save-every 5 --out "$work/o"
one_line "--save-every needs --save"
run 2 --f64 --bf16 --out "$work/o"  # trained in float64, --bf16 silently dropped
one_line "--bf16 rounds the float32 products to bfloat16, but --f64 trains in float64, which \
autocast leaves alone: give one of them"
[ ! -e "$work/o" ] || fail "a refused run wrote $work/o"
# With every attention output replaced by zeros there are no heads to rank or prune: both
# were skipped without a word, exit 0.
run 2 --no-attention --prune 2 --out "$work/o"
one_line "--prune has no heads to work on with --no-attention"
run 2 --analyze-heads --no-attention --out "$work/o"
one_line "--analyze-heads has no heads to work on with --no-attention"
[ ! -e "$work/o" ] || fail "a refused run wrote $work/o"
echo "ok   --pos rope, --prune, --analyze-heads, --save-every and --f64 with --bf16 checked before training"

# 2c. A file the run writes that is another it reads or writes (by another name too):
#     --save over the CSV or the picture under --out, or --out's CSV over --resume's
#     checkpoint. --save may be --resume's (a run continued in place).
mkdir -p "$work/same"
run 2 --save "$work/same/copy.csv" --out "$work/same"
one_line "--save $work/same/copy.csv is the file --out writes too ($work/same/copy.csv)"
run 2 --save "$work/same/copy_attention.svg" --out "$work/same/../same"
one_line "--save $work/same/copy_attention.svg is the file --out writes too"
echo "not a checkpoint" > "$work/same/copy.csv"
run 2 --resume "$work/same/copy.csv" --out "$work/same"
one_line "--out $work/same/copy.csv is the file --resume reads ($work/same/copy.csv)"
[ "$(cat "$work/same/copy.csv")" = "not a checkpoint" ] || fail "--resume's file was written"
run 0 --steps 2 --save "$work/same/c.ck" --out "$work/same"
run 0 --steps 3 --resume "$work/same/c.ck" --save "$work/same/c.ck" --out "$work/same"
# The task's splits under --data: a --save onto one replaced the training data with a
# checkpoint, and the run exited 0.
mkdir "$work/ds" && cp -r "$src/datasets/copy" "$work/ds/"
run 2 --data "$work/ds" --steps 2 --save "$work/ds/copy/../copy/train.txt" --out "$work/same"
one_line "--save $work/ds/copy/../copy/train.txt is the file --data reads ($work/ds/copy/train.txt)"
cmp -s "$work/ds/copy/train.txt" "$src/datasets/copy/train.txt" || fail "the training data was written"
echo "ok   a file written over another the run reads or writes refused"

# 2c. A batch whose sequences (262 MB of each of its three arrays here) the system cannot
#     give: one line, exit 1 (the allocations were unchecked, and the batch was filled
#     through NULL: a segfault). Under 700 MB of address space, where the program runs at
#     all (a sanitizer's shadow memory needs terabytes of it: there, this cannot be asked).
if (ulimit -v 700000 && "$bin" --help > /dev/null 2>&1); then
  set +e
  msg=$(ulimit -v 700000 && "$bin" "${data[@]}" --length 500 --batch 65536 --steps 1 \
        --out "$work/o" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ $rc -eq 1 ] || fail "a batch out of memory: exit $rc, said: $msg"
  one_line "--batch 65536: out of memory for its 65536 sequences of 1001 tokens"
  echo "ok   a batch the memory cannot hold refused with one line"
fi

# 2d. A path holding a newline is written escaped: the error stays one line.
set +e; msg=$("$bin" --data "$work/da"$'\n'"ta" --out "$work/o" 2>&1 >/dev/null); set -e
one_line "$work/da\\nta/copy/train.txt: cannot open"
echo "ok   a path holding a newline named on one line"

# 2e. A learned position table has a row for each position of the longest sequences, those
#     of --test-length included, which the checkpoint does not record: resumed with another
#     --test-length, the load said only "size mismatch for 'pos_emb.weight'".
"$bin" "${data[@]}" --steps 2 --test-length 24 --out "$work/o" --save "$work/t24.ck" > /dev/null
run 1 --steps 3 --out "$work/o" --resume "$work/t24.ck"
one_line "$work/t24.ck: its position table pos_emb.weight has 49 rows and this run needs 33: \
resume with the --test-length it was saved with"
run 1 --steps 3 --test-length 20 --out "$work/o" --resume "$work/t24.ck"
one_line "pos_emb.weight has 49 rows and this run needs 41"
run 0 --steps 3 --test-length 24 --out "$work/o" --resume "$work/t24.ck"
echo "ok   a resume with another --test-length named"

# 3. An unknown option is named as such, last or not; a known one given last
#    without its value says so.
run 2 --out "$work/o" --bogus
one_line "unknown option '--bogus'"
run 2 --bogus --out "$work/o"
one_line "unknown option '--bogus'"
run 2 --out "$work/o" --steps
one_line "--steps needs a value"
# A value left out before another option: that option was taken for the value (--out
# --cross made a directory "--cross" and trained without cross-attention).
run 2 --steps 2 --out --cross
one_line "--out needs a value, got the option '--cross' (see --help)"
run 2 --save --help
one_line "--save needs a value, got the option '--help' (see --help)"
[ -z "$(ls -A "$work/cwd")" ] || fail "files written: $(ls -A "$work/cwd")"
# What was typed is quoted escaped: a newline in it split the one line in two.
run 2 --steps $'1\n2' --out "$work/o"
one_line "--steps needs an integer in [1, 100000000], got '1\\n2'"
run 2 $'--bo\ngus' --out "$work/o"
one_line "unknown option '--bo\\ngus'"
run 2 --pos $'\xce\xa9' --out "$work/o"
one_line "got '\\xce\\xa9'"
echo "ok   unknown options and missing values"

# 4. Empty file and directory names are refused before any file is written.
for flag in --save --resume --out --data; do
  run 2 --steps 2 --target-acc 0 $flag ""
  one_line "$flag needs a value"
done
[ -z "$(ls -A "$work/cwd")" ] || fail "files written: $(ls -A "$work/cwd")"
echo "ok   empty names refused, nothing written"

# 4b. A --save that cannot be written is refused before training, not after it.
run 1 --steps 2 --target-acc 0 --out "$work/o_save" --save "$work/nowhere/ck.safetensors"
one_line "--save $work/nowhere/ck.safetensors: the directory $work/nowhere: No such file or \
directory"
run 1 --steps 2 --target-acc 0 --out "$work/o_save" --save "$work"
one_line "--save $work: is a directory, not a regular file"
[ ! -e "$work/o_save" ] || fail "trained before refusing --save"
# An --out too long for the names of its files: they were cut ("copy_attention." for
# "copy_attention.svg") and written where no one looks. Refused before training.
c200=$(printf 'c%.0s' {1..200})
long="$work/$c200/$c200/$c200/$c200/$c200"
mkdir -p "$long"
run 1 --steps 2 --target-acc 0 --out "$long"
one_line "...: the name is too long ("
[ -z "$(ls -A "$long")" ] || fail "files written under a too-long --out: $(ls -A "$long")"
# The CSV or the picture under --out that cannot be written (a directory there): the
# picture was found out after training, with one line, and the run exited 0.
mkdir -p "$work/o_svg/copy_attention.svg" "$work/o_csv/copy.csv"
run 1 --steps 2 --target-acc 0 --out "$work/o_svg"
one_line "--out $work/o_svg/copy_attention.svg: is a directory, not a regular file"
[ ! -e "$work/o_svg/copy.csv" ] || fail "trained before refusing the picture's path"
run 1 --steps 2 --target-acc 0 --out "$work/o_csv"
one_line "--out $work/o_csv/copy.csv: is a directory, not a regular file"
# A CSV that a full disk (/dev/full behind the name) refuses while it is written: its
# rows were lost without a word and the run exited 0 saying "wrote .../copy.csv". Now
# exit 1, one line, after the test line (the results are still shown).
if [ -w /dev/full ]; then
  mkdir "$work/full_csv"
  ln -s /dev/full "$work/full_csv/copy.csv"
  set +e
  out=$("$bin" "${data[@]}" --steps 2 --target-acc 0 --out "$work/full_csv" 2>"$work/err")
  rc=$?
  set -e
  msg=$(cat "$work/err")
  [ "$rc" -eq 1 ] || fail "copy.csv on a full disk: exit $rc, said: $msg"
  one_line "$work/full_csv/copy.csv"
  [[ $msg == *"No space left on device"* ]] || fail "copy.csv on a full disk said: $msg"
  [[ $(tail -n 1 <<<"$out") == test:* ]] || fail "copy.csv on a full disk: no test line: $out"
  ! grep -q "wrote.*$work/full_csv/copy.csv" <<<"$out" || fail "claims it wrote copy.csv: $out"
fi
# A picture that cannot be written (here a file size limit of 4 KB, which the CSV of two
# steps fits under; a full disk alike): one line, exit 1, after the test line, and an
# earlier run's picture kept whole, where it was cut at the limit.
mkdir "$work/limited"
echo "<svg>earlier</svg>" > "$work/limited/copy_attention.svg"
set +e
out=$( (trap '' XFSZ; ulimit -f 4; "$bin" "${data[@]}" --steps 2 --target-acc 0 \
        --out "$work/limited") 2>"$work/err")
rc=$?
set -e
msg=$(cat "$work/err")
[ "$rc" -eq 1 ] || fail "a picture that could not be written: exit $rc, said: $msg"
one_line "$work/limited/copy_attention.svg"
[[ $msg == *"too large"* ]] || fail "a picture over the size limit said: $msg"
[[ $(tail -n 1 <<<"$out") == test:* ]] || fail "a picture not written: no test line: $out"
[ "$(cat "$work/limited/copy_attention.svg")" = "<svg>earlier</svg>" ] \
  || fail "the earlier picture was not kept whole"
[ -z "$(ls -A "$work/limited" | grep -v -x -e copy_attention.svg -e copy.csv)" ] \
  || fail "left behind: $(ls -A "$work/limited")"
echo "ok   a --save into a missing directory, or onto a directory, refused before training"

# A checkpoint to tamper with: 10 steps, on a fixed configuration.
args=(--steps 10 --target-acc 0 --out "$work/o")
"$bin" "${data[@]}" "${args[@]}" --save "$work/good.safetensors" > /dev/null

# A --bf16 checkpoint resumed without --bf16 is refused, as any other setting that differs
# (it was not recorded: the resume trained on in float32, off the curve of the run never
# stopped).
"$bin" "${data[@]}" "${args[@]}" --bf16 --save "$work/bf16.safetensors" > /dev/null
run 1 --steps 20 --target-acc 0 --out "$work/o" --resume "$work/bf16.safetensors"
one_line "saved by a run with other settings: --bf16 true there, false here"
echo "ok   a --bf16 checkpoint resumed without --bf16 refused"

# --profile times a training step on the batch of the last one taken: a resume at --steps
# takes none, and it ran on a batch never drawn (an abort on an embedding index).
run 1 "${args[@]}" --profile --resume "$work/good.safetensors"
one_line "$work/good.safetensors: saved at step 10, so up to --steps 10 no training step is left for --profile to time"
run 0 "${args[@]}" --steps 11 --profile --resume "$work/good.safetensors"
echo "ok   --profile of a resumed run with no step left refused"


# 5. A checkpoint's step count is an integer in range (at most the most --steps
#    allows: 2147483647 skipped training and exited 0), and it is the number of
#    steps the optimizer took, or the resume stops.
for v in -5 abc 99999999999 7x "" 2147483647 100000001; do
  cp "$work/good.safetensors" "$work/bad.safetensors"
  edit_meta "$work/bad.safetensors" copy_task.step "$v"
  run 1 "${args[@]}" --steps 20 --resume "$work/bad.safetensors"
  one_line "copy_task.step '$v'"
done
for v in 9 11; do
  cp "$work/good.safetensors" "$work/bad.safetensors"
  edit_meta "$work/bad.safetensors" copy_task.step $v
  run 1 "${args[@]}" --steps 20 --resume "$work/bad.safetensors"
  one_line "copy_task.step is $v, but the optimizer has taken 10 steps: they must be equal"
done
cp "$work/good.safetensors" "$work/bad.safetensors"
edit_meta "$work/bad.safetensors" copy_task.last_check 11
run 1 "${args[@]}" --steps 20 --resume "$work/bad.safetensors"
one_line "copy_task.last_check '11'"
echo "ok   checkpoint step counts validated"

# 6. A NaN parameter in a checkpoint is refused at the load, and the good
#    checkpoint named by --save stays as it was.
cp "$work/good.safetensors" "$work/keep.safetensors"
cp "$work/good.safetensors" "$work/nan.safetensors"
poke "$work/nan.safetensors" head.bias 0000c07f  # f32 NaN
run 1 "${args[@]}" --steps 20 --resume "$work/nan.safetensors" --save "$work/keep.safetensors"
one_line "parameter head.bias holds a NaN"
cmp -s "$work/good.safetensors" "$work/keep.safetensors" || fail "the good checkpoint changed"
echo "ok   NaN parameter refused at load"

# 7. A finite but absurd Adam state (a first moment of 3e38 over a second
#    moment of 0: the step an absurd learning rate takes) makes the first
#    resumed step's update infinite: training stops at the next step, 12,
#    with one line naming it, exits non-zero, and does not save over the
#    good checkpoint.
cp "$work/good.safetensors" "$work/huge.safetensors"
poke "$work/huge.safetensors" optimizer.exp_avg.head.bias e6b1617f  # f32 3e38
poke "$work/huge.safetensors" optimizer.exp_avg_sq.head.bias 00000000
run 1 "${args[@]}" --steps 20 --resume "$work/huge.safetensors" --save "$work/keep.safetensors"
one_line "copy_task: step 12: "
one_line "the loss is inf; stopped without saving"
cmp -s "$work/good.safetensors" "$work/keep.safetensors" || fail "the good checkpoint changed"
ls "$work" | grep -q '\.tmp\.' && fail "temporary files left: $(ls "$work")"
echo "ok   non-finite step stops training, nothing saved"

# 8. Fine-tuning after --prune stops at its first non-finite loss, names the
#    step, exits non-zero and saves nothing (it went on, and saved). The model:
#    the good checkpoint with symbol 9's embedding at 1e38, and validation and
#    test splits without a 9, so that training is over, the head analysis and
#    the test are finite, and the first fine-tuning batch overflows.
mkdir -p "$work/no9/copy"
cp "$src/datasets/copy/train.txt" "$work/no9/copy/"
for split in valid test; do
  awk 'data && /9/ { next } data { rows[++n] = $0; next } { head[++h] = $0 } /^data$/ { data = 1 }
       END { for (i = 1; i <= h; i++) print (head[i] ~ /^count / ? "count " n : head[i])
             for (i = 1; i <= n; i++) print rows[i] }' \
    "$src/datasets/copy/$split.txt" > "$work/no9/copy/$split.txt"
done
tune=(--data "$work/no9" --steps 10 --target-acc 0 --out "$work/o9")
"$bin" "${tune[@]}" --save "$work/good9.safetensors" > /dev/null
cp "$work/good9.safetensors" "$work/tok9.safetensors"
poke "$work/tok9.safetensors" tok_emb.weight "$(printf '%0.s99c4967e' $(seq 64))" $((9 * 64 * 4))
cp "$work/good9.safetensors" "$work/keep9.safetensors"
set +e
msg=$("$bin" "${tune[@]}" --resume "$work/tok9.safetensors" --prune 1 --finetune-steps 5 \
      --save "$work/keep9.safetensors" 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -eq 1 ] || fail "fine-tuning a model that overflows exited $rc: $msg"
one_line "copy_task: fine-tuning step 1: the loss is nan; stopped without saving"
cmp -s "$work/good9.safetensors" "$work/keep9.safetensors" || fail "the good checkpoint changed"
echo "ok   a non-finite fine-tuning step stops the run, nothing saved"
