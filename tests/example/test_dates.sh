#!/usr/bin/env bash
# The dates example end to end, on a short budget: its last line, the held-out exact
# match after 150 steps, the attention picture, a checkpoint under PyTorch's names that
# --generate reloads to translate one date, a run replayed bit for bit from its seed, and
# what it refuses with one line (a date the vocabulary cannot say, a missing checkpoint,
# a bad flag).
# Usage: test_dates.sh DATES_BINARY
set -euo pipefail
bin=$(realpath "$1")
work=$(mktemp -d)
. "$(dirname "${BASH_SOURCE[0]}")/safetensors_edit.sh"  # edit_meta, poke
trap 'rm -rf "$work"' EXIT
mkdir "$work/cwd"
cd "$work/cwd"  # anything written by mistake lands here, where it is seen
fail() { echo "FAIL: $*" >&2; exit 1; }

# run EXPECTED_RC ARGS...: runs dates, checks its exit status; its stderr in $msg.
run() {
  local want=$1 rc
  shift
  set +e; msg=$("$bin" "$@" 2>&1 >/dev/null); rc=$?; set -e
  [ "$rc" -eq "$want" ] || fail "'$*' exited $rc, expected $want; said: $msg"
}
one_line() {  # SUBSTRING: $msg is one line, "dates: ...", holding SUBSTRING
  [ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == dates:* ]] && [[ $msg == *"$1"* ]] \
    || fail "expected one line with '$1', got: $msg"
}

# 0. --help says where the files go when --save and --svg are not given (it did not: the
#    run wrote dates.safetensors and dates_attention.svg to the working directory unsaid),
#    from the variables, as the other flags' defaults.
help=$("$bin" --help | tr -s ' \n' '  ')
[[ $help == *"--save the checkpoint (read by --generate) (default dates.safetensors)"* ]] \
  || fail "--help: --save's default: $help"
[[ $help == *"--svg the attention picture (default dates_attention.svg)"* ]] \
  || fail "--help: --svg's default: $help"
[[ $help != *"--generate translate this date with --save (default"* ]] || fail "--help: $help"
echo "ok   --help names the default files"

# 1. A short run ends with the test line; 150 steps already translate a third of the
#    held-out dates exactly (0.345 with seed 1); the picture and the checkpoint are written.
short=(--steps 150 --test 200 --save "$work/d.safetensors" --svg "$work/d.svg")
out=$("$bin" "${short[@]}")
last=$(tail -n 1 <<<"$out")
[[ $last =~ ^test:\ exact_match=([0-9.]+)\ n=200\ seconds=[0-9.]+$ ]] || fail "last line: $last"
awk -v m="${BASH_REMATCH[1]}" 'BEGIN { exit !(m >= 0.25) }' || fail "exact match ${BASH_REMATCH[1]}"
grep -q "^<svg" "$work/d.svg" && grep -q "<rect" "$work/d.svg" || fail "SVG"
head -c 20000 "$work/d.safetensors" > "$work/header"  # the JSON header, and some data
for name in src_emb.weight transformer.encoder.norm.weight \
            transformer.decoder.layers.1.multihead_attn.in_proj_weight head.bias; do
  grep -q "\"$name\"" "$work/header" || fail "checkpoint lacks $name"
done
echo "ok   short run, test line, picture, checkpoint"

