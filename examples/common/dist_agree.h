// What every process of a data-parallel run must have the same of, checked: ranks that
// differ would train apart and save as if all went well, or wait for each other
// forever (one with fewer --steps, or resuming where another starts afresh). Each
// check is collective (every rank calls it at the same point, see dist_check); a rank
// that differs from rank 0 says so in one line, and every rank exits with status 2.
// In one process they check nothing.
//
// A program checks, in this order:
//     dist_flags_parse(usage, flags, n, argc, argv);
//     dist_agree_flags(flags, n);              once its flags are final
//     dist_agree_data(bytes, n, "--data");     once its data is read
//     dist_agree_state(ps, opt, resume);       once its model is built or resumed
#ifndef EXAMPLES_DIST_AGREE_H
#define EXAMPLES_DIST_AGREE_H

#include <attograd.h>

#include "flags.h"

// flags_parse on every rank, and its outcome agreed on: returns when every rank's flags
// parse; after --help on every rank, exits with status 0; after one line on a bad
// flag (dist_check) or when some ranks asked for --help and others did not, with 2.
void dist_flags_parse(const char *usage_line, flag *flags, int n, int argc, char **argv);

// Every flag of the table but the per-rank ones (flags.h) has the same value on every
// rank, and each per-rank string flag is given on all or none: the settings, the step
// count, whether the run resumes, saves, ... "rank 1 of 2: started with other flags
// than rank 0 (every rank needs the same)".
void dist_agree_flags(const flag *flags, int n);

// The data read has the same bytes everywhere: "rank 1 of 2: its data differs from
// rank 0's (<flag>)", the flag that named it.
void dist_agree_data(const void *bytes, size_t n, const char *flag_name);

// The model's parameters and the optimizer's whole state (its step count, settings and
// buffers; opt may be NULL) are the same everywhere: "rank 1 of 2: <resume> holds
// another model than rank 0's copy" (resume: the checkpoint it loaded), or "rank 1 of
// 2: its initial model differs from rank 0's" (resume NULL).
void dist_agree_state(const ag_params *ps, ag_optim *opt, const char *resume);

#endif
