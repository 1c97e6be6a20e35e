#!/usr/bin/env bash
# A rank that fails ends the whole job within seconds, with a message, and
# the checkpoint rank 0 saved last still loads.
# Usage: test_dist_failures.sh DIST_FAILURES_BINARY MPIRUN [CASE]
# CASE: failures (the default: a rank dies, cannot load its file, or turns NaN), shapes
# (the ranks' stores differ in shape), steps (a rank ends before the others), dtypes and
# dtypes3 (the ranks' stores differ in dtype, on 2 and 3 ranks), empty (one rank's store
# is empty), lengths3 (on 3 ranks, one store small enough to gather, the others not), steps3 (steps
# on 3 ranks), sum and sum3 (a rank sums values where the others all-reduce, on 2 and 3
# ranks), sumcount (the ranks sum different counts), calls and calls3 (on 2 and 3 ranks, a
# rank broadcasts the parameters where another sums, all-reduces or has ended), early
# (ag_dist_abort before ag_dist_init), again (ag_dist_init after ag_dist_finalize), served
# (on 3 ranks, a rank whose store agrees still gets rank 0's values when another's differs),
# leftring (a rank that saw another's farewell in the ring still finalizes).
set -uo pipefail
bin=$1 mpirun=$2 case=${3:-failures} np=2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Runs the job with a 60 s guard; sets out, rc and seconds.
job() {
  local t0=$(date +%s%N)
  out=$(timeout 60 "$mpirun" --oversubscribe -np "$np" "$bin" "$@" 2>&1)
  rc=$?
  seconds=$(( ($(date +%s%N) - t0) / 1000000000 ))
}

# in_time LABEL: the job ended within 10 s more than starting and ending one costs here.
# That cost (many seconds for a sanitizer build on a loaded machine) is measured only for a
# job that took more than 10 s, from one that only starts and ends MPI; a job waiting
# forever is stopped by the guard at 60 s.
in_time() {
  [ $seconds -le 10 ] && return
  local took=$seconds saved_out=$out saved_rc=$rc
  job again "$work/none"
  [ $took -le $((seconds + 10)) ] \
    || fail "$1: the job took $took s to end (one that only starts and ends: $seconds s)"
  out=$saved_out rc=$saved_rc seconds=$took
}

# ends_as MODE LABEL LINE: the job in MODE ends within 10 s (in_time), not in success, printing a
# line that matches LINE (an extended regular expression); LABEL names it in the output.
ends_as() {
  job "$1" "$work/ck.safetensors"
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "$2: exit status $rc (124: still running after 60 s)"
  in_time "$2"
  grep -qxE "$3" <<<"$out" || fail "$2: expected '$3' in: $out"
  echo "ok   $2: the job ends in ${seconds} s: $(grep -xE "$3" <<<"$out" | head -n 1)"
}
# ends_with MODE LINE: the case ends as ends_as says, and so does the script.
ends_with() { ends_as "$1" "$1" "$2"; exit 0; }
# reports SPEC LINE: the job whose rank r makes the r-th call of SPEC ends as ends_as says.
reports() { ends_as "calls:$1" "$1 on $np ranks" "$2"; }
# What a rank says of rank $1 that is elsewhere while it broadcasts the parameters, and
# what a rank in a sum or the all-reduce says of rank $1 that broadcasts.
differ=": the ranks' calls differ"
b_sum() { echo "dist_broadcast_params: rank $1 is in ag_dist_sum where this rank broadcasts the parameters$differ"; }
b_grads() { echo "dist_broadcast_params: rank $1 is in the gradients' all-reduce \(ag_dist_allreduce_grads\) where this rank broadcasts the parameters$differ"; }
b_end() { echo "dist_broadcast_params: rank $1 has ended \(ag_dist_finalize\) while this rank broadcasts the parameters$differ"; }
sum_b() { echo "dist_sum: rank $1 is in ag_dist_broadcast_params where this rank sums values$differ"; }
grads_b() { echo "dist_allreduce_grads: rank $1 is in ag_dist_broadcast_params where this rank is in the gradients' all-reduce$differ"; }
# A rank broadcasts the parameters (rank 0 sends them, the others receive) where another
# sums, all-reduces the gradients or has ended. The broadcast was collectives: ranks in a
# sum or the all-reduce waited for each other forever, and the farewell of a rank that had
# ended was taken for its store's layout ("rank 1's store (0 parameters, 1 f32 elements)
# differs from rank 0's").
if [ "$case" = calls ]; then
  reports bcast,sum "attograd: rank (0 of 2: $(b_sum 1)|1 of 2: $(sum_b 0))"
  reports sum,bcast "attograd: rank (0 of 2: $(sum_b 1)|1 of 2: $(b_sum 0))"
  reports bcast,grads "attograd: rank (0 of 2: $(b_grads 1)|1 of 2: $(grads_b 0))"
  reports grads,bcast "attograd: rank (0 of 2: $(grads_b 1)|1 of 2: $(b_grads 0))"
  reports bcast,end "attograd: rank 0 of 2: $(b_end 1)"
  reports end,bcast "attograd: rank 1 of 2: $(b_end 0)"
  exit 0
