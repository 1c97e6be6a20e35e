// Loading a training checkpoint to go on from, refusing what would not continue the
// run: a parameter that is not finite (it would turn every step into NaN, or abort a
// sampler), a step count outside [0, last_step] (a schedule cannot take it).
#ifndef EXAMPLES_CHECKPOINT_H
#define EXAMPLES_CHECKPOINT_H

#include <attograd.h>

// Loads `path` into ps and, when opt is not NULL, into the optimizer (its step count
// in [0, last_step]); *file (when file is not NULL) receives the file, for its
// metadata (free it). False with one line in err (after a refusal, ps and opt hold
// the file's values: do not train on), and *file NULL.
bool checkpoint_load_checked(ag_params *ps, ag_optim *opt, const char *path, int last_step,
                             ag_safetensors **file, ag_err *err);

#endif
