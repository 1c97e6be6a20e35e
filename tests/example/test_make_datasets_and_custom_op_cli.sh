#!/usr/bin/env bash
# make_datasets and custom_op refuse a bad command line with one line and exit 2, and
# write nothing: make_datasets took "--help" (or any option) for its directory and made it;
# custom_op ignored whatever it was given.
# Usage: test_make_datasets_and_custom_op_cli.sh MAKE_DATASETS CUSTOM_OP
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect BINARY EXPECTED_RC EXPECTED_LINE ARGS...: the status, and stderr exactly this line.
expect() {
  local bin=$1 want=$2 line=$3 rc msg
  shift 3
  set +e
  msg=$("$bin" "$@" 2>&1 >/dev/null)
  rc=$?
  set -e
  [ "$rc" -eq "$want" ] || fail "$(basename "$bin") '$*' exited $rc, expected $want; said: $msg"
  [ "$msg" = "$line" ] || fail "$(basename "$bin") '$*' said: $msg; expected: $line"
}

expect "$1" 2 "make_datasets: unknown option '--bogus' (see --help)" --bogus
expect "$1" 2 "make_datasets: unknown option '-x' (see --help)" -x
expect "$1" 2 "make_datasets: DIR needs a value, got an empty one" ""
expect "$1" 2 "make_datasets: expected one argument, DIR; got 2 (see --help)" a b
expect "$1" 2 "make_datasets: expected one argument, DIR; got 0 (see --help)"
"$1" --help | grep -qx "usage: make_datasets DIR   (e.g. make_datasets datasets)" || fail "--help"
expect "$2" 2 "custom_op: unexpected argument '--bogus' (it takes none; see --help)" --bogus
# An argument holding a newline split the line in two: it is quoted escaped.
expect "$2" 2 "custom_op: unexpected argument 'x\\ny' (it takes none; see --help)" $'x\ny'
"$2" --help | grep -q "^usage: custom_op" || fail "custom_op --help"
[ -z "$(ls -A)" ] || fail "wrote files it should not have: $(ls -A)"
echo "make_datasets and custom_op: bad command lines refused with one line, nothing written"
