#!/usr/bin/env bash
# Installs the build into a prefix chosen now, at install time (the build was
# configured for another), then builds and runs a program outside the source
# tree against it: with pkg-config, and with find_package(attograd); then
# moves the whole prefix elsewhere and does both again (the installed files
# must not record where they were installed); and runs the installed
# attograd-mha. Each from C and from C++.
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
  # 3. from C++11, with pkg-config
  g++ -std=c++11 -Wall -Wextra -Wpedantic -Werror $flags "$src/tests/install/cxx/consumer.cpp" \
     -o "$out/pc_cxx" $(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags --libs attograd) \
     -Wl,-rpath,"$libdir"
  env -u LD_LIBRARY_PATH "$out/pc_cxx"
}
consumers "$prefix" installed

# A CMake project that enables only C++: find_package's dependencies, MPI's included, are
# found without C; shared, static, and attograd_dist when installed.
dist=OFF
[ -z "$(find "$prefix" -name 'libattograd_dist.a')" ] || dist=ON
cmake -S "$src/tests/install/cxx" -B "$work/cxx" -DCMAKE_PREFIX_PATH="$prefix" -DAG_EXPECT_DIST=$dist \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" > "$work/cxx.log" 2>&1 \
  || fail "find_package(attograd) from a C++ project: $(grep -A3 "CMake Error" "$work/cxx.log" | tail -n 3 | tr -s " \n" " ")"
cmake --build "$work/cxx" > "$work/cxx-build.log" || fail "the C++ consumers did not build"
"$work/cxx/consumer_shared"
"$work/cxx/consumer_static"

# Linked with OpenBLAS's static archive (where it is installed; not under a sanitizer,
# whose runtime may keep a thread of its own), OpenBLAS's workers are stopped as with
# libopenblas.so (tests/install/blas_workers.c).
blas_archive=$(pkg-config --variable=libdir openblas 2>/dev/null)/libopenblas.a
if [ -z "$flags" ] && [ -f "$blas_archive" ]; then
  libdir=$(find "$prefix" -name 'libattograd.a' -printf '%h\n' | head -n 1)
  cc -std=c11 -Wall -Wextra -Wpedantic -Werror "$src/tests/install/blas_workers.c" \
     -o "$work/blas_workers" -I"$prefix/include" "$libdir/libattograd.a" "$blas_archive" \
     $(pkg-config --static --libs-only-l openblas | sed 's/-lopenblas\b//g')
  "$work/blas_workers" || fail "OpenBLAS's workers still run in a program linked with libopenblas.a"
fi

# The ABI policy (README "Versions and the ABI"): while MAJOR is 0, the SONAME carries
# MAJOR.MINOR, so a program linked against another 0.x fails to load; find_package
# refuses another minor; a program built against other headers is refused by
# ag_abi_check.
major=$(sed -n 's/^#define AG_VERSION_MAJOR \([0-9]*\)$/\1/p' "$prefix/include/attograd/base.h")
minor=$(sed -n 's/^#define AG_VERSION_MINOR \([0-9]*\)$/\1/p' "$prefix/include/attograd/base.h")
[ "$major" = 0 ] || fail "the checks below are those of 0.x (major $major)"
libdir=$(find "$prefix" -name 'libattograd.so' -printf '%h\n' | head -n 1)
soname=$(objdump -p "$libdir/libattograd.so" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libattograd.so.$major.$minor" ] \
  || fail "the SONAME is $soname, not libattograd.so.$major.$minor"
# Old programs: one linked against 0.1, whose SONAME was libattograd.so.0 before this
# policy, and one linked against the minor before this one. Installed beside this
# library, neither finds a library of its ABI, and neither starts.
for old_soname in libattograd.so.0 "libattograd.so.$major.$((minor - 1))"; do
  old=$work/old/$old_soname
  mkdir -p "$old"
  echo 'const char *ag_version(void) { return "0.1.0"; }' > "$old/lib.c"
  echo 'const char *ag_version(void); int main(void) { return ag_version()[0] != 0; }' \
    > "$old/main.c"
  cc -shared -fPIC "$old/lib.c" -o "$old/libattograd.so.old" -Wl,-soname,"$old_soname"
  ln -s libattograd.so.old "$old/libattograd.so"
  cc "$old/main.c" -o "$old/app" -L"$old" -lattograd
  rm "$old"/libattograd.so*
  if out=$(env LD_LIBRARY_PATH="$libdir" "$old/app" 2>&1); then
    fail "a program linked against $old_soname ran on $soname"
  fi
  echo "$out" | grep -qF "$old_soname: cannot open shared object file" \
    || fail "the program linked against $old_soname failed for another reason: $out"
done
# find_package: this minor is found, the one before is refused.
cmake -S "$src/tests/install" -B "$work/want_same" -DCMAKE_PREFIX_PATH="$prefix" \
      -DAG_WANT_VERSION="$major.$minor" > "$work/want_same.log" \
  || fail "find_package(attograd $major.$minor) failed"
if cmake -S "$src/tests/install" -B "$work/want_old" -DCMAKE_PREFIX_PATH="$prefix" \
         -DAG_WANT_VERSION="$major.$((minor - 1))" > "$work/want_old.log" 2>&1; then
  fail "find_package(attograd $major.$((minor - 1))) accepted $major.$minor"
fi
# A program built against headers of the minor before (a binding's mirror of them):
# ag_abi_check refuses it before it runs anything.
mkdir -p "$work/old_headers"
cp -r "$prefix/include/." "$work/old_headers/"
sed -i "s/^#define AG_VERSION_MINOR $minor\$/#define AG_VERSION_MINOR $((minor - 1))/" \
  "$work/old_headers/attograd/base.h"
cc -std=c11 $flags "$src/tests/install/consumer.c" -I"$work/old_headers" -o "$work/old_headers/app" \
   -L"$libdir" -lattograd -Wl,-rpath,"$libdir"
if out=$("$work/old_headers/app" 2>&1); then
  fail "a program built against $major.$((minor - 1)) headers ran on $major.$minor"
fi
echo "$out" | grep -q "abi_check: built against the headers of attograd $major.$((minor - 1)), but this library is $major.$minor" \
  || fail "the program with old headers failed for another reason: $out"

# The same tree moved: a relocated install works as it is.
mv "$prefix" "$work/moved"
consumers "$work/moved" moved

# The installed program
"$work/moved/bin/attograd-mha" "$src/tests/reference/mha/cross_f64.in.safetensors" \
  "$work/mha.out.safetensors"
test -s "$work/mha.out.safetensors"
