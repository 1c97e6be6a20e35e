#!/usr/bin/env bash
# The tiny_lm example end to end, on tiny sizes: its output, CSV and SVG, bit-for-bit
# reproducibility, --save/--resume and --generate without repeating flags (the text
# trained on included), every position scheme, and what it refuses with one line
# (issue 9): a checkpoint's step count out of range, a non-finite parameter, another
# text than the one trained on, sizes the model cannot be built with; a non-finite
# step that stops training without saving.
# Usage: test_tiny_lm.sh TINY_LM_BINARY [mpi|nompi]  (nompi: built without MPI)
set -euo pipefail
bin=$(realpath "$1") mpi=${2:-mpi}
work=$(mktemp -d)
. "$(dirname "${BASH_SOURCE[0]}")/safetensors_edit.sh"  # edit_meta, poke
trap 'rm -rf "$work"' EXIT
mkdir "$work/cwd"
cd "$work/cwd"  # anything written by mistake lands here, where it is seen
fail() { echo "FAIL: $*" >&2; exit 1; }
# Text enough for both splits, made here so the test needs no system files.
for i in $(seq 1 200); do echo "line $i: the quick brown fox jumps over the lazy dog"; done > "$work/text"
small=(--data "$work/text" --ctx 16 --d-model 16 --heads 2 --layers 2 --batch 4 --eval-every 3
       --eval-batches 2 --sample 40 --warmup 2)
sample_of() { sed -n '/^--- sample/,$p' <<<"$1" | head -n -1; }  # without the speed line

# run EXPECTED_RC ARGS...: runs tiny_lm, checks its exit status; its stderr in $msg.
run() {
  local want=$1 rc
  shift
  set +e; msg=$("$bin" "$@" 2>&1 >/dev/null); rc=$?; set -e
  [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want; said: $msg"
}
one_line() {  # SUBSTRING: $msg is one line, "tiny_lm: ...", holding SUBSTRING
  [ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == tiny_lm:* ]] && [[ $msg == *"$1"* ]] \
    || fail "expected one line with '$1', got: $msg"
}

# 1. A short run prints the baselines, progress (both losses in bits per byte), a
#    sample; writes the CSV and the SVG.
out=$("$bin" "${small[@]}" --steps 6 --out "$work/a")
grep -q "^baselines, validation bits/byte: unigram [0-9.]*, bigram [0-9.]*$" <<<"$out" || fail "baselines: $out"
grep -q "^step 6/6 | bits/byte: train [0-9.]*, valid [0-9.]* | [0-9]* tok/s" <<<"$out" || fail "progress: $out"
grep -q "^--- 40 bytes at" <<<"$out" || fail "no sample: $out"
[ "$(wc -l < "$work/a.csv")" -eq 7 ] || fail "CSV rows"
head -n 1 "$work/a.csv" | grep -qx "step,train_bits,valid_bits,lr,tokens_per_s" || fail "CSV header"
grep -q "<polyline" "$work/a.svg" && grep -q "validation" "$work/a.svg" || fail "SVG"
echo "ok   short run, CSV, SVG, sample"

# 2. The same seed gives the same curve and sample, bit for bit, at 1 and 2 threads.
for t in 1 2; do
  s1=$("$bin" "${small[@]}" --steps 6 --threads $t --out "$work/r1")
  s2=$("$bin" "${small[@]}" --steps 6 --threads $t --out "$work/r2")
  cmp -s <(cut -d, -f1-4 "$work/r1.csv") <(cut -d, -f1-4 "$work/r2.csv") || fail "runs differ ($t threads)"
  [ "$(sample_of "$s1")" = "$(sample_of "$s2")" ] || fail "samples differ ($t threads)"
done
echo "ok   reproducible (1 and 2 threads)"

# 2b. --bf16 (autocast: the products on bf16 operands) trains on a curve of its own, which
#     the same seed repeats bit for bit at 1 and 2 threads.
for t in 1 2; do
  "$bin" "${small[@]}" --steps 6 --threads $t --bf16 --out "$work/h1" > /dev/null
  "$bin" "${small[@]}" --steps 6 --threads $t --bf16 --out "$work/h2" > /dev/null
  cmp -s <(cut -d, -f1-4 "$work/h1.csv") <(cut -d, -f1-4 "$work/h2.csv") || fail "--bf16 runs differ ($t threads)"
