#!/usr/bin/env bash
# mpirun -np N of tiny_lm takes the steps one process takes on the whole (global)
# batch: in float64, without dropout, -np 2 with 4 sequences each equals -np 1 with
# 8 (and -np 3 with 8 split 3 + 3 + 2, weighted by the targets each scores), the
# training and validation losses at every step and the final parameters within
# 1e-12. Only rank 0 writes files; --resume loads on every rank; an error every rank
# meets is one line, for all of them, and the job ends.
# Usage: test_tiny_lm_mpi.sh TINY_LM_BINARY MPIRUN
set -uo pipefail
bin=$1 mpirun=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }
for i in $(seq 1 300); do echo "line $i: pack my box with five dozen liquor jugs"; done > text
opts=(--data text --ctx 16 --d-model 16 --heads 2 --layers 2 --batch 8 --steps 5 --warmup 2
      --eval-every 2 --eval-batches 2 --dropout 0 --f64 --sample 0)

# same_curve A.csv B.csv: step, train and validation bits agree within 1e-12.
same_curve() {
  awk -F, 'function abs(x) { return x < 0 ? -x : x }
    NR == FNR { a[FNR] = $0; n = FNR; next }
    FNR > 1 { split(a[FNR], o, ",")
      if (o[1] != $1 || abs(o[2] - $2) > 1e-12 || (o[3] != $3 && abs(o[3] - $3) > 1e-12)) {
        print "row " FNR ": " a[FNR] " vs " $0; bad = 1 } }
    END { if (FNR != n) { print "lengths differ"; bad = 1 }; exit bad }' "$1" "$2"
}
# same_params A B: every F64 tensor of two safetensors files within 1e-12 (and the
# same names and shapes); prints the largest difference.
same_params() {
  perl -e '
    sub tensors { my ($f) = @_; open(my $h, "<:raw", $f) or die "$f: $!"; local $/;
      my $all = <$h>; my $n = unpack("Q<", substr($all, 0, 8)); my $json = substr($all, 8, $n);
      my %t; while ($json =~ /"([^"]+)":\{"dtype":"F64","shape":\[([\d,]*)\],"data_offsets":\[(\d+),(\d+)\]\}/g) {
        $t{$1} = [$2, unpack("d<*", substr($all, 8 + $n + $3, $4 - $3))] } return \%t }
    my ($a, $b) = (tensors($ARGV[0]), tensors($ARGV[1])); my $worst = 0;
    die "no tensors" unless %$a; die "names differ" unless join(",", sort keys %$a) eq join(",", sort keys %$b);
    for my $k (keys %$a) { my ($x, $y) = ($a->{$k}, $b->{$k}); die "$k: shapes differ" if $x->[0] ne $y->[0];
      for my $i (1 .. $#$x) { my $d = abs($x->[$i] - $y->[$i]); $worst = $d if $d > $worst } }
    printf "%.1e\n", $worst; exit($worst <= 1e-12 ? 0 : 1)' "$1" "$2"
}

# 1. One process, the whole batch; then -np 2 and -np 3 on it.
"$bin" "${opts[@]}" --out one --save one.ck > /dev/null || fail "one process failed"
for np in 2 3; do
  out=$(timeout 120 "$mpirun" --oversubscribe -np $np "$bin" "${opts[@]}" --out np$np --save np$np.ck) \
    || fail "-np $np failed: $out"
  grep -q "^data-parallel on $np processes" <<<"$out" || fail "-np $np: $out"
  same_curve np$np.csv one.csv || fail "-np $np: the curve differs from one process's"
  worst=$(same_params np$np.ck one.ck) || fail "-np $np: final parameters differ by $worst"
  echo "ok   -np $np equals one process with the whole batch (f64: parameters within $worst)"
done
[ "$(ls *.csv | wc -l)" -eq 3 ] && [ "$(ls | grep -c '\.ck$')" -eq 3 ] || fail "files: $(ls)"

# 2. Saved on -np 2 at step 3, resumed on -np 2 (every rank loads it, not even --data
#    repeated): the same curve and parameters as the run never stopped.
timeout 120 "$mpirun" --oversubscribe -np 2 "$bin" "${opts[@]}" --steps 3 --out part \
  --save part.ck > /dev/null || fail "-np 2 --steps 3 failed"
timeout 120 "$mpirun" --oversubscribe -np 2 "$bin" --resume part.ck --steps 5 --out rest \
  --save rest.ck > /dev/null || fail "-np 2 --resume failed"
same_curve <(cat part.csv <(tail -n +2 rest.csv)) np2.csv || fail "resumed curve differs"
same_params rest.ck np2.ck > /dev/null || fail "resumed parameters differ"
echo "ok   -np 2 --save, then --resume on every rank: the same run"

# 3. An error every rank meets (a checkpoint that does not load) ends the job within
#    seconds with one line, for all of them.
t0=$(date +%s)
msg=$(timeout 60 "$mpirun" --oversubscribe -np 2 "$bin" --resume missing.ck 2>&1)
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "error: exit status $rc (124: still running after 60 s)"
[ $(( $(date +%s) - t0 )) -le 20 ] || fail "error: the job took $(( $(date +%s) - t0 )) s"
[ "$(grep -c '^tiny_lm: ' <<<"$msg")" -eq 1 ] || fail "error: not one line: $msg"
grep -q "^tiny_lm: all 2 ranks: missing.ck: " <<<"$msg" || fail "error: $msg"
echo "ok   an error ends the job with one line: $(grep '^tiny_lm: ' <<<"$msg")"
msg=$(timeout 60 "$mpirun" --oversubscribe -np 3 "$bin" "${opts[@]}" --batch 2 2>&1)
grep -qx "tiny_lm: all 3 ranks: --batch 2 is less than the 3 processes: each needs at least one window" <<<"$msg" \
  || fail "a batch smaller than the processes: $msg"
echo "ok   a batch smaller than the number of processes is refused"
