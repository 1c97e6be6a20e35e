#!/usr/bin/env bash
# Every rank of an MPI run of an example must be started alike (issue 20, item 4):
# ranks started with other flags (--steps, --heads, --lr, --seed, --pos), one rank
# resuming a checkpoint where the other starts afresh, ranks resuming other
# checkpoints of the same run, or reading other data each end the job within seconds
# (10 s more than a job that does nothing), with one line from the rank that differs
# and a non-zero exit status: never a hang, and never a run that trains apart and
# exits 0. (Before: tiny_lm hung on other --steps and on --resume on one rank only,
# and trained and saved with exit status 0 when the ranks had other --heads, --pos,
# --lr, --seed or --data.)
# Usage: test_ranks_agree.sh copy_task|tiny_lm BINARY MPIRUN SOURCE_DIR
set -uo pipefail
prog=$1 bin=$2 mpirun=$3 src=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $prog: $*" >&2; exit 1; }

# Each program's run (tiny, a few steps), two of its checkpoints of the same settings
# at other steps, and other data.
case $prog in
  copy_task)
    cd "$src"  # the committed datasets
    base=(--steps 4 --target-acc 0 --out "$work/o")
    "$bin" --steps 3 --target-acc 0 --out "$work/o" --save "$work/a.ck" > /dev/null &&
      "$bin" --steps 4 --target-acc 0 --out "$work/o" --save "$work/b.ck" > /dev/null ||
      fail "setup: the checkpoints"
    mkdir -p "$work/other/copy"  # valid copy-task splits, other sequences in training
    cp datasets/copy/test.txt "$work/other/copy/train.txt"
    cp datasets/copy/valid.txt datasets/copy/test.txt "$work/other/copy/"
    other_data=(--data "$work/other")
    ;;
  tiny_lm)
    cd "$work"
    for i in $(seq 1 300); do echo "line $i: pack my box with five dozen liquor jugs"; done > text
    sed 's/box/bag/' text > other.text
    base=(--data text --ctx 16 --d-model 16 --heads 2 --layers 2 --batch 8 --steps 5 --warmup 2
          --eval-every 2 --eval-batches 2 --dropout 0 --sample 0 --out "$work/o")
    "$bin" "${base[@]}" --steps 3 --save a.ck > /dev/null &&
      "$bin" "${base[@]}" --steps 4 --save b.ck > /dev/null || fail "setup: the checkpoints"
    other_data=(--data other.text)
    ;;
  *) fail "unknown program" ;;
esac

# shellcheck source=jobs.sh
source "$here/jobs.sh"
# refused WHAT LINE: the job ended, non-zero, within the limit, with the one line LINE.
refused() {
  ended "$1"
  one_line "$1" "$2"
  echo "ok   $prog: $1: status $rc, $seconds s"
}
job_limit "$bin"

flags_differ="$prog: rank 1 of 2: started with other flags than rank 0 (every rank needs the same)"

# 1. Other flags on rank 1: the step count, a model size, the learning rate, the seed,
#    the positions.
for other in "--steps 6" "--heads 8" "--lr 0.02" "--seed 2" "--pos rope"; do
  # shellcheck disable=SC2086  # $other is a flag and its value
  job -np 1 "$bin" "${base[@]}" : -np 1 "$bin" "${base[@]}" $other
  refused "rank 1 started with $other" "$flags_differ"
done

# 2. --resume on rank 1 only.
job -np 1 "$bin" "${base[@]}" : -np 1 "$bin" "${base[@]}" --resume "$work/a.ck"
refused "--resume on rank 1 only" "$flags_differ"

# 3. Every rank resumes, rank 1 another checkpoint of the same run (its node's copy
#    is older, say).
job -np 1 "$bin" "${base[@]}" --resume "$work/b.ck" \
  : -np 1 "$bin" "${base[@]}" --resume "$work/a.ck"
refused "another checkpoint on rank 1" \
  "$prog: rank 1 of 2: $work/a.ck holds another model than rank 0's copy"

# 4. Other data on rank 1 (the same flags but for --data, whose path may differ from
#    one machine to the next: what it holds is compared).
job -np 1 "$bin" "${base[@]}" : -np 1 "$bin" "${base[@]}" "${other_data[@]}"
refused "other data on rank 1" "$prog: rank 1 of 2: its data differs from rank 0's (--data)"

# 5. The same run on both ranks is not refused.
job -np 2 "$bin" "${base[@]}"
[ $rc -eq 0 ] || fail "the same flags on both ranks: status $rc: $out"
echo "ok   $prog: the same flags on both ranks run"
