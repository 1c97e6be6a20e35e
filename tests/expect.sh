# Sourced by the tests of the repository's checkers (tests/floors, tests/names): a
# scratch directory $tmp removed at exit, a count of $failures, and
#   expect STATUS TEXT COMMAND...: COMMAND exits with STATUS and prints TEXT.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

expect() {
  local want=$1 text=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || [[ $out != *"$text"* ]]; then
    echo "FAIL: $* exited $rc (wanted $want) and printed:"
    echo "$out" | sed 's/^/    /'
    echo "  wanted a line containing: $text"
    failures=$((failures + 1))
  else
    echo "ok   $text"
  fi
}
