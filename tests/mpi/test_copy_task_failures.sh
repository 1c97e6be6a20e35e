#!/usr/bin/env bash
# The copy task on 2 processes when something goes wrong (issue 15): a rank that
# hits an error ends the whole job within seconds, with one line from that rank
# naming it ("copy_task: rank R of 2: ..."); an error every rank hits is printed
# once ("copy_task: all 2 ranks: ..."); never a hang. ("Within seconds": within
# 10 s more than a job that does nothing takes.) And a rank killed mid-run
# ends the job within seconds, and the last periodic checkpoint resumes to the
# numbers of a run never stopped.
# Usage: test_copy_task_failures.sh COPY_TASK_BINARY MPIRUN SOURCE_DIR
set -uo pipefail
bin=$1 mpirun=$2 src=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$src"
fail() { echo "FAIL: $*" >&2; exit 1; }

prog=copy_task
# shellcheck source=jobs.sh
source "$here/jobs.sh"

job_limit "$bin"
echo "ok   a job that does nothing takes ${seconds} s: each error must end its job in ${limit} s"

base=(--steps 10 --target-acc 0)
"$bin" "${base[@]}" --out "$work/o" --save "$work/good.safetensors" > /dev/null ||
  fail "setup: a one-process run with --save failed"

# 1. --save into a directory that does not exist: rank 0 (which saves) says so
#    before training. (Rank 0 went on to train, failed to save at the end and
#    finalized MPI while rank 1 waited in the evaluation: a hang.)
job -np 2 "$bin" "${base[@]}" --out "$work/o1" --save "$work/nowhere/ck.safetensors"
ended "--save into a missing directory"
one_line "--save into a missing directory" "copy_task: rank 0 of 2: --save \
$work/nowhere/ck.safetensors: the directory $work/nowhere: No such file or directory"
[ ! -e "$work/o1" ] || fail "--save into a missing directory: refused only after training"
echo "ok   --save into a missing directory: rank 0's line, ${seconds} s, before training"

# 2. A save that fails mid-run (the path became a directory after the first
#    periodic save): rank 0 says so, and every rank stops.
"$mpirun" --oversubscribe -np 2 "$bin" --steps 100000 --target-acc 0 --save-every 2 \
  --save "$work/mid.safetensors" --out "$work/o2" 2> "$work/mid.out" > /dev/null &
pid=$!
for _ in $(seq 600); do [ -e "$work/mid.safetensors" ] && break; sleep 0.1; done
[ -e "$work/mid.safetensors" ] || { kill $pid; fail "mid-run save: no checkpoint after 60 s"; }
until mkdir "$work/mid.safetensors" 2> /dev/null; do rm -f "$work/mid.safetensors"; done
t0=$(date +%s)
for _ in $(seq 600); do kill -0 $pid 2> /dev/null || break; sleep 0.1; done
seconds=$(( $(date +%s) - t0 ))
kill -0 $pid 2> /dev/null && { kill $pid; fail "mid-run save: running 60 s after the failure"; }
wait $pid
rc=$?
out=$(cat "$work/mid.out")
ended "a save failing mid-run"
grep "^copy_task:" <<<"$out" | grep -qx "copy_task: rank 0 of 2: $work/mid.safetensors: .*" &&
  [ "$(grep -c "^copy_task:" <<<"$out")" -eq 1 ] || fail "a save failing mid-run: $out"
echo "ok   a save failing mid-run: rank 0's line, the job ended ${seconds} s after"

# 3. A checkpoint that does not load on rank 1 only: rank 1 says so. (Rank 1
#    finalized MPI while rank 0 trained: a hang.)
printf 'not a safetensors file' > "$work/bad.safetensors"
job -np 1 "$bin" "${base[@]}" --out "$work/o3" --resume "$work/good.safetensors" \
  : -np 1 "$bin" "${base[@]}" --out "$work/o3" --resume "$work/bad.safetensors"
