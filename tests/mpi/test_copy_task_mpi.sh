#!/usr/bin/env bash
# mpirun -np N of the copy task follows the curve of one process with the
# whole (global) batch: the same loss and accuracy at every step (to
# rounding), the same step at which it reaches 99.9%, the same held-out result.
# Only rank 0 writes the CSV.
# Usage: test_copy_task_mpi.sh COPY_TASK_BINARY MPIRUN SOURCE_DIR
set -uo pipefail
bin=$1 mpirun=$2 src=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$src"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Compares two CSVs (step,loss,accuracy,valid_accuracy) row by row: losses
# within a relative `tol`, accuracies within `acc_tol`.
same_curve() {
  awk -F, -v tol="$3" -v acc_tol="$4" '
    function abs(x) { return x < 0 ? -x : x }
    NR == FNR { a[FNR] = $0; n = FNR; next }
    { split(a[FNR], o, ",")
      if (FNR == 1) next
      if (o[1] != $1) { print "step " o[1] " vs " $1; bad = 1; exit }
      if (abs(o[2] - $2) > tol * abs($2)) { print "step " $1 ": loss " o[2] " vs " $2; bad = 1 }
      if (abs(o[3] - $3) > acc_tol) { print "step " $1 ": accuracy " o[3] " vs " $3; bad = 1 }
      if (($4 == "") != (o[4] == "") || abs(o[4] - $4) > acc_tol) {
        print "step " $1 ": validation " o[4] " vs " $4; bad = 1 } }
    END { if (FNR != n) { print "lengths differ: " n " vs " FNR; bad = 1 }; exit bad }' "$1" "$2"
}

# 1. Two processes, 32 sequences each, against one with 64 (float32).
one=$("$bin" --batch 64 --out "$work/one" | tail -n 1) || fail "one process failed"
two=$("$mpirun" --oversubscribe -np 2 "$bin" --batch 64 --out "$work/two") || fail "-np 2 failed: $two"
last=$(tail -n 1 <<<"$two")
[ "${one% seconds=*}" = "${last% seconds=*}" ] || fail "-np 2: '$last' vs one process: '$one'"
grep -q "gradient all-reduce: .* ms per step" <<<"$two" || fail "-np 2 reports no all-reduce time"
same_curve "$work/two/copy.csv" "$work/one/copy.csv" 1e-4 0.002 || fail "-np 2 curve differs"
echo "ok   -np 2 follows one process with the doubled batch: ${last% seconds=*}"

# 2. Three processes on an uneven split (22 + 21 + 21 of 64), in float64: the
#    same curve to 1e-10 for 12 steps, validation split over the ranks too.
opts=(--f64 --steps 12 --target-acc 0 --eval-every 4)
"$bin" "${opts[@]}" --out "$work/one64" > /dev/null || fail "one process (f64) failed"
"$mpirun" --oversubscribe -np 3 "$bin" "${opts[@]}" --out "$work/three" > /dev/null \
  || fail "-np 3 failed"
same_curve "$work/three/copy.csv" "$work/one64/copy.csv" 1e-10 0 || fail "-np 3 curve differs"
echo "ok   -np 3 (uneven batch) follows one process in float64 to 1e-10"

# 3. --save on -np 2, then --resume on -np 2 (every rank loads the file):
#    the same CSV and result as the -np 2 run never stopped.
"$mpirun" --oversubscribe -np 2 "$bin" --batch 64 --steps 8 --save "$work/ck.safetensors" \
  --out "$work/part" > /dev/null || fail "-np 2 --save failed"
resumed=$("$mpirun" --oversubscribe -np 2 "$bin" --batch 64 --resume "$work/ck.safetensors" \
  --out "$work/part" | tail -n 1) || fail "-np 2 --resume failed"
[ "${resumed% seconds=*}" = "${last% seconds=*}" ] || fail "resumed '$resumed' vs '$last'"
cmp -s "$work/part/copy.csv" "$work/two/copy.csv" || fail "resumed CSV differs from the -np 2 run's"
echo "ok   -np 2 --save, then --resume on every rank, reaches the same numbers"