fi
# The same on three ranks, the odd one out rank 1 (it receives the broadcast, or does not
# take it) or rank 0 (it sends it, or does not); grads gathers 8 values, ring all-reduces
# 2^20 on a ring, whose ranks send to the next rank only.
if [ "$case" = calls3 ]; then
  np=3
  reports bcast,sum,bcast "attograd: rank (0 of 3: $(b_sum 1)|1 of 3: $(sum_b 0))"
  reports sum,bcast,bcast "attograd: rank (0 of 3: $(sum_b 1)|[12] of 3: $(b_sum 0))"
  reports bcast,grads,bcast "attograd: rank (0 of 3: $(b_grads 1)|1 of 3: $(grads_b 0))"
  reports grads,bcast,bcast "attograd: rank (0 of 3: $(grads_b 1)|[12] of 3: $(b_grads 0))"
  reports bcast,ring,bcast "attograd: rank 1 of 3: $(grads_b 0)"
  reports ring,bcast,bcast "attograd: rank (0 of 3: $(grads_b 2)|1 of 3: $(b_grads 0))"
  reports bcast,end,bcast "attograd: rank 0 of 3: $(b_end 1)"
  reports end,bcast,bcast "attograd: rank [12] of 3: $(b_end 0)"
  exit 0
fi

# ag_dist_abort before ag_dist_init: the line, without a rank (there is no job yet) and
# under attograd's name (the program's comes with ag_dist_init), and the exit, where
# MPI_Abort before MPI_Init made Open MPI complain that it was "called before MPI_INIT
# was invoked" and could not "guarantee that all other processes were killed".
if [ "$case" = early ]; then
  job early "$work/ck.safetensors"
  [ $rc -eq 1 ] || fail "early: exit status $rc, not 1"
  grep -qx "attograd: stopped before ag_dist_init" <<<"$out" || fail "early: no line in: $out"
  ! grep -q "MPI_INIT" <<<"$out" || fail "early: MPI_Abort before MPI_Init: $out"
  echo "ok   early: the job ends in ${seconds} s: $(grep "^attograd:" <<<"$out" | head -n 1)"
  exit 0
fi

# ag_dist_finalize twice, then ag_dist_init: the second finalize does nothing, and the
# start returns -1 with a line, where MPI_Comm_dup after MPI_Finalize ended the process
# with Open MPI's complaint.
if [ "$case" = again ]; then
  job again "$work/ck.safetensors"
  [ $rc -eq 0 ] || fail "again: exit status $rc, not 0 (3: the second start did not fail)"
  line="attograd: dist_init: MPI has ended in this process (ag_dist_finalize or MPI_Finalize) and cannot start again"
  [ "$(grep -cxF "$line" <<<"$out")" -eq 2 ] || fail "again: expected the line from both ranks in: $out"
  ! grep -q "MPI_FINALIZE" <<<"$out" || fail "again: MPI called after MPI_Finalize: $out"
  echo "ok   again: the job ends in ${seconds} s: $line"
  exit 0
