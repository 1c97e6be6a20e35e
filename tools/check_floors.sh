#!/usr/bin/env bash
# Fails when the library breaks its floors. Two checks:
#   includes  every #include "..." and #include <attograd...> of src/**/*.{c,h} and
#             include/attograd/*.h: no header of a higher floor or of a sibling floor,
#             and nothing outside the library (examples/, datasets/, tests/, ...);
#   calls     with --symbols BUILD_DIR, after a build: nm over the library's object
#             files (BUILD_DIR/CMakeFiles/{ag_*,attograd_dist}.dir/src/**/*.o); no object
#             refers to a function or variable defined in an object of a higher or a
#             sibling floor. This catches what no include shows: a declaration written
#             by hand, or a header that declares another floor's function.
#
# The floors, from the ground up (a file may use its own floor and any lower one;
# optim, io and dist stand side by side and never see each other):
#     0 random    src/random,  attograd/random.h
#     1 core      src/core,    attograd/base.h tensor.h tape.h params.h gradcheck.h state.h
#                              data_parallel.h
#     2 kernels   src/kernels
#     3 ops       src/ops,     attograd/ops.h tape_check.h op_check.h (the node-by-node
#                              check runs each op's float64 twin, so it stands on the ops,
#                              and the op suite runs it)
#     4 nn        src/nn,      attograd/nn.h generate.h
#     5 optim     src/optim,   attograd/optim.h
#     5 io        src/io,      attograd/io.h tape_html.h (a tape's web page: it shows the
#                              node-by-node check and writes its file atomically)
#     5 dist      src/dist,    attograd/dist.h (data-parallel training on MPI)
#     6 the umbrella attograd.h, which no library file includes
# Usage: tools/check_floors.sh [--symbols BUILD_DIR] [repository root]
set -uo pipefail
build=""
if [ "${1:-}" = "--symbols" ]; then
  if [ $# -lt 2 ]; then
    echo "check_floors: --symbols needs the build directory (e.g. --symbols build)"
    exit 2
  fi
  build=$(cd "$2" 2>/dev/null && pwd) || { echo "check_floors: no build directory $2"; exit 2; }
  shift 2
fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# Sets level and group for a repository path (level "" when it is in no floor).
floor_of() {
  group=""
  case $1 in
    src/random/*|include/attograd/random.h) level=0 group=random ;;
    src/core/*|include/attograd/base.h|include/attograd/tensor.h|include/attograd/tape.h|\
    include/attograd/params.h|include/attograd/gradcheck.h|include/attograd/state.h|\
    include/attograd/data_parallel.h)
      level=1 group=core ;;
    src/kernels/*) level=2 group=kernels ;;
    src/ops/*|include/attograd/ops.h|include/attograd/tape_check.h|include/attograd/op_check.h)
      level=3 group=ops ;;
    src/nn/*|include/attograd/nn.h|include/attograd/generate.h) level=4 group=nn ;;
    src/optim/*|include/attograd/optim.h) level=5 group=optim ;;
    src/io/*|include/attograd/io.h|include/attograd/tape_html.h) level=5 group=io ;;
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

# ---- Includes ---------------------------------------------------------------------
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
    if [[ $inc == *'"'* ]]; then
      inc=${inc#*\"}
      inc=${inc%%\"*}
      resolve "$f" "$inc"
      shown="\"$inc\""
    else
      # <...>: only the public headers are ours; <stdio.h> and <cblas.h> are not.
      inc=${inc#*<}
      inc=${inc%%>*}
      case $inc in
        attograd.h|attograd/*) target=include/$inc shown="<$inc>" ;;
        *) continue ;;
      esac
    fi
    case $target in
      examples/*|datasets/*|tests/*|bench/*|tools/*|../*)
        echo "$f:$line: includes $shown ($target):" \
             "the library never reaches outside src/ and include/"
        bad=1
        continue ;;
    esac
    floor_of "$target"
    ilevel=$level igroup=$group
    if [ -z "$ilevel" ]; then
      echo "$f:$line: includes $shown ($target), which is in no floor"
      bad=1
    elif [ "$igroup" != "$fgroup" ] && [ "$ilevel" -ge "$flevel" ]; then
      echo "$f:$line: includes $shown: $fgroup (floor $flevel) must not see $igroup (floor $ilevel)"
      bad=1
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' "$f")
done

# ---- Calls: symbols each object file uses, and where they are defined --------------
if [ -n "$build" ]; then
  objects=$(find "$build/CMakeFiles" \( -path '*/CMakeFiles/ag_*.dir/src/*.o' -o \
                 -path '*/CMakeFiles/attograd_dist.dir/src/*.o' \) 2>/dev/null | sort)
  if [ -z "$objects" ]; then
    echo "check_floors: no object files of the library under $build/CMakeFiles: build it first"
    exit 2
  fi
  table=$(mktemp)
  trap 'rm -f "$table"' EXIT
  n_objects=0
  for o in $objects; do
    src=${o#*.dir/}
    src=${src%.o}
    [ -f "$src" ] || continue  # left by a build of a file since moved or removed
    floor_of "$src"
    if [ -z "$level" ]; then
      echo "check_floors: $src ($o): in no floor (add its folder to tools/check_floors.sh)"
      bad=1
      continue
    fi
    printf '%s\t%s\t%s\t%s\n' "$o" "$src" "$level" "$group" >> "$table"
    n_objects=$((n_objects + 1))
  done
  # nm -P -A: "object: symbol type value size". Upper case types other than U are
  # definitions; U (and weak w, v) are uses. Local symbols (lower case) are the
  # object's own business.
  calls=$(cut -f1 "$table" | xargs nm -P -A 2>/dev/null | awk -F'\t' -v table="$table" '
    BEGIN {
      while ((getline row < table) > 0) {
        split(row, c, "\t")
        src[c[1]] = c[2]; lvl[c[1]] = c[3]; grp[c[1]] = c[4]
      }
    }
    {
      obj = $0; sub(/: .*/, "", obj)
      rest = substr($0, length(obj) + 3)
      split(rest, f, " ")
      name = f[1]; type = f[2]
      if (type == "U" || type == "w" || type == "v") { uses[++n] = obj SUBSEP name }
      else if (type ~ /^[A-Z]$/) { home[name] = obj }
    }
    END {
      for (i = 1; i <= n; i++) {
        split(uses[i], u, SUBSEP)
        o = u[1]; name = u[2]
        if (!(name in home)) continue
        d = home[name]
        if (grp[o] == grp[d] || lvl[d] + 0 < lvl[o] + 0) continue
        line = src[o] ": calls " name " (" src[d] "): " grp[o] " (floor " lvl[o] \
               ") must not reach " grp[d] " (floor " lvl[d] ")"
        if (!(line in seen)) { seen[line] = 1; print line }
      }
    }' | sort)
  if [ -n "$calls" ]; then
    echo "$calls"
    bad=1
  fi
fi

if [ "$bad" -ne 0 ]; then
  echo "check_floors: FAILED (floors: random < core < kernels < ops < nn < optim, io, dist)"
  exit 1
fi
echo "check_floors: $(echo "$files" | wc -l) files hold their floors in their includes"
if [ -n "$build" ]; then
  echo "check_floors: $n_objects object files hold their floors in their calls"
fi
