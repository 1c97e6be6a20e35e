#!/usr/bin/env bash
# copy_task --analyze-heads and --prune: the head table with both importance scores,
# pruning with the accuracy before, after and after fine-tuning, the refusal to
# prune every head of a layer, and a pruned model saved and resumed in its shape.
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
[ ! -e "$work/b" ] || fail "--prune 4 of 4 heads was refused only after training"
echo "ok   --prune refuses to empty a layer, before training"

# --finetune-steps without --prune fine-tuned nothing, and said nothing.
if "$bin" --finetune-steps 50 --steps 5 --out "$work/f" > /dev/null 2> "$work/err"; then
  fail "--finetune-steps without --prune succeeded"
fi
[ "$(cat "$work/err")" = "copy_task: --finetune-steps needs --prune" ] || fail "wrong error: $(cat "$work/err")"
[ ! -e "$work/f" ] || fail "--finetune-steps without --prune was refused only after training"
echo "ok   --finetune-steps needs --prune"

# --save with --prune saves the pruned, fine-tuned model (it saved the model before
# pruning), with each layer's heads in its metadata; --resume rebuilds that shape and
# tests the same model, with --prune K as saved or without --prune, and refuses
# another K. Two layers, so that they end with different head counts.
args=(--layers 2 --steps 20 --target-acc 0 --out "$work/p")
out=$("$bin" "${args[@]}" --prune 3 --finetune-steps 5 --save "$work/p.safetensors")
grep -qx "saved $work/p.safetensors at step 20: the pruned model, after 5 fine-tuning steps" \
  <<<"$out" || fail "the pruned model was not saved: $out"
params=$(sed -n 's/^prune: 3 of 8 heads, [0-9]* -> \([0-9]*\) parameters.*/\1/p' <<<"$out")
[ -n "$params" ] || fail "no prune summary: $out"
heads=$(head -c 2000 "$work/p.safetensors" | grep -ao '"copy_task.heads":"[0-9,]*"')
[[ $heads =~ \"copy_task.heads\":\"(1,4|2,3|3,2|4,1)\" ]] ||
  fail "head counts in the file: '$heads'"
want=$(tail -n 1 <<<"$out")
for again in "--prune 3" ""; do
  resumed=$("$bin" "${args[@]}" $again --resume "$work/p.safetensors")
  grep -q "^attograd .*, $params parameters, " <<<"$resumed" || fail "not rebuilt pruned: $resumed"
  grep -qx "resumed $work/p.safetensors at step 20: a model pruned by 3 heads after training \
and fine-tuned 5 steps, whose run is over" <<<"$resumed" || fail "resumed: $resumed"
  [ "$(tail -n 1 <<<"$resumed")" = "${want% seconds=*} seconds=0.00" ] ||
    fail "resumed '$(tail -n 1 <<<"$resumed")' vs saved '$want'"
done
if "$bin" "${args[@]}" --prune 2 --resume "$work/p.safetensors" > /dev/null 2> "$work/err"; then
  fail "resuming with another --prune succeeded"
fi
[ "$(cat "$work/err")" = "copy_task: $work/p.safetensors: holds a model pruned by 3 heads \
after training; resume it with --prune 3 or without --prune" ] || fail "another --prune: $(cat "$work/err")"
# Its run is over: --profile (of a training step) and --save-every were dropped unsaid.
for flag in --profile "--save-every 5 --save $work/p2.safetensors"; do
  if "$bin" "${args[@]}" $flag --resume "$work/p.safetensors" > /dev/null 2> "$work/err"; then
    fail "resuming a pruned model with $flag succeeded"
  fi
  what="time (--profile)"
  [ "$flag" = --profile ] || what="save (--save-every)"
  [ "$(cat "$work/err")" = "copy_task: $work/p.safetensors: holds a model pruned after \
training, whose run is over: it trains no step to $what" ] || fail "$flag: $(cat "$work/err")"
done
echo "ok   --save --prune saves the pruned model ($heads), and --resume rebuilds it"
