#!/usr/bin/env bash
# tools/check_floors.sh catches what breaks a floor, on a small tree made here: an
# include of a higher floor's header, in quotes or in angle brackets; a call into a
# higher floor or a sibling floor that no include shows (a declaration written by
# hand), found with nm in the object files; and it passes what holds its floors.
# Then the repository itself, with the object files of this build.
# Usage: test_check_floors.sh SOURCE_DIR BUILD_DIR C_COMPILER
set -uo pipefail
src_dir=$1 build_dir=$2 cc=$3
check="$src_dir/tools/check_floors.sh"
source "$src_dir/tests/expect.sh"

# A tree with one file per floor it needs: core, nn, optim and io.
tree() {
  rm -rf "$tmp/t"
  mkdir -p "$tmp/t/src/core" "$tmp/t/src/nn" "$tmp/t/src/optim" "$tmp/t/src/io" \
           "$tmp/t/include/attograd"
  echo 'int agi_core(void);' > "$tmp/t/include/attograd/base.h"
  echo 'int agi_nn(void);' > "$tmp/t/include/attograd/nn.h"
  echo 'int agi_core(void) { return 1; }' > "$tmp/t/src/core/core.c"
  printf '#include "attograd/base.h"\nint agi_nn(void) { return agi_core(); }\n' \
    > "$tmp/t/src/nn/nn.c"
  echo 'int agi_optim(void) { return 3; }' > "$tmp/t/src/optim/optim.c"
  echo 'int agi_io(void) { return 4; }' > "$tmp/t/src/io/io.c"
}

# Compiles every file of the tree where CMake puts the library's objects.
objects() {
  local f o
  for f in $(cd "$tmp/t" && find src -name '*.c'); do
    o="$tmp/t/build/CMakeFiles/ag_generic.dir/$f.o"
    mkdir -p "$(dirname "$o")"
    "$cc" -c -I"$tmp/t/include" "$tmp/t/$f" -o "$o" || exit 1
  done
}

tree
objects
expect 0 "object files hold their floors in their calls" \
  bash "$check" --symbols "$tmp/t/build" "$tmp/t"

tree
sed -i '1i #include <attograd/nn.h>' "$tmp/t/src/core/core.c"
expect 1 "src/core/core.c:1: includes <attograd/nn.h>: core (floor 1) must not see nn (floor 4)" \
  bash "$check" "$tmp/t"

tree
sed -i '1i #include "attograd/nn.h"' "$tmp/t/src/core/core.c"
expect 1 "src/core/core.c:1: includes \"attograd/nn.h\": core (floor 1) must not see nn (floor 4)" \
  bash "$check" "$tmp/t"

tree
printf 'int agi_nn(void);\nint agi_core2(void) { return agi_nn(); }\n' >> "$tmp/t/src/core/core.c"
objects
expect 0 "files hold their floors in their includes" bash "$check" "$tmp/t"
expect 1 "src/core/core.c: calls agi_nn (src/nn/nn.c): core (floor 1) must not reach nn (floor 4)" \
  bash "$check" --symbols "$tmp/t/build" "$tmp/t"

tree
printf 'int agi_io(void);\nint agi_optim2(void) { return agi_io(); }\n' \
  >> "$tmp/t/src/optim/optim.c"
objects
expect 1 \
  "src/optim/optim.c: calls agi_io (src/io/io.c): optim (floor 5) must not reach io (floor 5)" \
  bash "$check" --symbols "$tmp/t/build" "$tmp/t"

expect 2 "no object files of the library" bash "$check" --symbols "$tmp" "$tmp/t"

# The repository, with this build's objects.
expect 0 "object files hold their floors in their calls" \
  bash "$check" --symbols "$build_dir" "$src_dir"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
