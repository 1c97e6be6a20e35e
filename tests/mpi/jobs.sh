# What the MPI tests of the examples share (sourced): a job under mpirun, guarded by a
# timeout, and what a job that must fail must do. The sourcing script sets mpirun,
# work (a directory for the job's stdout), prog (the program's name, which starts its
# lines) and fail.

# job ARGS...: mpirun ARGS (app contexts), guarded by a 60 s timeout; sets out
# (stderr: mpirun forwards the ranks' stdout and stderr apart, so the two do
# not interleave by lines), rc and seconds.
job() {
  local t0
  t0=$(date +%s%N)
  out=$(timeout 60 "$mpirun" --oversubscribe "$@" 2>&1 > "$work/stdout")
  rc=$?
  seconds=$(( ($(date +%s%N) - t0) / 1000000000 ))
}
# job_limit BINARY: what starting and ending a job costs here (many seconds for a
# sanitizer build on a loaded machine), from a job that does nothing: every error must
# end its job within 10 s more (sets limit).
job_limit() {
  job -np 2 "$1" --help
  [ $rc -eq 0 ] || fail "--help on 2 processes: status $rc: $out"
  limit=$((seconds + 10))
}
# ended WHAT: the job failed, and within the limit (124: killed by the guard).
ended() {
  [ $rc -ne 124 ] || fail "$1: still running after 60 s (a hang): $out"
  [ $rc -ne 0 ] || fail "$1: exit status 0: $out"
  [ $seconds -le $limit ] || fail "$1: the job took $seconds s to end"
}
# one_line WHAT LINE: exactly one line on the job's output starts with "$prog:", and
# it is LINE.
one_line() {
  local lines
  lines=$(grep "^$prog:" <<<"$out")
  [ "$lines" = "$2" ] || fail "$1: expected the one line '$2', got: $out"
}
