#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a program
# outside the source tree against it: with pkg-config, and with
# find_package(attograd); and runs the installed attograd-mha.
# Usage: test_install.sh BUILD_DIR SOURCE_DIR [CFLAGS]
# (CFLAGS carries the sanitizer flags when the library was built with them.)
set -euo pipefail
build=$1 src=$2 flags=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
libdir=$(find "$prefix" -name 'libattograd.so' -printf '%h\n' | head -n 1)
export LD_LIBRARY_PATH=$libdir

# 1. pkg-config (the .pc file records the configured prefix, so point it here)
export PKG_CONFIG_PATH=$libdir/pkgconfig
cc -std=c11 -Wall -Wextra -Wpedantic -Werror $flags "$src/tests/install/consumer.c" -o "$work/pc" \
   $(pkg-config --define-variable=prefix="$prefix" --cflags --libs attograd)
"$work/pc"

# 2. find_package(attograd), shared and static
cmake -S "$src/tests/install" -B "$work/cm" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" > "$work/cm.log"
cmake --build "$work/cm" > "$work/cm-build.log"
"$work/cm/consumer_shared"
"$work/cm/consumer_static"

# 3. the installed program
"$prefix/bin/attograd-mha" "$src/tests/reference/mha/cross_f64.in.safetensors" "$work/mha.out.safetensors"
test -s "$work/mha.out.safetensors"
