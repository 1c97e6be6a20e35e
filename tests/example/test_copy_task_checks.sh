#!/usr/bin/env bash
# The copy-task example refuses what it cannot do, with one line (issue 9):
# integer flags parsed in full, flags checked against the task, unknown
# options named, an empty --save rejected before any file is written, a
# checkpoint's step count validated, a NaN parameter in a checkpoint refused,
# and training stopped at the first non-finite loss or gradient without
# saving over a good checkpoint.
# Usage: test_copy_task_checks.sh COPY_TASK_BINARY SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d)
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
echo "ok   --length checked against the task"

# 3. An unknown option is named as such, last or not; a known one given last
#    without its value says so.
run 2 --out "$work/o" --bogus
one_line "unknown option '--bogus'"
run 2 --bogus --out "$work/o"
one_line "unknown option '--bogus'"
run 2 --out "$work/o" --steps
one_line "--steps needs a value"
echo "ok   unknown options and missing values"

# 4. Empty file and directory names are refused before any file is written.
for flag in --save --resume --out --data; do
  run 2 --steps 2 --target-acc 0 $flag ""
  one_line "$flag needs a value"
done
[ -z "$(ls -A "$work/cwd")" ] || fail "files written: $(ls -A "$work/cwd")"
echo "ok   empty names refused, nothing written"

# A checkpoint to tamper with: 10 steps, on a fixed configuration.
args=(--steps 10 --target-acc 0 --out "$work/o")
"$bin" "${data[@]}" "${args[@]}" --save "$work/good.safetensors" > /dev/null

# edit_meta FILE KEY VALUE: sets one metadata value of a safetensors file.
edit_meta() {
  perl -e '
    my ($f, $k, $v) = @ARGV;
    open(my $h, "<:raw", $f) or die "$f: $!"; local $/; my $all = <$h>; close $h;
    my $n = unpack("Q<", substr($all, 0, 8));
    my ($json, $data) = (substr($all, 8, $n), substr($all, 8 + $n));
    $json =~ s/"\Q$k\E":"[^"]*"/"$k":"$v"/ or die "no $k in $f";
    $json .= " " x ((8 - length($json) % 8) % 8);
    open($h, ">:raw", $f) or die "$f: $!"; print $h pack("Q<", length $json), $json, $data;' "$@"
}
# poke FILE TENSOR HEX: overwrites the first bytes of a tensor's data.
poke() {
  perl -e '
    my ($f, $t, $hex) = @ARGV;
    open(my $h, "+<:raw", $f) or die "$f: $!"; read($h, my $len, 8); my $n = unpack("Q<", $len);
    read($h, my $json, $n);
    $json =~ /"\Q$t\E":\{[^}]*"data_offsets":\[(\d+),/ or die "no $t in $f";
    seek($h, 8 + $n + $1, 0); print $h pack("H*", $hex);' "$@"
}

# 5. A checkpoint's step count is an integer in range, or the resume stops.
for v in -5 abc 99999999999 7x ""; do
  cp "$work/good.safetensors" "$work/bad.safetensors"
  edit_meta "$work/bad.safetensors" copy_task.step "$v"
  run 1 "${args[@]}" --steps 20 --resume "$work/bad.safetensors"
  one_line "copy_task.step '$v'"
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