# 2. --generate reloads the checkpoint and prints one ISO date.
iso=$("$bin" --save "$work/d.safetensors" --generate "Thursday, 26 November 2026")
[[ $iso =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || fail "generate printed '$iso'"
greedy=$("$bin" --save "$work/d.safetensors" --generate "26/11/26" --beams 1)
[[ $greedy =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]] || fail "greedy generate printed '$greedy'"
echo "ok   --generate, beam search and greedy"


# 2b. A model that never draws the end token (its bias, token 2's, at -1e30 f32) fills all
#     11 tokens of a translation: --generate read on past them and printed whatever the
#     stack held, as '?'s.
cp "$work/d.safetensors" "$work/noend.safetensors"
poke "$work/noend.safetensors" head.bias 0000000000000000caf249f1
for beams in 1 4; do
  said=$("$bin" --save "$work/noend.safetensors" --generate "26/11/26" --beams $beams)
  [ "${#said}" -eq 11 ] || fail "a translation without its end (--beams $beams) printed '$said'"
done
echo "ok   --generate of a model that never ends a date prints its 11 tokens"

# 3. The same seed gives the same run, bit for bit (the losses and the exact match).
again=$("$bin" "${short[@]}")
[ "$(grep -v seconds <<<"$out")" = "$(grep -v seconds <<<"$again")" ] || fail "runs differ"
[ "$(sed 's/ seconds=.*//' <<<"$last")" = "$(tail -n 1 <<<"$again" | sed 's/ seconds=.*//')" ] \
  || fail "test lines differ"
echo "ok   reproducible"

# 3b. The held-out examples are translated 2000 at a time: all at once, the decoder's
#     memory grew with --test (1000000 asked for 7.4 GB), and the run aborted after its
#     training, before saving. Under 1 GB of address space, where the program runs at all
#     (a sanitizer's shadow memory needs terabytes of it: there, this cannot be asked).
if (ulimit -v 1000000 && "$bin" --help > /dev/null 2>&1); then
  set +e
  big=$(ulimit -v 1000000 && "$bin" --steps 1 --test 4001 --save "$work/big.safetensors" \
        --svg "$work/big.svg" 2>&1)
  rc=$?
  set -e
  [ $rc -eq 0 ] || fail "--test 4001 under 1 GB: exit $rc, said: $big"
  [[ $(tail -n 1 <<<"$big") =~ ^test:\ exact_match=[0-9.]+\ n=4001\ seconds= ]] || fail "--test 4001: $big"
  [ -s "$work/big.safetensors" ] || fail "--test 4001 saved no checkpoint"
  echo "ok   --test larger than one batch of translations, in bounded memory"
fi

# 4. Refusals, one line each, exit status 2.
run 2 --save "$work/d.safetensors" --generate "26_11_2026"
one_line "character '_' is not in the vocabulary"
# A newline or a byte of UTF-8 in the date was printed raw: two lines, or garbage.
run 2 --save "$work/d.safetensors" --generate $'nov\n26 2026'
one_line "dates: \"nov\\n26 2026\": character '\\n' is not in the vocabulary"
run 2 --save "$work/d.safetensors" --generate "26 Ωct 2026"
one_line "dates: \"26 \\xce\\xa9ct 2026\": character '\\xce' is not in the vocabulary"
run 2 --save "$work/d.safetensors" --generate "$(printf 'nov\n26 2026 %040d' 0)"
one_line "dates: \"nov\\n26 2026 0000000000000000000000000000...\" has 52 characters"
run 2 --save "$work/missing.safetensors" --generate "nov 26 2026"
one_line "missing.safetensors"
run 2 --steps 0
one_line "--steps"
# --generate only translates: training's flags beside it were dropped without a word.
run 2 --save "$work/d.safetensors" --generate "nov 26 2026" --svg "$work/g.svg"
one_line "dates: --generate only translates with --save's checkpoint: it takes no --svg"
run 2 --steps 5 --save "$work/d.safetensors" --generate "nov 26 2026"
one_line "it takes no --steps"
# --seed was dropped so too (the checkpoint replaces the weights it draws); and --beams
# without --generate (the test after training decodes greedily).
run 2 --seed 7 --save "$work/d.safetensors" --generate "nov 26 2026"
one_line "it takes no --seed"
run 2 --steps 2 --beams 2 --save "$work/d4.safetensors" --svg "$work/d4.svg"
one_line "dates: --beams is the beam width of --generate; without it, the test after training decodes greedily"
[ ! -e "$work/d4.safetensors" ] || fail "a run refused for --beams trained"
run 2 --bogus
one_line "unknown option '--bogus'"
# Where training writes at its end is checked before it: after, the steps were lost.
run 2 --steps 2 --save "$work/missing/d.safetensors" --svg "$work/d.svg"
one_line "--save $work/missing/d.safetensors: the directory $work/missing: No such file"
run 2 --steps 2 --save "$work/d2.safetensors" --svg "$work"
one_line "--svg $work: is a directory, not a regular file"
# The checkpoint and the picture in one file: one would overwrite the other.
run 2 --steps 2 --save "$work/d3" --svg "$work/../$(basename "$work")/d3"
one_line "--save $work/d3 is the file --svg writes too"
# A path holding a newline split the error in two lines: it is written escaped.
run 2 --steps 2 --save "$work/mis"$'\n'"sing/d.safetensors"
one_line "--save $work/mis\\nsing/d.safetensors: the directory $work/mis\\nsing: No such file"
# A seed a double cannot hold ran as its neighbour (2^53 + 1 as 2^53): refused.
run 2 --seed 9007199254740993
one_line "--seed needs an integer in [0, 9007199254740992], got '9007199254740993'"
[ -z "$(ls -A "$work/cwd")" ] || fail "files written in the working directory: $(ls "$work/cwd")"
echo "ok   refusals"

# 5. The lengths the README gives are what its own command counts (they had drifted).
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
count() { cat "$@" | grep -cvE '^\s*($|//)'; }
readme=$(tr '\n' ' ' < "$src/README.md")
n=$(count "$src/examples/dates/main.c")
[[ $readme == *"are \`examples/dates/main.c\`: $n lines of C"* ]] || fail "README: main.c is not $n lines"
n=$(count "$src/examples/dates/data.c" "$src/examples/dates/data.h")
[[ $readme == *"are \`data.c\` and \`data.h\`, $n lines by the same count"* ]] \
  || fail "README: data.c and data.h are not $n lines"
echo "ok   the README's line counts"
