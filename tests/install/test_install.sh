#!/usr/bin/env bash
# Installs the build into a prefix chosen now, at install time (the build was
# configured for another), then builds and runs a program outside the source
# tree against it: with pkg-config, and with find_package(attograd); then
# moves the whole prefix elsewhere and does both again (the installed files
# must not record where they were installed); and runs the installed
# attograd-mha.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR [CFLAGS]
# (CFLAGS carries the sanitizer flags when the library was built with them.)
set -euo pipefail
build=$1 src=$2 flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

configured=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$build/CMakeCache.txt")
prefix=$work/prefix
[ "$configured" != "$prefix" ] || fail "the build was configured for the test's prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
grep -rqF "$prefix" "$prefix"/lib*/pkgconfig "$prefix"/lib*/cmake \
  && fail "an installed pkg-config or CMake file records the install prefix"

# consumers PREFIX NAME: builds the consumer against PREFIX with pkg-config
# (as the README says, with an rpath so it runs without LD_LIBRARY_PATH) and
# with find_package (shared and static), and runs all three.
consumers() {
  local p=$1 out=$work/$2 libdir
  libdir=$(find "$p" -name 'libattograd.so' -printf '%h\n' | head -n 1)
  [ -n "$libdir" ] || fail "no libattograd.so under $p"
  mkdir -p "$out"
  # 1. pkg-config, with nothing but PKG_CONFIG_PATH pointing at the prefix
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror $flags "$src/tests/install/consumer.c" \
     -o "$out/pc" $(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs attograd) \
     -Wl,-rpath,"$libdir"
  env -u LD_LIBRARY_PATH "$out/pc"
  # 2. find_package(attograd) through CMAKE_PREFIX_PATH, shared and static
  cmake -S "$src/tests/install" -B "$out/cm" -DCMAKE_PREFIX_PATH="$p" \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" > "$out/cm.log"
  cmake --build "$out/cm" > "$out/cm-build.log"
  "$out/cm/consumer_shared"
  "$out/cm/consumer_static"
}
consumers "$prefix" installed

# The same tree moved: a relocated install works as it is.
mv "$prefix" "$work/moved"
consumers "$work/moved" moved

# The installed program
"$work/moved/bin/attograd-mha" "$src/tests/reference/mha/cross_f64.in.safetensors" \
  "$work/mha.out.safetensors"
test -s "$work/mha.out.safetensors"