done
# (r1 and h1 are both 2 threads' runs)
cmp -s <(cut -d, -f1-4 "$work/h1.csv") <(cut -d, -f1-4 "$work/r1.csv") && fail "--bf16 gave float32's curve"
echo "ok   --bf16 reproducible (1 and 2 threads), not float32's curve"

# 3. Stopped at step 3 and resumed with no flag repeated but --resume, not even
#    --data (the checkpoint names the text, by its full path: the resume runs from
#    another directory): the same curve and sample as the run never stopped;
#    --generate samples the same text.
relative=("${small[@]}")
relative[1]=text
(cd "$work" && "$bin" "${relative[@]}" --steps 3 --out p1 --save ck > /dev/null)
resumed=$("$bin" --resume "$work/ck" --steps 6 --sample 40 --out "$work/p2" --save "$work/ck6")
cmp -s <(cut -d, -f1-4 "$work/a.csv") <(cat <(cut -d, -f1-4 "$work/p1.csv") <(tail -n +2 "$work/p2.csv" | cut -d, -f1-4)) \
  || fail "resumed curve differs from the full run's"
[ "$(sample_of "$resumed")" = "$(sample_of "$out")" ] || fail "resumed sample differs"
gen=$("$bin" --generate "$work/ck6" --sample 40)
[ "$(head -n -1 <<<"$gen")" = "$(sample_of "$out")" ] || fail "--generate differs from the end of training"
# Resumed under the same --out: the plot holds the steps before the resume too, read
# from the CSV it continues (it began at the resume). Its training curve is the full
# run's (the two runs' x axes differ: the resumed one has no validation at step 0).
(cd "$work" && "$bin" "${relative[@]}" --steps 3 --out same --save ck_same > /dev/null)
"$bin" --resume "$work/ck_same" --steps 6 --sample 40 --out "$work/same" > /dev/null
train_ys() { grep -o 'stroke="#1f77b4" stroke-width="1.5" points="[^"]*"' "$1" \
               | grep -o '[0-9.]*,[0-9.]* ' | cut -d, -f2; }
[ "$(train_ys "$work/same.svg" | wc -l)" -eq 6 ] || fail "the resumed plot: $(train_ys "$work/same.svg")"
[ "$(train_ys "$work/same.svg")" = "$(train_ys "$work/a.svg")" ] || fail "the resumed plot's curve"
# Resumed in place: --save may be --resume's checkpoint.
cp "$work/ck" "$work/ck_in"
in_place=$("$bin" --resume "$work/ck_in" --steps 6 --sample 40 --out "$work/p3" --save "$work/ck_in")
[ "$(sample_of "$in_place")" = "$(sample_of "$out")" ] || fail "a resume in place differs"
[ "$("$bin" --generate "$work/ck_in" --sample 40 | head -n -1)" = "$(head -n -1 <<<"$gen")" ] \
  || fail "the checkpoint saved in place"
echo "ok   save, resume (the saved --data), generate"

# 3a. A CSV left empty (a run killed before its first rows were flushed) is continued
#     under its header: the resumed rows were written under none.
: > "$work/e.csv"
"$bin" --resume "$work/ck" --steps 6 --sample 0 --out "$work/e" > /dev/null
cmp -s <(cut -d, -f1-4 "$work/e.csv") <(sed -n '1p;5,$p' "$work/a.csv" | cut -d, -f1-4) \
  || fail "the CSV continued from an empty one: $(cat "$work/e.csv")"
echo "ok   an empty CSV continued under its header"

# 3b. A --data path of more than 1024 bytes: the checkpoint recorded it cut at 1023, and
#     --resume looked for a file that is not there.
q200=$(printf 'q%.0s' {1..200})
deep="$work/$q200/$q200/$q200/$q200/$q200"
mkdir -p "$deep"
cp "$work/text" "$deep/text"
"$bin" "${small[@]}" --data "$deep/text" --steps 3 --sample 0 --out "$work/d1" --save "$work/deep.ck" > /dev/null
"$bin" --resume "$work/deep.ck" --steps 6 --sample 0 --out "$work/d1" > /dev/null \
  || fail "--resume of a checkpoint trained on a path of ${#deep} bytes"
