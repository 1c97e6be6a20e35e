#!/usr/bin/env bash
# The teaching examples refuse a bad command line and report a failed write, each with
# one line and a non-zero exit: an unknown option is never taken for a file name, an
# empty path is refused, and a .dot that cannot be written is named (an earlier one kept
# whole).
# Usage: test_teaching_cli.sh TAPE_TOUR BACKPROP_WALKTHROUGH
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"  # anything written by mistake lands here, where it is seen
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect BINARY EXPECTED_RC EXPECTED_MESSAGE ARGS...: the exit status, and stderr is
# exactly one line, prefixed with the program's name, holding EXPECTED_MESSAGE.
expect() {
  local bin=$1 want=$2 text=$3 rc name
  shift 3
  name=$(basename "$bin")
  set +e
  msg=$("$bin" "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq "$want" ] || fail "$name '$*' exited $rc, expected $want; said: $msg"
  [ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == "$name: "* ]] || fail "$name: not one line: $msg"
  [[ $msg == *"$text"* ]] || fail "$name '$*': expected '$text' in: $msg"
}

for bin in "$1" "$2"; do
  expect "$bin" 2 "unknown option '--bogus'" --bogus
  expect "$bin" 2 "OUT.dot needs a value, got an empty one" ""
  expect "$bin" 2 "unexpected argument 'b.dot'" a.dot b.dot
  expect "$bin" 1 "cannot write $work/no-such-dir/" "$work/no-such-dir/out.dot"
  [ -z "$(ls -A)" ] || fail "$(basename "$bin") wrote files it should not have: $(ls -A)"
  "$bin" --help | grep -q "^usage: $(basename "$bin") \[OUT.dot\]" || fail "$bin --help"
done
# A .dot whose page (.html, one byte longer) would not fit the examples' 1024-byte paths
# is refused by name, never written under a cut name.
seg=$(printf 'd%.0s' $(seq 200))
deep="$seg/$seg/$seg/$seg/$seg"
mkdir -p "$deep"
long="$deep/$(printf 'x%.0s' $(seq $((1023 - ${#deep} - 5)))).dot"
[ ${#long} -eq 1023 ] || fail "the long path is ${#long} bytes, not 1023"
for bin in "$1" "$2"; do
  expect "$bin" 1 "is too long" "$long"
  [ -z "$(ls "$deep" | grep -v '\.dot$')" ] || fail "$(basename "$bin") wrote under a cut name"
done
# The walkthrough renders its graphs with Graphviz dot, which must get the paths as they
# are: a stand-in dot records its arguments. Quoted in a shell command line, "it's.dot"
# reached dot as one argument "…its.dot -o …its.svg", and a crafted name ran commands.
mkdir "$work/bin" "$work/q"
printf '#!/bin/sh\nprintf "%%s\\n" "$@" >> "%s/dot-args"\n' "$work" > "$work/bin/dot"
chmod +x "$work/bin/dot"
PATH="$work/bin:$PATH" "$2" "$work/q/it's.dot" > /dev/null || fail "walkthrough with it's.dot"
printf -- '-Tsvg\n%s\n-o\n%s\n' "$work/q/it's_notes.dot" "$work/q/it's_notes.svg" \
  "$work/q/it's.dot" "$work/q/it's.svg" > "$work/want"
cmp -s "$work/dot-args" "$work/want" || fail "dot was given: $(cat "$work/dot-args")"
(cd "$work/q" && PATH="$work/bin:$PATH" "$2" "x';touch pwned;'.dot" > /dev/null) \
  || fail "walkthrough with a crafted name"
[ ! -e "$work/q/pwned" ] || fail "a crafted .dot name ran a command"
# A .dot that cannot be written (a directory) leaves the notes' .dot of an earlier run as it
# was: opened first with fopen, it was emptied before the run stopped.
mkdir "$work/g"
"$2" "$work/g/x.dot" > /dev/null
cp "$work/g/x_notes.dot" "$work/notes.before"
rm "$work/g/x.dot" && mkdir "$work/g/x.dot"
expect "$2" 1 "cannot write $work/g/x.dot" "$work/g/x.dot"
cmp -s "$work/g/x_notes.dot" "$work/notes.before" || fail "a failed run emptied the notes' .dot"
# tape_tour's .dot that fails while it is written (a file size limit of 1 KB; a full disk
# alike) leaves an earlier run's .dot whole: opened with fopen, it was cut at the limit.
mkdir "$work/t"
echo "digraph earlier {}" > "$work/t/x.dot"
set +e
msg=$( (trap '' XFSZ; ulimit -f 1; "$1" "$work/t/x.dot") 2>&1 >/dev/null)
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "tape_tour over a size limit exited $rc; said: $msg"
[ "$(wc -l <<<"$msg")" -eq 1 ] && [[ $msg == "tape_tour: cannot write $work/t/x.dot"* ]] \
  || fail "tape_tour over a size limit: not one line naming the .dot: $msg"
[ "$(cat "$work/t/x.dot")" = "digraph earlier {}" ] || fail "tape_tour cut an earlier .dot short"
[ "$(ls -A "$work/t")" = x.dot ] || fail "tape_tour left behind: $(ls -A "$work/t")"
echo "teaching examples: bad command lines and failed writes refused with one line"
