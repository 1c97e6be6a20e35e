#!/usr/bin/env bash
# copy_task --analyze-heads and --prune: the head table with both importance scores,
# pruning with the accuracy before, after and after fine-tuning, and the refusal to
# prune every head of a layer.
# Usage: test_copy_task_heads.sh COPY_TASK_BINARY SOURCE_DIR
set -euo pipefail
bin=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$src"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$bin" --analyze-heads --prune 2 --finetune-steps 20 --out "$work/a")
grep -q "^head  entropy  distance  strongest (q->k, weight)  |dL/dmask|    ablation$" <<<"$out" \
  || fail "no head table"
[ "$(grep -cE '^ +[0-3] +[0-9.]+ +[0-9.]+ +[0-9]+ -> [0-9]+ ' <<<"$out")" = 4 ] \
  || fail "the table does not have one line per head"
[ "$(grep -c '^pruned layer 0 head ' <<<"$out")" = 2 ] || fail "two heads not pruned"
grep -qE '^prune: 2 of 4 heads, [0-9]+ -> [0-9]+ parameters; test token_acc [0-9.]+ before, [0-9.]+ after, [0-9.]+ after 20 fine-tuning steps$' <<<"$out" \
  || fail "no prune summary"
tail -n 1 <<<"$out" | grep -q '^test: token_acc=' || fail "the result line is not last"
echo "ok   --analyze-heads --prune 2"

if "$bin" --prune 4 --steps 5 --target-acc 0 --out "$work/b" > /dev/null 2> "$work/err"; then
  fail "--prune 4 of 4 heads succeeded"
fi
grep -q "would leave a layer with no head" "$work/err" || fail "wrong error: $(cat "$work/err")"
echo "ok   --prune refuses to empty a layer"