ended "a bad checkpoint on rank 1"
line=$(grep "^copy_task:" <<<"$out")
[[ $line == "copy_task: rank 1 of 2: $work/bad.safetensors: "* ]] &&
  [ "$(wc -l <<<"$line")" -eq 1 ] || fail "a bad checkpoint on rank 1: $out"
echo "ok   a bad checkpoint on rank 1: ${seconds} s: $line"

# 4. The same bad checkpoint on every rank: printed once.
job -np 2 "$bin" "${base[@]}" --out "$work/o4" --resume "$work/bad.safetensors"
ended "a bad checkpoint on every rank"
line=$(grep "^copy_task:" <<<"$out")
[[ $line == "copy_task: all 2 ranks: $work/bad.safetensors: "* ]] &&
  [ "$(wc -l <<<"$line")" -eq 1 ] || fail "a bad checkpoint on every rank: $out"
echo "ok   a bad checkpoint on every rank: printed once"

# 5. Another valid checkpoint of the same run on rank 1 (its node's copy is
#    older, say): the ranks would train different models; rank 1 says so.
cp "$work/good.safetensors" "$work/other.safetensors"
perl -e 'open(my $h, "+<:raw", $ARGV[0]) or die; read($h, my $l, 8); my $n = unpack("Q<", $l);
         read($h, my $j, $n); $j =~ /"head\.bias":\{[^}]*"data_offsets":\[(\d+),/ or die;
         seek($h, 8 + $n + $1, 0); print $h pack("f<", 0.5);' "$work/other.safetensors"
job -np 1 "$bin" "${base[@]}" --out "$work/o5" --resume "$work/good.safetensors" \
  : -np 1 "$bin" "${base[@]}" --out "$work/o5" --resume "$work/other.safetensors"
ended "another checkpoint on rank 1"
one_line "another checkpoint on rank 1" \
  "copy_task: rank 1 of 2: $work/other.safetensors holds another model than rank 0's copy"
echo "ok   another checkpoint on rank 1: rank 1's line"

# 6. A dataset split that is wrong on rank 1 only (another task's file).
mkdir -p "$work/mixed/copy"
cp datasets/copy/train.txt datasets/copy/test.txt "$work/mixed/copy/"
cp datasets/recall/valid.txt "$work/mixed/copy/valid.txt"
job -np 1 "$bin" "${base[@]}" --out "$work/o6" \
  : -np 1 "$bin" "${base[@]}" --out "$work/o6" --data "$work/mixed"
ended "a bad dataset on rank 1"
one_line "a bad dataset on rank 1" "copy_task: rank 1 of 2: $work/mixed/copy/valid.txt: \
a recall dataset, where a copy dataset was expected"
echo "ok   a bad dataset file on rank 1: rank 1's line"

# 7. Flags that differ between ranks (fewer steps on rank 1 would have left
#    rank 0 waiting for it forever).
job -np 1 "$bin" "${base[@]}" --out "$work/o7" \
  : -np 1 "$bin" --steps 5 --target-acc 0 --out "$work/o7"
ended "other flags on rank 1"
one_line "other flags on rank 1" \
  "copy_task: rank 1 of 2: started with other flags than rank 0 (every rank needs the same)"
echo "ok   other flags on rank 1: rank 1's line"

# 8. A flag error (every rank's): printed once.
job -np 2 "$bin" --bogus
ended "an unknown flag"
one_line "an unknown flag" "copy_task: all 2 ranks: unknown option '--bogus' (see --help)"
echo "ok   an unknown flag: printed once"

# 9. A non-finite loss on every rank (an absurd Adam state in the checkpoint, as
#    in test_copy_task_checks.sh): printed once, naming the step, nothing saved.
cp "$work/good.safetensors" "$work/huge.safetensors"
perl -e 'open(my $h, "+<:raw", $ARGV[0]) or die; read($h, my $l, 8); my $n = unpack("Q<", $l);
         read($h, my $j, $n);
         for (["optimizer.exp_avg.head.bias", 3e38], ["optimizer.exp_avg_sq.head.bias", 0]) {
           $j =~ /"\Q$_->[0]\E":\{[^}]*"data_offsets":\[(\d+),/ or die;
           seek($h, 8 + $n + $1, 0); print $h pack("f<", $_->[1]); }' "$work/huge.safetensors"
cp "$work/good.safetensors" "$work/keep.safetensors"
job -np 2 "$bin" --steps 20 --target-acc 0 --out "$work/o9" --resume "$work/huge.safetensors" \
  --save "$work/keep.safetensors"
ended "a non-finite loss"
one_line "a non-finite loss" \
  "copy_task: all 2 ranks: step 12: the loss is inf; stopped without saving"
cmp -s "$work/good.safetensors" "$work/keep.safetensors" ||
  fail "a non-finite loss: the good checkpoint changed"
echo "ok   a non-finite loss on every rank: printed once, nothing saved"

# 10. The kill test: rank 1 is killed (SIGKILL) mid-run, saving every 5 steps.
#     The job ends within seconds, mpirun names rank 1, and --resume from the
#     last checkpoint on disk reaches the CSV, bit for bit, of a run never
#     stopped. (Rank 1 runs through a shell that leaves its pid, then execs.)
kill_opts=(--steps 100000 --target-acc 0 --save-every 5 --save "$work/k.safetensors"
           --out "$work/k")
"$mpirun" --oversubscribe -np 1 "$bin" "${kill_opts[@]}" \
  : -np 1 bash -c 'echo $$ > "$0"; exec "$@"' "$work/k.pid" "$bin" "${kill_opts[@]}" \
  2> "$work/k.out" > /dev/null &
pid=$!
for _ in $(seq 600); do [ -e "$work/k.safetensors" ] && break; sleep 0.1; done
[ -e "$work/k.safetensors" ] && [ -s "$work/k.pid" ] ||
  { kill $pid; fail "kill: no checkpoint after 60 s"; }
sleep 0.5  # mid-run: between checkpoints
kill -KILL "$(cat "$work/k.pid")"
t0=$(date +%s)
for _ in $(seq 600); do kill -0 $pid 2> /dev/null || break; sleep 0.1; done
seconds=$(( $(date +%s) - t0 ))
kill -0 $pid 2> /dev/null && { kill $pid; fail "kill: still running 60 s after rank 1 died"; }
wait $pid
rc=$?
out=$(cat "$work/k.out")
ended "rank 1 killed"
grep -q "rank 1 with PID .* exited on signal 9" <<<"$out" ||
  fail "kill: no message names rank 1: $out"
step=$(head -c 4096 "$work/k.safetensors" | grep -ao '"copy_task.step":"[0-9]*"' |
       grep -o '[0-9]\+')
[ -n "$step" ] && [ $((step % 5)) -eq 0 ] && [ "$step" -gt 0 ] ||
  fail "kill: the last checkpoint is at step '$step'"
# Resumed to 10 steps past it, against a run never stopped, on 2 processes both.
more=(--steps $((step + 10)) --target-acc 0)
resumed=$("$mpirun" --oversubscribe -np 2 "$bin" "${more[@]}" --out "$work/k" \
          --resume "$work/k.safetensors" 2>&1) || fail "kill: --resume failed: $resumed"
grep -qx "resumed $work/k.safetensors at step $step" <<<"$resumed" || fail "kill: $resumed"
"$mpirun" --oversubscribe -np 2 "$bin" "${more[@]}" --out "$work/full" > /dev/null 2>&1 ||
  fail "kill: the run never stopped failed"
cmp -s "$work/k/copy.csv" "$work/full/copy.csv" || fail "kill: the resumed CSV differs from \
a run never stopped: $(diff "$work/k/copy.csv" "$work/full/copy.csv" | head -5)"
echo "ok   rank 1 killed mid-run: the job ended ${seconds} s after (status $rc);" \
     "the checkpoint at step $step resumes to the same CSV"
