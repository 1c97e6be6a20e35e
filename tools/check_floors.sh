#!/usr/bin/env bash
# Fails when a library file includes a header of a higher floor, or of a
# sibling floor, or reaches outside the library (examples/, datasets/, tests/).
#
# The floors, from the ground up (a file may include its own floor and any
# lower one; optim, io and dist stand side by side and never see each other):
#     0 random    src/random,  attograd/random.h
#     1 core      src/core,    attograd/base.h tensor.h tape.h params.h gradcheck.h state.h
#                              tape_check.h
#     2 kernels   src/kernels
#     3 ops       src/ops,     attograd/ops.h
#     4 nn        src/nn,      attograd/nn.h generate.h
#     5 optim     src/optim,   attograd/optim.h
#     5 io        src/io,      attograd/io.h
#     5 dist      src/dist,    attograd/dist.h (data-parallel training on MPI)
#     6 the umbrella attograd.h, which no library file includes
# Checked: every #include "..." of src/**/*.{c,h} and include/attograd/*.h.
# Usage: tools/check_floors.sh [repository root]
set -uo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# Sets level and group for a repository path (level "" when it is in no floor).
floor_of() {
  group=""
  case $1 in
    src/random/*|include/attograd/random.h) level=0 group=random ;;
    src/core/*|include/attograd/base.h|include/attograd/tensor.h|include/attograd/tape.h|\
    include/attograd/params.h|include/attograd/gradcheck.h|include/attograd/state.h|\
    include/attograd/tape_check.h)
      level=1 group=core ;;
    src/kernels/*) level=2 group=kernels ;;
    src/ops/*|include/attograd/ops.h) level=3 group=ops ;;
    src/nn/*|include/attograd/nn.h|include/attograd/generate.h) level=4 group=nn ;;
    src/optim/*|include/attograd/optim.h) level=5 group=optim ;;
    src/io/*|include/attograd/io.h) level=5 group=io ;;
    src/dist/*|include/attograd/dist.h) level=5 group=dist ;;
    include/attograd.h) level=6 group=umbrella ;;
    *) level="" ;;
  esac
}

# Sets path to $1 with "." and "dir/.." taken out (pure bash: this runs for
# every include, and a subprocess each would make the check slow).
normalize() {
  local IFS=/ part out=()
  for part in $1; do
    case $part in
      ""|.) ;;
      ..) if [ ${#out[@]} -gt 0 ] && [ "${out[-1]}" != ".." ]; then unset 'out[-1]'; else out+=(..); fi ;;
      *) out+=("$part") ;;
    esac
  done
  path="${out[*]}"
}

# Sets target to where `#include "name"` in file $1 lands, as the compiler
# searches: the file's own folder, then include/ and src/ (the library's
# include path).
resolve() {
  local dir=${1%/*} cand
  for cand in "$dir/$2" "include/$2" "src/$2"; do
    if [ -f "$cand" ]; then
      normalize "$cand"
      target=$path
      return
    fi
  done
  normalize "$dir/$2"
  target=$path
}

bad=0
files=$(find src include/attograd -name '*.[ch]' | sort)
for f in $files; do
  floor_of "$f"
  flevel=$level fgroup=$group
  if [ -z "$flevel" ]; then
    echo "check_floors: $f: in no floor (add its folder to tools/check_floors.sh)"
    bad=1
    continue
  fi
  while IFS=: read -r line inc; do
    inc=${inc#*\"}
    inc=${inc%%\"*}
    resolve "$f" "$inc"
    case $target in
      examples/*|datasets/*|tests/*|bench/*|tools/*|../*)
        echo "$f:$line: includes \"$inc\" ($target): the library never reaches outside src/ and include/"
        bad=1
        continue ;;
    esac
    floor_of "$target"
    ilevel=$level igroup=$group
    if [ -z "$ilevel" ]; then
      echo "$f:$line: includes \"$inc\" ($target), which is in no floor"
      bad=1
    elif [ "$igroup" != "$fgroup" ] && [ "$ilevel" -ge "$flevel" ]; then
      echo "$f:$line: includes \"$inc\": $fgroup (floor $flevel) must not see $igroup (floor $ilevel)"
      bad=1
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f")
done
if [ "$bad" -ne 0 ]; then
  echo "check_floors: FAILED (floors: random < core < kernels < ops < nn < optim, io)"
  exit 1
fi
echo "check_floors: $(echo "$files" | wc -l) files hold their floors"