cmp -s <(cut -d, -f1-4 "$work/a.csv") <(cut -d, -f1-4 "$work/d1.csv") \
  || fail "the resumed run on a long --data path differs from the run never stopped"
echo "ok   a --data path of more than 1024 bytes is saved whole"

# 3c. A --bf16 run resumed with no flag repeated goes on in bf16, on the curve of the run
#     never stopped (the checkpoint did not record --bf16: the resume trained in float32).
"$bin" "${small[@]}" --steps 6 --bf16 --out "$work/b" > /dev/null
"$bin" "${small[@]}" --steps 3 --bf16 --out "$work/b1" --save "$work/bck" > /dev/null
"$bin" --resume "$work/bck" --steps 6 --out "$work/b2" > /dev/null
cmp -s <(cut -d, -f1-4 "$work/b.csv") <(cat <(cut -d, -f1-4 "$work/b1.csv") <(tail -n +2 "$work/b2.csv" | cut -d, -f1-4)) \
  || fail "a resumed --bf16 run left the curve of the run never stopped"
echo "ok   a --bf16 run resumes in bf16"

# 4. Another text than the checkpoint's: refused when it comes from the checkpoint
#    (the file changed since), used and named when --data gives it.
cp "$work/text" "$work/text.orig"
echo "one more line" >> "$work/text"
run 2 --resume "$work/ck" --steps 6 --out "$work/o"
one_line "$work/text: 10706 bytes, FNV-1a hash"
[[ $msg == *"but $work/ck was trained on 10692 bytes, FNV-1a hash "*"(give --data to train on it)" ]] \
  || fail "data: $msg"
said=$("$bin" --resume "$work/ck" --data "$work/text" --steps 4 --sample 0 --out "$work/o")
grep -q "^data: training on 10706 bytes, FNV-1a hash [0-9a-f]*, not on the 10692 bytes, FNV-1a hash [0-9a-f]* $work/ck was trained on$" <<<"$said" \
  || fail "--data over the checkpoint's text: $said"
cp "$work/text.orig" "$work/text"
echo "ok   another text refused, or named when --data gives it"


# 5. A checkpoint's step count outside [0, --steps] is refused (before: 2^31
#    aborted in the schedule, 2^53 started again at step 0, 2^32 + 1 at step 1).
for v in 2147483648 9007199254740992 4294967297 7; do
  cp "$work/ck" "$work/bad"
  edit_meta "$work/bad" optimizer.step "$v"
  run 2 --resume "$work/bad" --steps 6 --out "$work/o"
  one_line "$work/bad: optimizer.step $v is outside [0, --steps 6]"
done
echo "ok   checkpoint step counts outside [0, --steps] refused"

# 6. A NaN parameter in a checkpoint is refused at the load, by --resume (before: it
#    stopped at the first step) and --generate (before: SIGABRT in the sampler); the
#    checkpoint named by --save stays as it was.
cp "$work/ck" "$work/nan"
poke "$work/nan" ln_f.bias 0000c07f  # f32 NaN
cp "$work/ck" "$work/keep"
run 2 --resume "$work/nan" --steps 6 --out "$work/o" --save "$work/keep"
one_line "$work/nan: parameter ln_f.bias holds a NaN or an infinity"
cmp -s "$work/ck" "$work/keep" || fail "the good checkpoint changed"
run 2 --generate "$work/nan" --sample 10
one_line "$work/nan: parameter ln_f.bias holds a NaN or an infinity"
echo "ok   NaN parameter refused by --resume and --generate"