fi

# Three ranks, rank 1's store [4] where the others' is [2,2], under an error handler that
# returns: rank 0 and rank 1 report it, and rank 2, whose store agrees, still gets rank 0's
# values, where rank 0 stopped at rank 1 and left rank 2 waiting for them forever (and
# every later ag_dist_finalize with it).
if [ "$case" = served ]; then
  np=3
  job served "$work/ck.safetensors"
  [ $rc -eq 0 ] || fail "served: exit status $rc (124: still running after 60 s): $out"
  grep -qx "rank 2 has rank 0's values" <<<"$out" || fail "served: rank 2 lacks them: $out"
  [ "$(grep -c "^reported: dist_broadcast_params: parameter 0 ('w' here) is" <<<"$out")" -eq 2 ] ||
    fail "served: expected a report from rank 0 and rank 1 in: $out"
  echo "ok   served: the job ends in ${seconds} s"
  exit 0
fi

# Rank 1 ends at once; rank 0, under an error handler that returns, all-reduces on the
# ring, reports rank 1's farewell, and then ends too: its ag_dist_finalize waited forever
# for the farewell that the ring had already taken.
if [ "$case" = leftring ]; then
  job leftring "$work/ck.safetensors"
  [ $rc -eq 0 ] || fail "leftring: exit status $rc (124: still running after 60 s): $out"
  grep -qx "rank 0 has ended" <<<"$out" || fail "leftring: rank 0 did not end: $out"
  grep -q "^reported: dist_allreduce_grads: rank 1 has ended" <<<"$out" ||
    fail "leftring: no report in: $out"
  echo "ok   leftring: the job ends in ${seconds} s"
  exit 0
fi

# Stores of the same length whose shapes differ ([2,3] on rank 0, [3,2] on rank 1): the
# broadcast would have mixed unrelated values. Both ranks see it; the first to report ends
# the job.
[ "$case" = shapes ] && ends_with shapes "attograd: rank [01] of 2: dist_broadcast_params: parameter 4 \('extra' here\) is \[3,2\] on rank 1 and \[2,3\] on rank 0"
# Stores of the same bytes but other dtypes (float32 [8], float64 [4]) that no broadcast
# compared: the all-reduce took the bytes as they came and added floats to doubles.
[ "$case" = dtypes ] && ends_with dtypes "attograd: rank [01] of 2: dist_allreduce_grads: rank [01] sent [48] f(32|64) gradients where this rank's store expects [48] f(32|64): the ranks' parameter stores differ"
# Rank 1's store is empty: it returned at once, and rank 0 waited for its gradients until
# rank 1 ended, then blamed the ranks' step counts.
[ "$case" = empty ] && ends_with empty "attograd: rank [01] of 2: dist_allreduce_grads: rank [01] sent [08] f32 gradients where this rank's store expects [08] f32: the ranks' parameter stores differ"
# The same on three ranks (f64 [4] on ranks 1 and 2), whose small buffers are gathered.
[ "$case" = dtypes3 ] && np=3 && ends_with dtypes "attograd: rank [012] of 3: dist_allreduce_grads: rank [012]'s store holds [48] f(32|64) gradients where this rank's holds [48] f(32|64): the ranks' parameter stores differ"
# Rank 1's store (8 values) is gathered whole while ranks 0 and 2 (2^20 values) run the
# ring: rank 1 waited in a collective and rank 2 for rank 1's ring message, forever.
[ "$case" = lengths3 ] && np=3 && ends_with lengths "attograd: rank [012] of 3: dist_allreduce_grads: rank [012] (gathers a store small enough to send whole, where this rank's runs the ring|runs the ring all-reduce of a store too large to gather, where this rank's holds 8 f32 gradients): the ranks' parameter stores differ"
# Rank 1 trains 3 steps and calls ag_dist_finalize, where rank 0 waited for its gradients
# forever: its all-reduce takes rank 1's farewell.
[ "$case" = steps ] && ends_with steps "attograd: rank 0 of 2: dist_allreduce_grads: rank 1 has ended \(ag_dist_finalize\) while this rank waits for its gradients: the ranks ran different numbers of steps"
# The same on three ranks, whose small buffers are gathered: the gather was a collective,
# which met rank 1's farewell with MPI's MPI_ERR_TRUNCATE.
[ "$case" = steps3 ] && np=3 && ends_with steps "attograd: rank [02] of 3: dist_allreduce_grads: rank 1 has ended \(ag_dist_finalize\) while this rank waits for its gradients: the ranks ran different numbers of steps"

