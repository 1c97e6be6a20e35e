#!/usr/bin/env bash
# tools/check_names.sh catches each break of the naming rule on a small library made
# here (a _get getter, a verb-first name, an alias, an exported function no header
# declares, a declared function no library defines), passes a library that keeps the
# rule, and then passes the repository's own libraries from this build.
# Usage: test_check_names.sh SOURCE_DIR C_COMPILER LIBRARY...
set -uo pipefail
src_dir=$1 cc=$2
shift 2
check="$src_dir/tools/check_names.sh"
source "$src_dir/tests/expect.sh"

# library NAME HEADER SOURCE: a tree $tmp/NAME with include/attograd/x.h and lib.so.
library() {
  mkdir -p "$tmp/$1/include/attograd"
  printf '%s\n' "$2" > "$tmp/$1/include/attograd/x.h"
  printf '%s\n' "$3" > "$tmp/$1/lib.c"
  "$cc" -shared -fPIC "$tmp/$1/lib.c" -o "$tmp/$1/lib.so" || exit 1
}

library good \
  'int ag_thing_size(void); void ag_thing_set_size(int n); int ag_thing_grow(void);
typedef void (*ag_thing_fn)(int);  // a type, not a function' \
  'static int size;
int ag_thing_size(void) { return size; }
void ag_thing_set_size(int n) { size = n; }
int ag_thing_grow(void) { return ++size; }'
expect 0 "check_names: 3 public functions follow the naming rule" \
  bash "$check" --root "$tmp/good" "$tmp/good/lib.so"

library bad \
  'int ag_thing_size_get(void);
void ag_set_size(int n);
void ag_init_thing(void);
int ag_thing_count(void);
int ag_thing_length(void);  // = ag_thing_count
int ag_thing_stale(void);' \
  'int ag_thing_size_get(void) { return 1; }
void ag_set_size(int n) { (void)n; }
void ag_init_thing(void) {}
int ag_thing_count(void) { return 1; }
int ag_thing_length(void) { return 1; }
int ag_thing_helper(void) { return 2; }'
for text in \
  "ag_thing_size_get: a getter is ag_<noun>_<property>, without _get" \
  "ag_set_size puts the verb first" \
  "ag_init_thing puts the verb first" \
  "an alias (one name per thing, attograd.h): include/attograd/x.h:5:" \
  "ag_thing_helper is exported but declared in no public header" \
  "ag_thing_stale is declared in include/ but no library defines it"; do
  expect 1 "$text" bash "$check" --root "$tmp/bad" "$tmp/bad/lib.so"
done

expect 0 "public functions follow the naming rule" bash "$check" --root "$src_dir" "$@"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