# 7. A finite but absurd AdamW state (a first moment of 3e38 over a second moment
#    of 0) makes the first resumed step's update infinite: training stops at the next
#    step, 5, with one line naming it, exit 1, and saves nothing over the checkpoint.
cp "$work/ck" "$work/huge"
poke "$work/huge" optimizer.exp_avg.ln_f.bias e6b1617f  # f32 3e38
poke "$work/huge" optimizer.exp_avg_sq.ln_f.bias 00000000
cp "$work/huge" "$work/huge.before"
run 1 --resume "$work/huge" --steps 6 --out "$work/o" --save "$work/huge"
one_line "non-finite loss at step 5: stopping, nothing saved"
cmp -s "$work/huge" "$work/huge.before" || fail "a non-finite model was saved over the checkpoint"
echo "ok   a non-finite step stops training, saves nothing"

# 7b. A checkpoint whose metadata claims sizes its tensors do not have (this one: the
#     ctx, width, depth and feed-forward of a 155 GB model, in a file of a few KB) is
#     refused by --generate and --resume before the model is built, with one line
#     naming the file and the first size that differs (before: the model was built
#     first, and the run aborted out of memory).
cp "$work/ck" "$work/crafted"
for kv in ctx:4096 d-model:4096 layers:64 ff:65536; do edit_meta "$work/crafted" "${kv%%:*}" "${kv#*:}"; done
for how in --generate --resume; do
  out_flag=(--out "$work/o")
  [ $how = --generate ] && out_flag=()  # --generate writes no CSV: it takes no --out
  run 2 $how "$work/crafted" --sample 10 "${out_flag[@]}"
  one_line "$work/crafted: the metadata says d-model 4096, but wte.weight is [256, 16]"
done
cp "$work/ck" "$work/crafted"
edit_meta "$work/crafted" layers 64
run 2 --generate "$work/crafted" --sample 10
one_line "$work/crafted: the metadata says layers 64, but blocks.2.linear1.weight is absent"
cp "$work/ck" "$work/crafted"
edit_meta "$work/crafted" ff 65536
run 2 --resume "$work/crafted" --out "$work/o"
one_line "$work/crafted: the metadata says ff 65536, but blocks.0.linear1.weight is [64, 16]"
cp "$work/ck" "$work/crafted"
edit_meta "$work/crafted" ctx 4096
run 2 --generate "$work/crafted" --sample 10
one_line "$work/crafted: the metadata says ctx 4096, but wpe.weight is [16, 16]"
echo "ok   a checkpoint's sizes checked against its tensors before the model is built"

# 7b. So is a safetensors file another program saved (here: one tensor, other
#     metadata), by --generate and --resume, with one line saying what it lacks.
header='{"__metadata__":{"task":"copy"},"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ printf "\\x$(printf %02x ${#header})"'\x00\x00\x00\x00\x00\x00\x00%s\x00\x00\x00\x00' "$header"
} > "$work/other"
run 2 --generate "$work/other" --sample 10
one_line "$work/other: no 'data' in the metadata, which this program's checkpoints record (saved by another program?)"
run 2 --resume "$work/other" --out "$work/o"
one_line "$work/other: no 'data' in the metadata"
echo "ok   another program's checkpoint refused, saying what it lacks"

# 7c. Flags that shape the model, given with --resume or --generate, must be what the
#     checkpoint records: --heads 4 on this 2-head checkpoint loaded (the same tensors)
#     and sampled from a model it never was; --pos rope dropped its learned positions'
#     meaning the same way. A size given is named as given, not as the metadata's.
run 2 --generate "$work/ck" --heads 4 --sample 10
one_line "$work/ck: saved by a run with other settings: --heads 2 there, 4 here"
run 2 --resume "$work/ck" --steps 6 --pos alibi --out "$work/o"
one_line "$work/ck: saved by a run with other settings: --pos learned there, alibi here"
run 2 --resume "$work/ck" --steps 6 --ff 32 --out "$work/o"
one_line "$work/ck: --ff 32 given here, but blocks.0.linear1.weight is [64, 16]"
run 0 --generate "$work/ck" --heads 2 --d-model 16 --sample 10  # the same: fine
echo "ok   flags that shape the model agree with the checkpoint's"

