#!/usr/bin/env bash
# Checks the public names against the naming rule written at the top of
# include/attograd.h, on what a program can actually call: the functions the built
# libraries export (nm), and the functions the public headers declare.
#   - every exported function is declared in include/, and every function declared
#     there is defined in a library (no internal name leaks out, no stale name stays);
#   - every public function starts with ag_;
#   - no getter ends in _get, and no name puts a verb before its noun (ag_get_*,
#     ag_set_*, ag_init_*);
#   - no header keeps an alias (a declaration commented "= ag_...").
# dist.h is checked only when its library (libattograd_dist.a) is given.
# Usage: tools/check_names.sh [--root DIR] LIBRARY...   (e.g. build/libattograd.so)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = "--root" ]; then
  root=$2
  shift 2
fi
if [ $# -eq 0 ]; then
  echo "check_names: give the built libraries, e.g. build/libattograd.so build/libattograd_dist.a"
  exit 2
fi
bad=0
complain() {
  echo "check_names: $*"
  bad=1
}

# The functions the libraries define and export (T: text, W: weak).
exported=$(for lib in "$@"; do
  [ -f "$lib" ] || { echo "check_names: no library $lib: build it first" >&2; exit 2; }
  nm -g --defined-only -P "$lib" 2>/dev/null | awk '$2 == "T" || $2 == "W" {print $1}'
done | sort -u) || exit 2
have_dist=0
case " $* " in *attograd_dist*) have_dist=1 ;; esac

# The functions the public headers declare: a name followed by "(", outside comments
# (a function-pointer type, "(*ag_x)(", is a type and not matched).
headers=$(find "$root/include" -name '*.h' | sort)
[ "$have_dist" = 1 ] || headers=$(echo "$headers" | grep -v '/attograd/dist\.h$')
declared=$(for h in $headers; do
  sed 's://.*$::' "$h" | grep -oE '\bag_[a-z0-9_]+[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//'
done | sort -u)

for f in $(comm -23 <(echo "$exported") <(echo "$declared")); do
  case $f in
    ag_*) complain "$f is exported but declared in no public header (an internal function is agi_ and not exported)" ;;
    *) ;;  # the linker's and the runtime's own symbols (_init, _fini, ...)
  esac
done
for f in $(comm -13 <(echo "$exported") <(echo "$declared")); do
  complain "$f is declared in include/ but no library defines it (a stale name?)"
done

for f in $declared; do
  case $f in
    ag_get_*|ag_set_*|ag_init_*)
      complain "$f puts the verb first: ag_<noun>_<verb> (attograd.h)" ;;
    *_get)
      complain "$f: a getter is ag_<noun>_<property>, without _get (attograd.h)" ;;
  esac
done

# Aliases: a declaration whose comment gives the name it stands for.
if aliases=$(grep -nHE '^[^/]*\bag_[a-z0-9_]+[[:space:]]*\(.*//[[:space:]]*=[[:space:]]*ag_' $headers); then
  while IFS= read -r line; do
    complain "an alias (one name per thing, attograd.h): ${line#"$root"/}"
  done <<< "$aliases"
fi

n=$(echo "$declared" | grep -c .)
if [ "$bad" = 0 ]; then
  echo "check_names: $n public functions follow the naming rule"
fi
exit $bad