# Rank 1 sums its loss (ag_dist_sum) where rank 0 all-reduces the gradients: each waited
# for the other forever, one in a collective, one for a point-to-point message.
[ "$case" = sum ] && ends_with sum "attograd: rank [01] of 2: (dist_allreduce_grads: rank 1 is in ag_dist_sum where this rank is in the gradients' all-reduce|dist_sum: rank 0 is in the gradients' all-reduce \(ag_dist_allreduce_grads\) where this rank sums values): the ranks' calls differ"
# The same on three ranks, whose small buffers are gathered.
[ "$case" = sum3 ] && np=3 && ends_with sum "attograd: rank [012] of 3: (dist_allreduce_grads: rank 1 is in ag_dist_sum where this rank is in the gradients' all-reduce|dist_sum: rank [02] is in the gradients' all-reduce \(ag_dist_allreduce_grads\) where this rank sums values): the ranks' calls differ"
# Rank 1 sums 2 values where rank 0 sums 1: MPI ended the job with MPI_ERR_TRUNCATE, or
# waited.
[ "$case" = sumcount ] && ends_with sumcount "attograd: rank [01] of 2: dist_sum: rank [01] sums [12] values where this rank sums [12]: n must be the same on every rank"

# 1. Rank 1 dies at step 6, without a word, while rank 0 waits for its
#    gradients.
job kill "$work/ck.safetensors"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "kill: exit status $rc (124: still running after 60 s)"
in_time kill
# mpirun names the process that died: "Process name: [[<job>,1],1]" is rank 1.
grep -Eq "Process name: \[\[[0-9]+,[0-9]+\],1\]" <<<"$out" || fail "kill: no message names rank 1: $out"
loaded=$("$bin" load "$work/ck.safetensors") || fail "kill: the last checkpoint does not load"
[[ $loaded =~ step\ [1-6]$ ]] || fail "kill: checkpoint at an unexpected step: $loaded"
echo "ok   a rank that dies ends the job in ${seconds} s (status $rc); checkpoint $loaded"

# 2. Rank 1 cannot read its file: one line from rank 1 says so.
printf 'not a safetensors file' > "$work/bad.safetensors"
job error "$work/bad.safetensors"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "error: exit status $rc"
in_time error
line=$(grep -c "^dist_failures: rank 1 of 2: $work/bad.safetensors: " <<<"$out")
[ "$line" -eq 1 ] || fail "error: expected one line from rank 1, got: $out"
echo "ok   a rank that cannot load its file ends the job in ${seconds} s: $(grep "^dist_failures: rank 1" <<<"$out")"

# 3. Rank 1's loss turns NaN: the job ends, rank 1 says where.
job nan "$work/ck2.safetensors"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "nan: exit status $rc"
in_time nan
grep -qx "dist_failures: rank 1 of 2: loss is NaN at step 3" <<<"$out" || fail "nan: $out"
"$bin" load "$work/ck2.safetensors" > /dev/null || fail "nan: the last checkpoint does not load"
echo "ok   a NaN loss on rank 1 ends the job in ${seconds} s"