# 8. Every position scheme trains, and its KV-cache sampling after training is
#    what --generate gives from the checkpoint (a new process, the cached path only).
# (Through files: an untrained model's bytes may hold NUL.) The choices are the library's
# schemes (ag_pos_kind_name): a list of tiny_lm's own had lost sinusoidal.
grep -q -- "(learned|relative|t5|alibi|rope|sinusoidal; default learned)" <("$bin" --help) \
  || fail "--help's --pos choices: $("$bin" --help | grep -A1 -- --pos)"
for pos in learned relative t5 alibi rope sinusoidal; do
  "$bin" "${small[@]}" --pos "$pos" --steps 4 --out "$work/$pos" --save "$work/$pos.ck" > "$work/out"
  grep -aq "^step 4/4 | bits/byte: train [0-9.]*, valid [0-9.]*" "$work/out" || fail "--pos $pos"
  "$bin" --generate "$work/$pos.ck" --sample 40 > "$work/gen"
  cmp -s <(sed -n '/^--- sample/,$p' "$work/out" | head -n -1) <(head -n -1 "$work/gen") \
    || fail "--pos $pos: --generate differs from the sample after training"
done
grep -q '"pos":"rope"' "$work/rope.ck" && ! grep -q 'wpe.weight' "$work/rope.ck" || fail "rope checkpoint"
grep -q 'relative_attention_bias.weight' "$work/t5.ck" || fail "t5 checkpoint"
echo "ok   --pos learned, relative, t5, alibi, rope, sinusoidal"

# 9. Bad inputs: one line, exit 2, before anything is built or written.
run 2 --data "$work/missing"; one_line "No such file or directory"
# A path holding a newline split the error in two lines; a byte that is not UTF-8 showed
# as garbage. Both are written escaped, UTF-8 as it is.
run 2 --data "$work/mis"$'\n'"sing"; one_line "$work/mis\\nsing: No such file or directory"
run 2 --data "$work/é"$'\xe9'; one_line "$work/é\\xe9: No such file or directory"
: > "$work/empty"
run 2 --data "$work/empty"; one_line "0 bytes is too little text"
mkdir "$work/emptydir"  # qsort was given its NULL list of names (UBSan stopped the run)
run 2 --data "$work/emptydir"; one_line "$work/emptydir: 0 bytes is too little text"
run 2 --bogus; one_line "unknown option '--bogus'"
mkfifo "$work/fifo"  # opening it waited for a writer; /dev/zero was read without end
run 2 --data "$work/fifo"; one_line "$work/fifo: is neither a regular file nor a directory"
run 2 --data /dev/zero; one_line "/dev/zero: is neither a regular file nor a directory"
run 2 --ctx 0; one_line "--ctx needs an integer"
run 2 --seed -1; one_line "--seed needs an integer in [0, 9007199254740992], got '-1'"
# Read as a double, 2^53 + 1 rounded to 2^53, passed the bound and ran as that seed.
run 2 --seed 9007199254740993
one_line "--seed needs an integer in [0, 9007199254740992], got '9007199254740993'"
run 2 --lr " 0.1"; one_line "--lr needs a number in [0, 10], got ' 0.1'"
# The cosine from --lr down to --min-lr climbed instead when --min-lr was the larger.
run 2 --lr 0.001 --min-lr 0.002
one_line "--min-lr 0.002 is above --lr 0.001: the learning rate decays from --lr to --min-lr"
run 2 --generate "$work/a.csv"; one_line "header"
# --generate only samples: a --resume or a --save beside it was dropped without a word.
run 2 --generate "$work/ck" --save "$work/ck2" --sample 3
one_line "--generate only samples from its checkpoint: it takes no --save"
run 2 --generate "$work/ck" --resume "$work/ck" --sample 3
one_line "--generate only samples from its checkpoint: it takes no --resume"
# So were the flags of training: --steps trained nothing, --out and --data were not used.
for f in "--steps 9" "--out $work/g" "--data $work/text" "--lr 0.1" "--dropout 0"; do
  run 2 --generate "$work/ck" --sample 3 $f
  one_line "--generate only samples from its checkpoint: it takes no ${f%% *}"
done
run 2 "${small[@]}" --heads 3; one_line "--d-model 16 is not a multiple of --heads 3"
run 2 "${small[@]}" --d-model 6 --heads 2 --pos rope
one_line "--pos rope needs an even head width, got --d-model 6 / --heads 2 = 3"
# --f64 with --bf16 trained and sampled in float64, --bf16 silently dropped.
run 2 "${small[@]}" --f64 --bf16
one_line "--bf16 rounds the float32 products to bfloat16, but --f64 trains in float64, which autocast leaves alone: give one of them"
run 2 --pos xpos; one_line "--pos needs one of learned|relative|t5|alibi|rope|sinusoidal, got 'xpos'"
# A --save that cannot be written was found after training, which was lost.
run 2 "${small[@]}" --steps 2 --save "$work"
one_line "--save $work: is a directory, not a regular file"
run 2 "${small[@]}" --steps 2 --save "$work/missing/ck"
one_line "--save $work/missing/ck: the directory $work/missing: No such file or directory"
# --data a directory reads every file in it: a checkpoint, CSV or plot written there became
# text of the next run, and --resume refused the text as changed since.
mkdir "$work/texts"
cp "$work/text" "$work/texts/a.txt"
texts=$(realpath "$work/texts")
run 2 "${small[@]}" --data "$work/texts" --steps 2 --save "$work/texts/ck" --out "$work/tx"
one_line "--save $work/texts/ck goes in --data's directory ($texts), every file of which is read"
run 2 "${small[@]}" --data "$work/texts" --steps 2 --out "$work/texts/../texts/run"
one_line "--out $work/texts/../texts/run.csv goes in --data's directory ($texts)"
(cd "$work/texts" && run 2 "${small[@]}" --data . --steps 2 &&
  one_line "--out tiny_lm.csv goes in --data's directory ($texts)")
[ "$(ls "$work/texts")" = a.txt ] || fail "written in --data's directory: $(ls "$work/texts")"
# An SVG that cannot be written (a directory by its name) was found after training, named
# by a line without the program's name, and the run exited 0.
mkdir "$work/pd.svg"
run 2 "${small[@]}" --steps 2 --out "$work/pd"
one_line "--out $work/pd.svg: is a directory, not a regular file"
[ ! -e "$work/pd.csv" ] || fail "trained before refusing the plot's path"
# A FIFO by the CSV's name: the run stopped for good where it opened the CSV (before
# training, reading nothing). Refused with the other files, before anything is read.
mkfifo "$work/pf.csv"
set +e; msg=$(timeout 30 "$bin" "${small[@]}" --steps 2 --out "$work/pf" 2>&1 >/dev/null); rc=$?; set -e
[ $rc -eq 2 ] || fail "a FIFO by the CSV's name: exit $rc, said: $msg"
one_line "--out $work/pf.csv: is a FIFO, not a regular file"
# A --out prefix too long for "<prefix>.csv" wrote the CSV under a cut name.
c200=$(printf 'c%.0s' {1..200})
mkdir -p "$work/$c200/$c200/$c200/$c200"
run 2 "${small[@]}" --steps 2 --out "$work/$c200/$c200/$c200/$c200/$(printf 'e%.0s' {1..220})"
one_line ".csv: File name too long"
[ -z "$(ls -A "$work/$c200/$c200/$c200/$c200")" ] || fail "a cut name was written"
# A file the run writes that is a file it reads or writes besides (by another name or a
# link too): refused before training. --save wrote its checkpoint over the text.
cp "$work/text" "$work/text0"
ln -s "$work/text" "$work/link"
run 2 "${small[@]}" --steps 2 --save "$work/../$(basename "$work")/text" --out "$work/st"
one_line "--save $work/../$(basename "$work")/text is the file --data reads ($work/text): give them different files"
run 2 "${small[@]}" --steps 2 --save "$work/link" --out "$work/st"
one_line "--save $work/link is the file --data reads"
run 2 "${small[@]}" --steps 2 --save "$work/st.svg" --out "$work/st"
one_line "--save $work/st.svg is the file --out writes too ($work/st.svg)"
cp "$work/text" "$work/t.csv"
run 2 "${small[@]}" --steps 2 --out "$work/t" --data "$work/t.csv"
one_line "--out $work/t.csv is the file --data reads"
cmp -s "$work/text" "$work/t.csv" || fail "the text under --out's name was overwritten"
cmp -s "$work/text" "$work/text0" || fail "the text was overwritten"
[ ! -e "$work/st.csv" ] && [ ! -e "$work/st.svg" ] || fail "a refused run wrote its CSV or SVG"
rm "$work/text0" "$work/link" "$work/t.csv"
[ -z "$(ls -A "$work/cwd")" ] || fail "files written: $(ls -A "$work/cwd")"
echo "ok   errors"

# 9b. A batch whose ids and targets (1 GiB each here) the system cannot give: one line,
#     exit 2, nothing written (the allocation was unchecked, and the windows were written
#     through NULL: a segfault). Under 1.5 GB of address space, where the program runs at
#     all (a sanitizer's shadow memory needs terabytes of it: there, this cannot be asked).
if (ulimit -v 1500000 && "$bin" --help > /dev/null 2>&1); then
  set +e
  msg=$(ulimit -v 1500000 && "$bin" --data "$work/text" --valid 0.5 --ctx 4096 --batch 65536 \
        --d-model 8 --heads 2 --layers 1 --steps 1 --sample 0 --out "$work/big" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "a batch out of memory: exit $rc, said: $msg"
  one_line "--batch 65536 windows of --ctx 4096 bytes: out of memory for the batch"
  [ ! -e "$work/big.csv" ] || fail "a run refused for its batch wrote its CSV"
  echo "ok   a batch the memory cannot hold refused with one line"
fi

# 9b2. A plot that cannot be written at the end (here a file size limit; a full disk
#     alike) fails the run with one line and keeps an earlier plot whole: it was cut at
#     the limit, with a line naming no program, and the run exited 0.
echo "<svg>earlier</svg>" > "$work/limited.svg"
set +e
msg=$( (trap '' XFSZ; ulimit -f 2; "$bin" "${small[@]}" --steps 6 --out "$work/limited") 2>&1 >/dev/null)
rc=$?
set -e
[ $rc -eq 1 ] || fail "a plot that could not be written: exit $rc, said: $msg"
one_line "limited.svg"
[ "$(cat "$work/limited.svg")" = "<svg>earlier</svg>" ] || fail "the earlier plot was not kept"
echo "ok   a plot that cannot be written fails the run and keeps the earlier one"

# 9b3. A CSV whose rows a full disk refuses (/dev/full behind the name): they were lost
#      without a word and the run exited 0. Now one line naming it, exit 1, after the
#      checkpoint is saved.
if [ -w /dev/full ]; then
  ln -s /dev/full "$work/full.csv"
  run 1 "${small[@]}" --steps 3 --out "$work/full" --save "$work/full.ck"
  one_line "$work/full.csv: No space left on device"
  [ -s "$work/full.ck" ] || fail "a CSV that could not be written lost the checkpoint"
  echo "ok   a CSV that cannot be written fails the run after the checkpoint"
fi

# 9c. The lengths the README gives are what its own command counts (they had drifted).
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
count() { cat "$@" | grep -cvE '^\s*($|//)'; }
readme=$(tr '\n' ' ' < "$src/README.md")
n=$(count "$src/examples/tiny_lm/"{main.c,model.c,model.h})
[[ $readme == *"\`model.h\`: $n lines of C"* ]] || fail "README: main.c, model.c, model.h are not $n lines"
n=$(count "$src/examples/tiny_lm/"{options.c,options.h})
[[ $readme == *"in checkpoints) is $n lines more"* ]] || fail "README: options.c, options.h are not $n lines"
echo "ok   the README's line counts"

# 10. Built without MPI, tiny_lm refuses to run as N copies under mpirun (each would
#     train alone and write the same files).
if [ "$mpi" = nompi ]; then
  set +e; msg=$(OMPI_COMM_WORLD_SIZE=2 "$bin" "${small[@]}" --steps 1 2>&1 >/dev/null); rc=$?; set -e
  [ $rc -eq 2 ] || fail "N copies: exit $rc"
  one_line "started by mpirun on 2 processes, but built without MPI"
  echo "ok   a build without MPI refuses N copies"
fi
